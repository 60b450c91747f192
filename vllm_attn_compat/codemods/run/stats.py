"""Which files are unchanged since a run read them, known from their status alone (as git, ruff and mypy do).

A rerun over an unchanged tree must not read its files: reading and hashing torch's 46 MB costs more than
the whole report it replays. The table keeps, for each file a run read, its status (size, inode, ``mtime_ns``
and ``ctime_ns``) and the SHA-256 of the bytes read. A file whose status is the same is trusted to hold the
same bytes; one whose status differs is read and hashed again (the content-hash fallback: ``touch`` or a
``git checkout`` that writes the same bytes back still finds the run's entry).

What the status cannot tell, and how it is handled:

* A file modified again within its timestamps' granularity (a few milliseconds on Linux, up to 2 s on FAT)
  after the run read it keeps its ``mtime_ns``, and its size when the edit keeps it. Git's "racy" rule: a
  row is not trusted for a file whose ``mtime`` or ``ctime`` is less than `RACY_NS` older than the moment the
  run started reading; such a file is hashed again by the next run, and trusted once it is old enough. (Its
  digest is kept, with a status no file has: what the run read is what an edit since changed, `bystanders`.)
* ``ctime`` cannot be set by a user: an edit followed by ``os.utime`` restoring the old ``mtime_ns`` changes it.
  The one change the table cannot see keeps the size, the inode, and both timestamps to the nanosecond:
  that takes setting the system clock back.

A first run, with no table, hashes every file: where there are enough, in a process of its own (`hasher`),
while the run reads and scans them.

The table is one JSON file in the cache folder (its rows do not depend on this tool's version or options:
a file's bytes are the same whoever read them), rows keyed by absolute path, written atomically. A table
that cannot be read or parsed is ignored (every file is then hashed, as without it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Mapping

from vllm_attn_compat.codemods.run import cachedir, sha256

# Files whose mtime or ctime is this close to (or after) the start of the run that read them are not
# trusted by their status next time (FAT's timestamps have a 2 s granularity).
RACY_NS = 3_000_000_000
# Rows of files this run did not see are kept (other paths given another time), up to this many in all.
MAX_ROWS = 200_000
_NAME = "stats.json"
_FORMAT = "vllm-attn-compat-stats/1"

Status = tuple[int, int, int, int]  # size, inode, mtime_ns, ctime_ns
# The status recorded with the digest of a racy file: no file's, so its digest is never trusted by status.
UNTRUSTED: Status = (-1, -1, -1, -1)
# A file's row: its status, then the digest of the bytes read with it (as the table's file holds it, a JSON array).
Row = tuple[int, int, int, int, str]


def digest(source: bytes) -> str:
    """What the table, and `cache.Cache.run_key`, know a file's bytes by."""
    return raw_digest(source).hex()


def raw_digest(source: bytes) -> bytes:
    """`digest` as bytes (what the `hasher` process shares with the run): SHA-256 (`sha256`)."""
    return sha256.digest(source)


def status_of(stat: os.stat_result) -> Status:
    return (stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns)


def racy(stat: os.stat_result, started_ns: int) -> bool:
    """Whether the file was modified too close to ``started_ns`` (the moment a run started reading) for its status
    to tell its bytes."""
    return max(stat.st_mtime_ns, stat.st_ctime_ns) >= started_ns - RACY_NS


def table_path(folder: str) -> str:
    """Where the table lives in the cache's entries folder ``folder`` (`cachedir.entries_folder`)."""
    return os.path.join(folder, _NAME)


def has_run(root: str) -> bool:
    """Whether the cache in ``root`` (``--cache-dir``) holds a table: every run with a cache saves the one of the
    files it read, so without it this is a first run, with nothing to replay."""
    return os.path.exists(table_path(cachedir.entries_folder(root)))


class StatTable:
    """Digests of files by their status: load once per run, look up, then record what the run read."""

    def __init__(self, root: str) -> None:
        """``root``: the cache's folder (``--cache-dir``)."""
        self.root = root
        self.path = table_path(cachedir.entries_folder(root))
        self.rows: dict[str, Row] = {}
        self._changed = False
        # Rows are by absolute path: `os.path.abspath` would ask the system for the working directory for each
        # file, twice a file on a first run (a run does not change directory).
        self._cwd = os.getcwd()
        self._folders: dict[str, str] = {}  # each folder of a path given, made absolute (`_absolute`), with a /
        try:
            with open(self.path, "rb") as handle:
                data = json.loads(handle.read())
            if data.get("format") != _FORMAT:
                return
            for path, (size, inode, mtime, ctime, digest) in data["rows"].items():
                if not (all(type(n) is int for n in (size, inode, mtime, ctime)) and _is_digest(digest)):
                    raise TypeError(f"malformed row for {path!r}")
                self.rows[path] = (size, inode, mtime, ctime, digest)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            self.rows = {}  # no table, or one this version cannot read: every file is hashed

    def digest(self, real_path: str, status: Status) -> str | None:
        """The digest of the file's bytes when its status is the one recorded, else None."""
        if not self.rows:  # a first run
            return None
        row = self.rows.get(self._absolute(real_path))
        return row[4] if row is not None and row[:4] == status else None

    def last_digest(self, real_path: str) -> str | None:
        """The digest recorded for the file, whatever its status now."""
        row = self.rows.get(self._absolute(real_path))
        return None if row is None else row[4]

    def record(self, real_path: str, stat: os.stat_result, digest: str, started_ns: int) -> None:
        """Remember the digest of the bytes a run read from ``real_path`` after taking ``stat``, unless the
        file is racy (modified too close to ``started_ns``, the moment the run started reading)."""
        path = self._absolute(real_path)
        if racy(stat, started_ns):
            row: Row = (*UNTRUSTED, digest)
        else:
            row = (stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, digest)
        if self.rows.get(path) != row:
            self.rows[path] = row
            self._changed = True

    def _absolute(self, real_path: str) -> str:
        """``os.path.abspath(real_path)``, with the working directory the run started in; each folder made absolute
        once (a run's files share them, and a file's name is neither ``.`` nor ``..``)."""
        if os.altsep:  # Windows: drives, two separators; made whole
            return os.path.normpath(os.path.join(self._cwd, real_path))
        head = real_path[: real_path.rfind("/") + 1]
        prefix = self._folders.get(head)
        if prefix is None:
            absolute = os.path.normpath(os.path.join(self._cwd, head))
            prefix = self._folders[head] = absolute if absolute.endswith("/") else absolute + "/"
        return prefix + real_path[len(head) :]

    def save(self, seen: Iterable[str] = ()) -> None:
        """Write the table if it changed (atomically; a failure costs the next run a hash of each file).
        Beyond `MAX_ROWS`, the rows of paths not in ``seen`` (absolute) go first."""
        if not self._changed:
            return
        rows: Mapping[str, Row] = self.rows
        if len(rows) > MAX_ROWS:
            keep = set(seen)
            rows = {path: row for path, row in rows.items() if path in keep}
        # json.dumps is in C, unlike json.dump (see cache.Cache._write); the rows are JSON arrays as they are.
        text = json.dumps({"format": _FORMAT, "rows": rows}, separators=(",", ":"))
        with contextlib.suppress(OSError):  # the cache's own writes warn about an unwritable folder
            cachedir.write_text(self.root, self.path, text)
        self._changed = False


_DIGEST = re.compile(r"[0-9a-f]{64}")


def _is_digest(value: object) -> bool:
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None
