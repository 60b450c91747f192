"""The import hook, over small packages written to disk: when its callback runs, and that modules imported while
it watches are the modules they would be without it."""

from __future__ import annotations

import importlib
import inspect
import itertools
import sys
import textwrap
from importlib.machinery import SourceFileLoader

import pytest

from vllm_attn_compat.import_hook import AfterImport

_names = itertools.count()

# `outer` imports the watched module half-way through; `failing` imports it, then raises; `broken` is a watched
# module that raises; `other` is watched by nobody; `stopper` imports the watched module, then stops the hook the
# test gives the package, before its own import completes. Each module defines LAST as its last statement.
MODULES = {
    "__init__": "LAST = True\n",
    "watched": "VALUE = 42\nLAST = True\n",
    "other": "LAST = True\n",
    "outer": "from . import watched\nfrom . import other\nLAST = True\n",
    "failing": "from . import watched\nraise RuntimeError('failing: on purpose')\n",
    "broken": "raise RuntimeError('broken: on purpose')\n",
    "stopper": "from . import HOOK, watched\n\nHOOK.stop()\nLAST = True\n",
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
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, AfterImport)]


class Calls:
    """The callback: records, at each call, which of the package's modules had run their code to the end (whole)
    and which had not (half-way), by the LAST each defines."""

    def __init__(self, package):
        self.package = package
        self.seen = []

    def __call__(self):
        prefix = self.package + "."
        mine = {name.removeprefix(prefix): module for name, module in sys.modules.items() if name.startswith(prefix)}
        mine[self.package] = sys.modules[self.package]
        half_way = {name for name, module in mine.items() if not hasattr(module, "LAST")}
        self.seen.append((half_way, set(mine) - half_way))


def _hook(package, *watched):
    calls = Calls(package)
    hook = AfterImport(package, [f"{package}.{name}" for name in watched], calls)
    hook.start()
    return hook, calls


def test_fires_once_after_the_outermost_import_completes_never_half_way(package):
    hook, calls = _hook(package, "watched")
    importlib.import_module(f"{package}.outer")
    # Not when `watched` finished (outer was still executing, `other` not imported): when `outer` completed.
    assert calls.seen == [(set(), {package, "watched", "other", "outer"})]
    assert hook.fired and hook not in sys.meta_path
    importlib.reload(sys.modules[f"{package}.watched"])
    assert len(calls.seen) == 1


def test_unwatched_imports_leave_it_watching(package):
    hook, calls = _hook(package, "watched")
    importlib.import_module(f"{package}.other")
    assert calls.seen == [] and hook in sys.meta_path
    importlib.import_module(f"{package}.watched")
    assert calls.seen == [(set(), {package, "other", "watched"})]


def test_only_the_package_is_watched(package, tmp_path):
    (tmp_path / f"{package}_sibling.py").write_text("LAST = True\n")  # a name sharing the package's prefix
    hook, _ = _hook(package, "watched")
    assert hook.find_spec(f"{package}_sibling", None) is None  # left to the other finders, untouched
    # The package itself and its modules: the other finders' spec, whose loader answers as the original does.
    assert hook.find_spec(package, None).submodule_search_locations == [str(tmp_path / package)]
    spec = hook.find_spec(f"{package}.other", [str(tmp_path / package)])
    assert spec.origin == str(tmp_path / package / "other.py")
    assert spec.loader.get_source(f"{package}.other") == MODULES["other"]
    assert hook.find_spec(f"{package}.missing", [str(tmp_path / package)]) is None


def test_a_failed_outer_import_still_fires_once_the_watched_module_is_whole(package):
    hook, calls = _hook(package, "watched")
    with pytest.raises(RuntimeError, match="failing: on purpose"):
        importlib.import_module(f"{package}.failing")
    assert hook.fired
    # Called as the failing import unwinds: the failing module, still in sys.modules then, is gone after.
    assert calls.seen == [({"failing"}, {package, "watched"})]
    assert f"{package}.failing" not in sys.modules


def test_a_watched_module_that_fails_to_import_fires_nothing(package):
    hook, calls = _hook(package, "broken", "watched")
    with pytest.raises(RuntimeError, match="broken: on purpose"):
        importlib.import_module(f"{package}.broken")
    assert calls.seen == [] and hook in sys.meta_path
    importlib.import_module(f"{package}.watched")
    assert len(calls.seen) == 1


def test_started_after_the_watched_module_was_imported_it_fires_at_once(package):
    importlib.import_module(f"{package}.watched")
    hook, calls = _hook(package, "watched")
    assert calls.seen == [(set(), {package, "watched"})] and hook not in sys.meta_path


def test_stopped_it_fires_nothing(package):
    hook, calls = _hook(package, "watched")
    hook.stop()
    importlib.import_module(f"{package}.outer")
    assert calls.seen == [] and not hook.fired and hook not in sys.meta_path


def test_stopped_during_an_import_under_way_it_fires_nothing(package):
    hook, calls = _hook(package, "watched")
    importlib.import_module(package).HOOK = hook
    importlib.import_module(f"{package}.stopper")  # imports the watched module, then stops the hook
    assert calls.seen == [] and not hook.fired and hook not in sys.meta_path


def _imported_as(package, watch):
    """What the import system leaves on each module of ``package`` (imported through ``outer``, then a missing
    name), with or without the hook; then forgets the modules."""
    if watch:
        _hook(package, "watched")
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
