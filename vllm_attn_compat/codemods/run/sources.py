"""Reading a source file once, deciding how it decodes, and writing a changed one back atomically.

Bytes are what the rules work on (libcst honours the BOM and coding declaration itself); decoding here
only proves the file is text in its declared encoding, so a binary or mis-encoded file is reported
with the position of the first bad byte instead of failing somewhere deeper.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import stat


class SourceError(Exception):
    """A file that cannot be used: unreadable, binary, or not decodable with its declared encoding."""

    def __init__(self, message: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


# O_BINARY: on Windows a plain O_RDONLY descriptor would translate CRLF to LF.
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_BINARY", 0)


def read_source(path: str) -> tuple[bytes, os.stat_result]:
    """A file's bytes and its status when read (to detect a later change), or a :class:`SourceError`."""
    try:
        descriptor = os.open(path, _READ_FLAGS)
        try:
            status = os.fstat(descriptor)
            wanted = max(status.st_size, 1) + 1
            source = os.read(descriptor, wanted)
            if len(source) == wanted:  # the file grew since fstat: read the rest
                chunks = [source]
                while chunks[-1]:
                    chunks.append(os.read(descriptor, 1 << 20))
                source = b"".join(chunks)
        finally:
            os.close(descriptor)
    except OSError as error:
        raise SourceError(f"could not read the file: {error.strerror or error}") from None
    return source, status


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
        import io
        import tokenize

        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
        except SyntaxError as error:
            raise SourceError(f"invalid encoding declaration: {error.msg}", error.lineno or 1, 1) from None
    if encoding == "utf-8" and source.isascii():
        return encoding  # most source files: valid without decoding, at a tenth of the cost
    try:
        source.decode(encoding)
    except UnicodeDecodeError as error:
        line, column = position_of(source, error.start)
        declared = "UTF-8 (no coding declaration)" if encoding == "utf-8" else encoding
        raise SourceError(
            f"cannot decode byte {source[error.start : error.start + 1]!r}: expected {declared} text", line, column
        ) from None
    return encoding


def position_of(source: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column of a byte offset (the column counts bytes)."""
    line_start = source.rfind(b"\n", 0, offset) + 1
    return source.count(b"\n", 0, offset) + 1, offset - line_start + 1


def write_atomic(path: str, data: bytes, expected_stat: os.stat_result | None = None) -> None:
    """Replace ``path``'s content by ``data`` so that a reader (or a crash) sees the old or the new file.

    The new bytes go to a temporary file in the same folder (same file system), keep the original's
    owner and permission bits, are flushed to disk, then renamed over the original. Where the system
    allows (Linux), the temporary file has no name until that moment: a run killed while writing
    leaves nothing behind. With ``expected_stat``, a file modified since it was read is left alone
    (:class:`SourceError`), rather than losing that edit.
    """
    current = os.stat(path)
    if expected_stat is not None and (current.st_mtime_ns, current.st_size) != (
        expected_stat.st_mtime_ns,
        expected_stat.st_size,
    ):
        raise SourceError("the file changed on disk during the run; it was not rewritten")
    folder, name = os.path.split(path)
    folder = folder or "."
    temporary = _written_unnamed(folder, name, data, current) or _written_named(folder, name, data, current)
    try:
        os.replace(temporary, path)
    except BaseException:
        _remove(temporary)
        raise


def _fill(descriptor: int, data: bytes, like: os.stat_result, path: str | None = None) -> None:
    """Write ``data`` to the new file, with the owner (when allowed) and permissions of ``like``, and
    flush it to disk; closes the descriptor. ``path`` names the file where permissions can only be
    set by name (Windows)."""
    mode = stat.S_IMODE(like.st_mode)  # the file was created private (0600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
        handle.flush()
        if hasattr(os, "fchown"):  # keep the owner when allowed (root running over a user's tree)
            with contextlib.suppress(OSError):
                os.fchown(handle.fileno(), like.st_uid, like.st_gid)
        if hasattr(os, "fchmod"):
            os.fchmod(handle.fileno(), mode)
        os.fsync(handle.fileno())
    if not hasattr(os, "fchmod") and path is not None:
        os.chmod(path, mode)


def _written_unnamed(folder: str, name: str, data: bytes, like: os.stat_result) -> str | None:
    """``data`` in a file created without a name (``O_TMPFILE``) and named only once complete; returns
    that name, or None where this cannot be done (another system, a file system without it, no
    ``/proc`` to name it through)."""
    if not hasattr(os, "O_TMPFILE") or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        descriptor = os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o600)
    except OSError:  # e.g. EOPNOTSUPP on a file system without unnamed files
        return None
    # _fill closes the descriptor, and the file would vanish with it: a duplicate keeps it until named.
    keeper = os.dup(descriptor)
    try:
        _fill(descriptor, data, like)  # a failure here (a full disk) would recur: it is raised
        try:
            return _name(keeper, folder, name)
        except OSError:  # e.g. a /proc that does not allow it: write a named temporary file instead
            return None
    finally:
        os.close(keeper)


def _name(descriptor: int, folder: str, name: str) -> str:
    """Give the unnamed file open as ``descriptor`` a fresh name next to ``name``; returns that path."""
    # A folder descriptor makes Python call linkat(AT_SYMLINK_FOLLOW), which links the file the /proc
    # entry stands for; a plain link() would try to link the /proc entry itself.
    folder_descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for _ in range(100):
            temporary = f".{name}.{os.urandom(4).hex()}.vac-tmp"
            try:
                os.link(f"/proc/self/fd/{descriptor}", temporary, dst_dir_fd=folder_descriptor, follow_symlinks=True)
                return os.path.join(folder, temporary)
            except FileExistsError:
                continue
    finally:
        os.close(folder_descriptor)
    raise FileExistsError(f"no free temporary name next to {name} in {folder}")


def _written_named(folder: str, name: str, data: bytes, like: os.stat_result) -> str:
    """``data`` in a new file named at once (``tempfile.mkstemp``); returns its name."""
    import tempfile  # only runs that write, where files cannot be unnamed, pay for this import

    descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".vac-tmp", dir=folder)
    try:
        _fill(descriptor, data, like, temporary)
    except BaseException:
        _remove(temporary)
        raise
    return temporary


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
