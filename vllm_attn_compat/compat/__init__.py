"""Deprecated forwarders for the pre-0.20 attention API, the legacy-backend adapter and the vLLM plugin.

Importing this package registers ``torch.ops.vllm_attn_compat.unified_attention`` / ``unified_mla_attention``.
The vLLM plugin (:mod:`vllm_attn_compat.compat.plugin`) installs the rest into a real vLLM >= 0.20: the removed
flags ``accept_output_buffer`` / ``use_output`` (read as True, with a warning), the legacy adapter for backends
that declare ``accept_output_buffer = False``, ``torch.ops.vllm.unified_attention`` and the ``splitting_ops``
normalisation. :func:`install_into_backends` does the flags and the adapter for this package's own reference
backends, which otherwise keep the >= 0.20 contract exactly (no ``accept_output_buffer`` at all).
"""

from importlib.util import find_spec as _find_spec

# The plain install is the codemod and the pytest plugin, without torch: fail here, saying what to install,
# rather than on an `import torch` deep inside.
if _find_spec("torch") is None:
    raise ModuleNotFoundError(
        "vllm_attn_compat.compat needs torch, which is not installed: the plain `pip install vllm-attn-compat` "
        "is the codemod and the pytest plugin only. Install the package with torch: "
        "pip install 'vllm-attn-compat[torch]' (or first the torch build you need, then the package; "
        "next to vLLM, vLLM brings torch)",
        name="torch",
    )

from vllm_attn_compat.backends.abstract import AttentionBackend as _AttentionBackend
from vllm_attn_compat.backends.layer import Attention as _Attention
from vllm_attn_compat.compat.adopt import ReturnValueIgnoredWarning
from vllm_attn_compat.compat.dead_overrides import DeadOverrideWarning
from vllm_attn_compat.compat.deprecation import ENV_WARNINGS, VllmAttnCompatDeprecationWarning
from vllm_attn_compat.compat.flags import install_removed_flags, remove_removed_flags
from vllm_attn_compat.compat.forwarders import unified_attention, unified_mla_attention
from vllm_attn_compat.compat.guard_switch import check_output
from vllm_attn_compat.compat.legacy import adapt_legacy_impl
from vllm_attn_compat.compat.op_names import RENAMED_OPS, normalize_splitting_ops
from vllm_attn_compat.compat.output_guard import (
    OutputNotCheckedWarning,
    OutputNotWrittenError,
    OutputNotWrittenWarning,
)


def install_into_backends() -> list[str]:
    """Give this package's ``AttentionBackend`` / ``Attention`` the removed flags and the legacy adapter hook.

    For running pre-0.20 backend code on the reference backends without vLLM; idempotent. Returns what was
    installed now. :func:`remove_from_backends` undoes it.
    """
    return install_removed_flags(_AttentionBackend, _Attention)


def remove_from_backends() -> None:
    remove_removed_flags(_AttentionBackend, _Attention)


__all__ = [
    "ENV_WARNINGS",
    "RENAMED_OPS",
    "DeadOverrideWarning",
    "OutputNotCheckedWarning",
    "OutputNotWrittenError",
    "OutputNotWrittenWarning",
    "ReturnValueIgnoredWarning",
    "VllmAttnCompatDeprecationWarning",
    "adapt_legacy_impl",
    "check_output",
    "install_into_backends",
    "normalize_splitting_ops",
    "remove_from_backends",
    "unified_attention",
    "unified_mla_attention",
]
