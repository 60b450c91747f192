"""Calling a function each time a process completes an import of a package's modules (the vLLM plugin's installs).

:class:`ImportWatcher` watches the imports of one package's modules, through a ``sys.meta_path`` finder the
package's watchers share. Each time the outermost of that package's imports in progress in a thread completes,
having executed at least one of its modules, it calls its callback in that thread, so that every module the import
executed is whole by then (never half-initialised) and the callback may look at them. It costs one string test per
first import of any module; it imports nothing itself (no torch, no vLLM).

Modules keep their own loaders: the finder hands the import system the other finders' spec with its loader
wrapped, and the wrapper puts the original back on the module and its spec before the module's code runs (wrapt's
post-import hooks do the same), so ``inspect.getsource``, ``importlib.resources`` and ``isinstance`` checks on
``__loader__`` see what they would without it.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, ClassVar


class ImportWatcher:
    """Calls ``callback()`` (in the importing thread) after each outermost import of ``package``'s modules that
    executed one of them completes, whether that import succeeded or raised, from :meth:`start` until :meth:`stop`.

    ``callback`` must not raise: it runs inside the import statement of whatever code imported the package. The
    watchers of one package share one finder (:class:`_PackageFinder`), so each sees every import, however many
    there are.
    """

    def __init__(self, package: str, callback: Callable[[], None]) -> None:
        self.package = package
        self.callback = callback

    def start(self) -> None:
        """Watch from now on (the package's finder goes first in ``sys.meta_path``, so no import escapes it)."""
        _PackageFinder.of(self.package).add(self)

    def stop(self) -> None:
        """Stop watching: the callback is not called from now on (not even by an import already under way)."""
        _PackageFinder.of(self.package).discard(self)

    def whole(self, name: str) -> ModuleType | None:
        """``sys.modules[name]`` when it has finished executing: not now running, nor left half-way by an error.

        A module imported before the package was first watched counts as whole: start watching outside the import
        of the package's modules (vLLM's plugin loader and the package's own import hooks do).
        """
        return _PackageFinder.of(self.package).whole(name)


def watched_packages() -> list[str]:
    """The packages watched now (by at least one started watcher)."""
    return sorted(finder.package for finder in sys.meta_path if isinstance(finder, _PackageFinder))


class _PackageFinder:
    """The ``sys.meta_path`` finder of one package's watchers: it wraps the loaders of the package's modules to see
    them execute, and calls the watchers back."""

    _finders: ClassVar[dict[str, _PackageFinder]] = {}  # one per package, for the process's life
    _finders_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def of(cls, package: str) -> _PackageFinder:
        with cls._finders_lock:
            finder = cls._finders.get(package)
            if finder is None:
                finder = cls._finders[package] = cls(package)
            return finder

    def __init__(self, package: str) -> None:
        self.package = package
        self._prefix = package + "."
        self._depth = threading.local()  # the package's module executions in progress, per thread
        self._lock = threading.Lock()  # guards the sets and list below; nothing is called while it is held
        self._watchers: list[ImportWatcher] = []
        self._executing: set[str] = set()  # modules whose code runs now, in any thread
        self._failed: set[str] = set()  # modules whose code raised (the import system drops them afterwards)

    def add(self, watcher: ImportWatcher) -> None:
        with self._lock:
            if watcher not in self._watchers:
                self._watchers.append(watcher)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def discard(self, watcher: ImportWatcher) -> None:
        with self._lock:
            if watcher in self._watchers:
                self._watchers.remove(watcher)
            idle = not self._watchers
        while idle and self in sys.meta_path:
            sys.meta_path.remove(self)

    def whole(self, name: str) -> ModuleType | None:
        with self._lock:
            if name in self._executing or name in self._failed:
                return None
        return sys.modules.get(name)

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

    def _execute(self, module: ModuleType, execute: Callable[[ModuleType], None]) -> None:
        name = module.__name__
        depth = getattr(self._depth, "value", 0)
        self._depth.value = depth + 1
        with self._lock:
            self._executing.add(name)
            self._failed.discard(name)
        executed = False
        try:
            execute(module)
            executed = True
        finally:
            self._depth.value = depth
            with self._lock:
                self._executing.discard(name)
                if not executed:
                    self._failed.add(name)
                watchers = list(self._watchers) if depth == 0 else []
            for watcher in watchers:
                if watcher in self._watchers:  # not stopped by a callback before it
                    watcher.callback()


class _WatchedLoader(importlib.abc.Loader):
    """A module's loader, seen by the import system until the module executes; then the original again."""

    def __init__(self, loader: Any, finder: _PackageFinder) -> None:
        self._loader = loader
        self._finder = finder

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
        self._finder._execute(module, self._loader.exec_module)
