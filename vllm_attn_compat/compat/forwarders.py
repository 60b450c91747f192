"""``unified_attention`` and ``unified_mla_attention``: the ops vLLM 0.20 removed, as deprecated forwarders.

Each forwarder takes what the old no-output path passed (2-D ``[T, heads * head_size]`` or 3-D inputs), lets the
layer's shape decide the output (``head_size_v`` may differ from ``head_size``), calls the mandatory-output op and
returns the old 2-D ``[T, num_heads * head_size_v]`` result. Where the work goes is a :class:`Route`: this
package's backends by default, vLLM's own ops and layers once the vLLM plugin has installed itself.

They exist as Python functions (PEP 702-marked) and as ops ``torch.ops.vllm_attn_compat.unified_attention`` /
``unified_mla_attention``. The ops are CompositeImplicitAutograd: under torch.compile they decompose into the
allocation plus the with-output op, so they need no fake and add no copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from typing_extensions import deprecated

from vllm_attn_compat.backends import forward_context
from vllm_attn_compat.backends.layer import view_heads
from vllm_attn_compat.backends.ops import NAMESPACE
from vllm_attn_compat.compat.deprecation import removed_api_message, warn_once

UNIFIED_ATTENTION_MESSAGE = removed_api_message(
    "`unified_attention` (torch.ops.vllm.unified_attention)",
    "allocate the output and call `unified_attention_with_output(query, key, value, output, layer_name)`",
    "VAC007",
)
UNIFIED_MLA_ATTENTION_MESSAGE = removed_api_message(
    "`unified_mla_attention` (torch.ops.vllm.unified_mla_attention)",
    "allocate the output and call `unified_mla_attention_with_output(q, kv_c_normed, k_pe, output, layer_name)`",
    "VAC007",
)


class Route:
    """Where the forwarders find layers and the with-output ops (this package's backends)."""

    def layer(self, layer_name: str) -> Any:
        return forward_context.get_attention_context(layer_name)[1]

    def encode(self, layer_name: str) -> Any:
        """The layer name as the with-output op takes it."""
        return layer_name

    def allocate(self, layer: Any, query: torch.Tensor) -> torch.Tensor:
        """The output buffer, ``[T, num_heads, head_size_v]``; the layer is the one place that allocates it."""
        output: torch.Tensor = layer.allocate_output(query)
        return output

    def attention_op(self) -> Callable[..., None]:
        return torch.ops.vllm_attn_compat.unified_attention_with_output

    def mla_attention_op(self) -> Callable[..., None]:
        return torch.ops.vllm_attn_compat.unified_mla_attention_with_output


_route: Route = Route()


def set_route(route: Route) -> Route:
    """Send the forwarders to ``route`` (the vLLM plugin does this); returns the previous route."""
    global _route
    previous, _route = _route, route
    return previous


def current_route() -> Route:
    return _route


def forward_unified_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_name: str, route: Route | None = None
) -> torch.Tensor:
    """The forwarder's work, without the warning: allocate via the layer, call the with-output op, return 2-D."""
    route = route or _route
    layer = route.layer(layer_name)
    heads, head_size, head_size_v = layer.num_heads, layer.head_size, layer.head_size_v
    query = view_heads("query", query, heads, head_size)
    key = view_heads("key", key, layer.num_kv_heads, head_size)
    value = view_heads("value", value, layer.num_kv_heads, head_size_v)
    output = route.allocate(layer, query).view(-1, heads, head_size_v)
    route.attention_op()(query, key, value, output, route.encode(layer_name))
    return output.view(-1, heads * head_size_v)


