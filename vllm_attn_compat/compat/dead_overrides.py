"""Overrides of hooks the running vLLM no longer has or calls: named once, as the layers that use them are built.

A backend written for an older vLLM keeps its ``get_kv_cache_shape`` (gone in 0.29), its metadata builder its
``build_for_drafting`` (gone in 0.34): nothing fails, vLLM just never calls them, and whatever they decided (the
KV-cache layout, the drafting metadata) is silently ignored. When an attention layer is built, the plugin checks
its backend class, that backend's metadata builder (``get_builder_cls()``) and the layer's impl against the
manifest of vLLM's attention interface (:mod:`vllm_attn_compat.manifest`) for the running release, and warns
once per class and hook with a :class:`DeadOverrideWarning` at the override's ``def``, naming the release that
removed the hook and what replaced it where vLLM says.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Any

from vllm_attn_compat import manifest
from vllm_attn_compat.compat.deprecation import warn_once_at


class DeadOverrideWarning(UserWarning):
    """An override of a hook the running vLLM no longer has or calls: its code never runs (rule VAC010).

    Filter it like any warning category (``-W error::vllm_attn_compat.compat.DeadOverrideWarning``); the pytest
    plugin counts it with the deprecated uses, so ``--vllm-attn-compat=error`` fails a session that built such a
    layer.
    """


# Handled by their own shims and rules (the flag is read as True, VAC004/VAC005): not a hook to warn about here.
_HANDLED = frozenset({"accept_output_buffer"})
_checked: set[type] = set()
_checked_lock = threading.Lock()


class DeadOverrides:
    """The check for one running vLLM release (``release``: the manifest's entry for it)."""

    def __init__(self, release: str) -> None:
        self.release = release

    def check_layer(self, layer: Any) -> None:
        """Check what ``layer`` was built with: its backend class, the backend's builder and the impl's class."""
        backend = getattr(layer, "attn_backend", None)
        classes = [backend, type(getattr(layer, "impl", None))]
        if backend is not None:
            # A backend whose builder a test or an older API never gave raises: there is no builder to check.
            with contextlib.suppress(Exception):
                classes.append(backend.get_builder_cls())
        for cls in classes:
            if isinstance(cls, type):
                self.check_class(cls)

    def check_class(self, cls: type) -> None:
        with _checked_lock:
            if cls in _checked:
                return
            _checked.add(cls)
        interface = _interface(self.release, cls)
        if interface is None:
            return
        for name, hook in manifest.dead_hooks(self.release, interface).items():
            if name in _HANDLED:
                continue
            owner = _overriding(cls, name)
            if owner is not None:
                _warn(owner, name, hook, self.release)


def _interface(release: str, cls: type) -> str | None:
    """The first class of ``cls``'s MRO that the manifest knows at ``release`` (vLLM's base it derives from)."""
    for klass in cls.__mro__:
        name = f"{klass.__module__}.{klass.__qualname__}"
        if manifest.class_info(release, name) is not None:
            return name
    return None


def _overriding(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO, outside vLLM, whose body defines ``name`` (the one vLLM would have called)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return None if klass.__module__.split(".")[0] == "vllm" else klass
    return None


def _warn(owner: type, name: str, hook: manifest.DeadHook, release: str) -> None:
    base = hook.owner.rsplit(".", 1)[-1]
    if hook.reason == "removed":
        what = f"vLLM {release} no longer has `{base}.{name}` (removed in {hook.since}), so it never calls it"
    else:
        what = f"vLLM {release} still defines `{base}.{name}` but never calls it (since {hook.since})"
    if hook.successor is not None and hook.successor.kind == "member":
        instead = f"move what it decides into `{hook.successor.use}`"
    elif hook.deprecated:
        instead = f"vLLM's note: {hook.deprecated}"
    else:
        instead = "what it decided is ignored: delete it, or port it to what replaced it in vLLM"
    where = owner.__qualname__.rsplit("<locals>.", 1)[-1]  # a class defined in a function: from its own name on
    message = (
        f"`{where}.{name}` overrides a hook that is dead: {what}; {instead}. "
        f"See `vllm-attn-compat rules VAC010` (rule VAC010)."
    )
    function = _function(vars(owner)[name])
    code = getattr(inspect.unwrap(function), "__code__", None) if callable(function) else None
    # At the override's `def`; an attribute (or a callable without code) at its class.
    warn_once_at((DeadOverrideWarning, owner, name), message, DeadOverrideWarning, code or owner, owner.__module__)


def _function(member: Any) -> Any:
    if isinstance(member, (staticmethod, classmethod)):
        return member.__func__
    if isinstance(member, property):
        return member.fget
    return member
