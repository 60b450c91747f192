"""The runs users repeat: a rerun over files unchanged since a run the cache holds replays its report.

Pre-commit and CI run ``migrate --check`` on the whole repository at every commit, almost always over a tree
that has not changed or is already migrated. Such a run lists the files, asks each one's status (`stats`),
and replays the report of the cached run over the same bytes: no file is read, nothing is parsed, and none
of the modules that read, index or migrate files is imported, nor are the rules (the cache's key names
the rules by the options that select them, and by this package's code).

Two ways to the run's entry, the first a shortcut for the second:

* the statuses of all the files (path as given, real path, size, inode, ``mtime_ns``, ``ctime_ns``) with the
  working directory and the mode, hashed together: the key of a small entry naming the run's key, recorded
  once a run over those very statuses had its entry, and only when no file was racy then (`stats.RACY_NS`).
  It trusts a status exactly as the `stats` table does, without loading the table or hashing every path.
* the table: each file's digest by its status; a file whose status changed is read and hashed again. When
  its bytes are still those of the cached run (``touch``, a checkout that wrote them back), the run is
  replayed all the same; when the cache holds a run over the new bytes (a branch checked out again), that
  run is. When a few files' bytes changed, or a few files are new, and none takes part in the run beyond
  answering its questions alike, the report is the run before's (`bystanders`).

Anything else is a miss, and `runner.run_paths` does the run, taking what was found here along.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from vllm_attn_compat.codemods.run import files, sources, stats
from vllm_attn_compat.codemods.run.report import FileError, RunReport

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.engine.rule import Rule
    from vllm_attn_compat.codemods.run.cache import Cache
    from vllm_attn_compat.codemods.run.options import Options


class Known(NamedTuple):
    """What the rerun found of a file: the status it took, the digest of the bytes of that status (the `stats`
    table's, or of the bytes it read), and the bytes where it read them."""

    stat: os.stat_result
    digest: str
    source: bytes | None


class Prepared:
    """What a run knows before it reads any file; ``started``: the time before any read (`stats.RACY_NS`).

    The rules the options select, and the `stats` table, are found when first asked for: a rerun the
    statuses replay needs neither."""

    def __init__(self, found: files.Discovered, options: Options, cache: Cache | None, started: int) -> None:
        self.found = found
        self.options = options
        self.cache = cache
        self.started = started
        self.tried: str | None = None  # the key of the run `replay` looked up (the runner does not look it up again)
        # Each file `replay` took the status of, by its path as given, when it found no report: the runner reads
        # none of them again unless asked for its bytes.
        self.known: dict[str, Known] = {}
        self._rules: list[type[Rule]] | None = None
        self._table: stats.StatTable | None = None

    @property
    def rules(self) -> list[type[Rule]]:
        if self._rules is None:
            from vllm_attn_compat.codemods import registry

            self._rules = list(registry.select_rules(self.options.select, self.options.ignore))
        return self._rules

    @property
    def table(self) -> stats.StatTable | None:
        if self._table is None and self.options.cache_dir:
            self._table = stats.StatTable(self.options.cache_dir)
        return self._table

    @property
    def excluded_paths(self) -> frozenset[str]:
        return frozenset(source_file.path for source_file in self.found.excluded)

    def report(self, mode: str) -> RunReport:
        """A report with what the listing found: skipped and unreadable paths."""
        report = RunReport(mode=mode)
        report.skipped = [(s.path, s.reason) for s in self.found.skipped]
        report.errors += [FileError(u.path, 1, 1, u.reason) for u in self.found.unreadable]
        return report

    def remember(self, mode: str, run_key: str, statuses: Iterable[tuple[files.SourceFile, os.stat_result]]) -> None:
        """Record that the run ``run_key`` (whose entry the cache holds) is the one over files of these
        statuses, each the status of the bytes whose digest keyed it: the next run over the same statuses
        finds it without the table. Nothing is recorded when a file is missing or racy (`stats.RACY_NS`)."""
        if self.cache is None:
            return
        found = {source_file.path: source_file for source_file in [*self.found.files, *self.found.excluded]}
        by_path = {}
        for source_file, stat in statuses:
            if stats.racy(stat, self.started):
                return
            by_path[source_file.path] = stats.status_of(stat)
        if by_path.keys() != found.keys():
            return
        ordered = [(found[path], by_path[path]) for path in sorted(by_path)]
        self.cache.store_seen(self.cache.seen_key(ordered, self.excluded_paths, mode), run_key)


def prepare(paths: Sequence[str], options: Options) -> Prepared:
    from vllm_attn_compat.codemods.index.names import forget_folders

    forget_folders()  # a run asks which folders are packages afresh (another run in this process may have asked)
    started = time.time_ns()  # before the listing, which may take the files' statuses (`files.SourceFile.status`)
    found = files.discover(paths, options.exclude, options.base)
    cache = _cache(options.cache_dir, options) if options.cache_dir else None
    return Prepared(found, options, cache, started)


def _cache(folder: str, options: Options) -> Cache:
    from vllm_attn_compat.codemods.run.cache import Cache

    # The rules by the options that select them (this package's code, in the key too, decides what they
    # select): the rules' modules are imported only by a run the cache cannot replay.
    select = sorted({code.upper() for code in options.select})
    ignore = sorted({code.upper() for code in options.ignore})
    return Cache(folder, (select, ignore, options.unsafe_fixes, options.old_op_calls, options.verifies))


def replay(prepared: Prepared, mode: str, report: RunReport) -> bool:
    """Put the report of the cached run over the files found, known by their status, into ``report``; False,
    having put nothing, when the cache holds no such run or a file cannot be read as source (the run that
    reads it reports it)."""
    cache = prepared.cache
    if cache is None:
        return False
    if not stats.has_run(cache.root):  # a first run: nothing to replay, and no status to take of each file for that
        return False
    statuses = _statuses(prepared)
    if statuses is None:
        return False
    excluded = prepared.excluded_paths
    run_key = cache.load_seen(cache.seen_key([(f, stats.status_of(s)) for f, s in statuses], excluded, mode))
    remembered = run_key is not None
    edited: dict[str, tuple[str, bytes]] = {}
    added: dict[str, bytes] = {}
    table = None
    if run_key is None:
        table = prepared.table
        if table is None or not table.rows:
            return False  # a first run: no file is known, the run that reads them all hashes them
        # The digests recorded are saved below if the run is replayed; a miss leaves them to the run that follows
        # (its key's), after it has forked its worker: after an edit, that worker is what the rerun waits for.
        read = _digests(prepared, table, statuses)
        if read is None:
            return False
        digests, edited, added = read
        run_key = cache.run_key(digests, excluded, mode)
    prepared.tried = run_key
    replayed = cache.load_run(run_key)
    if replayed is None and (edited or added):
        from vllm_attn_compat.codemods.run import bystanders

        replayed = bystanders.derive(cache, run_key, digests, bystanders.Edits(edited, added), excluded, mode)
    if replayed is None:
        return False
    if table is not None:
        table.save()
    if not remembered:
        prepared.remember(mode, run_key, statuses)
    findings, changed, report.parsed = replayed
    report.findings += findings
    report.changed += changed
    report.scanned = len(prepared.found.files)
    cache.prune()
    return True


def _statuses(prepared: Prepared) -> list[tuple[files.SourceFile, os.stat_result]] | None:
    """Each file found with its status, in the order of their paths; None if one cannot be asked."""
    found = prepared.found
    statuses = []
    try:
        for source_file in sorted([*found.files, *found.excluded], key=_by_path):
            statuses.append((source_file, source_file.status or os.stat(source_file.real_path)))
    except OSError:
        return None
    return statuses


def _by_path(source_file: files.SourceFile) -> str:
    return source_file.path


# Past this many files whose bytes changed or that are new (a checkout of another branch), the rerun is left to
# the runner: what a run over them, or over their old bytes, asks of each is more than the runner's reading.
EDITS_DERIVED = 32


def _digests(
    prepared: Prepared, table: stats.StatTable, statuses: list[tuple[files.SourceFile, os.stat_result]]
) -> tuple[dict[str, str], dict[str, tuple[str, bytes]], dict[str, bytes]] | None:
    """The digest of each file found (path as given), from its status where the table knows it, else from its
    bytes; the files whose bytes changed since the table recorded them last (path -> the digest then, the
    bytes now); and those the table has no record of (path -> bytes: new since). None at the first file that
    cannot be read as source, or the first past `EDITS_DERIVED` changed or new. A file read has its status
    replaced in ``statuses`` by the one it had when read."""
    digests = {}
    edited: dict[str, tuple[str, bytes]] = {}
    added: dict[str, bytes] = {}
    for number, (source_file, stat) in enumerate(statuses):
        known = table.digest(source_file.real_path, stats.status_of(stat))
        source = None
        if known is None:
            try:
                source, stat = sources.read_source(source_file.real_path)
                sources.source_encoding(source)
            except sources.SourceError:
                return None
            statuses[number] = (source_file, stat)
            known = stats.digest(source)
            last = table.last_digest(source_file.real_path)
            table.record(source_file.real_path, stat, known, prepared.started)
            if last != known:
                if len(edited) + len(added) == EDITS_DERIVED:
                    return None
                if last is None:
                    added[source_file.path] = source
                else:
                    edited[source_file.path] = (last, source)
        digests[source_file.path] = known
        prepared.known[source_file.path] = Known(stat, known, source)
    return digests, edited, added
