"""The digest of the code a cached result comes from: this package's codemods, libcst's version, Python's version.

Every key of the cache starts from it (`cache.Cache`), so every run with a cache makes it, a rerun that replays a
whole run included: reading and hashing the codemods' 75 modules (700 kB) took 1.5-2.3 ms of about 40 there. So the
digest is kept in the cache's folder with the status (`stats.Status`) of each file it read, and made again once one
of them changed, a module was added or removed, or Python's or this package's version is another: the trust the
status table gives the project's files (`stats`), more than Python gives its bytecode (a source's size and
``mtime``). A module modified within `stats.RACY_NS` of the moment it was read is not kept by its status. The file
keeps the digests of the latest `INSTALLS_KEPT` installations that ran on the project (its own environment and its
pre-commit hook's, say), each by its modules' absolute paths: runs from each in turn each find theirs.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any

from vllm_attn_compat.codemods.run import cachedir, keyhash, stats

_NAME = "code.json"
_FORMAT = "vllm-attn-compat-code/2"
_CODEMODS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package `vllm_attn_compat.codemods`
INSTALLS_KEPT = 4


def digest(root: str) -> str:
    """The code's digest, kept in the cache ``root`` (``--cache-dir``) by the files' statuses."""
    from vllm_attn_compat import __version__

    started = time.time_ns()
    versions = [__version__, sys.version]
    modules, libcst_version = code_files(), _libcst_version_file()
    try:
        taken = {path: os.stat(path) for path in [*modules, libcst_version] if path}
    except OSError:
        taken = {}  # a module gone since it was listed: the digest is made of what is read, and not kept
    files = {path: list(stats.status_of(stat)) for path, stat in taken.items()}
    # What the digest is kept with: libcst's version file is one of the files where it has one (else its metadata).
    made_of: dict[str, object] | None = None
    if files and libcst_version:
        made_of = {"install": _CODEMODS, "versions": versions, "files": files}
    path = os.path.join(cachedir.entries_folder(root), _NAME)
    kept = _kept(path)
    found = next((str(entry["digest"]) for entry in kept if made_of is not None and entry["of"] == made_of), None)
    if found is not None:
        return found
    made = _made(versions, modules, libcst_version)
    if made_of is not None and not any(stats.racy(stat, started) for stat in taken.values()):
        others = [entry for entry in kept if entry["of"].get("install") != _CODEMODS][: INSTALLS_KEPT - 1]
        text = json.dumps({"format": _FORMAT, "installs": [{"digest": made, "of": made_of}, *others]})
        with contextlib.suppress(OSError):  # the cache's entries warn about a folder that cannot be written
            cachedir.write_text(root, path, text)
    return made


def code_files() -> list[str]:
    """Every module of ``vllm_attn_compat.codemods``, in a fixed order: the code a cached result comes from."""
    found = []
    for folder, names, files in os.walk(_CODEMODS):
        names.sort()
        found += [os.path.join(folder, name) for name in sorted(files) if name.endswith(".py")]
    return found


def _kept(path: str) -> list[dict[str, Any]]:
    """The digests the file ``path`` keeps, each with what it was made of (`digest`), the latest first; none where
    the file is missing or not one this code wrote."""
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read())
        if data["format"] != _FORMAT:
            return []
        return [item for item in data["installs"] if isinstance(item["digest"], str) and isinstance(item["of"], dict)]
    except (OSError, ValueError, TypeError, KeyError):
        return []  # none yet, or not one this code reads


def _made(versions: list[str], modules: list[str], libcst_version: str) -> str:
    """The digest of the versions, libcst's version file (``libcst_version``), and each module's path and bytes."""
    made = keyhash.new("\0".join(versions).encode())
    made.update(_libcst_version(libcst_version))
    for module in modules:
        with open(module, "rb") as handle:
            made.update(os.path.relpath(module, _CODEMODS).encode() + b"\0" + handle.read())
    return made.hexdigest()


def _libcst_version_file() -> str:
    """libcst's version file, found without importing libcst (a quarter of a second); "" where there is none."""
    import importlib.util

    spec = importlib.util.find_spec("libcst")
    if spec is None or spec.origin is None:
        return ""
    return os.path.join(os.path.dirname(spec.origin), "_version.py")


def _libcst_version(path: str) -> bytes:
    """libcst's version file (``path``), else the installed distribution's metadata (30 ms, a tenth of a rerun)."""
    if path:
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except OSError:
            pass
    from importlib import metadata

    try:
        return metadata.version("libcst").encode()
    except metadata.PackageNotFoundError:
        return b"no libcst"
