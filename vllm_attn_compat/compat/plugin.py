"""The ``vllm.general_plugins`` entry point: installs the compatibility layer into a real vLLM >= 0.20.

vLLM calls :func:`register` once per process (engine, each worker), possibly more than once; so do this package's
pytest plugin (when a test process imports vLLM) and any user. Every call returns at once, whatever the order, the
nesting or the thread: :func:`register` imports nothing of vLLM and never waits. It installs each feature
(:data:`vllm_install.FEATURES`) once vLLM has imported the modules that feature patches: those already imported
at once, the others as vLLM imports them (an :class:`ImportWatcher` calls back after each of vLLM's imports
completes). So the plugin never re-enters vLLM's imports, and a process pays for no vLLM module it does not import
itself. Features detect what they need instead of parsing versions: nothing is installed into a vLLM whose
``AttentionBackend`` still declares ``accept_output_buffer`` (< 0.20), nothing without vLLM, and nothing when
``VLLM_ATTN_COMPAT_DISABLE_PLUGIN=1``. A feature whose names a release lacks is skipped and named in the log line.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING

from vllm_attn_compat.compat import vllm_install
from vllm_attn_compat.compat.output_guard import ENV_CHECK_OUTPUT
from vllm_attn_compat.compat.vllm_install import Feature, old_api_reason
from vllm_attn_compat.import_hook import ImportWatcher

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["ENV_DISABLE", "old_api_reason", "pending", "register", "vllm_api_reason"]

ENV_DISABLE = "VLLM_ATTN_COMPAT_DISABLE_PLUGIN"

# Under vLLM's "vllm" logger, so the line appears with vLLM's own logging configuration.
logger = logging.getLogger("vllm.plugins.vllm_attn_compat")


class _Installation:
    """This process's install: the features not yet installed, and the watcher that installs them."""

    def __init__(self) -> None:
        # Guards the fields below, held for a few reads and writes only: never while importing or calling into vLLM.
        self.lock = threading.Lock()
        self.started = False
        self.pending: list[Feature] = list(vllm_install.FEATURES)
        self.installed: list[Feature] = []  # those installed (or skipped): the output guard's are run again
        self.watcher: ImportWatcher | None = None

    def claim_ready(self, whole: Callable[[str], ModuleType | None]) -> list[Feature]:
        """Take the pending features whose modules are imported (and whole); stop watching once none is left."""
        with self.lock:
            ready = [feature for feature in self.pending if _imported(feature, whole)]
            self.pending = [feature for feature in self.pending if feature not in ready]
            self.installed += ready
            done = not self.pending
        if done and self.watcher is not None:
            self.watcher.stop()
        return ready

    def abandon(self) -> None:
        """Install nothing more (an old vLLM, or an error no check foresaw)."""
        with self.lock:
            self.pending = []
        if self.watcher is not None:
            self.watcher.stop()


_installation = _Installation()


def register() -> None:
    """Install into vLLM what it has imported, and the rest as it imports it; log one line per install saying what
    was installed and what was skipped.

    Never raises (vLLM calls it without a guard), never waits, and imports nothing of vLLM.
    """
    if os.environ.get(ENV_DISABLE, "").strip() not in ("", "0"):
        logger.info("vllm-attn-compat: plugin disabled by %s; nothing installed", ENV_DISABLE)
        return
    if importlib.util.find_spec("vllm") is None:
        logger.info("vllm-attn-compat: nothing installed (vLLM is not installed)")
        return
    state = _installation
    with state.lock:
        watcher = None if state.started else ImportWatcher("vllm", _install_ready)
        state.started = True
        state.watcher = state.watcher or watcher
    if watcher is not None:
        watcher.start()
        _install_ready()
    else:
        _install_ready(again=True)


def _install_ready(again: bool = False) -> None:
    """Install the features whose modules vLLM has imported; with ``again``, the output guard once more (the
    pytest plugin turns it on, then registers, where vLLM's loader may have registered first)."""
    state = _installation
    watcher = state.watcher
    whole: Callable[[str], ModuleType | None] = watcher.whole if watcher is not None else sys.modules.get
    try:
        ready = state.claim_ready(whole)
        if again and os.environ.get(ENV_CHECK_OUTPUT, "").strip() not in ("", "0"):
            with state.lock:
                ready += [feature for feature in state.installed if feature.again and feature not in ready]
        if not ready:
            return
        installed, skipped = vllm_install.install_features(ready)
    except vllm_install.OldApi as reason:
        state.abandon()
        logger.info("vllm-attn-compat: nothing installed (%s)", reason)
        return
    except Exception as error:  # noqa: BLE001 - anything the feature checks did not foresee
        state.abandon()
        logger.warning("vllm-attn-compat: nothing installed (unexpected %s: %s)", type(error).__name__, error)
        return
    if not installed and not skipped:
        return
    line = "vllm-attn-compat: installed " + (", ".join(installed) or "nothing")
    if skipped:
        logger.warning("%s; skipped %s", line, "; ".join(skipped))
    else:
        logger.info("%s", line)


def pending() -> list[str]:
    """The features not installed yet, waiting for vLLM to import the modules they patch (a module a release lacks
    keeps its features here)."""
    with _installation.lock:
        return [feature.name for feature in _installation.pending]


def _imported(feature: Feature, whole: Callable[[str], ModuleType | None]) -> bool:
    needs = (*feature.needs, vllm_install.BACKEND_MODULES) if feature.new_api else feature.needs
    return all(any(whole(name) is not None for name in paths) for paths in needs)


def vllm_api_reason() -> str | None:
    """Why this environment's vLLM gets nothing, or None when it has the >= 0.20 attention API. Imports vLLM's
    ``AttentionBackend``: for callers outside vLLM's imports (``check_output``), never for the plugin itself."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    try:
        backend = importlib.import_module(vllm_install.BACKEND_MODULES[0])
        backend_base = backend.AttentionBackend
    except Exception as error:  # noqa: BLE001 - ImportError, or whatever a broken vLLM raises while importing
        return f"vLLM's v1 AttentionBackend does not import: {type(error).__name__}: {error}"
    return old_api_reason(backend_base)
