"""The removed flags ``AttentionBackend.accept_output_buffer`` and ``Attention.use_output``, read as True.

Since vLLM 0.20 every backend writes into the layer's output buffer, so both flags are always true in effect.
Installed on a base class, :class:`AlwaysTrueFlag` answers reads of the old flag on any subclass or instance
with True and a warning. A backend class that still assigns the flag itself shadows the descriptor;
:func:`check_backend_flag` reports it and adapts the impls of backends that declare ``False``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

from vllm_attn_compat.compat.deprecation import removed_api_message, warn_once, warn_once_about
from vllm_attn_compat.compat.legacy import adapt_legacy_impl

ACCEPT_OUTPUT_BUFFER = "accept_output_buffer"
USE_OUTPUT = "use_output"


class AlwaysTrueFlag:
    """A class attribute that reads as True and warns once per call site.

    A non-data descriptor: a subclass or an instance that assigns the name shadows it, as pre-0.20 code did.
    """

    def __init__(self, old: str, rule: str) -> None:
        self.old = old
        self.message = removed_api_message(
            f"`{old}`",
            "every attention backend now writes into the output buffer the layer allocates, so it is always "
            "True here; delete the read",
            rule,
        )

    def __get__(self, instance: object, owner: type | None = None) -> bool:
        warn_once(self.message)
        return True


def install_flag(cls: type, name: str, flag: AlwaysTrueFlag) -> bool:
    """Put ``flag`` on ``cls`` as ``name`` unless the class already has its own value; True if installed now."""
    current = cls.__dict__.get(name)
    if isinstance(current, AlwaysTrueFlag):
        return False
    if current is not None:
        raise RuntimeError(
            f"{cls.__module__}.{cls.__qualname__} still defines `{name}` = {current!r}: this is a vLLM older "
            "than 0.20, which vllm-attn-compat must not patch"
        )
    setattr(cls, name, flag)
    return True


def declared_accept_output_buffer(backend_cls: type) -> bool | None:
    """The value a backend class (or a base below the patched one) assigns to the flag; None if none does."""
    for klass in backend_cls.__mro__:
        value = klass.__dict__.get(ACCEPT_OUTPUT_BUFFER)
        if isinstance(value, AlwaysTrueFlag):
            return None
        if value is not None:
            return bool(value)
    return None


class _BackendClass(Protocol):
    """A backend class as :func:`check_backend_flag` uses it: ours or vLLM's."""

    @staticmethod
    def get_impl_cls() -> type: ...


def check_backend_flag(backend_cls: type[_BackendClass]) -> None:
    """Report a backend that still declares ``accept_output_buffer``, once per class; adapt a ``False`` one's impl.

    ``True`` is redundant and keeps working (reported for out-of-tree classes only). ``False`` marks a pre-0.20
    return-value backend: its impl class (from ``get_impl_cls()``) gets :func:`adapt_legacy_impl`, which warns on
    first use.
    """
    declared = declared_accept_output_buffer(backend_cls)
    if declared is None:
        return
    if declared:
        if backend_cls.__module__.split(".")[0] == "vllm":
            return  # vLLM's own backends still carry stale `= True` lines; they are not the user's to delete
        warn_once_about(
            backend_cls,
            removed_api_message(
                f"`{backend_cls.__qualname__}.accept_output_buffer = True`",
                "it is redundant (every backend writes into `output` now); delete the line",
                "VAC004",
            ),
        )
        return
    adapt_legacy_impl(backend_cls.get_impl_cls())


# Set on a hooked layer __init__.
_CHECKS_BACKEND = "__vllm_attn_compat_checks_backend__"


def install_removed_flags(backend_base: type, attention_layer: type) -> list[str]:
    """Install the old flags on a backend base class and an attention layer class; idempotent.

    Returns what was installed now, for the log line. See :func:`install_backend_flag` and
    :func:`install_layer_flag`.
    """
    return install_backend_flag(backend_base) + install_layer_flag(attention_layer)


def install_backend_flag(backend_base: type) -> list[str]:
    """``accept_output_buffer`` on the backend base class, read as True; idempotent."""
    name = f"{backend_base.__name__}.{ACCEPT_OUTPUT_BUFFER}"
    return [name] if install_flag(backend_base, ACCEPT_OUTPUT_BUFFER, AlwaysTrueFlag(name, "VAC005")) else []


def install_layer_flag(attention_layer: type) -> list[str]:
    """``use_output`` on the layer class, and a hook on its ``__init__`` that passes each layer's backend to
    :func:`check_backend_flag` (backend classes may be defined before this runs); idempotent."""
    installed = []
    if install_flag(attention_layer, USE_OUTPUT, AlwaysTrueFlag(f"{attention_layer.__name__}.{USE_OUTPUT}", "VAC005")):
        installed.append(f"{attention_layer.__name__}.{USE_OUTPUT}")
    if after_init(attention_layer, _CHECKS_BACKEND, lambda layer: check_backend_flag(layer.attn_backend)):
        installed.append(f"legacy adapter for {attention_layer.__name__} backends with accept_output_buffer = False")
    return installed


def after_init(layer_cls: type[Any], marker: str, check: Callable[[Any], None]) -> bool:
    """Make ``layer_cls.__init__`` call ``check(layer)`` once the layer is built; once per ``marker``.

    True if hooked now. Hooks stack; each one's marker stays visible on the outermost ``__init__``.
    """
    original_init = layer_cls.__init__
    if getattr(original_init, marker, False):
        return False

    @functools.wraps(original_init)
    def __init__(self: object, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        check(self)

    setattr(__init__, marker, True)
    layer_cls.__init__ = __init__
    return True


def remove_removed_flags(backend_base: type, attention_layer: type[Any]) -> None:
    """Undo :func:`install_removed_flags` (impl classes already adapted stay adapted)."""
    for cls, name in ((backend_base, ACCEPT_OUTPUT_BUFFER), (attention_layer, USE_OUTPUT)):
        if isinstance(cls.__dict__.get(name), AlwaysTrueFlag):
            delattr(cls, name)
    if getattr(attention_layer.__dict__.get("__init__"), _CHECKS_BACKEND, False):
        attention_layer.__init__ = attention_layer.__init__.__wrapped__
