#!/usr/bin/env bash
# Installs the real-vLLM test tier (tests marked `vllm`): vLLM 0.20.0's Python modules on a CPU build of torch,
# exactly as the spec's section 6 does. Idempotent: when everything is already there it changes nothing and
# returns in about a second. Install torch first (`pip install torch==2.13.0`); this script does not pull it.
set -euo pipefail

VLLM_VERSION=0.20.0
# vLLM pins a CUDA torch, so it goes in with --no-deps and its Python deps are named here (spec section 6).
DEPS=(numpy packaging psutil pyzmq urllib3 regex pydantic cbor2 huggingface_hub safetensors transformers gguf
      aiohttp openai-harmony openai einops msgspec pillow pybase64 cachetools cloudpickle uvloop py-cpuinfo
      prometheus_client)
PYTHON=${PYTHON:-python}
export PIP_DISABLE_PIP_VERSION_CHECK=1

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "install-vllm-tier: torch is not importable by $PYTHON; install it first: pip install torch==2.13.0" >&2
    exit 1
fi

# Prints the missing distributions (vllm included when its version differs); reads metadata only, imports nothing.
missing=$("$PYTHON" - "$VLLM_VERSION" "${DEPS[@]}" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

wanted, deps = sys.argv[1], sys.argv[2:]
missing = []
try:
    if version("vllm") != wanted:
        missing.append("vllm")
except PackageNotFoundError:
    missing.append("vllm")
for dist in deps:
    try:
        version(dist)
    except PackageNotFoundError:
        missing.append(dist)
print(" ".join(missing))
PY
)

if [[ -z "$missing" ]]; then
    echo "install-vllm-tier: vllm==$VLLM_VERSION and its Python deps are already installed"
    exit 0
fi

echo "install-vllm-tier: installing $missing"
if [[ " $missing " == *" vllm "* ]]; then
    "$PYTHON" -m pip install -q --no-deps "vllm==$VLLM_VERSION"
fi
"$PYTHON" -m pip install -q "${DEPS[@]}"

# The tier needs this import (it registers torch.ops.vllm.unified_attention_with_output on a CPU-only machine).
if ! "$PYTHON" -c "import vllm.model_executor.layers.attention.attention" >/dev/null 2>&1; then
    echo "install-vllm-tier: vllm $VLLM_VERSION was installed but does not import; see the error of:" >&2
    echo "  $PYTHON -c 'import vllm.model_executor.layers.attention.attention'" >&2
    exit 1
fi
echo "install-vllm-tier: ready"
