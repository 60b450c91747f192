"""``migrate`` over files and folders: the funnel that keeps whole-repository runs fast, and the writes.

1. Every file is read once, as bytes, and checked to be decodable text.
2. A literal scan (anchored ``bytes.find``) finds the files worth parsing at all.
3. The class-hierarchy pass (stdlib ``ast``) indexes the kept files that mention vLLM, then, round after
   round, files naming (as a whole identifier) an attention class found so far, until no new name
   appears: a plugin's base class in one file makes its backends in other files attention code; and any
   file, whatever it imports, that may call a method whose fix the call-site analysis decides.
   Files an exclude glob matches take part in this pass (a base class, a caller that withholds a fix),
   and in nothing else: they are never migrated, and nothing is reported in them.
4. libcst parses only the files holding a rule's tokens (for rules scoped to attention classes, only
   files whose class index shows an attention class), in worker processes when there are enough.
5. A rewritten file is written only if every invariant in :mod:`safety` holds, atomically.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from vllm_attn_compat.codemods import registry
from vllm_attn_compat.codemods.engine import migrate
from vllm_attn_compat.codemods.index import classscan
from vllm_attn_compat.codemods.index.names import forget_folders
from vllm_attn_compat.codemods.run import answers as answers_module
from vllm_attn_compat.codemods.run import parallel, progress, rerun, scans, sources, worker
from vllm_attn_compat.codemods.run.dependencies import MissingDependency
from vllm_attn_compat.codemods.run.options import Options
from vllm_attn_compat.codemods.run.reading import Changed, Reading, Scanned, digest_of, read_and_filter, read_context
from vllm_attn_compat.codemods.run.report import FileError, RunReport, unified_diff
from vllm_attn_compat.codemods.run.rounds import index_hierarchy
from vllm_attn_compat.codemods.run.scan import TokenScan

if TYPE_CHECKING:
    from typing import TypeAlias

    from vllm_attn_compat.codemods.engine.rule import Rule
    from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy
    from vllm_attn_compat.codemods.run.cache import Cache
    from vllm_attn_compat.codemods.run.rounds import IndexOutcome

    # A file's migration as `_record` takes it: done or failed.
    Recorded: TypeAlias = worker.Migrated | FileError | parallel.WorkerCrashed


def _parse_scanned(
    candidates: Sequence[Scanned], indexes: Mapping[str, IndexOutcome], options: Options, report: RunReport
) -> list[Scanned]:
    """The candidates, less those that do not parse: a file the class scan spared is parsed by ``ast``
    before libcst sees it, as every indexed file was (CPython's parser rejects input on which libcst's
    native parser would hang or crash, and points at syntax errors more precisely)."""
    spared = [c for c in candidates if isinstance(indexes.get(c.source_file.path), classscan.ScannedIndex)]
    tasks = [(c.source_file.path, (c.source, c.source_file.path)) for c in spared]
    failed: set[str] = set()
    # In this process: a few hundred kilobytes, less than a pool's start-up costs.
    for path, outcome in parallel.parallel_map(worker.check_syntax, tasks, jobs=1, initializer=worker.no_setup):
        if isinstance(outcome, FileError):
            report.errors.append(outcome)
            failed.add(path)
        elif isinstance(outcome, parallel.WorkerCrashed):
            report.errors.append(FileError(path, 1, 1, f"internal error: {outcome}"))
            failed.add(path)
    return [c for c in candidates if c.source_file.path not in failed]


def run_paths(
    paths: Sequence[str],
    options: Options,
    *,
    emit_diff: Callable[[str], object] = lambda text: None,
    prepared: rerun.Prepared | None = None,
) -> RunReport:
    """Migrate the given files and folders; ``emit_diff`` receives each file's unified diff (diff mode).

    ``prepared``: the files found for ``paths`` by a caller that tried `rerun.replay` already (the cache held no
    run over them).
    """
    try:
        if prepared is None:
            prepared = rerun.prepare(paths, options)
            report = prepared.report(options.mode)
            if rerun.replay(prepared, options.mode, report):
                return report  # a rerun over files whose status says they are unchanged: none was read
        try:
            return _run(prepared, options, emit_diff)
        except Changed:
            # A file the rerun took the status of changed since (it was edited during the run): what the run asked
            # of its bytes may mix two versions. The run starts again, reading every file. (Nothing was written: a
            # run that writes reads every file first.)
            prepared.known.clear()
            return _run(prepared, options, emit_diff)
    finally:
        forget_folders()  # what this run found of the folders is not the next's to trust (nor another caller's)


def _run(prepared: rerun.Prepared, options: Options, emit_diff: Callable[[str], object]) -> RunReport:
    """`run_paths` over the files found, the rerun having found no report of them."""
    report = prepared.report(options.mode)
    found, rules, cache, table, started = (
        prepared.found, prepared.rules, prepared.cache, prepared.table, prepared.started
    )  # fmt: skip
    prefilter = migrate.prefilter_tokens(rules)
    answers = answers_module.Answers(cache.root if cache else None, cache.code if cache else b"")
    # A run that writes reads each file before it writes any (`Changed` would start it again half-written).
    known = prepared.known if options.mode != "write" else {}
    reading = Reading(answers, table if cache else None, started, known)
    scanned, worth = read_and_filter(found.files, prefilter, report, reading)
    context, context_worth = read_context(found.excluded, prefilter, reading)
    run_key = None
    if cache and table is not None:
        table.save()
        digests = {s.source_file.path: s.digest for s in [*scanned, *context] if s.digest is not None}
        run_key = cache.run_key(digests, prepared.excluded_paths, options.mode)
    replayed = cache.load_run(run_key) if cache and run_key is not None and run_key != prepared.tried else None
    stored = replayed is not None
    errors = len(report.errors)
    involved: set[str] = set()
    if replayed is not None:
        findings, changed, report.parsed = replayed
        report.findings += findings
        report.changed += changed
    # On a big tree without any file worth parsing, nothing is parsed and libcst is never imported here.
    # (An excluded file may hold the base class that makes the others' classes attention code.)
    elif worth or context_worth:
        involved = _migrate_worth(
            scanned, worth, rules, options, report, emit_diff, cache, context, context_worth, reading=reading
        )
    based = None
    if (
        cache
        and replayed is None
        and run_key is not None
        and len(report.errors) == errors
        and (options.mode == "check" or not report.changed)
    ):
        from vllm_attn_compat.codemods.run.cache import RunBasis

        cache.store_run(run_key, report.findings, report.changed, report.parsed)
        stored = True
        involved |= {path for path, _ in report.findings} | set(report.changed)
        asked, looked_for = frozenset(reading.asked), frozenset(reading.looked_for)
        cache.store_basis(run_key, RunBasis(frozenset(involved), asked, looked_for, run_key, {}))
        based = run_key  # the answers hold every question this run asked of its files
    if stored and run_key is not None:
        prepared.remember(options.mode, run_key, [(s.source_file, s.stat) for s in [*scanned, *context]])
    if cache:
        answers.save(based)
        cache.prune()
    return report


def candidate_rules(
    rules: Sequence[type[Rule]], index: object, hierarchy: ClassHierarchy, path: str
) -> Sequence[type[Rule]]:
    """The rules that can act in a file: all of them where its index shows an attention class, else
    only those that act anywhere."""
    from vllm_attn_compat.codemods.index.hierarchy import ModuleIndex

    if isinstance(index, ModuleIndex) and hierarchy.has_attention_classes(path):
        return rules
    return [rule for rule in rules if not rule.scoped]


def _migrate_worth(
    scanned: Sequence[Scanned],
    worth: Sequence[Scanned],
    rules: Sequence[type[Rule]],
    options: Options,
    report: RunReport,
    emit_diff: Callable[[str], object],
    cache: Cache | None = None,
    context: Sequence[Scanned] = (),
    context_worth: Sequence[Scanned] = (),
    *,
    reading: Reading,
) -> set[str]:
    """Index, then migrate the candidates among ``scanned`` (``worth``: those the prefilter kept). The
    ``context`` files (excluded; ``context_worth``: those the prefilter kept) take part in the index alone.
    Returns the files that took part beyond answering the run's questions: indexed, scanned, or parsed."""
    sources = _Sources({s.source_file.path: s for s in scanned})  # the files this run may migrate
    excluded = {s.source_file.path for s in context}
    tests: dict[tuple[tuple[str, ...], frozenset[str]], Callable[[Scanned], bool]] = {}

    def needs_libcst(path: str, acting: Sequence[type[Rule]], names: frozenset[str]) -> bool:
        """`migrate.needs_parsing` of a file the run may migrate, as the answers keep it (by the codes of the
        rules ``acting`` and the attention classes ``names``)."""
        key = (tuple(rule.code for rule in acting), names)
        if key not in tests:
            terms = [*scans.rule_terms(acting), *(f"class {name}" for name in names)]
            tests[key] = reading.asking("parse", terms)
        return tests[key](sources.scanned[path])

    if cache is not None:
        cache.defer()  # the index's entries are written once the rounds know which uses the run reads
    hierarchy, indexes = index_hierarchy(
        [*scanned, *context], [*worth, *context_worth], options, report, cache, excluded, reading=reading
    )
    if cache is not None:
        cache.write_deferred()()
    failed = {error.path for error in report.errors}
    names = hierarchy.attention_class_names()
    # A file needing libcst holds a prefilter token, or an attention-class name (it was indexed);
    # rules scoped to attention classes matter only where the index shows such a class.
    reachable = {s.source_file.path: s for s in scanned if s.source_file.path in indexes}
    reachable |= {s.source_file.path: s for s in worth}

    def needs_parsing(s: Scanned) -> bool:
        path = s.source_file.path
        return needs_libcst(path, candidate_rules(rules, indexes.get(path), hierarchy, path), names)

    candidates = [s for path, s in sorted(reachable.items()) if path not in failed and needs_parsing(s)]
    involved = set(indexes) | {c.source_file.path for c in candidates}
    report.parsed = len((set(indexes) - excluded) | {c.source_file.path for c in candidates})
    diffs: dict[str, str] = {}
    rewritten: dict[str, bytes] = {}  # the files the run's fixes changed, as they left them
    keys: dict[str, str] = {}
    if cache is not None:
        missed: list[Scanned] = []
        for item in candidates:
            path = item.source_file.path
            keys[path] = cache.file_key(path, digest_of(item))
            cached = cache.load(keys[path], hierarchy)
            if cached is None:
                missed.append(item)
            else:  # (an entry is only made of a file that parsed)
                _record(item, cached, options, report, diffs, rewritten)
        candidates = missed
    candidates = _parse_scanned(candidates, indexes, options, report)
    by_path = {c.source_file.path: c for c in candidates}
    settings = (rules, hierarchy, options.unsafe_fixes, options.old_op_calls, options.verifies)
    tasks = [(c.source_file.path, (c.source, c.source_file.path)) for c in candidates]
    outcomes = parallel.parallel_map(
        worker.migrate_file, tasks, jobs=options.jobs, initializer=worker.setup, initargs=settings
    )
    # libcst missing or broken: every file fails alike, and the command names it once (cli.py)
    missing: MissingDependency | None = None
    for path, outcome in progress.bar(outcomes, len(candidates), options.progress, "migrate"):
        if isinstance(outcome, MissingDependency):
            missing = outcome  # raised once all are in: the pools shut down as usual, leaving no process behind
        else:
            _record(by_path[path], outcome, options, report, diffs, rewritten)
            if cache is not None and isinstance(outcome, worker.Migrated):
                cache.store(keys[path], outcome)
    if missing is not None:
        raise missing
    for path in sorted(diffs):  # workers finish in any order; the output must not depend on it
        emit_diff(diffs[path])
    report.changed.sort()
    # A finding at each use in the run that withholds a fix (`index.callsites`), where findings are reported,
    # unless the run's own fixes deleted it.
    from vllm_attn_compat.codemods.index import callsites

    report.findings += callsites.findings_for_run(
        hierarchy.calls,
        _Sources({path: sources.scanned[path] for path in indexes if path in sources.scanned}),
        [rule.code for rule in rules],
        options.unsafe_fixes,
        rewritten,
    )
    return involved


