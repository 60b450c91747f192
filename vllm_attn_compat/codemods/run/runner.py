"""``migrate`` over files and folders: the funnel that keeps whole-repository runs fast, and the writes.

1. Every file is read once, as bytes, and checked to be decodable text.
2. A literal scan (anchored ``bytes.find``) finds the files worth parsing at all. The first one that will
   probably need libcst starts a worker process, which imports libcst while the rest goes on.
3. The class-hierarchy pass (stdlib ``ast``) indexes the kept files that mention vLLM, then, round after
   round, files naming (as a whole identifier) an attention class found so far, until no new name
   appears: a plugin's base class in one file makes its backends in other files attention code; and any
   file, whatever it imports, that may call a method whose fix the call-site analysis decides. After
   each round, files whose migration can no longer change go to the early worker (:mod:`handoff`).
   Files an exclude glob matches take part in this pass (a base class, a caller that withholds a fix),
   and in nothing else: they are never migrated, and nothing is reported in them.
4. libcst parses only the files holding a rule's tokens (for rules scoped to attention classes, only
   files whose class index shows an attention class), in worker processes when there are enough.
5. A rewritten file is written only if every invariant in :mod:`safety` holds, atomically.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from vllm_attn_compat.codemods import registry
from vllm_attn_compat.codemods.engine import migrate
from vllm_attn_compat.codemods.index import classscan
from vllm_attn_compat.codemods.run import answers as answers_module
from vllm_attn_compat.codemods.run import files, parallel, prefork, rerun, scans, sources, stats, worker
from vllm_attn_compat.codemods.run.dependencies import MissingDependency
from vllm_attn_compat.codemods.run.handoff import Handoff, candidate_rules
from vllm_attn_compat.codemods.run.indexing import RoundIndexing
from vllm_attn_compat.codemods.run.options import Options
from vllm_attn_compat.codemods.run.report import FileError, RunReport, unified_diff
from vllm_attn_compat.codemods.run.scan import TokenScan

if TYPE_CHECKING:
    from typing import TypeAlias

    from vllm_attn_compat.codemods.engine.rule import Rule
    from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, ModuleIndex
    from vllm_attn_compat.codemods.run.cache import Cache
    from vllm_attn_compat.codemods.run.worker import MigrateOutcome

    # What the hierarchy pass knows of each file it took part in: its index, or why it has none.
    IndexOutcome: TypeAlias = ModuleIndex | FileError | parallel.WorkerCrashed
    # A file's migration as `_record` takes it: done or failed.
    Recorded: TypeAlias = worker.Migrated | FileError | parallel.WorkerCrashed

Item = TypeVar("Item")


class _Changed(Exception):
    """A file whose status changed since the rerun took it (`rerun.Prepared.known`), read at last: the run reads
    every file again (`run_paths`)."""


@dataclass(eq=False)
class _Scanned:
    """A file of the run: its status, its bytes, how they decode, and their digest (`stats.digest`, known with a
    cache: the run's key, and what its answers are kept by). A file whose digest the rerun knew by its status
    (`rerun.Prepared.known`) is read only once something asks for its bytes: a rerun keeps most answers."""

    source_file: files.SourceFile
    stat: os.stat_result
    digest: str | None = None
    _source: bytes | None = None
    _encoding: str | None = None

    @property
    def source(self) -> bytes:
        if self._source is None:
            try:
                source, stat = sources.read_source(self.source_file.real_path)
            except sources.SourceError:
                raise _Changed(self.source_file.path) from None
            if stats.status_of(stat) != stats.status_of(self.stat):
                raise _Changed(self.source_file.path)
            self._source = source
        return self._source

    @property
    def encoding(self) -> str:
        if self._encoding is None:
            try:
                self._encoding = sources.source_encoding(self.source)
            except sources.SourceError:  # (the table only knows files that decode)
                raise _Changed(self.source_file.path) from None
        return self._encoding


def _digest_of(s: _Scanned) -> str:
    """The digest of a file's bytes: the one read with them, else (a run without a cache) made now."""
    return s.digest if s.digest is not None else stats.digest(s.source)


@dataclass(eq=False)
class _Reading:
    """How a run reads its files: with a cache, each file's digest comes from the `stats` table where its status
    is the one recorded (else from its bytes, recorded), and what the run asks of its bytes from `answers`."""

    answers: answers_module.Answers
    table: stats.StatTable | None = None
    started: int = 0
    # What the rerun found of each file it took the status of (`rerun.Prepared.known`): none is read again for that.
    known: Mapping[str, rerun.Known] = field(default_factory=dict)
    # Every question of `scans` the run asked (of some file): what a rerun asks an edited file (`bystanders`).
    asked: set[tuple[str, tuple[str, ...]]] = field(default_factory=set)
    # The classes whose module the run looked for among the files, by their paths (`_defining_files`).
    looked_for: set[str] = field(default_factory=set)

    def read(self, source_file: files.SourceFile) -> _Scanned:
        """The file read once, as bytes, and checked to be decodable (`sources.SourceError` if not); one the rerun
        knew is read when first asked for its bytes."""
        seen = self.known.get(source_file.path)
        if seen is not None:
            return _Scanned(source_file, seen.stat, seen.digest, seen.source)
        source, stat = sources.read_source(source_file.real_path)
        scanned = _Scanned(source_file, stat, _source=source, _encoding=sources.source_encoding(source))
        if self.table is not None:
            known = self.table.digest(source_file.real_path, stats.status_of(stat))
            scanned.digest = known if known is not None else stats.digest(source)
            self.table.record(source_file.real_path, stat, scanned.digest, self.started)
        return scanned

    def asking(self, kind: str, terms: Iterable[str | bytes]) -> Callable[[_Scanned], bool]:
        """The question ``kind`` with ``terms`` (`scans.test`) of a file, its answer kept; the question is one
        of those the run asked (`asked`)."""
        spelled = answers_module.spell(terms)
        self.asked.add((kind, spelled))
        asked = answers_module.question(kind, spelled)
        made: list[scans.Test] = []  # the test, made once a file's answer is not kept (a rerun keeps most)

        def test(s: _Scanned) -> bool:
            if not made:
                made.append(scans.test(kind, spelled))
            return made[0](s.source)

        return lambda s: self.answers.ask(s.digest, asked, lambda: test(s))


def _read_and_filter(
    source_files: Sequence[files.SourceFile],
    rules: Sequence[type[Rule]],
    prefilter: Sequence[bytes],
    options: Options,
    report: RunReport,
    warm: list[prefork.PreforkedWorker],
    reading: _Reading,
) -> tuple[list[_Scanned], list[_Scanned], list[prefork.PreforkedWorker], int]:
    """Read every file once; returns them all, those worth parsing, the workers started early, and how
    many files will probably need libcst (counted up to ``parallel.IN_PROCESS_BELOW``).

    Without a worker started already (``warm``), the first file that will probably need libcst starts one
    at once, so that its import of libcst (a quarter of a second) overlaps the reading and the
    class-hierarchy pass.
    """
    worth_parsing = reading.asking("prefilter", prefilter)
    probably_parsed = reading.asking("probable", scans.rule_terms(rules))
    scanned: list[_Scanned] = []
    worth: list[_Scanned] = []
    may_start = not warm and prefork.worth_starting(options.jobs)
    probable = 0
    try:
        for source_file in source_files:
            try:
                item = reading.read(source_file)
            except sources.SourceError as error:
                report.errors.append(FileError(source_file.path, error.line, error.column, error.message))
                continue
            scanned.append(item)
            if worth_parsing(item):
                worth.append(item)
                # Counted up to what decides a second worker (each test reads the whole file for tokens).
                if probable < parallel.IN_PROCESS_BELOW and probably_parsed(item):
                    probable += 1
                    if may_start:
                        early = prefork.start(worker.preload, sibling=True)
                        warm, may_start = [early] if early else [], False
    except BaseException:
        for early in warm:
            early.close()
        raise
    report.scanned = len(source_files)
    return scanned, worth, warm, probable


def _index_hierarchy(
    scanned: Sequence[_Scanned],
    worth: Sequence[_Scanned],
    options: Options,
    report: RunReport,
    after_round: Callable[[ClassHierarchy, Mapping[str, IndexOutcome]], None],
    early: Handoff | None = None,
    cache: Cache | None = None,
    excluded: Set[str] = frozenset(),
    *,
    reading: _Reading,
) -> tuple[ClassHierarchy, dict[str, IndexOutcome]]:
    """Build the class hierarchy of the run; returns it with the index of each file that took part.

    The first round indexes the files the prefilter kept that can define a vLLM attention class by
    themselves: they mention vLLM, or belong to a package named ``vllm`` (a fork). The others (torch has
    a ``class Attention(nn.Module)``) take part only if they name an attention class. Later rounds index
    every file naming (as a whole identifier) an attention class found so far. ``after_round(hierarchy,
    indexes)`` runs for each round, once the next one's files are handed out (the last's, at the end).
    The files are indexed in the ``early`` workers, as the class scan finds them, when they are all the jobs
    (`indexing.RoundIndexing`), those the ``cache`` holds not at all. A file of ``excluded`` that does not
    parse is left out unreported.
    """
    from vllm_attn_compat.codemods.index import callsites
    from vllm_attn_compat.codemods.index import hierarchy as hierarchy_module
    from vllm_attn_compat.codemods.index.names import guess_module_name

    def in_vllm_package(path: str) -> bool:
        return guess_module_name(path).partition(".")[0] == "vllm"

    indexes: dict[str, IndexOutcome] = {}
    names_vllm = reading.asking("vllm", [])
    pending = [s for s in worth if names_vllm(s) or in_vllm_package(s.source_file.path)]
    # A read of `accept_output_buffer` anywhere in the run decides whether deleting a declaration is safe
    # (`ClassHierarchy.flag_readers`), whatever the file imports or the rules selected.
    first = {s.source_file.path for s in pending}
    reads_flag = reading.asking("flag", [])
    pending += [s for s in scanned if s.source_file.path not in first and reads_flag(s)]
    known_names: frozenset[str] = frozenset()
    must_parse: set[str] = set()  # files the class scan spared once, which later rounds need indexed
    checked_methods: frozenset[str] = frozenset()  # the methods each file spared in earlier rounds was checked for
    read_for: frozenset[str] = frozenset()  # the methods each file not indexed was checked for
    built = hierarchy_module.ClassHierarchy.build([])
    settled: ClassHierarchy | None = None  # the last round's hierarchy, for `after_round` once the next is under way
    while pending:
        # Files whose class headers show no class that can be an attention class (nor a patch, nor a
        # backend's shape) skip the parse until a later round needs them (below).
        spared_now: set[str] = set()
        indexing = RoundIndexing(options.jobs, early)
        class_scans = _ClassScans(known_names, reading)
        index_keys: dict[str, str] = {}  # the cache's key of each file of the round to index (looked up, then stored)
        for s in pending:
            path = s.source_file.path
            scanned_index = None if path in must_parse else class_scans.scan(s)
            if scanned_index is not None:
                indexes[path] = scanned_index
                spared_now.add(path)
                continue
            if cache is not None:
                index_keys[path] = _index_key(cache, s)
                cached = cache.load_index(index_keys[path])
                if cached is not None:
                    indexes[path] = cached
                    continue
            indexing.add(path, s.source)
        outcomes = indexing.outcomes()
        if settled is not None:
            # The last round's settled files go to the early workers after this round's files, which the run
            # waits for when they index them. (The entries just added are the class scan's: `after_round` skips them.)
            after_round(settled, indexes)
        for path, outcome in _with_progress(outcomes, len(indexing), options.progress, "index classes"):
            if isinstance(outcome, FileError):
                if path not in excluded:
                    report.errors.append(outcome)
            elif isinstance(outcome, parallel.WorkerCrashed):
                report.errors.append(FileError(path, 1, 1, f"internal error: {outcome}"))
            elif cache:
                cache.store_index(index_keys[path], outcome)
            indexes[path] = outcome
        built = hierarchy_module.ClassHierarchy.build(
            index for index in indexes.values() if isinstance(index, hierarchy_module.ModuleIndex)
        )
        settled = built
        new_names = built.attention_class_names() - known_names
        known_names |= new_names
        has_name = reading.asking("words", new_names)
        pending = [s for s in scanned if s.source_file.path not in indexes and has_name(s)]
        # A spared file is indexed once a name it uses in a class header or a patch, or defines, is an
        # attention class or patched code found since (`ScannedIndex.names_any`), or once it may use a
        # method whose fix the call-site analysis decides (`callsites`: its calls would be missed).
        # (A file spared before this round was checked for the methods known then: only the others count.)
        methods = frozenset(name for _, name in built.calls.methods)
        new_methods = methods - checked_methods
        checked_methods = methods
        uses, new_uses = _may_use(reading, methods), _may_use(reading, new_methods)
        for s in scanned:
            path = s.source_file.path
            spared = indexes.get(path)
            if not isinstance(spared, classscan.ScannedIndex):
                continue
            if spared.names_any(new_names) or (uses(s) if path in spared_now else new_uses(s)):
                must_parse.add(path)
                pending.append(s)
        missing = built.missing_flag_bases()
        reading.looked_for |= missing
        pending += _defining_files(missing, scanned, indexes, pending, must_parse)
        if not pending:
            # Every caller in the run counts, whatever it imports (`runner.py` calling `engine.impl.prefill(x)`):
            # once the rounds have settled, a file not indexed is parsed if it may use a method with a fix still
            # safe (`open_method_names`), whose fix its calls may withhold. Asked only then, so that what is
            # read depends on the files alone, not on the order the rounds found things in. (Each earlier
            # time, every file not indexed was checked for the names read for then.)
            unread = callsites.open_method_names(built.calls) - read_for
            read_for |= unread
            unread_uses = _may_use(reading, unread)
            pending = [s for s in scanned if s.source_file.path not in indexes and unread_uses(s)]
            must_parse.update(s.source_file.path for s in pending)
    if settled is not None:
        after_round(settled, indexes)
    return built, indexes


def _may_use(reading: _Reading, methods: frozenset[str]) -> Callable[[_Scanned], bool]:
    """`calltext.may_use` of a file, for the methods ``methods``, as `answers` keep it."""
    return reading.asking("uses", methods)


def _defining_files(
    names: Set[str],
    scanned: Sequence[_Scanned],
    indexes: Mapping[str, IndexOutcome],
    pending: Sequence[_Scanned],
    must_parse: set[str],
) -> list[_Scanned]:
    """The files not indexed yet whose module may define one of the classes ``names`` (dotted); those the class
    scan spared are parsed this time (``must_parse``)."""
    if not names:
        return []
    from vllm_attn_compat.codemods.index.names import guess_module_name, may_define

    queued = {s.source_file.path for s in pending}
    # A module that may define ``a.b.C`` ends in ``b`` (`names_match`): its file is ``b.py`` (or a package's
    # ``__init__.py``). Looked at first, so that a module name (a look for ``__init__.py`` in each folder above)
    # is guessed only for those files.
    lasts = {name.rpartition(".")[0].rpartition(".")[2] for name in names}
    found = []
    for s in scanned:
        path = s.source_file.path
        index = indexes.get(path)
        if path in queued or not (index is None or isinstance(index, classscan.ScannedIndex)):
            continue
        stem = os.path.basename(path).rsplit(".", 1)[0]  # as `guess_module_name` takes it
        if stem != "__init__" and stem.rpartition(".")[2] not in lasts:
            continue
        module = guess_module_name(path)
        if any(may_define(module, name) for name in names):
            must_parse.add(path)
            found.append(s)
    return found


class _ClassScans:
    """`classscan.quick_index` of the files of a round, as the answers keep it (by the file's bytes, path, module
    name, and the attention-class names ``known`` when the round began)."""

    def __init__(self, known: frozenset[str], reading: _Reading) -> None:
        self.known = known
        self.reading = reading
        # The question's terms are the names (the same for each file of the round) and the file's path and module
        # name, spelled in that order (`answers.spell` sorts them: "class ..." < "module ..." < "path ..."):
        # hashed once for the names (`answers.question`).
        names = "\0".join(sorted(f"class {name}" for name in known))
        self._names = hashlib.sha256(f"{names}\0".encode("utf-8", "surrogateescape") if names else b"")

    def question(self, path: str) -> str:
        """`answers.question` of the scan of the file of ``path``."""
        from vllm_attn_compat.codemods.index.names import guess_module_name

        spelled = self._names.copy()
        spelled.update(f"module {guess_module_name(path)}\0path {path}".encode("utf-8", "surrogateescape"))
        return f"scan {spelled.hexdigest()[:32]}"

    def scan(self, s: _Scanned) -> classscan.ScannedIndex | None:
        """The file's `classscan.ScannedIndex`, or None where it must be parsed."""
        from vllm_attn_compat.codemods.index import records

        path = s.source_file.path
        return self.reading.answers.recall(
            s.digest,
            self.question(path),
            lambda: classscan.quick_index(s.source, path, self.known),
            lambda spared: None if spared is None else records.scan_to_data(spared),
            lambda data: None if data is None else records.scan_from_data(data),
        )


def _index_key(cache: Cache, s: _Scanned) -> str:
    """The cache's key of the file's index."""
    from vllm_attn_compat.codemods.index.names import guess_module_name

    path = s.source_file.path
    return cache.index_key(path, guess_module_name(path), _digest_of(s))


def _parse_scanned(
    candidates: Sequence[_Scanned], indexes: Mapping[str, IndexOutcome], options: Options, report: RunReport
) -> list[_Scanned]:
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
    warm: Sequence[prefork.PreforkedWorker] = (),
    prepared: rerun.Prepared | None = None,
) -> RunReport:
    """Migrate the given files and folders; ``emit_diff`` receives each file's unified diff (diff mode).

    ``warm`` are workers the caller started (:func:`worker.preload`) to have them ready sooner; the run
    stops them when done. ``prepared``: the files found for ``paths`` by a caller that tried
    `rerun.replay` already (the cache held no run over them).
    """
    if prepared is None:
        prepared = rerun.prepare(paths, options)
        report = prepared.report(options.mode)
        if rerun.replay(prepared, options.mode, report):
            for early in warm:
                early.close()
            return report  # a rerun over files whose status says they are unchanged: none was read
    try:
        return _run(prepared, options, emit_diff, list(warm))
    except _Changed:
        # A file the rerun took the status of changed since (it was edited during the run): what the run asked of
        # its bytes may mix two versions. The run starts again, reading every file. (Nothing was written: a run
        # that writes reads every file first.)
        prepared.known.clear()
        return _run(prepared, options, emit_diff, [])


