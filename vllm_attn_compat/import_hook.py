"""Calling a function once, after a process first imports some of a package's modules (for the pytest plugin).

:class:`AfterImport` is a ``sys.meta_path`` finder that watches the first imports of one package's modules. Once
one of the named modules has been executed, it calls its callback when the outermost of that package's imports in
progress completes, so that every module of the package is whole by then (never half-initialised) and the
callback may import more of them. It then removes itself. Until then it costs one string test per first import
of any module; it imports nothing itself (no torch, no vLLM).

Modules keep their own loaders: the finder hands the import system the other finders' spec with its loader
wrapped, and the wrapper puts the original back on the module and its spec before the module's code runs (wrapt's
post-import hooks do the same), so ``inspect.getsource``, ``importlib.resources`` and ``isinstance`` checks on
``__loader__`` see what they would without it.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any


class AfterImport:
    """Calls ``callback`` (once, in the importing thread) after ``package``'s outermost import that executed one
    of ``modules`` completes; whether that import succeeded or raised.

    ``callback`` must not raise: it runs inside the import statement of whatever code imported the package.
    """

    def __init__(self, package: str, modules: Iterable[str], callback: Callable[[], None]) -> None:
        self.package = package
        self.modules = frozenset(modules)
        self.callback = callback
        self._prefix = package + "."
        self._depth = threading.local()  # the package's module executions in progress, per thread
        self._lock = threading.Lock()
        self._seen = False  # one of `modules` has been executed
        self._fired = False
        self._stopped = False

    @property
    def fired(self) -> bool:
        return self._fired

    def start(self) -> None:
        """Watch from now on; call the callback at once if one of ``modules`` is already imported (whole)."""
        self._stopped = False
        if any(_whole(sys.modules.get(name)) for name in self.modules):
            self._fire()
        elif self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def stop(self) -> None:
        """Stop watching: the callback is not called from now on (not even by an import already under way)."""
        self._stopped = True
        while self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.package and not fullname.startswith(self._prefix):
            return None
        # Ask the finders after this one, as the import system would have: the spec is theirs, only its loader
        # is wrapped until the module executes.
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec: ModuleSpec | None = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is not None and hasattr(loader, "exec_module") and not isinstance(loader, _WatchedLoader):
            spec.loader = _WatchedLoader(loader, self)
        return spec

    def _executing(self, module: ModuleType, execute: Callable[[ModuleType], None]) -> None:
        depth = getattr(self._depth, "value", 0)
        self._depth.value = depth + 1
        executed = False
        try:
            execute(module)
            executed = True
        finally:
            self._depth.value = depth
            if executed and module.__name__ in self.modules:
                self._seen = True
            if depth == 0 and self._seen:
                self._fire()

    def _fire(self) -> None:
        with self._lock:
            if self._fired or self._stopped:
                return
            self._fired = True
        self.stop()
        self.callback()


def _whole(module: ModuleType | None) -> bool:
    """Whether ``module`` is imported and has finished executing."""
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


class _WatchedLoader(importlib.abc.Loader):
    """A module's loader, seen by the import system until the module executes; then the original again."""

    def __init__(self, loader: Any, hook: AfterImport) -> None:
        self._loader = loader
        self._hook = hook

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        self._hook._executing(module, self._loader.exec_module)