class _Sources(Mapping[str, bytes]):
    """The bytes of the files of ``scanned`` by path, each read when first asked for (`Scanned.source`)."""

    def __init__(self, scanned: Mapping[str, Scanned]) -> None:
        self.scanned = scanned

    def __getitem__(self, path: str) -> bytes:
        return self.scanned[path].source

    def __iter__(self) -> Iterator[str]:
        return iter(self.scanned)

    def __len__(self) -> int:
        return len(self.scanned)


def _record(
    item: Scanned,
    outcome: Recorded,
    options: Options,
    report: RunReport,
    diffs: dict[str, str],
    rewritten: dict[str, bytes],
) -> None:
    path = item.source_file.path
    if isinstance(outcome, parallel.WorkerCrashed):
        report.errors.append(FileError(path, 1, 1, f"internal error: {outcome}; the file was not changed"))
        return
    if isinstance(outcome, FileError):
        report.errors.append(outcome)
        return
    new_source = outcome.new_source
    report.findings += [(path, finding) for finding in outcome.findings]
    if new_source is None:
        return
    if options.mode == "write":
        try:
            sources.write_atomic(item.source_file.real_path, new_source, expected_stat=item.stat)
        except sources.SourceError as error:
            report.errors.append(FileError(path, 1, 1, error.message))
            return
        except OSError as error:
            report.errors.append(FileError(path, 1, 1, f"could not write the file: {error.strerror or error}"))
            return
    elif options.mode == "diff":
        diffs[path] = unified_diff(path, item.source, new_source, item.encoding)
    report.changed.append(path)
    rewritten[path] = new_source


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
    report = RunReport(mode=options.mode, scanned=1)
    rules = registry.select_rules(options.select, options.ignore)
    try:
        encoding = sources.source_encoding(source)
    except sources.SourceError as error:
        report.errors.append(FileError(path, error.line, error.column, error.message))
        return report, source, ""
    if not TokenScan(migrate.prefilter_tokens(rules), once=True)(source):
        return report, source, ""
    from vllm_attn_compat.codemods.index import callsites, hierarchy

    index = worker.index_file(source, path)
    if isinstance(index, FileError):
        report.errors.append(index)
        return report, source, ""
    report.parsed = 1
    built = hierarchy.ClassHierarchy.build([index])
    new_source = _migrate_source(source, path, options, rules, built, report)
    codes = [rule.code for rule in rules]
    rewritten = {path: new_source} if new_source is not None else None
    report.findings += callsites.findings_for_run(built.calls, {path: source}, codes, options.unsafe_fixes, rewritten)
    if new_source is None:
        return report, source, ""
    report.changed.append(path)
    return report, new_source, unified_diff(path, source, new_source, encoding)


def _migrate_source(
    source: bytes, path: str, options: Options, rules: Sequence[type[Rule]], built: ClassHierarchy, report: RunReport
) -> bytes | None:
    """`run_source`'s migration of its one file: the new source, or None (unchanged, or failed: reported)."""
    acting = rules if built.has_attention_classes(path) else [rule for rule in rules if not rule.scoped]
    if not migrate.needs_parsing(source, acting, built.attention_class_names()):
        return None
    worker.setup(rules, built, options.unsafe_fixes, options.old_op_calls, options.verifies)
    outcome = worker.migrate_file(source, path)
    if isinstance(outcome, MissingDependency):
        raise outcome
    if isinstance(outcome, FileError):
        report.errors.append(outcome)
        return None
    report.findings += [(path, finding) for finding in outcome.findings]
    return outcome.new_source
