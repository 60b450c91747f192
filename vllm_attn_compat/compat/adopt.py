"""SGLang's rule for methods that may return their result instead of writing into ``output``.

vLLM >= 0.20 hands an impl's ``forward`` (an MLA impl's ``forward_mha``, an MLA layer's ``forward_impl``) a
preallocated ``output`` and ignores what it returns. A backend written for vLLM <= 0.19 that never declared
``accept_output_buffer`` returned its result, so on 0.20 the layer silently yields an uninitialised buffer.
:func:`adopt_returned_result` wraps such a method once per class: after the call, a returned tensor whose memory
is not ``output``'s is copied into ``output`` (with one warning per class); anything else passes through untouched.
The method was given ``output`` and may have written it, so a returned tensor that cannot be ``output``'s content
is ignored, as vLLM ignores it, with one :class:`ReturnValueIgnoredWarning` per class: the plugin never raises
where vLLM would not.
A backend that writes into ``output`` pays one identity test per call and gets no copy and no warning.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any

import torch

from vllm_attn_compat import deprecated_uses
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
    """The slow path, taken when the method returned something other than None or ``output`` itself.

    Never raises: the method was given ``output`` and may have written it, and vLLM >= 0.20 ignores what it returns.
    A returned tensor that cannot be ``output``'s content is ignored the same way, with one warning per class.
    """
    if not isinstance(result, torch.Tensor) or not isinstance(output, torch.Tensor):
        return result  # called without a buffer (the pre-0.20 way), or a return value vLLM never read
    if shares_memory(result, output):
        return result  # a view of output: the method wrote there
    if kwargs.get("output_scale") is not None or kwargs.get("output_block_scale") is not None:
        warn_result_ignored(
            cls,
            method,
            result,
            output,
            "output_scale / output_block_scale ask for a quantized "
            "`output`, which vllm-attn-compat cannot make from a returned tensor",
        )
        return result
    if not fills(result, output):
        warn_result_ignored(cls, method, result, output, None)
        return result
    deprecation.warn_once_about(cls, message)
    copy_into(result, output)
    return output


def shares_memory(result: torch.Tensor, output: torch.Tensor) -> bool:
    """Whether ``result`` lies in ``output``'s storage (``output`` itself, or any view of it)."""
    return (
        result.data_ptr() == output.data_ptr()
        or result.untyped_storage().data_ptr() == output.untyped_storage().data_ptr()
    )


def fills(result: torch.Tensor, output: torch.Tensor) -> bool:
    """Whether ``result`` can be ``output``'s content: the same elements in any shape (2-D ``[T, heads * size]``
    into 3-D), or whole rows for the first rows only (a result without the CUDA-graph padding rows)."""
    if result.numel() == output.numel():
        return True
    row_size = output[0].numel() if output.dim() and output.shape[0] else 0
    return bool(result.dim() and result.shape[0] < output.shape[0] and row_size) and (
        result.numel() == result.shape[0] * row_size
    )


def copy_into(result: torch.Tensor, output: torch.Tensor) -> None:
    """Copy ``result`` into ``output``, which it :func:`fills`."""
    if result.numel() == output.numel():
        output.copy_(result.reshape(output.shape))
    else:
        output[: result.shape[0]].copy_(result.reshape((result.shape[0], *output.shape[1:])))


class ReturnValueIgnoredWarning(RuntimeWarning):
    """A backend method given ``output`` returned a tensor that cannot be ``output``'s content; vllm-attn-compat
    ignored it, as vLLM >= 0.20 ignores every return value there (``output`` keeps what the method wrote)."""


_ignored_warned: set[type] = set()


def warn_result_ignored(cls: type, method: str, result: torch.Tensor, output: torch.Tensor, why: str | None) -> None:
    """Once per class, at its definition: the returned tensor was ignored, and what to do."""
    if cls in _ignored_warned or torch.compiler.is_compiling():
        return
    _ignored_warned.add(cls)
    row_size = output[0].numel() if output.dim() and output.shape[0] else 0
    reason = why or (
        f"it cannot fill `output` of shape {tuple(output.shape)} ({output.numel()} elements, or whole rows of "
        f"{row_size} elements each)"
    )
    message = (
        f"`{method}` was given `output` and returned a tensor of shape {tuple(result.shape)}, and {reason}. vLLM "
        ">= 0.20 ignores what this method returns, so vllm-attn-compat ignores it too: `output` keeps what the "
        "method wrote into it. If the returned tensor is the attention result, write it into `output` instead; if "
        "it is something else (an LSE, a statistic), return `output` or None to silence this warning. To check "
        "that every row of `output` is written, run once with VLLM_ATTN_COMPAT_CHECK_OUTPUT=error."
    )
    filename, lineno = deprecated_uses.definition_site(cls)
    warnings.warn_explicit(message, ReturnValueIgnoredWarning, filename, lineno, module=cls.__module__)


def outside(obj: object, package: str) -> bool:
    """Whether ``obj`` (a class or a function) is defined in a module outside ``package``."""
    module = getattr(obj, "__module__", None) or ""
    return not (module == package or module.startswith(package + "."))
