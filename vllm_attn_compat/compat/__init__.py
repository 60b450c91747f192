"""Deprecated forwarders for the pre-0.20 attention API, the legacy-backend adapter and the vLLM plugin.

Importing this package registers ``torch.ops.vllm_attn_compat.unified_attention`` / ``unified_mla_attention``
and gives this package's own ``AttentionBackend`` and ``Attention`` the removed flags ``accept_output_buffer``
and ``use_output`` (read as True, with a warning). The vLLM plugin (:mod:`vllm_attn_compat.compat.plugin`) does
the same for a real vLLM >= 0.20.
"""

from vllm_attn_compat.backends.abstract import AttentionBackend as _AttentionBackend
from vllm_attn_compat.backends.layer import Attention as _Attention
from vllm_attn_compat.compat.deprecation import ENV_WARNINGS, VllmAttnCompatDeprecationWarning
from vllm_attn_compat.compat.flags import install_removed_flags
from vllm_attn_compat.compat.forwarders import unified_attention, unified_mla_attention
from vllm_attn_compat.compat.legacy import adapt_legacy_impl
from vllm_attn_compat.compat.op_names import RENAMED_OPS, normalize_splitting_ops

install_removed_flags(_AttentionBackend, _Attention)

__all__ = [
    "ENV_WARNINGS",
    "RENAMED_OPS",
    "VllmAttnCompatDeprecationWarning",
    "adapt_legacy_impl",
    "normalize_splitting_ops",
    "unified_attention",
    "unified_mla_attention",
]
