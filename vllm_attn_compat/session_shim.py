"""The vLLM plugin's shim in a test process, installed as vLLM's plugin loader installs it (for the pytest plugin).

vLLM runs its general plugins, this package's :func:`vllm_attn_compat.compat.plugin.register` among them, only in
the processes of an engine. A test that imports a backend and exercises it without an engine would see a vLLM the
engine never sees (``AttentionBackend.accept_output_buffer`` raising ``AttributeError``), and the pytest plugin,
whose job is to count such uses, would see a crash. :func:`watch` calls the entry point, as
``vllm.plugins.load_general_plugins`` does, once the test process has imported the ``vllm`` package; the plugin
then installs each feature as vLLM's modules it patches are imported, so the test pays for no module it does not
import. A process that never imports vLLM pays nothing, and nothing here imports vLLM or torch before then.
"""

from __future__ import annotations

import logging
import sys
import threading
from importlib.metadata import EntryPoint, entry_points

from vllm_attn_compat.import_hook import ImportWatcher

GROUP = "vllm.general_plugins"  # vllm.plugins.DEFAULT_PLUGINS_GROUP
TARGET = "vllm_attn_compat.vllm_entry_point:register"  # this package's entry point in that group (pyproject.toml)

# vLLM's loader logs a plugin that fails to load under its own logger, and carries on.
_vllm_plugins_logger = logging.getLogger("vllm.plugins")
logger = logging.getLogger("vllm.plugins.vllm_attn_compat")


class SessionShim:
    """Calls the entry point once, after the import that executed the ``vllm`` package completes."""

    def __init__(self) -> None:
        self.fired = False
        self._lock = threading.Lock()  # held for the test-and-set of `fired` only
        self._watcher = ImportWatcher("vllm", self._after_import)

    def start(self) -> None:
        if "vllm" in sys.modules:  # imported before the session started (whole: nothing of vLLM is importing now)
            self._fire()
        else:
            self._watcher.start()

    def stop(self) -> None:
        """Stop watching; what the plugin installed stays (vLLM's classes keep the shim for the rest of the process)."""
        self._watcher.stop()

    def _after_import(self) -> None:
        if self._watcher.whole("vllm") is not None:
            self._fire()

    def _fire(self) -> None:
        with self._lock:
            if self.fired:
                return
            self.fired = True
        self._watcher.stop()
        _install_unguarded()


def watch() -> SessionShim:
    """Install the shim once this process has imported ``vllm`` (at once if it has already)."""
    shim = SessionShim()
    shim.start()
    return shim


def selected() -> list[EntryPoint]:
    """This package's ``vllm.general_plugins`` entry points that vLLM's loader would call in this process: every
    installed one, or, when ``VLLM_PLUGINS`` is set, those it names (as ``vllm.envs`` reads it: comma-separated,
    compared whole). Call only once vLLM is imported."""
    import vllm.envs as envs

    allowed = envs.VLLM_PLUGINS
    return [ep for ep in entry_points(group=GROUP) if ep.value == TARGET and (allowed is None or ep.name in allowed)]


def install() -> bool:
    """Load and call the entry points :func:`selected` returns, as vLLM's loader does; whether one was called.

    The plugin itself honours ``VLLM_ATTN_COMPAT_DISABLE_PLUGIN`` and logs what it installed.
    """
    called = False
    for ep in selected():
        try:
            register = ep.load()
        except Exception:  # vLLM's loader logs a plugin that fails to load, and goes on
            _vllm_plugins_logger.exception("Failed to load plugin %s", ep.name)
            continue
        register()
        called = True
    return called


def _install_unguarded() -> None:
    # Runs inside the import statement of the code under test: an error here must not become that import's error.
    try:
        install()
    except Exception as error:  # noqa: BLE001 - anything; the test then sees vLLM without the shim
        logger.warning("vllm-attn-compat: the test session's install failed (%s: %s)", type(error).__name__, error)
