"""The output guard: names the backend, the layer and the rows of ``output`` that a step left unwritten.

vLLM >= 0.20 hands every backend an uninitialised ``output`` (``torch.empty``) and ignores what it returns, so a
backend that skips a row, a path or the buffer altogether yields garbage and no error. When the guard is on, each
attention layer built afterwards gets its impl's ``forward`` (MLA: the layer's ``forward_impl``) wrapped, on that
instance only: before the call the rows the step must write (``[:num_actual_tokens]`` from the metadata, all rows
where the metadata does not say) are filled with a NaN of a recognisable bit pattern; afterwards, rows still
holding it were not written. The wrapper is what the op body calls, so it runs wherever the op body runs,
torch.compile included; it cannot run inside a CUDA-graph replay (nothing Python runs there), and is skipped while
a graph is being captured.

Off (the default), nothing is installed. On, :func:`install_on` hooks a layer class's ``__init__``; the mode
(``error``: raise :class:`OutputNotWrittenError`; ``warn``: one :class:`OutputNotWrittenWarning` per layer) is
read on every call, so :func:`set_mode` switches it, and ``None`` makes the wrappers already installed call
straight through.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from vllm_attn_compat.compat.flags import after_init

ENV_CHECK_OUTPUT = "VLLM_ATTN_COMPAT_CHECK_OUTPUT"
MODES = ("error", "warn")


class OutputNotWrittenError(RuntimeError):
    """A backend left rows of the ``output`` it was given unwritten (the guard in ``error`` mode)."""


class OutputNotWrittenWarning(RuntimeWarning):
    """A backend left rows of the ``output`` it was given unwritten (the guard in ``warn`` mode, once per layer)."""


class OutputNotCheckedWarning(RuntimeWarning):
    """The guard met an ``output`` whose dtype has no NaN to fill it with (once per dtype): it checks nothing there."""


def parse_mode(value: str | None, source: str = ENV_CHECK_OUTPUT) -> str | None:
    """``error``, ``warn`` or None (off) from a setting: ``1`` means ``error``, unset, empty, ``0`` and ``off`` off."""
    text = (value or "").strip().lower()
    if text in ("", "0", "off"):
        return None
    if text == "1":
        return "error"
    if text in MODES:
        return text
    raise ValueError(f"{source}: expected error, warn, 1 (= error), or 0 / unset (off); found {value!r}")


_mode: str | None = None


def set_mode(mode: str | None) -> None:
    global _mode
    if mode is not None and mode not in MODES:
        raise ValueError(f"output guard mode: expected one of {', '.join(MODES)} or None (off); found {mode!r}")
    _mode = mode


def current_mode() -> str | None:
    return _mode


# The NaN each dtype is filled with: (the integer dtype of the same size, its bits). Where the format allows it, the
# NaN whose bits are the largest integer of that width (quiet, every payload bit set): arithmetic produces the
# canonical NaN instead, so a NaN a backend computes is not taken for an unwritten element, and one reduction
# (``amax``) tells whether any element still holds it. The fnuz fp8 formats have one NaN, 0x80: the smallest int8.
_BITS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float64: (torch.int64, 0x7FFFFFFFFFFFFFFF),
    torch.float32: (torch.int32, 0x7FFFFFFF),
    torch.float16: (torch.int16, 0x7FFF),
    torch.bfloat16: (torch.int16, 0x7FFF),
}
for _name, _int_dtype, _bits in (
    ("float8_e4m3fn", torch.uint8, 0xFF),
    ("float8_e5m2", torch.uint8, 0xFF),
    ("float8_e8m0fnu", torch.uint8, 0xFF),
    ("float8_e4m3fnuz", torch.int8, -0x80),
    ("float8_e5m2fnuz", torch.int8, -0x80),
):
    if hasattr(torch, _name):  # each only where this torch has the format
        _BITS[getattr(torch, _name)] = (_int_dtype, _bits)
_COMPLEX = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def sentinel_view(rows: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """``rows`` as integers and the bits of its NaN, or None for a dtype with no NaN (integers, bool, packed fp4)."""
    if rows.dtype in _COMPLEX:
        rows = torch.view_as_real(rows)
    found = _BITS.get(rows.dtype)
    if found is None:
        return None
    int_dtype, bits = found
    return rows.view(int_dtype), bits


def still_filled(bits: torch.Tensor, pattern: int) -> bool:
    """Whether any element still holds ``pattern``: the extreme integer of its width, so one reduction tells."""
    if not bits.numel():
        return False
    extreme = bits.amin() if pattern < 0 else bits.amax()
    return int(extreme) == pattern


_said: set[object] = set()  # layers warned about, dtypes said to be unchecked
_said_lock = threading.Lock()


def _first_time(key: object) -> bool:
    with _said_lock:
        if key in _said:
            return False
        _said.add(key)
        return True


def reset_warnings() -> None:
    """Forget which layers and dtypes were warned about (for tests, and for a new run in one process)."""
    with _said_lock:
        _said.clear()


def _num_rows(output: torch.Tensor, attn_metadata: object) -> int:
    """The rows this step must write: ``num_actual_tokens`` when the metadata says it, else all of them."""
    rows = output.shape[0] if output.dim() else 0
    actual = getattr(attn_metadata, "num_actual_tokens", None)
    if isinstance(actual, int) and not isinstance(actual, bool) and 0 <= actual < rows:
        return actual
    return rows


def _describe(impl: object, layer: object) -> tuple[str, str]:
    impl_cls = type(impl)
    return f"`{impl_cls.__qualname__}` (module `{impl_cls.__module__}`)", str(getattr(layer, "layer_name", "?"))


def message(impl: object, layer: object, unwritten: int, rows: int, first: int) -> str:
    """The one wording of the guard's report."""
    impl_name, layer_name = _describe(impl, layer)
    return (
        f"vllm-attn-compat output guard: attention impl {impl_name}, layer {layer_name!r}, left {unwritten} of the "
        f"{rows} rows of `output` this step must write unwritten (first: row {first}). vLLM >= 0.20 hands the "
        "backend an uninitialised `output` and ignores what it returns: write the result of every token "
        "[:num_actual_tokens] into `output`, on every path (prefill, decode, each cache layout and fallback). "
        f"The guard is on because {ENV_CHECK_OUTPUT} (or check_output()) turned it on; it costs a fill and a scan "
        "of `output` per call."
    )


