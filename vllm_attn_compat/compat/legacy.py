"""The legacy adapter: runs a pre-0.20 return-value ``AttentionImpl`` under the mandatory-output contract.

vLLM >= 0.20 hands every impl a preallocated ``output`` ``[T, num_heads, head_size_v]`` and ignores the return
value, so an impl written for ``accept_output_buffer = False`` (which returned a new ``[T, num_heads * head_size_v]``
tensor) now silently yields an uninitialised buffer. The adapter restores the old calling convention around the
impl's ``forward`` and copies the result into ``output``, only when the impl did not write there itself.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from vllm_attn_compat import deprecated_uses
from vllm_attn_compat.compat import deprecation
from vllm_attn_compat.compat.adopt import ADOPTS, LEGACY_FORWARD, copy_into, fills, shares_memory, warn_result_ignored

ImplClass = TypeVar("ImplClass", bound=type)


def adapt_legacy_impl(cls: ImplClass) -> ImplClass:
    """Class decorator for an ``AttentionImpl`` whose ``forward`` returns its result instead of writing ``output``.

    The adapted ``forward`` passes query/key/value in the 2-D ``[T, heads * head_size]`` layout the old
    no-output path delivered (and a 2-D view of ``output`` when the legacy forward has an ``output`` parameter),
    then copies the returned tensor into ``output`` unless it lies in ``output``'s memory. Fused output
    quantization (``output_scale`` / ``output_block_scale``) is rejected. Applying it twice changes nothing.
    """
    if not isinstance(cls, type):
        raise TypeError(f"adapt_legacy_impl decorates an AttentionImpl class; found {cls!r}")
    legacy_forward: Callable[..., torch.Tensor] | None = getattr(cls, "forward", None)
    if not callable(legacy_forward):
        raise TypeError(
            f"adapt_legacy_impl needs a class with a forward(layer, query, key, value, kv_cache, attn_metadata) "
            f"method; {cls.__qualname__} has none"
        )
    if hasattr(legacy_forward, LEGACY_FORWARD):
        return cls
    legacy_forward = getattr(legacy_forward, ADOPTS, legacy_forward)  # the plugin's wrapper copies too: drop it
    message = deprecation.removed_api_message(
        f"`{cls.__qualname__}.forward` returning its result instead of writing into `output` "
        "(accept_output_buffer = False)",
        "an AttentionImpl must write into the preallocated `output`; until it does, its result is copied "
        "into `output` on every call",
        "VAC004",
    )
    warned = (message, cls)  # warn_once_about's key: checked inline, a call per call is a measurable cost
    passes_output = "output" in inspect.signature(legacy_forward).parameters

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
        # Warned once; while the pytest plugin counts, it counts each call.
        if warned not in deprecation._reported or deprecated_uses.tally is not None:
            deprecation.warn_once_about(cls, message)
        # flatten(1): [T, heads, size] -> [T, heads * size], a view whenever the memory allows; 2-D stays as is.
        query = query.flatten(1)
        if key is not None:
            key = key.flatten(1)
        if value is not None:
            value = value.flatten(1)
        if passes_output:
            rows = output.flatten(1)
            result = legacy_forward(self, layer, query, key, value, kv_cache, attn_metadata, output=rows)
            if result is rows or result is None or not isinstance(result, torch.Tensor):
                return output  # the impl took the buffer and wrote into it, the >= 0.20 way
        else:
            result = legacy_forward(self, layer, query, key, value, kv_cache, attn_metadata)
        _store(result, output, cls, given_output=passes_output)
        return output

    setattr(forward, LEGACY_FORWARD, legacy_forward)
    cls.forward = forward  # type: ignore[attr-defined]  # ImplClass is bound to `type`; forward was checked above
    return cls


def is_adapted(cls: type) -> bool:
    return hasattr(getattr(cls, "forward", None), LEGACY_FORWARD)


def _store(result: object, output: torch.Tensor, cls: type, *, given_output: bool) -> None:
    """Copy ``result`` into ``output`` unless it lies in ``output``'s memory already.

    An impl that was given ``output`` may have written it: a tensor it returns that cannot fill ``output`` is then
    ignored, as vLLM ignores it (warned once per class). One that was not given ``output`` can only have returned
    its result, so a result that cannot be ``output``'s content is an error naming the shapes.
    """
    method = f"{cls.__qualname__}.forward"
    if not isinstance(result, torch.Tensor):
        raise TypeError(
            f"{method} is adapted as a legacy return-value impl and must return the attention "
            f"result tensor [num_tokens, num_heads * head_size_v]; it returned {type(result).__name__}"
        )
    if shares_memory(result, output):
        return
    if fills(result, output):
        copy_into(result, output)
    elif given_output:
        warn_result_ignored(cls, method, result, output, None)
    else:
        row_size = output[0].numel() if output.dim() and output.shape[0] else 0
        raise ValueError(
            f"{method} returned a tensor of shape {tuple(result.shape)} that cannot fill `output` of shape "
            f"{tuple(output.shape)}: expected {output.numel()} elements, or whole rows of {row_size} elements each "
            "(rule VAC004)"
        )


def _describe(tensor: torch.Tensor | None) -> str:
    return "None" if tensor is None else f"Tensor{tuple(tensor.shape)}"
