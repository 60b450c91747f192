"""A first run's digests, taken on a core the run leaves idle.

A run with a cache knows each file by the SHA-256 of its bytes (`stats`): a rerun finds its report by them. A rerun
takes them from the status table; the first run over a tree has none and hashes every file, 46 MB on torch's tree,
on the path of a run that has little else to do there but read and scan. So the first run (allowed more than one
process, ``--jobs``) forks a process, at the lowest priority, that reads and hashes the files while the run reads,
scans and indexes them (the early worker importing libcst has the other core first).

The run needs the digests only at its end (`reading.Reading.settle`). It then takes what the process has done so
far, without waiting: a file's digest where both read the file with the same status and the file is not racy
(`stats.RACY_NS`: its status cannot tell its bytes); any other file it hashes itself, from the bytes it read (those
the process did not reach on a busy machine, and any edited between the two reads). The process only reads files and
writes to memory it shares with the run, so the run ends it with a signal, whatever it is doing (its work done, it
waits for that; Ctrl-C is the run's to handle). A process that fails to start leaves the run to hash every file
itself, as without it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import struct
from collections.abc import Sequence

from vllm_attn_compat.codemods.run import parallel, sources, stats

# Below this many files, hashing them (a few milliseconds) costs less than forking.
FROM_FILES = 200
# A file's record: its status when the process read it (`stats.Status`; size -1 for a file that is not source text),
# then `stats.raw_digest` of those bytes.
Record = tuple[int, int, int, int, bytes]
# The memory shared with the process: how many files it has hashed, then their records.
_DONE = struct.Struct("<q")
_RECORD = struct.Struct("<qqqq32s")


class Hasher:
    """The process hashing the files of ``real_paths``, in their order, started at once."""

    def __init__(self, real_paths: Sequence[str]) -> None:
        self._paths = list(real_paths)
        self._shared = mmap.mmap(-1, _DONE.size + max(len(self._paths), 1) * _RECORD.size)
        # The process waits, its work done, until the run ends (this end closed, by `close` or the run's own end):
        # its pid stays its own until the run has signalled it, even where children are reaped as they exit.
        waiting, self._lifeline = os.pipe()
        try:
            self._pid = os.fork()
        except OSError:
            os.close(waiting)
            os.close(self._lifeline)
            raise
        if self._pid == 0:  # pragma: no cover - the forked process (its work is tested through the run's)
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run's to handle: it ends this process then
                os.close(self._lifeline)
                os.nice(19)  # the run's own process and workers first
                _hash(self._paths, self._shared)
                os.read(waiting, 1)
            finally:
                os._exit(0)
        os.close(waiting)

    @property
    def hashed(self) -> int:
        """How many files the process has hashed so far (the first ones of ``real_paths``)."""
        return int(_DONE.unpack_from(self._shared)[0])

    def records(self) -> dict[str, Record]:
        """What the process found of each file it has hashed so far (by real path): `Record`; the process is stopped.
        (Made in C, without a step per file: a run takes it for every file at its end.)"""
        self.close()
        done = self.hashed
        records = _RECORD.iter_unpack(self._shared[_DONE.size : _DONE.size + done * _RECORD.size])
        return dict(zip(self._paths[:done], records, strict=True))

    def close(self) -> None:
        """Stop the process (a run leaves none behind)."""
        if self._pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self._pid, 0)
            os.close(self._lifeline)
            self._pid = 0


def start(real_paths: Sequence[str]) -> Hasher | None:
    """A `Hasher` where one pays (enough files, a platform that forks safely), else None."""
    if len(real_paths) < FROM_FILES or not may_fork():
        return None
    try:
        return Hasher(real_paths)
    except OSError:
        return None


def may_fork() -> bool:
    """Whether this process may fork the hasher now: on a platform that forks safely, with no other thread running
    (one may hold a lock the forked process would then wait for forever; Python 3.12 warns). The command line has
    none then; a program calling the runner may."""
    import threading

    return parallel.forks_safely() and threading.active_count() == 1


def _hash(paths: Sequence[str], shared: mmap.mmap) -> None:
    for number, path in enumerate(paths):
        try:
            source, stat = sources.read_source(path)
            sources.source_encoding(source)  # the table knows only files that decode (`reading.Scanned.encoding`)
            record = (*stats.status_of(stat), stats.raw_digest(source))
        except sources.SourceError:
            record = (-1, 0, 0, 0, b"")
        _RECORD.pack_into(shared, _DONE.size + number * _RECORD.size, *record)
        _DONE.pack_into(shared, 0, number + 1)  # after the record: the run reads no record half-written
