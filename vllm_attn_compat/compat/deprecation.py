"""The package's deprecation warning: its category, its messages, and warn-once per call site.

Every deprecated path of vllm-attn-compat reports through :func:`warn_once`, so one environment variable
(``VLLM_ATTN_COMPAT_WARNINGS``) and one category (:class:`VllmAttnCompatDeprecationWarning`) control them all.
"""

from __future__ import annotations

import os
import sys
import threading
import types
import warnings

import torch

from vllm_attn_compat import deprecated_uses

ENV_WARNINGS = "VLLM_ATTN_COMPAT_WARNINGS"
_MODES = ("default", "error", "ignore")


class VllmAttnCompatDeprecationWarning(DeprecationWarning):
    """An API removed in vLLM 0.20 was used through vllm-attn-compat's forwarders.

    Filter it like any warning category (``-W error::vllm_attn_compat.compat.VllmAttnCompatDeprecationWarning``,
    pytest's ``filterwarnings``), or set ``VLLM_ATTN_COMPAT_WARNINGS=error`` (raise) / ``ignore`` (silence).
    """


# Python hides DeprecationWarnings raised outside __main__, which is where a plugin's deprecated calls live; show
# ours (once per call site) unless the user configured warnings (-W, PYTHONWARNINGS), whose filters then decide.
if not sys.warnoptions:
    warnings.filterwarnings("default", category=VllmAttnCompatDeprecationWarning)


def removed_api_message(
    old: str, replacement: str, rule: str, *, by_hand: bool = False, removed_in: str = "0.20"
) -> str:
    """The wording of every deprecation message: what was removed (in which vLLM release), what replaces it, the
    rule that migrates it.

    ``by_hand``: ``migrate`` cannot find this use (nothing in the source marks it), so the message says to change it
    by hand instead of pointing to ``migrate``.
    """
    fix = deprecated_uses.BY_HAND if by_hand else "run `vllm-attn-compat migrate` to rewrite it"
    return (
        f"{old} was removed in vLLM {removed_in}; {replacement}. vllm-attn-compat keeps it working for now: {fix} "
        f"(rule {rule})."
    )


def warning_mode() -> str:
    """The value of ``VLLM_ATTN_COMPAT_WARNINGS``: ``default`` (warn once per call site), ``error`` or ``ignore``."""
    mode = os.environ.get(ENV_WARNINGS, "default").strip().lower() or "default"
    if mode not in _MODES:
        raise ValueError(f"{ENV_WARNINGS} must be one of {', '.join(_MODES)}; found {mode!r}")
    return mode


# Call sites (or classes) already warned about. A call site's key holds id() of its code object, which hashes
# in a fraction of the time the code object itself takes; the value keeps that code object alive so that its id
# cannot be reused. Reads are lock-free (keys are only ever added); the lock makes add-if-absent atomic, so
# racing threads warn exactly once.
_reported: dict[tuple[object, ...], object] = {}
_reported_lock = threading.Lock()


def _claim(key: tuple[object, ...], pinned: object, message: str) -> bool:
    """Whether to warn for ``key`` now: only the first time, in ``default`` mode; ``error`` mode raises."""
    mode = warning_mode()
    if mode == "ignore":
        return False
    if mode == "error":
        raise VllmAttnCompatDeprecationWarning(message)
    if key in _reported:
        return False
    with _reported_lock:
        if key in _reported:
            return False
        _reported[key] = pinned
        return True


def warn_once(message: str, *, depth: int = 1) -> None:
    """Warn ``message`` once per call site; ``depth`` counts frames from warn_once's caller up to the user's line.

    ``depth=1`` names the line that called the function which called warn_once. Silent while torch.compile
    traces (a ``warnings.warn`` there breaks ``fullgraph=True``). In ``error`` mode it raises on every call.
    """
    if torch.compiler.is_compiling():
        return
    caller = sys._getframe(depth + 1)
    key = (message, id(caller.f_code), caller.f_lineno)
    if key in _reported:
        if deprecated_uses.tally is not None:  # the pytest plugin counts every use, not only the first
            deprecated_uses.tally.at_line(message, caller.f_code, caller.f_lineno)
        return
    if _torch_machinery(caller):
        return  # dynamo evaluating a class attribute while it traces or builds its guards, not a user's line
    if deprecated_uses.tally is not None:  # before _claim, which raises in error mode
        deprecated_uses.tally.at_line(message, caller.f_code, caller.f_lineno)
    if _claim(key, caller.f_code, message):
        warnings.warn(message, VllmAttnCompatDeprecationWarning, stacklevel=depth + 2)


def _torch_machinery(frame: types.FrameType) -> bool:
    """Whether ``frame`` runs torch's code: a torch module's, or a string torch evaluates (torch 2.12's dynamo reads a
    class attribute for its guards through ``eval``, in globals without a module name)."""
    if (frame.f_globals.get("__name__") or "").startswith("torch."):
        return True
    outer = frame.f_back
    return (
        frame.f_code.co_filename == "<string>"
        and outer is not None
        and (outer.f_globals.get("__name__") or "").startswith("torch.")
    )


def warn_once_at(
    key: tuple[object, ...], message: str, category: type[Warning], place: types.CodeType | type, module: str
) -> None:
    """Warn ``message`` once per ``key`` at ``place``: the first line of a function of ``module`` the user wrote (its
    code), or a class's definition; the place to change. Counted there for the pytest plugin.
    ``VLLM_ATTN_COMPAT_WARNINGS`` decides as for the other warnings."""
    if isinstance(place, type):
        filename, lineno = deprecated_uses.definition_site(place)
        if deprecated_uses.tally is not None:
            deprecated_uses.tally.at_class(message, place)
    else:
        filename, lineno = place.co_filename, place.co_firstlineno
        if deprecated_uses.tally is not None:
            deprecated_uses.tally.at_line(message, place, lineno)
    mode = warning_mode()
    if mode == "ignore":
        return
    if mode == "error":
        raise category(message)
    with _reported_lock:
        if key in _reported:
            return
        _reported[key] = place
    # `module` always given: warn_explicit(module=None) shows nothing on CPython 3.11.
    warnings.warn_explicit(message, category, filename, lineno, module=module)


def warn_once_about(subject: type, message: str) -> None:
    """Warn ``message`` once per ``subject`` class, reported at the class's definition (its call sites are vLLM's)."""
    if torch.compiler.is_compiling():
        return
    key = (message, subject)
    if deprecated_uses.tally is not None:
        deprecated_uses.tally.at_class(message, subject)
    if key not in _reported and _claim(key, subject, message):
        filename, lineno = deprecated_uses.definition_site(subject)
        warnings.warn_explicit(message, VllmAttnCompatDeprecationWarning, filename, lineno, module=subject.__module__)
