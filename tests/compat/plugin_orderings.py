"""Run as a script: the vLLM plugin's four entry points driven in every order and nesting, against the real vLLM.

The entry points: vLLM's loader (``vllm.plugins.load_general_plugins``), the session shim (``session_shim.install``,
as the pytest plugin calls it), the import hook (``session_shim.watch`` and an import of vLLM's attention layer) and
an explicit ``register()``. A scenario is an order of the four and how each is called once the one before it is
under way: ``serial`` (after it returns), ``entry`` (inside it, as it enters the plugin's entry point), ``install``
(inside the plugin's install of a feature), ``import`` (inside the callback of one of vLLM's imports that it made) or
``thread`` (from another thread started as it enters the plugin's entry point, joined at the end). An entry point
whose turn never came inside the one before (nothing there to nest in) is called after it, and the report says so.

``python plugin_orderings.py STAGE`` imports vLLM up to the stage (``cold``: nothing of vLLM; ``backend``:
vLLM, its config and ``AttentionBackend``, not the attention layers; ``layers``: everything the plugin patches),
then runs each scenario in a forked child with a deadline and prints one JSON object: scenario -> end state, or
``{"hung": true}`` for a child that missed its deadline.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this tree's package, not an installed one

import torch

torch.set_num_threads(1)  # before any op: the children are forked

ENTRY_POINTS = ("loader", "shim", "hook", "register")
# Four cyclic orders: their rotations put each entry point first four times and each ordered pair next to each other.
CYCLES = (
    ("loader", "shim", "hook", "register"),
    ("register", "hook", "shim", "loader"),
    ("loader", "hook", "shim", "register"),
    ("loader", "register", "shim", "hook"),
)
ORDERS = [cycle[i:] + cycle[:i] for cycle in CYCLES for i in range(4)]
NESTINGS = ("serial", "entry", "install", "import", "thread")
LAYERS = ("vllm.model_executor.layers.attention.attention", "vllm.model_executor.layers.attention.mla_attention")
# Everything the plugin's features patch (the rest of the end state is read from these).
ALL_NEEDED = (*LAYERS, "vllm.v1.attention.backend", "vllm.config", "vllm.forward_context", "vllm.utils.torch_utils")


def scenarios(stage: str) -> list[tuple[tuple[str, ...], str]]:
    if stage == "cold":  # each entry point first, the others nested inside the imports it makes: the path
        return [(order, "import") for order in ORDERS[:4]]
    nestings = [n for n in NESTINGS if n != "import" or stage == "backend"]  # no vLLM import is left to nest in
    return list(itertools.product(ORDERS, nestings))


def _call(name: str) -> None:
    if name == "loader":
        import vllm.plugins

        vllm.plugins.load_general_plugins()
    elif name == "shim":
        from vllm_attn_compat import session_shim

        session_shim.install()
    elif name == "hook":
        import importlib

        from vllm_attn_compat import session_shim

        session_shim.watch()
        importlib.import_module(LAYERS[0])
    else:
        from vllm_attn_compat import vllm_entry_point

        vllm_entry_point.register()


class Chain:
    """Calls the entry points of an order, each inside the one before as the nesting says."""

    def __init__(self, order: tuple[str, ...], nesting: str) -> None:
        self.queue = list(order)
        self.nesting = nesting
        self.how: dict[str, str] = {}  # entry point -> how it was called
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def run(self) -> None:
        first = self.queue.pop(0)
        self.how[first] = "first"
        self._run(first)
        self._join()  # a thread's entry point starts the next thread: all of them before the queue is drained
        while self.queue:  # those whose turn never came inside the one before
            name = self.queue.pop(0)
            self.how.setdefault(name, "after")
            self._run(name)
            self._join()

    def _join(self) -> None:
        joined = 0
        while joined < len(self.threads):
            thread = self.threads[joined]
            thread.join(60)
            if thread.is_alive():
                self.errors.append("a thread calling an entry point did not finish within 60 s")
            joined += 1

    def nest(self, where: str) -> None:
        """Called at each place an entry point may nest: call the next one if this scenario nests here."""
        if where != self.nesting:
            return
        with self._lock:
            if not self.queue:
                return
            name = self.queue.pop(0)
        if where == "thread":
            self.how[name] = "thread"
            thread = threading.Thread(target=self._run, args=(name,))
            self.threads.append(thread)
            thread.start()
        else:
            self.how[name] = f"inside ({where})"
            self._run(name)

    def _run(self, name: str) -> None:
        try:
            _call(name)
        except BaseException:  # noqa: BLE001 - an entry point must never raise: the report says which did
            self.errors.append(f"{name}: {traceback.format_exc()}")


def _instrument(chain: Chain) -> None:
    """The places to nest in: the plugin's entry point (what vLLM's loader and the shim load by name), the plugin's
    install, and the end of each of vLLM's imports."""
    from vllm_attn_compat import vllm_entry_point
    from vllm_attn_compat.compat import vllm_install
    from vllm_attn_compat.import_hook import ImportWatcher

    register, install_features = vllm_entry_point.register, vllm_install.install_features

    def entry() -> None:
        chain.nest("entry")
        chain.nest("thread")
        register()

    def install(features):  # type: ignore[no-untyped-def]
        chain.nest("install")
        return install_features(features)

    vllm_entry_point.register = entry
    vllm_install.install_features = install
    ImportWatcher("vllm", lambda: chain.nest("import")).start()


