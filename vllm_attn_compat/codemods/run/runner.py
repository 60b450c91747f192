"""``migrate`` over files and folders: the funnel that keeps whole-repository runs fast, and the writes.

0. With the cache (`cache`), a rerun in the same mode over the same unchanged files replays the last report:
   nothing is read, parsed or imported beyond this module and the cache's.
1. Every file is read once, as bytes, and checked to be decodable text; a file the cache vouches for by its status
   only when its bytes are asked for (`reading`), and what the run asks of its bytes is kept with its results.
2. A literal scan (anchored ``bytes.find``) finds the files worth parsing at all. The first such file read afresh
   that will probably need libcst starts the worker processes (`parallel.Pool`, owned here), which import libcst
   while the rest goes on.
3. The class hierarchy's rounds (`rounds`, stdlib ``ast``): the files that mention vLLM, then, round after round,
   the files naming an attention class found so far, and any file, whatever it imports, that may call a method
   whose fix the call-site analysis decides. Files an exclude glob matches take part in this pass (a base class,
   a caller that withholds a fix), and in nothing else: they are never migrated, and nothing is reported in them.
4. Once the rounds have settled, libcst migrates the files holding a rule's tokens (for rules scoped to attention
   classes, only files whose index shows an attention class), in the workers when there are enough, each
   migration the cache holds serving instead while the hierarchy answers its questions the same.
5. A rewritten file is written only if every invariant in :mod:`safety` holds, atomically.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from typing import TYPE_CHECKING, Any

from vllm_attn_compat.codemods.findings import TargetRelease
from vllm_attn_compat.codemods.index.names import forget_folders
from vllm_attn_compat.codemods.run import cache as cache_module
from vllm_attn_compat.codemods.run import files, parallel, progress, reading, sources, worker
from vllm_attn_compat.codemods.run.options import Options
from vllm_attn_compat.codemods.run.reading import Changed, RunFile
from vllm_attn_compat.codemods.run.report import FileError, RunReport, unified_diff

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.engine.rule import Rule
    from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, ModuleIndex

__all__ = ["Options", "run_paths", "run_source"]


def run_paths(
    paths: Sequence[str],
    options: Options,
    *,
    emit_diff: Callable[[str], object] = lambda text: None,
    on_miss: Callable[[], object] = lambda: None,
) -> RunReport:
    """Migrate the given files and folders; ``emit_diff`` receives each file's unified diff (diff mode).
    ``on_miss()`` is called before a run the cache does not replay (the command line checks the configured rule
    codes then: a replayed run's codes were valid when it was made, and checking imports every rule)."""
    forget_folders()  # which folders are packages is asked afresh (an earlier run in this process may have seen others)
    try:
        started = time.time_ns()  # before any file's status is taken (`cache.racy`)
        found = files.discover(paths, options.exclude, options.base)
        cache = _cache(options) if options.cache_dir else None
        report = _listing(found, options)
        if cache is not None and cache.replay(found, options.mode, report):
            return report
        on_miss()
        listed = [os.path.realpath(path) for path in paths if os.path.isdir(path)]
        try:
            # A run that writes reads each file before it writes any (`Changed` would start it again half-written).
            return _run(found, listed, options, cache, emit_diff, started, trusting=options.mode != "write")
        except Changed:
            # A file the cache vouched for changed during the run: what the run asked of its bytes may mix two
            # versions. The run starts again, reading every file. (Nothing was written: see above.)
            return _run(found, listed, options, cache, emit_diff, started, trusting=False)
    finally:
        forget_folders()


def _cache(options: Options) -> cache_module.Cache:
    """The cache of the project's root, for the settings that change results (the rules by the options that select
    them: this package's code, in the key too, decides what they select)."""
    assert options.cache_dir is not None
    select = sorted({code.upper() for code in options.select})
    ignore = sorted({code.upper() for code in options.ignore})
    settings = [select, ignore, options.unsafe_fixes, options.old_op_calls, list(_release(options))]
    return cache_module.Cache(options.cache_dir, os.path.abspath(options.base), settings)


def _release(options: Options) -> TargetRelease:
    """What the rules see of the run's target: its release and the oldest it allows (the newest release without
    one)."""
    target = options.target
    if target is None:
        from vllm_attn_compat.codemods.target_version import newest_target

        target = newest_target()
    return TargetRelease(target.release, target.oldest)


def _listing(found: files.Discovered, options: Options) -> RunReport:
    """A report with what the listing found: skipped and unreadable paths."""
    report = RunReport(mode=options.mode, target=options.target)
    report.skipped = [(s.path, s.reason) for s in found.skipped]
    report.errors += [FileError(u.path, 1, 1, u.reason) for u in found.unreadable]
    return report


def _run(
    found: files.Discovered,
    listed: Sequence[str],
    options: Options,
    cache: cache_module.Cache | None,
    emit_diff: Callable[[str], object],
    started: int,
    *,
    trusting: bool,
) -> RunReport:
    """`run_paths` over the files found, the cache holding no report of them. The run's worker processes are
    started and stopped here, and only here."""
    pool = parallel.Pool(options.jobs)
    try:
        from vllm_attn_compat.codemods import registry
        from vllm_attn_compat.codemods.engine import migrate, tokens
        from vllm_attn_compat.codemods.engine.scan import GuardedScan

        report = _listing(found, options)
        rules = registry.select_rules(options.select, options.ignore)
        plain, guarded = migrate.prefilter_groups(rules)
        worth_parsing = reading.asking(
            "prefilter", GuardedScan.terms(plain, guarded), lambda: GuardedScan(plain, guarded)
        )
        anywhere, scoped = tokens.own_tokens(rules, scoped=False), tokens.own_tokens(rules, scoped=True)

        def probable(f: RunFile) -> bool:
            """Whether the file, read afresh (the cache most likely holds the others' migrations), will probably need
            libcst: it starts the workers, which import libcst while this process reads on and runs the rounds."""
            return not f.trusted and worth_parsing(f) and tokens.probably_libcst(f.source, anywhere, scoped)

        # A worker's import of libcst costs as much CPU as migrating a few files: one worker starts for every
        # IN_PROCESS_BELOW such files. Where the cache vouches for no file (a first run, or none), every worker
        # starts once that many were read, and one where fewer lie within _FEW_WITHIN files of the first (a
        # plugin's files lie together: torch's tree holding the legacy plugin); else one at once where a file the
        # replay found changed is one (a rerun after a backend's edit), or else once every file is read.
        cold = cache is None or not cache.statuses
        if cache is not None and any(tokens.probably_libcst(text, anywhere, scoped) for text, _ in cache.read.values()):
            _preload(pool, 1)
        read_count = needing = 0  # the files read, those that will probably need libcst
        first_needing = 0  # how many files were read when the first of them was

        def read(f: RunFile) -> None:
            nonlocal read_count, needing, first_needing
            if not cold or pool.started:
                return
            read_count += 1
            if probable(f):
                needing += 1
                first_needing = first_needing or read_count
                if needing >= parallel.IN_PROCESS_BELOW:
                    _preload(pool, options.jobs)
            elif needing and read_count - first_needing >= _FEW_WITHIN:
                _preload(pool, 1)

        run_files, context = _read(found, cache, started, trusting, report, read)
        if not pool.started:
            few = parallel.IN_PROCESS_BELOW
            count = sum(1 for _ in itertools.islice(filter(probable, run_files), options.jobs * few))
            _preload(pool, -(-count // few))
        # Kept by the prefilter as the first round asks: its files are indexed while the others are scanned.
        worth = reading.Kept(itertools.chain(run_files, context), worth_parsing)
        migration = _Migration(rules, options, report, pool, cache)
        saving = _Saving(cache, [*run_files, *context], migration) if cache is not None else None
        # On a big tree without any file worth parsing, nothing is parsed and libcst is never imported.
        # (An excluded file may hold the base class that makes the others' classes attention code.)
        if worth:
            migration.run(run_files, context, worth, emit_diff, saving.ahead if saving else None)
        if saving is not None:
            saving.save(found, listed, report)
        return report
    finally:
        pool.close()


def _read(
    found: files.Discovered,
    cache: cache_module.Cache | None,
    started: int,
    trusting: bool,
    report: RunReport,
    each: Callable[[RunFile], object],
) -> tuple[list[RunFile], list[RunFile]]:
    """The files to migrate (``each`` called as each is read) and the excluded ones (read for what decides the
    others' fixes; nothing is reported in them), less those that cannot be read as source (reported if not
    excluded)."""
    run_files, context = [], []
    for source_file in found.files:
        try:
            run_files.append(reading.read(source_file, cache, started, trusting))
        except sources.SourceError as error:
            report.errors.append(FileError(source_file.path, error.line, error.column, error.message))
            continue
        each(run_files[-1])
    for source_file in found.excluded:
        try:
            context.append(reading.read(source_file, cache, started, trusting))
        except sources.SourceError:
            continue
    report.scanned = len(found.files)
    return run_files, context


# How far past the first file that will probably need libcst a first run reads before it starts one worker, where
# fewer than IN_PROCESS_BELOW such files were found (vLLM's trees hold 8 within 160 files of the first, plugins'
# within 400).
_FEW_WITHIN = 512


def _reads_text(rule: type[Rule]) -> bool:
    """Whether the rule's narrowing reads the file's text (`Rule.facts`), not the run's index alone."""
    from vllm_attn_compat.codemods.engine.rule import Rule

    return rule.facts.__func__ is not Rule.facts.__func__  # type: ignore[attr-defined]


def _preload(pool: parallel.Pool, workers: int) -> None:
    """Start ``workers`` of the pool, each importing libcst at once (`worker.preload`)."""
    pool.prepare(worker.preload, workers)


class _Migration:
    """Steps 3 to 5 of the funnel, over the files the prefilter kept."""

    def __init__(
        self,
        rules: Sequence[type[Rule]],
        options: Options,
        report: RunReport,
        pool: parallel.Pool,
        cache: cache_module.Cache | None,
    ) -> None:
        self.rules, self.options, self.report, self.pool, self.cache = rules, options, report, pool, cache
        self.excluded: set[str] = set()
        self.indexed: dict[str, ModuleIndex] = {}  # the indexes this run made, which the cache keeps
        self._needs: dict[tuple[bool, bool], Any] = {}  # the questions `_needs_libcst` asks, by the file's kinds

    def run(
        self,
        run_files: Sequence[RunFile],
        context: Sequence[RunFile],
        worth: reading.Kept,
        emit_diff: Callable[[str], object],
        meanwhile: Callable[[Set[str]], object] | None = None,
    ) -> None:
        """Index, then migrate the candidates among ``run_files``. The ``context`` files (excluded) take part in the
        index alone. ``worth``: the files of both the prefilter keeps. ``meanwhile(paths)`` runs while the workers
        migrate the files of ``paths``."""
        from vllm_attn_compat.codemods.index import callsites, classscan
        from vllm_attn_compat.codemods.run.rounds import build_hierarchy

        report, options = self.report, self.options
        self.excluded = {f.path for f in context}
        from vllm_attn_compat.codemods.engine.migrate import prefilter_tokens

        prefilter = frozenset(prefilter_tokens(self.rules))
        hierarchy, indexes = build_hierarchy([*run_files, *context], worth, self._index, prefilter)
        failed = {error.path for error in report.errors}
        # A file needing libcst holds a prefilter token, or an attention-class name (it was indexed);
        # rules scoped to attention classes matter only where the index shows such a class.
        reachable = {f.path: f for f in run_files if f.path in indexes} | {
            f.path: f for f in worth if f.path not in self.excluded
        }
        candidates: list[RunFile] = []
        diffs: dict[str, str] = {}
        rewritten: dict[str, bytes] = {}  # the files the run's fixes changed, as they left them
        pending: set[str] = set()

        def to_migrate() -> Iterator[RunFile]:
            """The files that need libcst and whose migration the cache does not hold, each as soon as it is found
            (the workers migrate the first while this process asks the others)."""
            # The files the cache holds nothing of (new or edited) first: a rerun after an edit hands the edited file
            # to the worker before it looks at the others (sorted by path otherwise: the report does not depend on it).
            for path, f in sorted(reachable.items(), key=lambda item: (bool(item[1].kept), item[0])):
                if path in failed or not self._needs_libcst(f, indexes.get(path), hierarchy):
                    continue
                candidates.append(f)
                kept = self._kept_migration(f, hierarchy)
                if kept is not None:  # (a migration is kept only of a file that parsed)
                    self._record(f, kept, diffs, rewritten)
                    continue
                # A file the class scan spared is parsed by ``ast`` before libcst sees it, as every indexed file
                # was (CPython's parser rejects input on which libcst's native parser would hang or crash, and
                # points at syntax errors more precisely).
                if isinstance(indexes.get(path), classscan.ScannedIndex):
                    checked = worker.check_syntax(f.source, path)
                    if isinstance(checked, FileError):
                        report.errors.append(checked)
                        continue
                pending.add(path)
                yield f

        self._migrate(to_migrate(), hierarchy, diffs, rewritten, (lambda: meanwhile(pending)) if meanwhile else int)
        report.parsed = len((set(indexes) - self.excluded) | {c.path for c in candidates})
        for path in sorted(diffs):  # workers finish in any order; the output must not depend on it
            emit_diff(diffs[path])
        report.changed.sort()
        # A finding at each use in the run that withholds a fix (`index.callsites`), where findings are reported,
        # unless the run's own fixes deleted it.
        by_path = {f.path: f for f in run_files}
        report.findings += callsites.findings_for_run(
            hierarchy.calls,
            _Sources({path: by_path[path] for path in indexes if path in by_path}),
            [rule.code for rule in self.rules],
            options.unsafe_fixes,
            rewritten,
        )

    def _index(self, to_index: Iterable[RunFile], names: frozenset[str]) -> Iterator[tuple[str, object]]:
        """``(path, outcome)`` of each file to index, recording the uses of the attribute ``names``: the index the
        cache kept of its bytes, where it recorded them, else one made (in the workers, as the files come, when
        there are enough); a file that does not parse is reported, unless excluded."""
        from vllm_attn_compat.codemods.index import records

        kept: list[tuple[str, object]] = []
        by_path: dict[str, RunFile] = {}

        def tasks() -> Iterator[tuple[str, tuple[bytes, str, frozenset[str]]]]:
            for f in to_index:
                data = f.kept_for_module().get("index")
                if data is not None:
                    try:
                        index = records.from_data(data)
                    except ValueError as error:
                        assert self.cache is not None
                        self.cache.warn(f"holds an index that is not valid ({error})")
                    else:
                        if not index.calls.lacks(names):
                            kept.append((f.path, index))
                            f.results["index"] = data
                            continue
                by_path[f.path] = f
                yield f.path, (f.source, f.path, names)

        outcomes = self.pool.map(worker.index_file, tasks(), few_here=True)  # (the workers may be importing libcst)
        for path, outcome in progress.bar(outcomes, None, self.options.progress, "index classes"):
            if isinstance(outcome, FileError):
                if path not in self.excluded:
                    self.report.errors.append(outcome)
            elif isinstance(outcome, parallel.WorkerCrashed):
                self.report.errors.append(FileError(path, 1, 1, f"internal error: {outcome}"))
            else:
                self.indexed[path] = outcome
                by_path[path].module  # noqa: B018 - the results keep the module it was indexed as
            yield path, outcome
        yield from kept

    def _needs_libcst(self, f: RunFile, index: object, hierarchy: ClassHierarchy) -> bool:
        """`migrate.needs_parsing` of a file for the rules that can act in it (all where its index shows an
        attention class, else those acting anywhere; a rule that requires more than its tokens, where the file holds
        it: `Rule.requires`; a rule that narrows its tokens, where it acts: `Rule.narrows`),
        the answers kept by the rules' codes and the run's attention classes."""
        from vllm_attn_compat.codemods.engine import migrate
        from vllm_attn_compat.codemods.index.hierarchy import ModuleIndex

        indexed = isinstance(index, ModuleIndex)
        kinds = (
            indexed and hierarchy.has_attention_classes(f.path),
            indexed and hierarchy.has_interface_classes(f.path),
        )
        if kinds not in self._needs:
            rules = migrate.acting(self.rules, attention=kinds[0], interface=kinds[1])
            names = hierarchy.scope_class_names()
            plain = self._parse_question([rule for rule in rules if not (rule.narrows or rule.requires)], names)
            narrowing = [(rule, self._parse_question([rule], names)) for rule in rules if rule.narrows or rule.requires]
            self._needs[kinds] = plain, narrowing, _release(self.options).release
        plain, narrowing, release = self._needs[kinds]
        return self._holds_tokens(f, plain) or any(
            self._may_act(rule, question, f, hierarchy, release) for rule, question in narrowing
        )

    def _may_act(self, rule: type[Rule], question: Any, f: RunFile, hierarchy: ClassHierarchy, release: str) -> bool:
        """Whether ``rule`` (one that requires or narrows) needs libcst to see the file: the file holds what it
        requires and one of its tokens, and it acts there. A narrowing read from the run's index alone is asked
        before the tokens, which cost more to look for."""
        from vllm_attn_compat.codemods.engine import migrate

        if rule.requires and not f.ask(f"requires {rule.code}", functools.partial(migrate.holds_required, rule)):
            return False
        if not rule.narrows:
            return self._holds_tokens(f, question)
        if not _reads_text(rule):
            return rule.acts_in(None, hierarchy, f.path, release) and self._holds_tokens(f, question)
        return self._holds_tokens(f, question) and rule.acts_in(
            f.ask(f"facts {rule.code}", rule.facts), hierarchy, f.path, release
        )

    def _parse_question(
        self, rules: Sequence[type[Rule]], names: frozenset[str]
    ) -> tuple[tuple[bytes, ...], tuple[bytes, ...], frozenset[str], str]:
        from vllm_attn_compat.codemods.engine import tokens

        anywhere, scoped = tokens.own_tokens(rules, scoped=False), tokens.own_tokens(rules, scoped=True)
        terms = [b"anywhere " + t for t in anywhere] + [b"scoped " + t for t in scoped]
        return anywhere, scoped, names, reading.question("parse", [*terms, *(f"class {name}" for name in names)])

    @staticmethod
    def _holds_tokens(f: RunFile, asked: tuple[tuple[bytes, ...], tuple[bytes, ...], frozenset[str], str]) -> bool:
        from vllm_attn_compat.codemods.engine import tokens

        anywhere, scoped, names, question = asked
        return f.ask(question, lambda source: tokens.needs_libcst(source, anywhere, scoped, names))

    def _kept_migration(self, f: RunFile, hierarchy: ClassHierarchy) -> worker.Migrated | None:
        """The migration the cache kept of the file's bytes, if it was checked for safety where this run needs it
        and this run's hierarchy answers each question it asked the same."""
        from vllm_attn_compat.codemods.index.questions import still_holds

        data = f.kept.get("migration")
        if data is None:
            return None
        try:
            new_source, findings, answers, verified = cache_module.migration_from_data(data)
            if not (verified or not self.options.verifies) or not still_holds(answers, hierarchy):
                return None
        except (ValueError, TypeError, KeyError) as error:
            assert self.cache is not None
            self.cache.warn(f"holds a migration that is not valid ({error})")
            return None
        f.results["migration"] = data
        return worker.Migrated(new_source, findings, answers)

    def _migrate(
        self,
        items: Iterable[RunFile],
        hierarchy: ClassHierarchy,
        diffs: dict[str, str],
        rewritten: dict[str, bytes],
        meanwhile: Callable[[], object],
    ) -> None:
        import pickle

        from vllm_attn_compat.codemods.run.dependencies import MissingDependency

        options = self.options
        settings = pickle.dumps(
            (self.rules, hierarchy, options.unsafe_fixes, options.old_op_calls, options.verifies, _release(options))
        )
        by_path: dict[str, RunFile] = {}

        def tasks() -> Iterator[tuple[str, tuple[bytes, bytes, str]]]:
            for item in items:
                by_path[item.path] = item
                yield item.path, (settings, item.source, item.path)

        # libcst missing or broken: every file fails alike, and the command names it once (cli.py)
        missing: MissingDependency | None = None
        outcomes = self.pool.map(worker.migrate_with, tasks(), meanwhile=meanwhile)
        for path, outcome in progress.bar(outcomes, None, options.progress, "migrate"):
            if isinstance(outcome, MissingDependency):
                missing = outcome  # raised once all are in: the pool shuts down as usual, leaving no process behind
                continue
            self._record(by_path[path], outcome, diffs, rewritten)
            if isinstance(outcome, worker.Migrated) and outcome.answers is not None and self.cache is not None:
                by_path[path].results["migration"] = cache_module.migration_to_data(
                    outcome.new_source, outcome.findings, outcome.answers, options.verifies
                )
        if missing is not None:
            raise missing

    def _record(
        self,
        item: RunFile,
        outcome: worker.Migrated | FileError | parallel.WorkerCrashed,
        diffs: dict[str, str],
        rewritten: dict[str, bytes],
    ) -> None:
        path, report, mode = item.path, self.report, self.options.mode
        if isinstance(outcome, parallel.WorkerCrashed):
            report.errors.append(FileError(path, 1, 1, f"internal error: {outcome}; the file was not changed"))
            return
        if isinstance(outcome, FileError):
            report.errors.append(outcome)
            return
        report.findings += [(path, finding) for finding in outcome.findings]
        new_source = outcome.new_source
        if new_source is None:
            return
        if mode == "write":
            try:
                sources.write_atomic(item.source_file.real_path, new_source, expected_stat=item.stat)
            except sources.SourceError as error:
                report.errors.append(FileError(path, 1, 1, error.message))
                return
            except OSError as error:
                report.errors.append(FileError(path, 1, 1, f"could not write the file: {error.strerror or error}"))
                return
        elif mode == "diff":
            diffs[path] = unified_diff(path, item.source, new_source, item.encoding)
        report.changed.append(path)
        rewritten[path] = new_source


class _Sources(Mapping[str, bytes]):
    """The bytes of the files of ``run_files`` by path, each read when first asked for (`RunFile.source`)."""

    def __init__(self, run_files: Mapping[str, RunFile]) -> None:
        self.run_files = run_files

    def __getitem__(self, path: str) -> bytes:
        return self.run_files[path].source

    def __iter__(self) -> Iterator[str]:
        return iter(self.run_files)

    def __len__(self) -> int:
        return len(self.run_files)


class _Saving:
    """The cache's file, written at the run's end: each file's results (most of them encoded while the workers
    migrate: `ahead`), and the report where a rerun may replay it, a run without errors that changed no file (with
    ``--check``, that would change some). A file this run wrote is read afresh next time."""

    def __init__(self, cache: cache_module.Cache, run_files: Sequence[RunFile], migration: _Migration) -> None:
        self.cache, self.run_files, self.migration = cache, run_files, migration
        self.encoded: tuple[str, frozenset[str]] = ("{}", frozenset())

    def _results(self, run_files: Iterable[RunFile], written: Set[str]) -> dict[str, dict[str, Any]]:
        from vllm_attn_compat.codemods.index import records

        indexes = self.migration.indexed
        results: dict[str, dict[str, Any]] = {}
        for f in run_files:
            if f.path in written:
                self.cache.statuses.pop(f.source_file.real_path, None)
                continue
            if f.path in indexes:
                f.results["index"] = records.to_data(indexes[f.path])
            results[f.source_file.real_path] = f.results
        return results

    def ahead(self, pending: Set[str]) -> None:
        """Encode the results of the files other than those still ``pending`` (being migrated)."""
        report = self.migration.report
        written = set(report.changed) if report.mode == "write" else set()
        done = [f for f in self.run_files if f.path not in pending]
        self.encoded = self.cache.encode(self._results(done, written))

    def save(self, found: files.Discovered, listed: Sequence[str], report: RunReport) -> None:
        written = set(report.changed) if report.mode == "write" else set()
        rest = [f for f in self.run_files if f.source_file.real_path not in self.encoded[1]]
        replayable = not report.errors and (report.mode == "check" or not report.changed)
        run = self.cache.keep_run(found, report.mode, report) if replayable else None
        self.cache.save(run, self._results(rest, written), listed, self.encoded)


def run_source(source: bytes, path: str, options: Options) -> tuple[RunReport, bytes, str]:
    """Migrate one source given as bytes (standard input); ``path`` names it in reports.

    Returns the report, the resulting source (the input itself when nothing changed or the file
    failed, so a pipe never loses code) and the unified diff (empty when unchanged).
    """
    forget_folders()
    try:
        return _run_source(source, path, options)
    finally:
        forget_folders()


def _run_source(source: bytes, path: str, options: Options) -> tuple[RunReport, bytes, str]:
    from vllm_attn_compat.codemods import registry
    from vllm_attn_compat.codemods.engine import migrate
    from vllm_attn_compat.codemods.engine.scan import GuardedScan
    from vllm_attn_compat.codemods.index import callsites, hierarchy
    from vllm_attn_compat.codemods.run.dependencies import MissingDependency

    report = RunReport(mode=options.mode, scanned=1, target=options.target)
    rules = registry.select_rules(options.select, options.ignore)
    try:
        encoding = sources.source_encoding(source)
    except sources.SourceError as error:
        report.errors.append(FileError(path, error.line, error.column, error.message))
        return report, source, ""
    if not GuardedScan(*migrate.prefilter_groups(rules))(source):
        return report, source, ""
    index = worker.index_file(source, path)
    if isinstance(index, FileError):
        report.errors.append(index)
        return report, source, ""
    report.parsed = 1
    built = hierarchy.ClassHierarchy.build([index])
    new_source = None
    acting = migrate.acting(
        rules, attention=built.has_attention_classes(path), interface=built.has_interface_classes(path)
    )
    if migrate.needs_parsing(source, acting, built.scope_class_names()):
        worker.setup(rules, built, options.unsafe_fixes, options.old_op_calls, options.verifies, _release(options))
        outcome = worker.migrate_file(source, path)
        if isinstance(outcome, MissingDependency):
            raise outcome
        if isinstance(outcome, FileError):
            report.errors.append(outcome)
        else:
            report.findings += [(path, finding) for finding in outcome.findings]
            new_source = outcome.new_source
    codes = [rule.code for rule in rules]
    rewritten = {path: new_source} if new_source is not None else None
    report.findings += callsites.findings_for_run(built.calls, {path: source}, codes, options.unsafe_fixes, rewritten)
    if new_source is None:
        return report, source, ""
    report.changed.append(path)
    return report, new_source, unified_diff(path, source, new_source, encoding)
