"""What the plugin installs into a real vLLM >= 0.20 (imported only by the plugin, once vLLM is known to import).

Each ``install_*`` function is idempotent and returns the names of what it installed now.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from vllm.config import CompilationConfig
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention import attention as vllm_attention
from vllm.model_executor.layers.attention import mla_attention as vllm_mla_attention  # noqa: F401 (registers its op)
from vllm.utils.torch_utils import LayerNameType, _encode_layer_name, _resolve_layer_name
from vllm.v1.attention.backend import AttentionBackend

from vllm_attn_compat.compat import forwarders
from vllm_attn_compat.compat.deprecation import removed_api_message, warn_once
from vllm_attn_compat.compat.flags import install_removed_flags
from vllm_attn_compat.compat.op_names import RENAMED_OPS, normalize_splitting_ops, renamed_in


class VllmRoute(forwarders.Route):
    """vLLM's forward context, layers and ``torch.ops.vllm.*_with_output`` ops."""

    def layer(self, layer_name: str) -> Any:
        layers = get_forward_context().no_compile_layers
        try:
            return layers[layer_name]
        except KeyError:
            raise KeyError(
                f"layer_name: expected the name of an attention layer in vLLM's forward context "
                f"({len(layers)} known, e.g. {sorted(layers)[:4]}); found {layer_name!r}"
            ) from None

    def encode(self, layer_name: str) -> Any:
        return _encode_layer_name(layer_name)

    def allocate(self, layer: Any, query: torch.Tensor) -> torch.Tensor:
        # As vLLM's Attention.forward / MLAAttention callers do: [T, num_heads * head_size_v], query's dtype.
        size_v = layer.v_head_dim if hasattr(layer, "v_head_dim") else layer.head_size_v
        return torch.empty((query.shape[0], layer.num_heads * size_v), dtype=query.dtype, device=query.device)

    def attention_op(self):
        return torch.ops.vllm.unified_attention_with_output

    def mla_attention_op(self):
        return torch.ops.vllm.unified_mla_attention_with_output


ROUTE = VllmRoute()


def install_flags() -> list[str]:
    return install_removed_flags(AttentionBackend, vllm_attention.Attention)


def install_route() -> list[str]:
    if isinstance(forwarders.current_route(), VllmRoute):
        return []
    forwarders.set_route(ROUTE)
    return ["vllm_attn_compat.compat.unified_attention/unified_mla_attention -> vLLM"]


_vllm_lib: torch.library.Library | None = None  # kept alive: the ops live as long as their library


def install_ops() -> list[str]:
    """``torch.ops.vllm.unified_attention`` / ``unified_mla_attention``, taking vLLM's layer-name type."""
    global _vllm_lib
    if _vllm_lib is not None or hasattr(torch.ops.vllm, "unified_attention"):
        return []
    _vllm_lib = torch.library.Library("vllm", "FRAGMENT")
    # LayerName (opaque, torch >= 2.11) or str, as vLLM's own ops; eager callers may pass either.
    probe_schema = torch.library.infer_schema(_layer_name_probe, mutates_args=())  # "(<type> layer_name) -> ()"
    layer_name_type = probe_schema[1 : probe_schema.index(" layer_name")]
    kernels = forwarders.forwarder_kernels(ROUTE, _resolve_layer_name)
    forwarders.define_forwarder_ops(_vllm_lib, layer_name_type, kernels)
    return ["torch.ops.vllm.unified_attention", "torch.ops.vllm.unified_mla_attention"]


def _layer_name_probe(layer_name: LayerNameType) -> None: ...


_SPLITTING_OPS_HOOK = "__vllm_attn_compat_normalizes_splitting_ops__"


def install_splitting_ops_normalization() -> list[str]:
    original = CompilationConfig.__post_init__
    if getattr(original, _SPLITTING_OPS_HOOK, False):
        return []

    def __post_init__(self: CompilationConfig) -> None:
        if self.splitting_ops:
            stale = renamed_in(self.splitting_ops)
            if stale:
                self.splitting_ops = normalize_splitting_ops(self.splitting_ops)
                _warn_stale_ops(stale)
        original(self)

    setattr(__post_init__, _SPLITTING_OPS_HOOK, True)
    CompilationConfig.__post_init__ = __post_init__
    return ["CompilationConfig.splitting_ops normalization"]


def _warn_stale_ops(stale: list[str]) -> None:
    for old in stale:
        message = removed_api_message(
            f"The op {old!r} named in splitting_ops",
            f"the entry now reads {RENAMED_OPS[old]!r} (update your config)",
            "VAC006",
        )
        # The user's line is the CompilationConfig(...) call, above pydantic's and vLLM's frames.
        warn_once(message, depth=_depth_outside(("vllm", "pydantic", "pydantic_core", "vllm_attn_compat")))


def _depth_outside(packages: tuple[str, ...]) -> int:
    """How many frames above our caller's caller the first frame outside ``packages`` is (the user's line)."""
    frame, depth = sys._getframe(2), 1
    while frame.f_back is not None:
        module = frame.f_globals.get("__name__", "")
        if not any(module == p or module.startswith(p + ".") for p in packages):
            break
        frame, depth = frame.f_back, depth + 1
    return depth


def install() -> list[str]:
    return install_flags() + install_ops() + install_route() + install_splitting_ops_normalization()