def _run(
    prepared: rerun.Prepared, options: Options, emit_diff: Callable[[str], object], warm: list[prefork.PreforkedWorker]
) -> RunReport:
    """`run_paths` over the files found, the rerun having found no report of them."""
    report = prepared.report(options.mode)
    try:
        found, rules, cache, table, started = (
            prepared.found, prepared.rules, prepared.cache, prepared.table, prepared.started
        )  # fmt: skip
        prefilter = migrate.prefilter_tokens(rules)
        answers = answers_module.Answers(cache.root if cache else None, cache.prefix if cache else b"")
        # A run that writes reads each file before it writes any (`_Changed` would start it again half-written).
        known = prepared.known if options.mode != "write" else {}
        reading = _Reading(answers, table if cache else None, started, known)
        scanned, worth, warm, probable = _read_and_filter(found.files, rules, prefilter, options, report, warm, reading)
        context, context_worth = _read_context(found.excluded, prefilter, reading)
        run_key = None
        if cache and table:
            digests = {s.source_file.path: s.digest for s in [*scanned, *context] if s.digest is not None}
            run_key = cache.run_key(digests, prepared.excluded_paths, options.mode)
            table.save()
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
            if len(warm) == 1 and options.jobs > 1 and probable >= parallel.IN_PROCESS_BELOW:
                # Enough work for a second early worker: forked by the first once it has imported libcst
                # (else it imports it during the hierarchy rounds). Not sooner: a small or cached run
                # would only pay for it.
                second = warm[0].sibling() or prefork.start(worker.preload)
                warm += [second] if second else []
            involved = _migrate_worth(
                scanned, worth, rules, options, report, emit_diff, warm, cache, context, context_worth, reading=reading
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
    finally:
        for early in warm:
            early.close()
    return report


def _read_context(
    excluded: Sequence[files.SourceFile], prefilter: Sequence[bytes], reading: _Reading
) -> tuple[list[_Scanned], list[_Scanned]]:
    """The excluded files that can be read as source, and those of them the ``prefilter`` keeps: what they
    define and call still decides the fixes of the others. One that cannot be read is left out silently:
    nothing is reported in excluded files."""
    context = []
    for source_file in excluded:
        try:
            context.append(reading.read(source_file))
        except sources.SourceError:
            continue
    worth_parsing = reading.asking("prefilter", prefilter)
    return context, [s for s in context if worth_parsing(s)]


def _migrate_worth(
    scanned: Sequence[_Scanned],
    worth: Sequence[_Scanned],
    rules: Sequence[type[Rule]],
    options: Options,
    report: RunReport,
    emit_diff: Callable[[str], object],
    warm: list[prefork.PreforkedWorker],
    cache: Cache | None = None,
    context: Sequence[_Scanned] = (),
    context_worth: Sequence[_Scanned] = (),
    *,
    reading: _Reading,
) -> set[str]:
    """Index, then migrate the candidates among ``scanned`` (``worth``: those the prefilter kept). The
    ``context`` files (excluded; ``context_worth``: those the prefilter kept) take part in the index alone.
    Returns the files that took part beyond answering the run's questions: indexed, scanned, or parsed."""
    sources = _Sources({s.source_file.path: s for s in scanned})  # the files this run may migrate
    excluded = {s.source_file.path for s in context}
    early = (
        Handoff(
            warm,
            rules,
            options.unsafe_fixes,
            limit=None if options.jobs <= len(warm) else parallel.IN_PROCESS_BELOW,
            old_op_calls=options.old_op_calls,
            verify=options.verifies,
        )
        if warm
        else None
    )

    # With a cache, a file is sent before the last round only if the cache holds no migration of its bytes:
    # whether an entry serves is asked of the last round's hierarchy (`cache.Cache.load`).
    sendable = sources if cache is None else _Unmigrated({s.source_file.path: s for s in scanned}, cache)

    def after_round(built: ClassHierarchy, indexes: Mapping[str, IndexOutcome]) -> None:
        if early is not None:
            early.after_round(built, indexes, sendable)

    if cache is not None:
        cache.defer()  # the index's entries are written while the workers migrate (below)
    hierarchy, indexes = _index_hierarchy(
        [*scanned, *context],
        [*worth, *context_worth],
        options,
        report,
        after_round,
        early,
        cache,
        excluded,
        reading=reading,
    )
    # A finding at each call in the run that withholds a fix (`index.callsites`), where findings are reported.
    from vllm_attn_compat.codemods.index import callsites

    report.findings += callsites.findings_for_run(
        hierarchy.calls,
        _Sources({path: sources.scanned[path] for path in indexes if path in sources.scanned}),
        [rule.code for rule in rules],
    )
    failed = {error.path for error in report.errors}
    names = hierarchy.attention_class_names()
    # A file needing libcst holds a prefilter token, or an attention-class name (it was indexed);
    # rules scoped to attention classes matter only where the index shows such a class.
    reachable = {s.source_file.path: s for s in scanned if s.source_file.path in indexes}
    reachable |= {s.source_file.path: s for s in worth}
    tests: dict[tuple[str, ...], Callable[[_Scanned], bool]] = {}

    def needs_parsing(s: _Scanned) -> bool:
        acting = candidate_rules(rules, indexes.get(s.source_file.path), hierarchy, s.source_file.path)
        codes = tuple(rule.code for rule in acting)
        if codes not in tests:
            terms = [*scans.rule_terms(acting), *(f"class {name}" for name in names)]
            tests[codes] = reading.asking("parse", terms)
        return tests[codes](s)

    candidates = [s for path, s in sorted(reachable.items()) if path not in failed and needs_parsing(s)]
    involved = set(indexes) | {c.source_file.path for c in candidates}
    report.parsed = len((set(indexes) - excluded) | {c.source_file.path for c in candidates})
    diffs: dict[str, str] = {}
    keys: dict[str, str] = {}
    if cache is not None:
        missed: list[_Scanned] = []
        for item in candidates:
            path = item.source_file.path
            keys[path] = cache.file_key(path, _digest_of(item))
            if early is not None and path in early.sent:  # had no entry: migrated already, the answer comes
                missed.append(item)
                continue
            cached = cache.load(keys[path], hierarchy)
            if cached is None:
                missed.append(item)
            else:  # (an entry is only made of a file that parsed)
                _record(item, cached, options, report, diffs)
        candidates = missed
    candidates = _parse_scanned(candidates, indexes, options, report)
    by_path = {c.source_file.path: c for c in candidates}
    rest = [c for c in candidates if early is None or c.source_file.path not in early.sent]
    # The early workers take the rest when they are all the jobs, or when it is a few files; else their
    # share, and the other jobs the rest.
    jobs = options.jobs
    running = early.running() if early else []
    settings = (rules, hierarchy, options.unsafe_fixes, options.old_op_calls, options.verifies)
    outcomes: Iterable[tuple[str, MigrateOutcome | parallel.WorkerCrashed]]
    others = 0 if len(candidates) <= parallel.IN_PROCESS_BELOW else max(jobs - len(running), 0)
    if early is not None and running and not others:
        # The early workers are all the jobs: each takes the next file as it finishes one (a file sent ahead of
        # the last round too, if it must be migrated again).
        files = [(item.source_file.path, item.source) for item in rest]
        outcomes = _from_early(early.stream(files, hierarchy), early, jobs, settings)
    else:
        if early is not None and rest and running:
            share, rest = _early_share(rest, [early.loads[number] for number in running], others)
            pickled = early.settings(hierarchy)
            for item, to in share:
                early.send(item.source_file.path, item.source, pickled, running[to])
            jobs = others
        tasks = [(c.source_file.path, (c.source, c.source_file.path)) for c in rest]
        outcomes = parallel.parallel_map(
            worker.migrate_file, tasks, jobs=jobs, initializer=worker.setup, initargs=settings
        )
        if early is not None:
            # The early workers are at their tasks already (their answers wait, read as they come): start the
            # rest first, so that all run at once.
            outcomes = itertools.chain(outcomes, _from_early(early.results(hierarchy), early, jobs, settings))
    # libcst missing or broken: every file fails alike, and the command names it once (cli.py)
    missing: MissingDependency | None = None
    written = cache.write_deferred() if cache is not None else None
    try:
        for path, outcome in _with_progress(outcomes, len(candidates), options.progress, "migrate"):
            if isinstance(outcome, MissingDependency):
                missing = outcome  # raised once all are in: the pools shut down as usual, leaving no process behind
            else:
                _record(by_path[path], outcome, options, report, diffs)
                if cache is not None and isinstance(outcome, worker.Migrated):
                    cache.store(keys[path], outcome)
    finally:
        if written is not None:
            written()
    if missing is not None:
        raise missing
    for path in sorted(diffs):  # workers finish in any order; the output must not depend on it
        emit_diff(diffs[path])
    report.changed.sort()
    return involved


class _Sources(Mapping[str, bytes]):
    """The bytes of the files of ``scanned`` by path, each read when first asked for (`_Scanned.source`)."""

    def __init__(self, scanned: Mapping[str, _Scanned]) -> None:
        self.scanned = scanned

    def __getitem__(self, path: str) -> bytes:
        return self.scanned[path].source

    def __iter__(self) -> Iterator[str]:
        return iter(self.scanned)

    def __len__(self) -> int:
        return len(self.scanned)


class _Unmigrated(Mapping[str, bytes]):
    """The sources (path -> bytes) of the files of ``scanned`` of which the cache holds no migration, asked of
    the cache per file as a round hands files out."""

    def __init__(self, scanned: Mapping[str, _Scanned], cache: Cache) -> None:
        self.scanned = scanned
        self.cache = cache
        self._known: dict[str, bool] = {}

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str) or path not in self.scanned:
            return False
        if path not in self._known:
            self._known[path] = not self.cache.holds(self.cache.file_key(path, _digest_of(self.scanned[path])))
        return self._known[path]

    def __getitem__(self, path: str) -> bytes:
        if path not in self:
            raise KeyError(path)
        return self.scanned[path].source

    def __iter__(self) -> Iterator[str]:
        return (path for path in self.scanned if path in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _from_early(
    answers: Iterable[tuple[str, MigrateOutcome | parallel.WorkerCrashed]],
    early: Handoff,
    jobs: int,
    settings: tuple[object, ...],
) -> Iterator[tuple[str, MigrateOutcome | parallel.WorkerCrashed]]:
    """The early workers' ``answers`` (`Handoff.stream` or `Handoff.results`), then those of the files left to
    migrate once they stopped (`Handoff.left`: no worker ran any more, or a file sent ahead of the last round
    must be migrated again), from a pool."""
    yield from answers
    tasks = [(path, (source, path)) for path, source in early.left]
    yield from parallel.parallel_map(worker.migrate_file, tasks, jobs=jobs, initializer=worker.setup, initargs=settings)


# What the parent (or a pool) spends importing libcst before its first file, in bytes of migrated source
# (about 0.25 s at 0.3 MB/s); the early workers imported it already.
_IMPORT_IN_BYTES = 80_000


def _early_share(
    rest: Sequence[_Scanned], loads: Sequence[int], others: int
) -> tuple[list[tuple[_Scanned, int]], list[_Scanned]]:
    """The files for the early workers, each with the number of the worker to take it (worker ``n`` has
    ``loads[n]`` bytes to migrate already), and those for the ``others`` processes to start: largest first,
    each to the process with the least work. Forking a full pool instead would import libcst once more per
    process, and leave the early workers idle."""
    early_loads = list(loads)
    mine: list[tuple[_Scanned, int]] = []
    theirs: list[_Scanned] = []
    other = _IMPORT_IN_BYTES * others  # the others' work in all, shared among them
    for item in sorted(rest, key=lambda item: -len(item.source)):
        least = min(range(len(early_loads)), key=early_loads.__getitem__)
        if not others or early_loads[least] <= other / others:
            mine.append((item, least))
            early_loads[least] += len(item.source)
        else:
            theirs.append(item)
            other += len(item.source)
    return mine, theirs


def _with_progress(outcomes: Iterable[Item], total: int, enabled: bool, stage: str) -> Iterable[Item]:
    if not enabled:
        return outcomes
    from tqdm import tqdm

    # No monitor thread: the worker processes are forked while the bar is alive.
    tqdm.monitor_interval = 0
    bar: Iterable[Item] = tqdm(outcomes, total=total, unit="file", desc=stage, delay=0.5, leave=False)
    return bar


def _record(item: _Scanned, outcome: Recorded, options: Options, report: RunReport, diffs: dict[str, str]) -> None:
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


def run_source(source: bytes, path: str, options: Options) -> tuple[RunReport, bytes, str]:
    """Migrate one source given as bytes (standard input); ``path`` names it in reports.

    Returns the report, the resulting source (the input itself when nothing changed or the file
    failed, so a pipe never loses code) and the unified diff (empty when unchanged).
    """
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
    report.findings += callsites.findings_for_run(built.calls, {path: source}, [rule.code for rule in rules])
    acting = rules if built.has_attention_classes(path) else [rule for rule in rules if not rule.scoped]
    if not migrate.needs_parsing(source, acting, built.attention_class_names()):
        return report, source, ""
    worker.setup(rules, built, options.unsafe_fixes, options.old_op_calls, options.verifies)
    outcome = worker.migrate_file(source, path)
    if isinstance(outcome, MissingDependency):
        raise outcome
    if isinstance(outcome, FileError):
        report.errors.append(outcome)
        return report, source, ""
    new_source = outcome.new_source
    report.findings += [(path, finding) for finding in outcome.findings]
    if new_source is None:
        return report, source, ""
    report.changed.append(path)
    return report, new_source, unified_diff(path, source, new_source, encoding)
