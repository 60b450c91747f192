"""The mandatory-output attention contract of vLLM >= 0.20, implemented without vLLM.

Importing this package registers ``torch.ops.vllm_attn_compat.unified_attention_with_output``
and ``torch.ops.vllm_attn_compat.unified_mla_attention_with_output``. Backends ("sdpa",
"flex", "flash", "mla_reference") are imported on first use by name.
"""

from importlib.util import find_spec as _find_spec

# The plain install is the codemod and the pytest plugin, without torch: fail here, saying what to install,
# rather than on an `import torch` deep inside.
if _find_spec("torch") is None:
    raise ModuleNotFoundError(
        "vllm_attn_compat.backends needs torch, which is not installed: the plain `pip install vllm-attn-compat` "
        "is the codemod and the pytest plugin only. Install the package with torch: "
        "pip install 'vllm-attn-compat[torch]' (or first the torch build you need, then the package; "
        "next to vLLM, vLLM brings torch)",
        name="torch",
    )

from vllm_attn_compat.backends import ops
from vllm_attn_compat.backends.abstract import AttentionBackend, AttentionImpl, MLAAttentionImpl
from vllm_attn_compat.backends.buffers import validate_output_buffer
from vllm_attn_compat.backends.forward_context import (
    STATIC_FORWARD_CONTEXT,
    ForwardContext,
    NoForwardContextError,
    UnknownLayerError,
    get_attention_context,
    get_forward_context,
    register_layer,
    set_forward_context,
    unregister_layer,
)
from vllm_attn_compat.backends.layer import Attention, MLAAttention
from vllm_attn_compat.backends.metadata import AttentionMetadata
from vllm_attn_compat.backends.ops import unified_attention_with_output, unified_mla_attention_with_output
from vllm_attn_compat.backends.registry import available_backends, get_backend, register_backend

__all__ = [
    "STATIC_FORWARD_CONTEXT",
    "Attention",
    "AttentionBackend",
    "AttentionImpl",
    "AttentionMetadata",
    "ForwardContext",
    "MLAAttention",
    "MLAAttentionImpl",
    "NoForwardContextError",
    "UnknownLayerError",
    "available_backends",
    "get_attention_context",
    "get_backend",
    "get_forward_context",
    "ops",
    "register_backend",
    "register_layer",
    "set_forward_context",
    "unified_attention_with_output",
    "unified_mla_attention_with_output",
    "unregister_layer",
    "validate_output_buffer",
]