def check(call: Callable[[], Any], output: object, attn_metadata: object, impl: object, layer: object) -> Any:
    """Run ``call`` (the backend's work) with the guard around it; see the module's docstring."""
    mode = _mode
    # No metadata: vLLM's warm-up and profiling runs, where backends may leave `output` alone on purpose.
    if mode is None or not isinstance(output, torch.Tensor) or attn_metadata is None:
        return call()
    if output.is_cuda and torch.cuda.is_current_stream_capturing():
        return call()  # a fill and a scan cannot be captured; replay runs no Python anyway
    rows = _num_rows(output, attn_metadata)
    view = sentinel_view(output[:rows])
    if view is None:
        if _first_time(output.dtype):
            warnings.warn(
                f"vllm-attn-compat output guard: `output` of dtype {output.dtype} has no NaN to fill it with, so "
                f"the guard cannot check it (first met in layer {_describe(impl, layer)[1]!r}, impl "
                f"{_describe(impl, layer)[0]}); layers with such an output are not checked",
                OutputNotCheckedWarning,
                stacklevel=2,
            )
        return call()
    bits, pattern = view
    bits.fill_(pattern)
    result = call()
    if rows and still_filled(bits, pattern):
        left = bits.reshape(rows, -1).eq(pattern).any(1).nonzero()
        report(mode, impl, layer, left.numel(), rows, int(left[0]))
    return result