def _markers(cls: type) -> dict[str, int]:
    """How many of the __init__ wrappers stacked on ``cls`` set each of this package's markers (``functools.wraps``
    copies the markers of the function it wraps: a wrapper sets those its wrapped function lacks)."""
    counts: dict[str, int] = {}
    init = cls.__dict__.get("__init__")
    while init is not None:
        wrapped = getattr(init, "__wrapped__", None)
        for name in vars(init):
            if name.startswith("__vllm_attn_compat") and name not in vars(wrapped or (lambda: None)):
                counts[name] = counts.get(name, 0) + 1
        init = wrapped
    return counts


def _state(lines: list[str]) -> dict[str, object]:
    import importlib

    for name in ALL_NEEDED:  # the end state is read once every module the plugin patches is imported
        importlib.import_module(name)
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.v1.attention.backend import AttentionBackend

    from vllm_attn_compat.compat import VllmAttnCompatDeprecationWarning, forwarders, output_guard, plugin

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            AttentionBackend.accept_output_buffer  # noqa: B018 - the read under test
    return {
        "pending": plugin.pending(),
        "lines": lines,
        "flags": [
            type(cls.__dict__.get(name)).__name__
            for cls, name in ((AttentionBackend, "accept_output_buffer"), (Attention, "use_output"))
        ],
        "attention_markers": _markers(Attention),
        "mla_markers": _markers(MLAAttention),
        "ops": [name for name in ("unified_attention", "unified_mla_attention") if hasattr(torch.ops.vllm, name)],
        "route": type(forwarders.current_route()).__name__,
        "warnings": sum(issubclass(w.category, VllmAttnCompatDeprecationWarning) for w in caught),
        "guard": output_guard.current_mode(),
    }


def _child(order: tuple[str, ...], nesting: str, guard: bool) -> dict[str, object]:
    from vllm_attn_compat.compat import plugin

    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    # A logger of its own, outside logging's registry: vLLM's first import configures its "vllm" logger, which
    # resets the handlers of the loggers under it (the plugin's own).
    plugin.logger = logging.Logger(plugin.logger.name, logging.INFO)
    plugin.logger.addHandler(handler)
    os.environ["VLLM_PLUGINS"] = "vllm_attn_compat"
    os.environ.pop("VLLM_ATTN_COMPAT_DISABLE_PLUGIN", None)
    if guard:
        os.environ["VLLM_ATTN_COMPAT_CHECK_OUTPUT"] = "error"
    else:
        os.environ.pop("VLLM_ATTN_COMPAT_CHECK_OUTPUT", None)
    chain = Chain(order, nesting)
    _instrument(chain)
    chain.run()
    return {"how": chain.how, "errors": chain.errors, **_state(lines)}


def _import_stage(stage: str) -> None:
    import importlib

    if stage == "cold":
        for name in ("transformers", "pydantic", "numpy"):  # vLLM's heavy dependencies, none of vLLM itself
            importlib.import_module(name)
        return
    importlib.import_module("vllm.plugins")
    importlib.import_module("vllm.config")
    importlib.import_module("vllm.model_executor.layers.linear")  # imports AttentionBackend's module, not the layers
    assert not any(name in sys.modules for name in LAYERS)
    if stage == "layers":
        for name in ALL_NEEDED:
            importlib.import_module(name)


def main() -> None:
    stage = sys.argv[1]
    deadline = {"cold": 240, "backend": 60, "layers": 60}[stage]
    _import_stage(stage)
    results = {}
    for index, (order, nesting) in enumerate(scenarios(stage)):
        guard = index % 2 == 1
        key = f"{'>'.join(order)} {nesting}{' guard' if guard else ''}"
        with tempfile.TemporaryFile("w+") as channel:
            pid = os.fork()
            if pid == 0:
                try:
                    json.dump(_child(order, nesting, guard), channel)
                except BaseException:  # noqa: BLE001 - the forked child reports any failure to the parent
                    json.dump({"probe_error": traceback.format_exc()}, channel)
                channel.flush()
                os._exit(0)
            start = time.monotonic()
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() - start > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.02)
            else:
                channel.seek(0)
                results[key] = json.load(channel)
                continue
            results[key] = {"hung": True}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
