"""The legacy adapter: runs a pre-0.20 return-value ``AttentionImpl`` under the mandatory-output contract.

vLLM >= 0.20 hands every impl a preallocated ``output`` ``[T, num_heads, head_size_v]`` and ignores the return
value, so an impl written for ``accept_output_buffer = False`` (which returned a new ``[T, num_heads * head_size_v]``
tensor) now silently yields an uninitialised buffer. The adapter restores the old calling convention around the
impl's ``forward`` and copies the result into ``output``, only when the impl did not write there itself.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, TypeVar

import torch

from vllm_attn_compat.compat.deprecation import removed_api_message, warn_once_about

ImplClass = TypeVar("ImplClass", bound=type)

# Set on an adapted forward; holds the impl's own forward.
_LEGACY_FORWARD = "__vllm_attn_compat_legacy_forward__"


def adapt_legacy_impl(cls: ImplClass) -> ImplClass:
    """Class decorator for an ``AttentionImpl`` whose ``forward`` returns its result instead of writing ``output``.

    The adapted ``forward`` passes query/key/value in the 2-D ``[T, heads * head_size]`` layout the old
    no-output path delivered (and a 2-D view of ``output`` when the legacy forward has an ``output`` parameter),
    then copies the returned tensor into ``output`` unless it already is ``output``'s memory. Fused output
    quantization (``output_scale`` / ``output_block_scale``) is rejected. Applying it twice changes nothing.
    """
    if not isinstance(cls, type):
        raise TypeError(f"adapt_legacy_impl decorates an AttentionImpl class; found {cls!r}")
    legacy_forward = getattr(cls, "forward", None)
    if not callable(legacy_forward):
        raise TypeError(
            f"adapt_legacy_impl needs a class with a forward(layer, query, key, value, kv_cache, attn_metadata) "
            f"method; {cls.__qualname__} has none"
        )
    if hasattr(legacy_forward, _LEGACY_FORWARD):
        return cls
    passes_output = "output" in inspect.signature(legacy_forward).parameters
    message = removed_api_message(
        f"`{cls.__qualname__}.forward` returning its result instead of writing into `output` "
        "(accept_output_buffer = False)",
        "an AttentionImpl must write into the preallocated `output`; until it does, its result is copied "
        "into `output` on every call",
        "VAC004",
    )

    @functools.wraps(legacy_forward)
    def forward(
        self: Any,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        kv_cache: torch.Tensor,
        attn_metadata: Any,
        output: torch.Tensor | None = None,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output is None:  # called the pre-0.20 way: nothing to adapt
            return legacy_forward(self, layer, query, key, value, kv_cache, attn_metadata)
        if output_scale is not None or output_block_scale is not None:
            raise ValueError(
                f"{cls.__qualname__} is a legacy return-value attention impl: it cannot quantize into `output`, "
                f"so output_scale and output_block_scale must be None; found output_scale="
                f"{_describe(output_scale)}, output_block_scale={_describe(output_block_scale)}. Disable fused "
                "output quantization or make the impl write into `output` (rule VAC004)."
            )
        warn_once_about(cls, message)
        extra = {"output": _rows(output)} if passes_output else {}
        result = legacy_forward(
            self, layer, _rows(query), _rows(key), _rows(value), kv_cache, attn_metadata, **extra
        )
        _store(result, output, cls, wrote_output=passes_output)
        return output

    setattr(forward, _LEGACY_FORWARD, legacy_forward)
    cls.forward = forward
    return cls


def is_adapted(cls: type) -> bool:
    return hasattr(getattr(cls, "forward", None), _LEGACY_FORWARD)


def _rows(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """``[T, heads, size]`` -> ``[T, heads * size]``, a view whenever the memory allows (the old 2-D layout)."""
    if tensor is None or tensor.dim() <= 2:
        return tensor
    # Spelled out rather than -1: reshape cannot infer a size from zero elements (an empty batch).
    return tensor.reshape(tensor.shape[0], tensor.shape[1:].numel())


def _store(result: object, output: torch.Tensor, cls: type, *, wrote_output: bool) -> None:
    """Copy ``result`` into ``output`` unless it already is ``output`` (same memory, same element order)."""
    if result is None and wrote_output:
        return  # the impl took the buffer and wrote into it, the >= 0.20 way
    if not isinstance(result, torch.Tensor):
        raise TypeError(
            f"{cls.__qualname__}.forward is adapted as a legacy return-value impl and must return the attention "
            f"result tensor [num_tokens, num_heads * head_size_v]; it returned {type(result).__name__}"
        )
    if result.numel() != output.numel():
        raise ValueError(
            f"{cls.__qualname__}.forward returned a tensor of shape {tuple(result.shape)}; expected "
            f"{output.numel()} elements to fill `output` of shape {tuple(output.shape)} "
            "[num_tokens, num_heads, head_size_v]"
        )
    if result.data_ptr() == output.data_ptr():
        if result.is_contiguous() and output.is_contiguous():
            return  # the impl wrote into output itself: no copy (SGLang's data_ptr check)
        result = result.clone()  # same memory, other element order: copying in place would overlap
    output.copy_(result.reshape(output.shape))


def _describe(tensor: torch.Tensor | None) -> str:
    return "None" if tensor is None else f"Tensor{tuple(tensor.shape)}"
