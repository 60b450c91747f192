"""One release's attention interface (a "snapshot"), read from its ``vllm/`` sources: a folder or a wheel.

The modules read (``SCOPE``): ``vllm/v1/attention/backend.py`` (the backend, impl, builder and metadata
interface), ``vllm/v1/attention/backends/registry.py`` (``AttentionBackendEnum``, ``register_backend``) and every
module of ``vllm/model_executor/layers/attention/`` (the layers and the ops they register). The whole ``vllm/``
tree is scanned for the members vLLM still uses (references.py) and for the abstract members its own concrete
classes leave out (left_out.py). And every module of vLLM's attention packages (``MODULE_TREES``) is listed, read
or not: an import of one a release no longer has raises ImportError there.

A snapshot is JSON-ready::

    {"modules": {module: {name: kind}},
     "classes": {qualified name: {"bases", "kind", "metaclass"?, "deprecated"?, "members": {name: state}}},
     "functions": {qualified name: state},
     "ops": {"vllm::name": state},
     "left_out": {qualified name of a concrete class of vLLM's: ["<interface class>.<member>", ...]},
     "module_files": {module under MODULE_TREES: "package" or "module"}}
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import left_out, references
from .extract import Module

SCOPE_FILES = ("vllm/v1/attention/backend.py", "vllm/v1/attention/backends/registry.py")
SCOPE_FOLDERS = ("vllm/model_executor/layers/attention/",)
# The packages of vLLM's attention code, old layout and new, whose modules a plugin imports.
MODULE_TREES = ("vllm/attention/", "vllm/v1/attention/", "vllm/model_executor/layers/attention/")

Snapshot = dict[str, Any]


class Sources:
    """A release's ``vllm/`` Python files: ``paths()`` ("vllm/..." each, sorted) and ``read(path)``."""

    def paths(self) -> list[str]:
        raise NotImplementedError

    def read(self, path: str) -> str:
        raise NotImplementedError

    def items(self) -> Iterator[tuple[str, str]]:
        for path in self.paths():
            yield path, self.read(path)


class FolderSources(Sources):
    """``root/vllm/**.py``: an unpacked release (``/work/vllm-src/0.34.0``) or an installed one (site-packages)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        if not (root / "vllm").is_dir():
            raise FileNotFoundError(f"{root}: expected a folder holding vllm/, found none")

    def paths(self) -> list[str]:
        found = []
        for folder, dirs, files in os.walk(self.root / "vllm"):
            dirs.sort()
            relative = Path(folder).relative_to(self.root).as_posix()
            found += [f"{relative}/{name}" for name in files if name.endswith(".py")]
        return sorted(found)

    def read(self, path: str) -> str:
        return (self.root / path).read_text(encoding="utf-8", errors="replace")


class WheelSources(Sources):
    """The ``vllm/**.py`` members of a wheel, read straight out of the zip."""

    def __init__(self, wheel: Path) -> None:
        self.zip = zipfile.ZipFile(wheel)
        self._paths = sorted(n for n in self.zip.namelist() if n.startswith("vllm/") and n.endswith(".py"))

    def paths(self) -> list[str]:
        return self._paths

    def read(self, path: str) -> str:
        return self.zip.read(path).decode("utf-8", errors="replace")

    def close(self) -> None:
        self.zip.close()


def in_scope(path: str) -> bool:
    return path in SCOPE_FILES or any(path.startswith(f) and "/" not in path[len(f) :] for f in SCOPE_FOLDERS)


def module_name(path: str) -> tuple[str, bool]:
    """("vllm.a.b", is a package) for "vllm/a/b.py" or "vllm/a/b/__init__.py"."""
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def module_files(paths: Iterator[str] | list[str]) -> dict[str, str]:
    """The modules of ``MODULE_TREES`` among ``paths``: "package" or "module" by dotted name."""
    found = {}
    for path in paths:
        if path.startswith(MODULE_TREES):
            name, is_package = module_name(path)
            found[name] = "package" if is_package else "module"
    return found


def snapshot(sources: Sources) -> Snapshot:
    """The attention interface of the release whose files ``sources`` holds."""
    files = list(sources.items())
    result: Snapshot = {"modules": {}, "classes": {}, "functions": {}, "ops": {}, "left_out": {}}
    result["module_files"] = module_files(path for path, _ in files)
    class_scope_uses: set[str] = set()
    for path, text in files:
        if not in_scope(path):
            continue
        name, is_package = module_name(path)
        module = Module(name, text, is_package)
        result["modules"][name] = dict(sorted(module.provided_names().items()))
        result["classes"].update(module.classes())
        result["functions"].update(module.module_functions())
        class_scope_uses |= module.class_scope_uses()
        for op, state in module.ops().items():
            result["ops"][op] = {"module": name, **state}
    names = {member for cls in result["classes"].values() for member in cls["members"]}
    used = references.used_names(files, names) | (class_scope_uses & names)
    for cls in result["classes"].values():
        for member, state in cls["members"].items():
            if member not in used:
                state["referenced"] = False  # absent: used (the common case, kept out of the data)
    result["left_out"] = left_out.left_out(((*module_name(path), text) for path, text in files), result["classes"])
    for key in result:
        result[key] = dict(sorted(result[key].items()))
    return result
