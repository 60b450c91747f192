#!/usr/bin/env bash
# Runs the `vllm` test tier against each vLLM release from 0.20 on, each in its own CPU venv, and prints one line
# per release, then a Markdown table for docs/vllm-versions.md. The logic lives in scripts/vllm_matrix.py.
#
#   scripts/vllm-matrix.sh                    # the latest patch of each minor release, 0.20 to the newest
#   scripts/vllm-matrix.sh 0.25.1 0.33.0      # these releases
#   scripts/vllm-matrix.sh --newest           # the newest only (--oldest, both, --all-patches, --list)
#   scripts/vllm-matrix.sh --newest -- -x -k plugin   # extra pytest arguments after --
#
# Venvs live in ${VLLM_MATRIX_DIR:-$HOME/.cache/vllm-attn-compat/matrix} (about 2 GB each) and are reused once
# complete; the package itself is reinstalled (editable, from this tree) on every run. pytest's junit XML and log
# for each release land in its reports/ folder, with matrix.md (the table so far, rewritten after each release).
# Exit status 0 only when every release installed, imported vLLM's attention modules and passed its tier with no
# failure or error; skips are listed with their reasons.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/vllm_matrix.py" "$@"
