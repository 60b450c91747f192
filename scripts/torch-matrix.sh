#!/usr/bin/env bash
# Runs the runtime half's tests that need no vLLM (tests/backends, tests/compat) with each torch release given, each
# in its own venv, and prints one line per release. The logic lives in scripts/torch_matrix.py.
#
#   scripts/torch-matrix.sh 2.10.0 2.11.0 2.12.0          # these torch releases
#   scripts/torch-matrix.sh 2.12.0 -- -x -k flex          # extra pytest arguments after --
#
# Venvs (about 5 GB each: pip finds CUDA builds, which import without a GPU) live beside vllm-matrix.sh's, in
# ${VLLM_MATRIX_DIR:-$HOME/.cache/vllm-attn-compat/matrix}, and are reused once complete; the package itself is
# reinstalled (editable, from this tree) on every run. Exit status 0 only when every release installed and passed.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/torch_matrix.py" "$@"
