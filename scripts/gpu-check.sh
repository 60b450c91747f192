#!/usr/bin/env bash
# The runtime half's tests on a CUDA machine, the flash backend's included, where no package registry can be
# reached (an accelerator lent for minutes): flash-attn is built there from its sdist, for head size 64 and the
# machine's GPU only (what tests/backends/test_flash.py and test_copies.py run), which takes about 1.5 minutes
# on 16 cores instead of hours. Download the sdist where PyPI is reachable (its only distribution: the file
# list of https://pypi.org/pypi/flash-attn/json), carry it over, then:
#   scripts/gpu-check.sh flash_attn-2.8.3.post2.tar.gz [pytest arguments]
# Uses the machine's python3 and torch (CUDA), with this checkout on PYTHONPATH; needs nvcc.
set -euo pipefail

sdist=${1:?usage: scripts/gpu-check.sh FLASH_ATTN_SDIST.tar.gz [pytest arguments]}
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
tar xzf "$sdist" -C "$work"
source_dir=$(find "$work" -maxdepth 1 -mindepth 1 -type d -name 'flash_attn-*')
arch=$(python3 -c "import torch; major, minor = torch.cuda.get_device_capability(); print(f'{major}{minor}')")
case $arch in 80 | 90 | 100 | 120) ;; *) arch=80 ;; esac # the archs flash-attn's setup.py builds; sm_80 code runs on 8.x

python3 - "$source_dir" <<'PATCH'
import re, sys
from pathlib import Path

root = Path(sys.argv[1])
setup = root / "setup.py"
text = setup.read_text()
# The head-size-64 kernels only, and none of the features the backend never asks for (dropout, ALiBi, softcap,
# local windows, uneven head sizes, the backward pass): each is a template axis that multiplies the build.
kept = [line for line in text.splitlines() if not re.match(r'\s*"csrc/flash_attn/src/flash_\w+_hdim(?!64_)\d+_', line)]
text = "\n".join(kept) + "\n"
for feature in ("BACKWARD", "DROPOUT", "ALIBI", "SOFTCAP", "UNEVEN_K", "LOCAL"):
    text = text.replace(f'# "-DFLASHATTENTION_DISABLE_{feature}",', f'"-DFLASHATTENTION_DISABLE_{feature}",')
setup.write_text(text)
switch = root / "csrc/flash_attn/src/static_switch.h"
header = switch.read_text()
start = header.index("#define HEADDIM_SWITCH")
end = header.index("}()", start) + 3
header = header[:start] + (
    "#define HEADDIM_SWITCH(HEADDIM, ...) [&] { \\\n"
    '    if (!(HEADDIM > 32 && HEADDIM <= 64)) throw std::runtime_error("built for head size 64 only"); \\\n'
    "    constexpr static int kHeadDim = 64; return __VA_ARGS__(); }()"
) + header[end:]
switch.write_text(header.replace("#pragma once", "#pragma once\n#include <stdexcept>", 1))
PATCH

(cd "$source_dir" && FLASH_ATTN_CUDA_ARCHS=$arch MAX_JOBS=$(nproc) NVCC_THREADS=2 FLASH_ATTENTION_FORCE_BUILD=TRUE \
    python3 setup.py build_ext --inplace >"$work/build.log" 2>&1) || { tail -40 "$work/build.log"; exit 1; }

cd "$repo"
PYTHONPATH="$repo:$source_dir${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -p no:cacheprovider -q -rfs \
    tests/backends tests/compat "$@"
