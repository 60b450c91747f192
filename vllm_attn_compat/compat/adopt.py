"""SGLang's rule for methods that may return their result instead of writing into ``output``.

vLLM >= 0.20 hands an impl's ``forward`` (an MLA impl's ``forward_mha``, an MLA layer's ``forward_impl``) a
preallocated ``output`` and ignores what it returns. A backend written for vLLM <= 0.19 that never declared
``accept_output_buffer`` returned its result, so on 0.20 the layer silently yields an uninitialised buffer.
:func:`adopt_returned_result` wraps such a method once per class: after the call, a returned tensor whose memory
is not ``output``'s is copied into ``output`` (with one warning per class); anything else passes through untouched.
A backend that writes into ``output`` pays one identity test per call and gets no copy and no warning.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from vllm_attn_compat.compat import deprecation

# Set on a wrapping method; the value is the method it wraps.
ADOPTS = "__vllm_attn_compat_adopts_result__"
# Set by adapt_legacy_impl on the forward it installs: that forward copies already.
LEGACY_FORWARD = "__vllm_attn_compat_legacy_forward__"


def adopt_returned_result(cls: type, name: str, output_index: int) -> bool:
    """Wrap ``cls.<name>`` so that a returned tensor outside ``output``'s memory is copied into ``output``.

    ``output_index`` is the position of ``output`` among the method's arguments after ``self`` (vLLM passes it
    by keyword; the position serves other callers). Idempotent: a method already wrapped, in ``cls`` or in a
    base, or adapted by ``adapt_legacy_impl``, is left alone. Returns True when it wrapped now.
    """
    method = inspect.getattr_static(cls, name, None)
    if not inspect.isfunction(method) or hasattr(method, ADOPTS) or hasattr(method, LEGACY_FORWARD):
        return False
    message = deprecation.removed_api_message(
        f"`{method.__qualname__}` returning its result instead of writing into `output`",
        "write the result into the `output` tensor it is given and return `output` (or None); until then "
        "vllm-attn-compat copies the returned tensor into `output` on every call",
        "VAC004",
        by_hand=True,
    )

    if _has_impl_forward_signature(method):
        # vLLM's own call shape, spelled out: about 0.3 us a call against 2 us for *args/**kwargs, which build and
        # unpack a tuple and a dict on every call (the forward of every attention layer, every step).
        @functools.wraps(method)
        def adopting(
            self: Any,
            layer: Any,
            query: Any,
            key: Any,
            value: Any,
            kv_cache: Any,
            attn_metadata: Any,
            output: Any = None,
            output_scale: Any = None,
            output_block_scale: Any = None,
        ) -> Any:
            result = method(
                self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
            )
            if result is output or result is None:
                return result
            scales = {"output_scale": output_scale, "output_block_scale": output_block_scale}
            return adopt(result, output, cls, method.__qualname__, message, scales)

    else:

        @functools.wraps(method)
        def adopting(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = method(self, *args, **kwargs)
            if result is None:
                return result
            output = kwargs.get("output")
            if output is None and len(args) > output_index:
                output = args[output_index]
            if result is output:
                return result
            return adopt(result, output, cls, method.__qualname__, message, kwargs)

    setattr(adopting, ADOPTS, method)
    setattr(cls, name, adopting)
    return True


_IMPL_FORWARD_PARAMETERS = [
    "self",
    "layer",
    "query",
    "key",
    "value",
    "kv_cache",
    "attn_metadata",
    "output",
    "output_scale",
    "output_block_scale",
]


def _has_impl_forward_signature(method: Any) -> bool:
    """Whether ``method`` has exactly ``AttentionImpl.forward``'s parameters, all positional-or-keyword."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return [p.name for p in parameters] == _IMPL_FORWARD_PARAMETERS and all(
        p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters
    )


def adopt(result: Any, output: Any, cls: type, method: str, message: str, kwargs: dict[str, Any]) -> Any:
    """The slow path, taken when the method returned something other than None or ``output`` itself."""
    if not isinstance(result, torch.Tensor) or not isinstance(output, torch.Tensor):
        return result  # called without a buffer (the pre-0.20 way), or a return value vLLM never read
    if shares_memory(result, output):
        return result  # a view of output: the method wrote there
    if kwargs.get("output_scale") is not None or kwargs.get("output_block_scale") is not None:
        raise ValueError(
            f"{method} returned a new tensor of shape {tuple(result.shape)} instead of writing the "
            f"quantized result into `output`; vllm-attn-compat cannot quantize it for you (output_scale / "
            "output_block_scale were given). Disable fused output quantization or write into `output` (rule VAC004)."
        )
    deprecation.warn_once_about(cls, message)
    copy_into(result, output, method)
    return output


def shares_memory(result: torch.Tensor, output: torch.Tensor) -> bool:
    """Whether ``result`` lies in ``output``'s storage (``output`` itself, or any view of it)."""
    return (
        result.data_ptr() == output.data_ptr()
        or result.untyped_storage().data_ptr() == output.untyped_storage().data_ptr()
    )


def copy_into(result: torch.Tensor, output: torch.Tensor, method: str) -> None:
    """Copy ``result`` into ``output``: the same elements in any shape (2-D ``[T, heads * size]`` into 3-D), or
    the first rows only (a result without the CUDA-graph padding rows)."""
    if result.numel() == output.numel():
        output.copy_(result.reshape(output.shape))
        return
    rows = result.shape[0] if result.dim() else 0
    row_size = output[0].numel() if output.dim() and output.shape[0] else 0
    if result.dim() and rows < output.shape[0] and row_size and result.numel() == rows * row_size:
        output[:rows].copy_(result.reshape((rows, *output.shape[1:])))
        return
    raise ValueError(
        f"{method} returned a tensor of shape {tuple(result.shape)} that cannot fill `output` of shape "
        f"{tuple(output.shape)}: expected {output.numel()} elements, or whole rows of {row_size} elements each "
        "(rule VAC004)"
    )


def outside(obj: object, package: str) -> bool:
    """Whether ``obj`` (a class or a function) is defined in a module outside ``package``."""
    module = getattr(obj, "__module__", None) or ""
    return not (module == package or module.startswith(package + "."))
