"""Which files a run covers.

Discovery honours ``.gitignore`` by asking ``git`` itself (``git ls-files``), so every git feature
(nested ignore files, negations, ``info/exclude``, global excludes) behaves as the user expects; outside
a git work tree it walks the folders. Virtual-environment and cache folders are skipped either way.
Symbolic links are used only when they resolve inside the paths given on the command line, so a run
never reads or writes anything it was not pointed at; each real file is visited once.
"""

from __future__ import annotations

import fnmatch
import operator
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

PYTHON_SUFFIXES = (".py", ".pyi")

# Folders that hold installed or generated code, never the user's sources.
SKIPPED_FOLDER_NAMES = frozenset(
    {
        ".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", ".direnv",
        "__pypackages__", ".eggs", "site-packages", "node_modules", ".mypy_cache",
        ".pytest_cache", ".ruff_cache", ".hypothesis", ".vllm-attn-compat-cache",
    }
)  # fmt: skip


class SourceFile(NamedTuple):
    """A file to process: ``path`` is what reports show, ``real_path`` is what is read and written; ``status``
    is the file's as the listing found it, where it took one (git's listing does, of every file)."""

    path: str
    real_path: str
    status: os.stat_result | None = None


class Skipped(NamedTuple):
    """A file left out on purpose (not an error), with the reason shown to the user."""

    path: str
    reason: str


def is_excluded(relative_path: str, patterns: Sequence[str]) -> bool:
    """Whether a ``/``-separated path matches one of the exclude globs.

    A pattern without ``/`` matches any single path component (``tests``, ``*_pb2.py``); a pattern
    with ``/`` matches the path or one of its parent folders (``vendor/*/legacy``).
    """
    parts = relative_path.split("/")
    for pattern in patterns:
        pattern = pattern.rstrip("/")
        if "/" in pattern:
            pattern = pattern.removeprefix("./")
            if any(fnmatch.fnmatchcase("/".join(parts[:n]), pattern) for n in range(1, len(parts) + 1)):
                return True
        elif any(fnmatch.fnmatchcase(part, pattern) for part in parts):
            return True
    return False


def _is_skipped_folder(path: str) -> bool:
    name = os.path.basename(path)
    if name in SKIPPED_FOLDER_NAMES or name.endswith(".egg-info"):
        return True
    return os.path.isfile(os.path.join(path, "pyvenv.cfg"))  # a virtual environment of any name


def _may_be_in_git(folder: str) -> bool:
    """Whether git could find a work tree for ``folder``: a ``.git`` (folder, or file of a linked work tree or
    submodule) there or above, or ``GIT_DIR`` set. Else the folder is walked without starting git at all,
    which costs as much as the rest of a rerun the cache replays."""
    if "GIT_DIR" in os.environ:
        return True
    current = os.path.realpath(folder)  # where git looks from: the folder's physical path
    while True:
        if os.path.lexists(os.path.join(current, ".git")):
            return True
        parent = os.path.dirname(current)
        if parent == current:
            return False
        current = parent


