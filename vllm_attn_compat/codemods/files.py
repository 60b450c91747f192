"""Which files a run covers, how each is read once and decoded, and how a changed one is written back.

Discovery honours ``.gitignore`` by asking ``git`` itself (``git ls-files``), so every git feature
(nested ignore files, negations, ``info/exclude``, global excludes) behaves as the user expects; outside
a git work tree it walks the folders. Virtual-environment and cache folders are skipped either way.
Symbolic links are used only when they resolve inside the paths given on the command line, so a run
never reads or writes anything it was not pointed at; each real file is visited once.
"""

from __future__ import annotations

import codecs
import fnmatch
import io
import os
import stat
import subprocess
import tempfile
import tokenize
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

PYTHON_SUFFIXES = (".py", ".pyi")

# Folders that hold installed or generated code, never the user's sources.
SKIPPED_FOLDER_NAMES = frozenset(
    {
        ".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", ".direnv",
        "__pypackages__", ".eggs", "site-packages", "node_modules", ".mypy_cache",
        ".pytest_cache", ".ruff_cache", ".hypothesis",
    }
)  # fmt: skip


@dataclass(frozen=True)
class SourceFile:
    """A file to process: ``path`` is what reports show, ``real_path`` is what is read and written."""

    path: str
    real_path: str


@dataclass(frozen=True)
class Skipped:
    """A file left out on purpose (not an error), with the reason shown to the user."""

    path: str
    reason: str


class SourceError(Exception):
    """A file that cannot be used: unreadable, binary, or not decodable with its declared encoding."""

    def __init__(self, message: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


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
    return name in SKIPPED_FOLDER_NAMES or name.endswith(".egg-info") or os.path.isfile(os.path.join(path, "pyvenv.cfg"))


def _git_listing(folder: str) -> list[str] | None:
    """Tracked and untracked-but-not-ignored files under ``folder`` (relative), or None outside git."""
    try:
        listed = subprocess.run(
            ["git", "-C", folder, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=False,
        )
    except OSError:  # git is not installed: walk the folder instead
        return None
    if listed.returncode != 0:
        return None
    names = listed.stdout.decode("utf-8", "surrogateescape").split("\0")
    return sorted({name for name in names if name})


def _walk(folder: str) -> Iterator[str]:
    """Relative paths of the files under ``folder``, not descending into symlinked or skipped folders."""
    for current, folders, files in os.walk(folder):
        folders[:] = sorted(f for f in folders if not _is_skipped_folder(os.path.join(current, f)))
        relative = os.path.relpath(current, folder)
        for name in sorted(files):
            yield name if relative == "." else f"{relative}/{name}"
        # os.walk lists a symlink to a folder under `folders` and does not follow it: offer it as a path.
        for name in folders:
            if os.path.islink(os.path.join(current, name)):
                yield name if relative == "." else f"{relative}/{name}"


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
        self.skipped: list[Skipped] = []
        self.missing: list[str] = []
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

    def add_file(self, path: str) -> None:
        if is_excluded(self._relative_to_base(path), self.exclude):
            return
        real_path = os.path.realpath(path)
        if os.path.islink(path) and not _within(real_path, self.allowed_roots):
            self.skipped.append(Skipped(path, f"symbolic link to {real_path}, outside the given paths"))
            return
        if real_path not in self._seen:
            self._seen.add(real_path)
            self.files.append(SourceFile(path, real_path))

    def add_folder(self, folder: str) -> None:
        listing = _git_listing(folder)
        for relative in listing if listing is not None else _walk(folder):
            path = os.path.join(folder, relative) if folder != "." else relative
            if listing is not None and self._inside_skipped_folder(folder, relative):
                continue
            if os.path.islink(path) and os.path.isdir(path):
                if _within(os.path.realpath(path), self.allowed_roots):
                    continue  # its target is inside a given folder and is visited there
                self.skipped.append(Skipped(path, f"symbolic link to {os.path.realpath(path)}, outside the given paths"))
            elif os.path.isdir(path):  # a git submodule: list it with its own git
                if not _is_skipped_folder(path) and not is_excluded(self._relative_to_base(path), self.exclude):
                    self.add_folder(path)
            elif path.endswith(PYTHON_SUFFIXES) and os.path.lexists(path):
                self.add_file(path)


def discover(paths: Sequence[str], exclude: Sequence[str] = (), base: str = ".") -> tuple[list[SourceFile], list[Skipped], list[str]]:
    """Expand files and folders into the Python files to process.

    Returns the files (in a stable order), the files skipped on purpose, and the given paths that do
    not exist. ``exclude`` globs are matched against paths relative to ``base`` (the folder of the
    configuration file, or the working directory). A file named explicitly is processed whatever its
    suffix, unless an exclude glob matches it.
    """
    discovery = _Discovery(paths, exclude, base)
    for path in paths:
        if os.path.isdir(path):
            discovery.add_folder(path)
        elif os.path.lexists(path):
            discovery.add_file(path)
        else:
            discovery.missing.append(path)
    return discovery.files, discovery.skipped, discovery.missing


def read_source(path: str) -> bytes:
    """Read a file's bytes, turning OS errors into a :class:`SourceError`."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise SourceError(f"could not read the file: {error.strerror or error}") from None


def source_encoding(source: bytes) -> str:
    """The encoding Python would use for ``source`` (BOM, then coding declaration, then UTF-8).

    Raises :class:`SourceError` when the source is binary or not decodable as declared.
    """
    if b"\0" in source:
        offset = source.index(b"\0")
        line, column = position_of(source, offset)
        raise SourceError("binary file (contains a NUL byte); expected Python source text", line, column)
    if source.startswith(codecs.BOM_UTF8):
        encoding = "utf-8-sig"
    elif b"coding" not in source[: source.find(b"\n", source.find(b"\n") + 1) + 1 or len(source)]:
        encoding = "utf-8"  # the fast path: no BOM and no declaration in the first two lines
    else:
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
        except SyntaxError as error:
            raise SourceError(f"invalid encoding declaration: {error.msg}", error.lineno or 1, 1) from None
    try:
        source.decode(encoding)
    except UnicodeDecodeError as error:
        line, column = position_of(source, error.start)
        declared = "UTF-8 (no coding declaration)" if encoding == "utf-8" else encoding
        raise SourceError(
            f"cannot decode byte {source[error.start:error.start + 1]!r}: expected {declared} text", line, column
        ) from None
    return encoding


def position_of(source: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column of a byte offset (the column counts bytes)."""
    line_start = source.rfind(b"\n", 0, offset) + 1
    return source.count(b"\n", 0, offset) + 1, offset - line_start + 1


def write_atomic(path: str, data: bytes, expected_stat: os.stat_result | None = None) -> None:
    """Replace ``path``'s content by ``data`` so that a reader (or a crash) sees the old or the new file.

    The new bytes go to a temporary file in the same folder (same file system), keep the original's
    permission bits, are flushed to disk, then renamed over the original. With ``expected_stat``, a
    file modified since it was read is left alone (:class:`SourceError`), rather than losing that edit.
    """
    current = os.stat(path)
    if expected_stat is not None and (current.st_mtime_ns, current.st_size) != (
        expected_stat.st_mtime_ns,
        expected_stat.st_size,
    ):
        raise SourceError("the file changed on disk during the run; it was not rewritten")
    folder, name = os.path.split(path)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".vac-tmp", dir=folder or ".")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), stat.S_IMODE(current.st_mode))
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
