"""Where the cache lives by default, and how a folder made for it keeps out of git and backups.

The default is a ``.vllm-attn-compat-cache`` folder at the project's root (the folder of the nearest
``pyproject.toml``, else the working directory), as ruff's ``.ruff_cache``, mypy's ``.mypy_cache`` and
pytest's ``.pytest_cache``: it goes away with the project, a CI job caches it by that one path, pre-commit
finds it where it runs, and its entries (keyed on the project's paths) are never shared with another
checkout. A folder the tool creates for its cache holds a ``.gitignore`` of ``*`` (git ignores it without an
entry in the project's own) and a ``CACHEDIR.TAG`` (backup tools skip it); a folder that existed before (say,
``--cache-dir .``) is never given either.
"""

from __future__ import annotations

import contextlib
import os

DEFAULT_NAME = ".vllm-attn-compat-cache"
# Turns the cache off, whatever the configuration says (as RUFF_NO_CACHE): for test suites and read-only trees.
NO_CACHE_VARIABLE = "VLLM_ATTN_COMPAT_NO_CACHE"

_TAG = (
    b"Signature: 8a477f597d28d172789f06886806bc55\n"
    b"# This file is a cache directory tag created by vllm-attn-compat.\n"
    b"# For information about cache directory tags see https://bford.info/cachedir/\n"
)


def entries_folder(root: str) -> str:
    """Where the cache in ``root`` (``--cache-dir``) keeps its entries and `stats` table: a folder of its own,
    so that ``--cache-dir`` may name a folder shared with other tools."""
    return os.path.join(root, "vllm-attn-compat")


def default_folder(project_root: str) -> str:
    return os.path.join(project_root, DEFAULT_NAME)


def disabled_by_environment() -> bool:
    return os.environ.get(NO_CACHE_VARIABLE, "") not in ("", "0", "false", "False")


def write_text(root: str, path: str, text: str) -> None:
    """Write ``text`` to ``path``, a file in the cache ``root`` (made as `make` makes it), atomically: the file
    is complete or as it was. Raises OSError, leaving no temporary file behind."""
    make(root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomically(path, text.encode("utf-8"))


def write_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to ``path``, in an existing folder, so that a reader finds the file complete or as it was.
    Raises OSError, leaving no temporary file behind."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def make(folder: str) -> None:
    """Create ``folder`` (and its parents) for the cache, tagged, unless it exists; raises OSError."""
    if os.path.isdir(folder):
        return
    os.makedirs(folder, exist_ok=True)
    with contextlib.suppress(OSError):  # the tags are a courtesy: the cache works without them
        for name, content in ((".gitignore", b"# Created by vllm-attn-compat.\n*\n"), ("CACHEDIR.TAG", _TAG)):
            with open(os.path.join(folder, name), "xb") as handle:
                handle.write(content)