def _git_listing(folder: str) -> list[str] | None:
    """Tracked and untracked-but-not-ignored files under ``folder`` (relative), or None outside git."""
    if not _may_be_in_git(folder):
        return None
    listed = _git(folder, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if listed is None or listed[0] != 0:  # git is not installed, or this is no work tree: walk the folder
        return None
    # A folder the user names is entered even when the enclosing repository ignores it as a whole
    # (site-packages inside a versioned ~/.pyenv); ignore rules then apply below it only.
    if not listed[1]:
        ignored = _git(folder, "check-ignore", "-q", ".")
        if ignored is not None and ignored[0] == 0:
            return None
    names = listed[1].decode("utf-8", "surrogateescape").split("\0")
    return sorted({name for name in names if name})


def _git(folder: str, *arguments: str) -> tuple[int, bytes] | None:
    """``git -C folder ...``'s exit code and output (its errors are dropped), or None if git cannot be started.
    Started with `os.posix_spawnp` where there is one: importing `subprocess` costs as much as git's whole
    listing of a fork, in a rerun the cache replays."""
    command = ["git", "-C", folder, *arguments]
    if not hasattr(os, "posix_spawnp"):
        import subprocess

        try:
            done = subprocess.run(command, capture_output=True, check=False)
        except OSError:
            return None
        return done.returncode, done.stdout
    reading, writing = os.pipe()
    errors = None
    try:
        errors = os.open(os.devnull, os.O_WRONLY)
        actions = [(os.POSIX_SPAWN_DUP2, writing, 1), (os.POSIX_SPAWN_DUP2, errors, 2)]
        process = os.posix_spawnp("git", command, os.environ, file_actions=actions)
    except OSError:
        os.close(reading)
        return None
    finally:
        os.close(writing)
        if errors is not None:
            os.close(errors)
    with os.fdopen(reading, "rb") as output:
        listed = output.read()
    _, status = os.waitpid(process, 0)
    return os.waitstatus_to_exitcode(status), listed


def _walk(folder: str) -> Iterator[tuple[str, str, None]]:
    """``(relative path, kind)`` of the Python files (``file``) and the symlinks (``link``) under ``folder``.

    ``os.scandir`` answers "folder? symlink?" from the directory listing itself, without a system
    call per entry; symlinked and skipped folders are not descended into.
    """
    stack = [("", folder)]
    while stack:
        relative, current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:  # unreadable folder: nothing in it can be processed
            continue
        for entry in entries:
            name = f"{relative}/{entry.name}" if relative else entry.name
            if entry.is_symlink():
                yield name, "link", None
            elif entry.is_dir():
                if not _is_skipped_folder(entry.path):
                    stack.append((name, entry.path))
            elif entry.name.endswith(PYTHON_SUFFIXES):
                yield name, "file", None


def _under(folder: str) -> Callable[[str], str]:
    """``os.path.join(folder, relative)`` for the many paths listed in one folder (a tenth of its cost, a few
    milliseconds of a rerun over 1,500 files): the folder's prefix made once. ``relative`` is never absolute."""
    if os.altsep:  # Windows: drives, two separators
        return lambda relative: os.path.join(folder, relative)
    prefix = folder if not folder or folder.endswith("/") else folder + "/"
    return prefix.__add__


def _within(real_path: str, roots: Iterable[str]) -> bool:
    return any(real_path == root or real_path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


class _Discovery:
    def __init__(self, paths: Sequence[str], exclude: Sequence[str], base: str) -> None:
        self.exclude = exclude
        self.base = os.path.abspath(base)
        # Symlinks may point anywhere inside what the user named: folders, or files that are no links.
        self.allowed_roots = [
            os.path.realpath(p) for p in paths if os.path.isdir(p) or (os.path.isfile(p) and not os.path.islink(p))
        ]
        self.files: list[SourceFile] = []
        self.excluded: list[SourceFile] = []  # matched an exclude glob: read for context, never changed
        self.skipped: list[Skipped] = []
        self.unreadable: list[Skipped] = []  # given paths that do not exist, broken links
        self._seen: set[str] = set()
        self._skipped_folders: dict[str, bool] = {}

    def _inside_skipped_folder(self, folder: str, relative: str) -> bool:
        """Whether a listed file lies in a virtual-environment or cache folder below ``folder``."""
        parent = relative.rpartition("/")[0]
        if not parent:
            return False
        key = os.path.join(folder, parent)
        if key not in self._skipped_folders:
            self._skipped_folders[key] = self._inside_skipped_folder(folder, parent) or _is_skipped_folder(key)
        return self._skipped_folders[key]

    def _relative_to_base(self, path: str) -> str:
        absolute = os.path.abspath(path)
        if _within(absolute, [self.base]):
            return os.path.relpath(absolute, self.base).replace(os.sep, "/")
        return absolute.replace(os.sep, "/")

    def add_named_file(self, path: str) -> None:
        """A file given on the command line: used whatever its suffix, unless excluded."""
        if os.path.islink(path):
            if not os.path.exists(path):
                self._add_link(path)
                return
            real_path = os.path.realpath(path)
            if not _within(real_path, self.allowed_roots):
                self.skipped.append(Skipped(path, f"symbolic link to {real_path}, outside the given paths"))
                return
        self._add(path, os.path.realpath(path), self._excluded(path))

    def add_folder(self, folder: str) -> None:
        listing = _git_listing(folder)
        real_folder = _under(os.path.realpath(folder))
        in_folder = _under(folder) if folder != "." else str
        entries = _walk(folder) if listing is None else self._git_entries(folder, listing)
        for relative, kind, status in entries:
            path = in_folder(relative)
            if kind == "link":
                self._add_link(path)
            elif kind == "folder":  # a git submodule: listed by its own git
                if not _is_skipped_folder(path):
                    self.add_folder(path)
            else:
                # No symlink on the way down (those are never descended into): no realpath needed.
                self._add(path, real_folder(relative), self._excluded(path), status)

    def _git_entries(self, folder: str, listing: list[str]) -> Iterator[tuple[str, str, os.stat_result | None]]:
        for relative in listing:
            if self._inside_skipped_folder(folder, relative):
                continue
            is_python = relative.endswith(PYTHON_SUFFIXES)
            if not is_python and "." in relative.rpartition("/")[2]:
                continue  # not Python, and no submodule (those are folders without a suffix)
            try:
                status = os.lstat(os.path.join(folder, relative))
            except OSError:  # tracked but deleted in the work tree
                continue
            if stat.S_ISLNK(status.st_mode):
                yield relative, "link", None
            elif stat.S_ISDIR(status.st_mode):
                yield relative, "folder", None
            elif is_python:  # a regular file's status, kept: a rerun asks no file twice
                yield relative, "file", status if stat.S_ISREG(status.st_mode) else None

    def _excluded(self, path: str) -> bool:
        return bool(self.exclude) and is_excluded(self._relative_to_base(path), self.exclude)

    def _add(self, path: str, real_path: str, excluded: bool = False, status: os.stat_result | None = None) -> None:
        if real_path not in self._seen:
            self._seen.add(real_path)
            (self.excluded if excluded else self.files).append(SourceFile(path, real_path, status))

    def _add_link(self, path: str) -> None:
        if path.endswith(PYTHON_SUFFIXES) and not os.path.exists(path):
            reason = "could not read the file: broken symbolic link (missing target, or a loop)"
            self.unreadable.append(Skipped(path, reason))
            return
        if not path.endswith(PYTHON_SUFFIXES) and not os.path.isdir(path):
            return  # a link to something that is not Python: nothing to say about it
        real_path = os.path.realpath(path)
        if not _within(real_path, self.allowed_roots):
            self.skipped.append(Skipped(path, f"symbolic link to {real_path}, outside the given paths"))
        elif os.path.isfile(real_path) and path.endswith(PYTHON_SUFFIXES):
            self._add(path, real_path, self._excluded(path))
        # A link to a folder inside the given paths: that folder is visited where it really is.


class Discovered(NamedTuple):
    files: list[SourceFile]  # to process, in a stable order
    skipped: list[Skipped]  # left out on purpose, with the reason
    unreadable: list[Skipped]  # given paths that do not exist, broken or looping symbolic links
    # Matched an exclude glob: never changed nor reported, but read for what decides the others' fixes
    # (`runner`: a caller in an excluded test still withholds the fix that would break it).
    excluded: list[SourceFile]


def discover(paths: Sequence[str], exclude: Sequence[str] = (), base: str = ".") -> Discovered:
    """Expand files and folders into the Python files to process.

    ``exclude`` globs are matched against paths relative to ``base`` (the folder of the configuration
    file, or the working directory). A file named explicitly is processed whatever its
    suffix, unless an exclude glob matches it.
    """
    discovery = _Discovery(paths, exclude, base)
    for path in paths:
        if os.path.isdir(path):
            discovery.add_folder(path)
        elif os.path.lexists(path):
            discovery.add_named_file(path)
        else:
            discovery.unreadable.append(Skipped(path, "no such file or directory"))
    by_path = operator.attrgetter("path")
    return Discovered(
        sorted(discovery.files, key=by_path),
        discovery.skipped,
        discovery.unreadable,
        sorted(discovery.excluded, key=by_path),
    )