def report(mode: str, impl: object, layer: object, unwritten: int, rows: int, first: int) -> None:
    text = message(impl, layer, unwritten, rows, first)
    if mode == "error":
        raise OutputNotWrittenError(text)
    if _first_time(("layer", id(layer), getattr(layer, "layer_name", None))):
        warnings.warn(text, OutputNotWrittenWarning, stacklevel=3)


# Set on the layer __init__ hook.
GUARDS = "__vllm_attn_compat_guards_output__"


class Guarded:
    """``owner.<name>`` with the guard around it, set on the instance. A plain object, not a closure, so that a
    deep copy or a pickle of the layer (vLLM may copy modules) guards the copy's own impl and layer.

    ``impl.forward`` takes ``output`` 7th and the metadata 6th; an MLA layer's ``forward_impl``, 6th and 5th. The
    class's method is looked up at each call, so a class wrapped later (the plugin's result copy, the legacy
    adapter) runs inside the guard, and a result it copies counts as written.
    """

    def __init__(self, owner: Any, name: str, output_index: int, metadata_index: int, impl: Any, layer: Any):
        self.owner, self.name, self.impl, self.layer = owner, name, impl, layer
        self.output_index, self.metadata_index = output_index, metadata_index
        self.own = vars(owner).get(name)  # an instance attribute the owner had already (rare), else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        def call() -> Any:
            if self.own is not None:
                return self.own(*args, **kwargs)
            return getattr(type(self.owner), self.name)(self.owner, *args, **kwargs)

        output = kwargs["output"] if "output" in kwargs else _positional(args, self.output_index)
        metadata = kwargs["attn_metadata"] if "attn_metadata" in kwargs else _positional(args, self.metadata_index)
        return check(call, output, metadata, self.impl, self.layer)


def _positional(args: tuple[Any, ...], index: int) -> Any:
    return args[index] if len(args) > index else None


def guard_method(owner: object, name: str, output_index: int, metadata_index: int, impl: Any, layer: Any) -> bool:
    """Set a :class:`Guarded` ``owner.<name>`` on the instance; True if set now (False: guarded already)."""
    if not hasattr(owner, "__dict__") or isinstance(vars(owner).get(name), Guarded):
        return False
    setattr(owner, name, Guarded(owner, name, output_index, metadata_index, impl, layer))
    return True


def guard_layer(layer: Any, *, mla: bool) -> None:
    """Guard one layer as it is built: an MLA layer at its ``forward_impl`` (which the MLA op body calls), any
    other at its impl's ``forward``."""
    impl = getattr(layer, "impl", None)
    if impl is None:
        return
    if mla:
        guard_method(layer, "forward_impl", 5, 4, impl, layer)
    else:
        guard_method(impl, "forward", 6, 5, impl, layer)


def install_on(layer_cls: type[Any], *, mla: bool) -> bool:
    """Hook ``layer_cls.__init__`` so that every layer built afterwards is guarded; True if hooked now."""
    if mla:
        return after_init(layer_cls, GUARDS, _guard_mla_layer)
    return after_init(layer_cls, GUARDS, _guard_attention_layer)


def _guard_mla_layer(layer: Any) -> None:
    guard_layer(layer, mla=True)


def _guard_attention_layer(layer: Any) -> None:
    guard_layer(layer, mla=False)


def remove_from(layer_cls: type[Any]) -> bool:
    """Undo :func:`install_on` where its hook is the outermost ``__init__``; True if removed."""
    init = layer_cls.__dict__.get("__init__")
    if init is None or not getattr(init, GUARDS, False) or not hasattr(init, "__wrapped__"):
        return False
    # after_init keeps each inner hook's marker visible on the outer one: only ours may be unwrapped here.
    inner = init.__wrapped__
    if getattr(inner, GUARDS, False):
        return False
    layer_cls.__init__ = inner
    return True
