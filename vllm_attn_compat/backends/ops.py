"""The mandatory-output attention ops, ``torch.ops.vllm_attn_compat.*``.

Importing this module registers, with the argument names and order of vLLM's ops:

- ``unified_attention_with_output(Tensor query, Tensor key, Tensor value, Tensor(a3!) output,
  str layer_name, Tensor? output_scale=None, Tensor(a6!)? output_block_scale=None,
  Tensor? kv_cache_dummy_dep=None) -> ()``
- ``unified_mla_attention_with_output(Tensor q, Tensor kv_c_normed, Tensor k_pe,
  Tensor(a3!) output, str layer_name, ...same tail...) -> ()``

They are defined with `torch.library.Library.define` + ``impl`` rather than the
``custom_op`` decorator, which adds about 20 us of Python per call (spec section 7). The
``Tensor(a!)`` annotations let torch.compile write straight into the caller's buffer (no
defensive clone); the fake implementations do nothing, since the ops return nothing.
``layer_name`` is a plain ``str`` (vLLM >= 0.20 uses an opaque type on torch >= 2.11; a
string keeps the ops usable on torch 2.10 and readable in generated code).
"""

from __future__ import annotations

import torch

from vllm_attn_compat.backends.forward_context import get_attention_context

NAMESPACE = "vllm_attn_compat"

_TAIL = (
    "str layer_name, Tensor? output_scale=None, Tensor(a6!)? output_block_scale=None, "
    "Tensor? kv_cache_dummy_dep=None) -> ()"
)
SCHEMAS = {
    "unified_attention_with_output": (
        "unified_attention_with_output(Tensor query, Tensor key, Tensor value, Tensor(a3!) output, " + _TAIL
    ),
    "unified_mla_attention_with_output": (
        "unified_mla_attention_with_output(Tensor q, Tensor kv_c_normed, Tensor k_pe, Tensor(a3!) output, " + _TAIL
    ),
}


def unified_attention_with_output(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    layer_name: str,
    output_scale: torch.Tensor | None = None,
    output_block_scale: torch.Tensor | None = None,
    kv_cache_dummy_dep: torch.Tensor | None = None,
) -> None:
    """The op body (vLLM's): find the layer and its metadata, let the backend fill ``output``."""
    del kv_cache_dummy_dep  # only orders the cache update before attention in a graph
    attn_metadata, layer, kv_cache = get_attention_context(layer_name)
    layer.impl.forward(
        layer,
        query,
        key,
        value,
        kv_cache,
        attn_metadata,
        output=output,
        output_scale=output_scale,
        output_block_scale=output_block_scale,
    )


def unified_mla_attention_with_output(
    q: torch.Tensor,
    kv_c_normed: torch.Tensor,
    k_pe: torch.Tensor,
    output: torch.Tensor,
    layer_name: str,
    output_scale: torch.Tensor | None = None,
    output_block_scale: torch.Tensor | None = None,
    kv_cache_dummy_dep: torch.Tensor | None = None,
) -> None:
    """The MLA op body (vLLM's): ``layer.forward_impl`` fills ``output``."""
    del kv_cache_dummy_dep
    attn_metadata, layer, kv_cache = get_attention_context(layer_name)
    layer.forward_impl(
        q,
        kv_c_normed,
        k_pe,
        kv_cache,
        attn_metadata,
        output=output,
        output_scale=output_scale,
        output_block_scale=output_block_scale,
    )


def _fake(*args: object, **kwargs: object) -> None:
    return None


_lib = torch.library.Library(NAMESPACE, "FRAGMENT")
for _name, _fn in (
    ("unified_attention_with_output", unified_attention_with_output),
    ("unified_mla_attention_with_output", unified_mla_attention_with_output),
):
    _lib.define(SCHEMAS[_name])
    # CompositeExplicitAutograd: one kernel for every device; the backend picks the kernel.
    _lib.impl(_name, _fn, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{_name}", _fake, lib=_lib)
