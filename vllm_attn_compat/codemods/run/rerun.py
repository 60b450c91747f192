"""The runs users repeat: a rerun over files unchanged since a run the cache holds replays its report.

Pre-commit and CI run ``migrate --check`` on the whole repository at every commit, almost always over a tree
that has not changed or is already migrated. Such a run lists the files, asks each one's status (`stats`),
and replays the report of the cached run over the same bytes: no file is read, nothing is parsed, and none
of the modules that read, index or migrate files is imported (this module imports only the listing, the
rules' codes and the cache's keys). A file whose status changed is read and hashed again; when its bytes
are still those of the cached run (``touch``, a checkout that wrote them back), the run is replayed all the
same. Anything else is a miss, and `runner.run_paths` does the run, taking what was found here along.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_attn_compat.codemods import registry
from vllm_attn_compat.codemods.run import files, sources, stats
from vllm_attn_compat.codemods.run.report import FileError, RunReport

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.engine.rule import Rule
    from vllm_attn_compat.codemods.run.cache import Cache
    from vllm_attn_compat.codemods.run.options import Options


@dataclass
class Prepared:
    """What a run knows before it reads any file; ``started``: the time before any read (`stats.RACY_NS`)."""

    found: files.Discovered
    rules: list[type[Rule]]
    cache: Cache | None
    table: stats.StatTable | None
    started: int
    tried: str | None = None  # the key of the run `replay` looked up (the runner does not look it up again)

    def report(self, mode: str) -> RunReport:
        """A report with what the listing found: skipped and unreadable paths."""
        report = RunReport(mode=mode)
        report.skipped = [(s.path, s.reason) for s in self.found.skipped]
        report.errors += [FileError(u.path, 1, 1, u.reason) for u in self.found.unreadable]
        return report


def prepare(paths: Sequence[str], options: Options) -> Prepared:
    rules = registry.select_rules(options.select, options.ignore)
    found = files.discover(paths, options.exclude, options.base)
    cache = _cache(options.cache_dir, options, rules) if options.cache_dir else None
    table = stats.StatTable(options.cache_dir) if options.cache_dir else None
    return Prepared(found, list(rules), cache, table, time.time_ns())


def _cache(folder: str, options: Options, rules: Sequence[type[Rule]]) -> Cache:
    from vllm_attn_compat.codemods.run.cache import Cache

    settings = ([rule.code for rule in rules], options.unsafe_fixes, options.old_op_calls, options.verifies)
    return Cache(folder, settings)


def replay(prepared: Prepared, mode: str, report: RunReport) -> bool:
    """Put the report of the cached run over the files found, known by their status, into ``report``; False,
    having put nothing, when the cache holds no such run or a file cannot be read as source (the run that
    reads it reports it)."""
    cache, table = prepared.cache, prepared.table
    if cache is None or table is None:
        return False
    if not table.rows:
        return False  # a first run: no file is known, the run that reads them all hashes them
    try:
        digests = _digests(prepared, table)
    finally:
        table.save()
    if digests is None:
        return False
    prepared.tried = cache.run_key(digests, mode)
    replayed = cache.load_run(prepared.tried)
    if replayed is None:
        return False
    findings, changed, report.parsed = replayed
    report.findings += findings
    report.changed += changed
    report.scanned = len(prepared.found.files)
    cache.prune()
    return True


def _digests(prepared: Prepared, table: stats.StatTable) -> dict[str, str] | None:
    """The digest of each file found (path as given), from its status where the table knows it, else from its
    bytes; None at the first file that cannot be read as source, or whose bytes are not those recorded for
    it last: the run is not the cached one (the cache may hold a run over them from another branch, but the
    runner reading every file again costs more than it would save)."""
    found = prepared.found
    digests = {}
    for source_file in [*found.files, *found.excluded]:
        try:
            status = stats.status_of(os.stat(source_file.real_path))
        except OSError:
            return None
        known = table.digest(source_file.real_path, status)
        if known is None:
            try:
                source, stat = sources.read_source(source_file.real_path)
                sources.source_encoding(source)
            except sources.SourceError:
                return None
            known = stats.digest(source)
            last = table.last_digest(source_file.real_path)
            table.record(source_file.real_path, stat, known, prepared.started)
            if last is not None and last != known:
                return None
        digests[source_file.path] = known
    return digests
