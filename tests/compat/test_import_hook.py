"""The import watcher, over small packages written to disk: when its callback runs, what it counts as whole, and
that modules imported while it watches are the modules they would be without it."""

from __future__ import annotations

import importlib
import inspect
import itertools
import sys
import textwrap
import threading
from importlib.machinery import SourceFileLoader

import pytest

from vllm_attn_compat.import_hook import ImportWatcher, _PackageFinder

_names = itertools.count()

# `outer` imports `watched` half-way through; `failing` imports it, then raises; `broken` raises; `stopper` imports
# `watched`, then stops the watcher the test gives the package, before its own import completes; `probe` records
# what the watcher calls whole while it executes; `slow` waits for the test's GATE. Each module defines LAST as its
# last statement.
MODULES = {
    "__init__": "LAST = True\n",
    "watched": "VALUE = 42\nLAST = True\n",
    "other": "LAST = True\n",
    "outer": "from . import watched\nfrom . import other\nLAST = True\n",
    "failing": "from . import watched\nraise RuntimeError('failing: on purpose')\n",
    "broken": "raise RuntimeError('broken: on purpose')\n",
    "stopper": "from . import HOOK, watched\n\nHOOK.stop()\nLAST = True\n",
    "probe": "from . import HOOK, watched\n\nSEEN = HOOK.whole(__name__), HOOK.whole(watched.__name__)\nLAST = True\n",
    "slow": "from . import GATE\n\nGATE.wait(30)\nLAST = True\n",
}


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A fresh package on disk under a new name, removed from sys.modules (and its hooks from sys.meta_path) after."""
    name = f"hooked_pkg_{next(_names)}"
    folder = tmp_path / name
    folder.mkdir()
    for module, source in MODULES.items():
        (folder / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield name
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]
    finder = _PackageFinder._finders.pop(name, None)
    sys.meta_path[:] = [entry for entry in sys.meta_path if entry is not finder]


class Calls:
    """The callback: records, at each call, which of the package's modules had run their code to the end (by the
    LAST each defines), which had not (half-way), and which of them the watcher calls whole."""

    def __init__(self, package):
        self.package = package
        self.watcher = None
        self.seen = []

    def __call__(self):
        prefix = self.package + "."
        mine = {name.removeprefix(prefix): module for name, module in sys.modules.items() if name.startswith(prefix)}
        mine[self.package] = sys.modules[self.package]
        half_way = {name for name, module in mine.items() if not hasattr(module, "LAST")}
        whole = {name for name in mine if self.watcher.whole(self._full(name)) is not None}
        self.seen.append((half_way, set(mine) - half_way, whole))

    def _full(self, name):
        return name if name == self.package else f"{self.package}.{name}"


def _watch(package):
    """Watch ``package``, imported first: the tests import its modules (importing a package's module executes the
    package first, an outermost import of its own)."""
    importlib.import_module(package)
    calls = Calls(package)
    watcher = ImportWatcher(package, calls)
    calls.watcher = watcher
    watcher.start()
    return watcher, calls


def test_calls_back_after_each_outermost_import_never_half_way(package):
    _, calls = _watch(package)
    importlib.import_module(f"{package}.outer")
    # Not when `watched` or `other` finished (outer was still executing): when `outer` completed.
    everything = {package, "watched", "other", "outer"}
    assert calls.seen == [(set(), everything, everything)]
    importlib.import_module(f"{package}.outer")  # nothing executed: no call
    assert len(calls.seen) == 1
    importlib.reload(sys.modules[f"{package}.other"])  # reloading executes the module again: its own call
    assert len(calls.seen) == 2 and _PackageFinder.of(package) in sys.meta_path


def test_two_watchers_of_one_package_each_see_every_import(package):
    first, first_calls = _watch(package)
    second, second_calls = _watch(package)
    importlib.import_module(f"{package}.outer")
    assert len(first_calls.seen) == len(second_calls.seen) == 1
    assert sys.meta_path.count(_PackageFinder.of(package)) == 1  # one finder: neither asks the other (no recursion)
    first.stop()
    importlib.reload(sys.modules[f"{package}.other"])
    assert len(first_calls.seen) == 1 and len(second_calls.seen) == 2
    second.stop()
    assert _PackageFinder.of(package) not in sys.meta_path


def test_only_the_package_is_watched(package, tmp_path):
    (tmp_path / f"{package}_sibling.py").write_text("LAST = True\n")  # a name sharing the package's prefix
    _watch(package)
    finder = _PackageFinder.of(package)
    assert finder.find_spec(f"{package}_sibling", None) is None  # left to the other finders, untouched
    # The package itself and its modules: the other finders' spec, whose loader answers as the original does.
    assert finder.find_spec(package, None).submodule_search_locations == [str(tmp_path / package)]
    spec = finder.find_spec(f"{package}.other", [str(tmp_path / package)])
    assert spec.origin == str(tmp_path / package / "other.py")
    assert spec.loader.get_source(f"{package}.other") == MODULES["other"]
    assert finder.find_spec(f"{package}.missing", [str(tmp_path / package)]) is None


def test_a_failed_import_calls_back_and_its_module_is_not_whole(package):
    _, calls = _watch(package)
    with pytest.raises(RuntimeError, match="failing: on purpose"):
        importlib.import_module(f"{package}.failing")
    # Called as the failing import unwinds: the failing module, still in sys.modules then, is not whole (and is gone
    # after); what it imported before it raised is.
    assert calls.seen == [({"failing"}, {package, "watched"}, {package, "watched"})]
    assert f"{package}.failing" not in sys.modules
    with pytest.raises(RuntimeError, match="broken: on purpose"):
        importlib.import_module(f"{package}.broken")
    assert calls.seen[-1] == ({"broken"}, {package, "watched"}, {package, "watched"})


def test_a_module_executing_is_not_whole(package):
    watcher, _ = _watch(package)
    importlib.import_module(package).HOOK = watcher
    probe = importlib.import_module(f"{package}.probe")
    assert (None, sys.modules[f"{package}.watched"]) == probe.SEEN
    assert watcher.whole(f"{package}.probe") is probe


def test_a_module_executing_in_another_thread_is_not_whole(package):
    watcher, calls = _watch(package)
    gate = importlib.import_module(package).GATE = threading.Event()
    importer = threading.Thread(target=importlib.import_module, args=(f"{package}.slow",))
    importer.start()
    try:
        for _ in range(3000):  # until the other thread is inside `slow`
            if f"{package}.slow" in sys.modules:
                break
            threading.Event().wait(0.01)
        assert f"{package}.slow" in sys.modules and watcher.whole(f"{package}.slow") is None
    finally:
        gate.set()
        importer.join(30)
    assert watcher.whole(f"{package}.slow") is sys.modules[f"{package}.slow"]
    assert calls.seen[-1][2] >= {package, "slow"}  # called back in the importing thread, once `slow` was whole


def test_imported_before_it_started_counts_as_whole(package):
    module = importlib.import_module(f"{package}.watched")
    watcher, calls = _watch(package)
    assert watcher.whole(f"{package}.watched") is module and calls.seen == []


def test_stopped_it_calls_nothing(package):
    watcher, calls = _watch(package)
    watcher.stop()
    importlib.import_module(f"{package}.outer")
    assert calls.seen == [] and _PackageFinder.of(package) not in sys.meta_path


def test_stopped_during_an_import_under_way_it_calls_nothing(package):
    watcher, calls = _watch(package)
    importlib.import_module(package).HOOK = watcher
    importlib.import_module(f"{package}.stopper")  # imports the watched module, then stops the watcher
    assert calls.seen == [] and _PackageFinder.of(package) not in sys.meta_path


def _imported_as(package, watch):
    """What the import system leaves on each module of ``package`` (imported through ``outer``, then a missing
    name), with or without the watcher; then forgets the modules."""
    if watch:  # the package itself too is imported through the watcher here
        ImportWatcher(package, lambda: None).start()
    importlib.import_module(f"{package}.outer")
    with pytest.raises(ModuleNotFoundError) as missing:
        importlib.import_module(f"{package}.missing")
    found = {}
    for name in (package, f"{package}.watched", f"{package}.other", f"{package}.outer"):
        module = sys.modules.pop(name)
        spec = module.__spec__
        found[name] = {
            "loader": type(module.__loader__),
            "spec.loader is __loader__": spec.loader is module.__loader__,
            "source": inspect.getsource(module),
            **{attr: getattr(module, attr, None) for attr in ("__file__", "__cached__", "__package__", "__path__")},
            **{attr: getattr(spec, attr) for attr in ("name", "origin", "cached", "parent", "has_location")},
            "submodule_search_locations": spec.submodule_search_locations,
        }
    return found, str(missing.value)


def test_modules_are_what_they_would_be_without_it(package):
    watched, error_watched = _imported_as(package, watch=True)
    plain, error_plain = _imported_as(package, watch=False)
    assert watched == plain and error_watched == error_plain
    assert all(module["loader"] is SourceFileLoader for module in plain.values())
    assert plain[f"{package}.watched"]["source"] == textwrap.dedent(MODULES["watched"])