def forward_unified_mla_attention(
    q: torch.Tensor,
    kv_c_normed: torch.Tensor,
    k_pe: torch.Tensor,
    layer_name: str,
    kv_cache_dummy_dep: torch.Tensor | None = None,
    route: Route | None = None,
) -> torch.Tensor:
    """The MLA forwarder's work: ``q`` and ``k_pe`` as 3-D views (vLLM's layout), ``kv_c_normed`` unchanged."""
    route = route or _route
    layer = route.layer(layer_name)
    q = view_heads("q", q, layer.num_heads, layer.qk_head_dim)
    k_pe = view_heads("k_pe", k_pe, 1, layer.qk_rope_head_dim)
    output = route.allocate(layer, q)
    route.mla_attention_op()(
        q, kv_c_normed, k_pe, output, route.encode(layer_name), kv_cache_dummy_dep=kv_cache_dummy_dep
    )
    # Sizes spelled out rather than -1: view cannot infer a size from zero elements (an empty batch).
    return output.view(q.shape[0], output.shape[1:].numel())


# category=None: the marker is for type checkers and IDEs; warn_once does the run-time part, once per call site.
@deprecated(UNIFIED_ATTENTION_MESSAGE, category=None)
def unified_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_name: str) -> torch.Tensor:
    """Deprecated: the pre-0.20 ``unified_attention``; returns a new ``[T, num_heads * head_size_v]`` tensor."""
    warn_once(UNIFIED_ATTENTION_MESSAGE)
    return forward_unified_attention(query, key, value, layer_name)


@deprecated(UNIFIED_MLA_ATTENTION_MESSAGE, category=None)
def unified_mla_attention(
    q: torch.Tensor,
    kv_c_normed: torch.Tensor,
    k_pe: torch.Tensor,
    layer_name: str,
    kv_cache_dummy_dep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Deprecated: the pre-0.20 ``unified_mla_attention``; returns a new ``[T, num_heads * v_head_dim]`` tensor."""
    warn_once(UNIFIED_MLA_ATTENTION_MESSAGE)
    return forward_unified_mla_attention(q, kv_c_normed, k_pe, layer_name, kv_cache_dummy_dep)


# In an op kernel the user's line is 2 frames up (the kernel <- OpOverloadPacket.__call__ <- user).
_OP_CALLER_DEPTH = 2


def forwarder_kernels(
    route: Route | None = None, resolve_name: Callable[[Any], str] = str
) -> dict[str, Callable[..., torch.Tensor]]:
    """Op kernels of the two forwarders: warn once per caller, then forward (to ``route``, default: the current one).

    ``resolve_name`` turns the op's layer-name argument into a ``str`` (vLLM passes an opaque ``LayerName``).
    """

    def unified_attention_kernel(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_name: Any
    ) -> torch.Tensor:
        warn_once(UNIFIED_ATTENTION_MESSAGE, depth=_OP_CALLER_DEPTH)
        return forward_unified_attention(query, key, value, resolve_name(layer_name), route)

    def unified_mla_attention_kernel(
        q: torch.Tensor,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        layer_name: Any,
        kv_cache_dummy_dep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        warn_once(UNIFIED_MLA_ATTENTION_MESSAGE, depth=_OP_CALLER_DEPTH)
        return forward_unified_mla_attention(q, kv_c_normed, k_pe, resolve_name(layer_name), kv_cache_dummy_dep, route)

    return {"unified_attention": unified_attention_kernel, "unified_mla_attention": unified_mla_attention_kernel}


FORWARDER_SCHEMAS = {
    "unified_attention": "(Tensor query, Tensor key, Tensor value, {layer_name} layer_name) -> Tensor",
    "unified_mla_attention": (
        "(Tensor q, Tensor kv_c_normed, Tensor k_pe, {layer_name} layer_name, "
        "Tensor? kv_cache_dummy_dep=None) -> Tensor"
    ),
}


def define_forwarder_ops(
    lib: torch.library.Library, layer_name_type: str, kernels: dict[str, Callable[..., torch.Tensor]]
) -> None:
    """Define the forwarder ops of ``kernels`` (names of :data:`FORWARDER_SCHEMAS`) in ``lib``,
    CompositeImplicitAutograd: they decompose under torch.compile."""
    for name, kernel in kernels.items():
        lib.define(name + FORWARDER_SCHEMAS[name].format(layer_name=layer_name_type))
        lib.impl(name, kernel, "CompositeImplicitAutograd")


_lib = torch.library.Library(NAMESPACE, "FRAGMENT")
define_forwarder_ops(_lib, "str", forwarder_kernels())
