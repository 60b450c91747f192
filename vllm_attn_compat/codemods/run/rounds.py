"""The class hierarchy of a run, built round after round (step 3 of `runner`'s funnel).

The first round indexes the files that can define a vLLM attention class by themselves; each later round
the files naming (as a whole identifier) an attention class found so far, those the class scan spared that
a later round needs, and those whose module may define a base the flag's owners need; once no new name
appears, the files that may call a method whose fix the call-site analysis decides. The class scan
(`index.classscan`) spares the parse of files whose class headers show nothing; the others are indexed in
the early workers as the scan finds them (`indexing`), or come from the cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence, Set
from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.index import classscan
from vllm_attn_compat.codemods.run import keyhash, parallel, progress
from vllm_attn_compat.codemods.run.indexing import RoundIndexing
from vllm_attn_compat.codemods.run.options import Options
from vllm_attn_compat.codemods.run.reading import Reading, Scanned, digest_of
from vllm_attn_compat.codemods.run.report import FileError, RunReport

if TYPE_CHECKING:
    from typing import TypeAlias

    from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, ModuleIndex
    from vllm_attn_compat.codemods.run.cache import Cache
    from vllm_attn_compat.codemods.run.handoff import Handoff

    # What the hierarchy pass knows of each file it took part in: its index, or why it has none.
    IndexOutcome: TypeAlias = ModuleIndex | FileError | parallel.WorkerCrashed


def index_hierarchy(
    scanned: Sequence[Scanned],
    worth: Sequence[Scanned],
    options: Options,
    report: RunReport,
    after_round: Callable[[ClassHierarchy, Mapping[str, IndexOutcome]], None],
    early: Handoff | None = None,
    cache: Cache | None = None,
    excluded: Set[str] = frozenset(),
    *,
    reading: Reading,
) -> tuple[ClassHierarchy, dict[str, IndexOutcome]]:
    """Build the class hierarchy of the run; returns it with the index of each file that took part.

    The first round indexes the files the prefilter kept that can define a vLLM attention class by
    themselves: they mention vLLM, or belong to a package named ``vllm`` (a fork). The others (torch has
    a ``class Attention(nn.Module)``) take part only if they name an attention class. Later rounds index
    every file naming (as a whole identifier) an attention class found so far. ``after_round(hierarchy,
    indexes)`` runs for each round, once the next one's files are handed out to be indexed, or before the next
    one loads its indexes when it has none to index (the last round's, at the end).
    The files are indexed in the ``early`` workers, as the class scan finds them, when they are all the jobs
    (`indexing.RoundIndexing`), those the ``cache`` holds not at all. A file of ``excluded`` that does not
    parse is left out unreported.
    """
    from vllm_attn_compat.codemods.index import hierarchy as hierarchy_module
    from vllm_attn_compat.codemods.index.names import guess_module_name

    def in_vllm_package(path: str) -> bool:
        return guess_module_name(path).partition(".")[0] == "vllm"

    indexes: dict[str, IndexOutcome] = {}
    # The files that did not parse, by their text's occurrences of names (`hierarchy.unparsed_index`): a use of
    # what a fix changes there withholds the fix (#50).
    unparsed: dict[str, hierarchy_module.ModuleIndex] = {}
    by_path = {s.source_file.path: s for s in scanned}
    run_modules = frozenset(guess_module_name(path) for path in by_path)
    # How many files the accounting reads next (`accounting_terms`): doubled after each time. The first few are indexed
    # in this process (a worker may still be importing libcst): on torch's tree, they are all it reads.
    accounted = parallel.IN_PROCESS_BELOW // 2
    queue: list[Scanned] = []  # the files the accounting may read, the smallest first
    looked_at = 0  # how far into it
    looked_for: frozenset[str] = frozenset()  # the names it looked for there
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
    built = hierarchy_module.ClassHierarchy.build([], run_modules)
    stems = _Stems(scanned)
    settled: ClassHierarchy | None = None  # the last round's hierarchy, for `after_round` once the next is under way
    while pending:
        # Files whose class headers show no class that can be an attention class (nor a patch, nor a
        # backend's shape) skip the parse until a later round needs them (below).
        spared_now: set[str] = set()
        indexing = RoundIndexing(options.jobs, early)
        class_scans = ClassScans(known_names, reading)
        index_keys: dict[str, str] = {}  # the cache's key of each file of the round to index (looked up, then stored)
        held: list[Scanned] = []  # the files whose index the cache holds an entry of, loaded below
        for s in pending:
            path = s.source_file.path
            scanned_index = None if path in must_parse else class_scans.scan(s)
            if scanned_index is not None:
                indexes[path] = scanned_index
                spared_now.add(path)
                continue
            if cache is not None:
                index_keys[path] = index_key(cache, s)
                if cache.holds(index_keys[path]):
                    held.append(s)
                    continue
            indexing.add(path, s.source)
        if settled is not None and not len(indexing):
            # Nothing of this round to index (a rerun's later rounds): the last round's settled files go to the early
            # workers at once, and migrate while this process loads the round's indexes. (The entries added this
            # round are the class scan's: `after_round` skips them.)
            after_round(settled, indexes)
            settled = None
        for s in held:
            path = s.source_file.path
            cached = cache.load_index(index_keys[path]) if cache is not None else None
            if cached is not None:
                indexes[path] = cached
            else:  # gone since, or no valid entry (a warning says so): the file is indexed
                indexing.add(path, s.source)
        outcomes = indexing.outcomes()
        if settled is not None:
            # The last round's settled files go to the early workers after this round's files, which the run
            # waits for when they index them.
            after_round(settled, indexes)
        for path, outcome in progress.bar(outcomes, len(indexing), options.progress, "index classes"):
            if isinstance(outcome, FileError):
                if path not in excluded:
                    report.errors.append(outcome)
                unparsed[path] = hierarchy_module.unparsed_index(by_path[path].source, path)
            elif isinstance(outcome, parallel.WorkerCrashed):
                report.errors.append(FileError(path, 1, 1, f"internal error: {outcome}"))
            elif cache:
                cache.store_index(index_keys[path], outcome)
            indexes[path] = outcome
        indexed = [index for index in indexes.values() if isinstance(index, hierarchy_module.ModuleIndex)]
        built = hierarchy_module.ClassHierarchy.build([*indexed, *unparsed.values()], run_modules)
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
        missing = built.missing_classes()
        reading.looked_for |= missing
        pending += _defining_files(missing, stems, indexes, pending, must_parse)
        if not pending:
            # Every use in the run counts, whatever its file imports (`runner.py` calling `engine.impl.prefill(x)`,
            # reflection in a tool): once the rounds have settled, a file not indexed is parsed if it holds a name
            # whose fixes are still safe (`accounting_terms`). Asked only then, so that what is read depends on the
            # files alone, not on the order the rounds found things in; and a few files at a time, the smallest
            # first (by size, then path), each time twice as many: once a use withholds every fix a name decides,
            # the name is looked for no more, so a tree holding thousands of `forward`s (torch's) parses a handful
            # of small files.
            # (A file that held none of the names looked for holds none of fewer names: the queue is read on from
            # where it stopped, unless a name was added.)
            terms = built.accounting_terms()
            if not terms <= looked_for:
                queue, looked_at = sorted(scanned, key=_smallest_first), 0
            looked_for = terms
            holds = reading.asking("names", terms)
            while terms and looked_at < len(queue) and len(pending) < accounted:
                s = queue[looked_at]
                looked_at += 1
                if _unread(s.source_file.path, indexes) and holds(s):
                    pending.append(s)
            accounted *= 2
            must_parse.update(s.source_file.path for s in pending)
    if settled is not None:
        after_round(settled, indexes)
    if cache is not None:  # (its indexes are written once the workers have their files: `Cache.write_deferred`)
        cache.read_names = frozenset(name for _, name in built.calls.methods)
    return built, indexes


def _smallest_first(s: Scanned) -> tuple[int, str]:
    """The order the accounting reads files in: a small file costs little to parse, and a use that withholds every
    fix (reflection) is as likely there as in a large one. Decided by the files alone (sizes, then paths)."""
    return s.stat.st_size, s.source_file.path


def _unread(path: str, indexes: Mapping[str, IndexOutcome]) -> bool:
    """Whether the accounting may still read the file: not indexed, or spared by the class scan."""
    return path not in indexes or isinstance(indexes[path], classscan.ScannedIndex)


def _may_use(reading: Reading, methods: frozenset[str]) -> Callable[[Scanned], bool]:
    """`calltext.may_use` of a file, for the methods ``methods``, as `answers` keep it."""
    return reading.asking("uses", methods)


def _defining_files(
    names: Set[str],
    stems: _Stems,
    indexes: Mapping[str, IndexOutcome],
    pending: Sequence[Scanned],
    must_parse: set[str],
) -> list[Scanned]:
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
    for s in stems.named(lasts):
        path = s.source_file.path
        index = indexes.get(path)
        if path in queued or not (index is None or isinstance(index, classscan.ScannedIndex)):
            continue
        module = guess_module_name(path)
        if any(may_define(module, name) for name in names):
            must_parse.add(path)
            found.append(s)
    return found


class _Stems:
    """The files of a run by the last part of their module's name as `guess_module_name` takes it from the file's
    name (``b`` for ``a/b.py`` and ``a/x.b.py``), and its packages' ``__init__.py`` files apart; made when first
    asked (a round looks for the modules that may define a class)."""

    def __init__(self, scanned: Sequence[Scanned]) -> None:
        self._scanned = scanned
        self._by_last: dict[str, list[int]] | None = None
        self._inits: list[int] = []

    def named(self, lasts: Set[str]) -> list[Scanned]:
        """The files whose name ends a module name in ``lasts``, and every ``__init__.py``, in the run's order."""
        if self._by_last is None:
            self._by_last = {}
            for number, s in enumerate(self._scanned):
                stem = os.path.basename(s.source_file.path).rsplit(".", 1)[0]  # as `guess_module_name` takes it
                if stem == "__init__":
                    self._inits.append(number)
                else:
                    self._by_last.setdefault(stem.rpartition(".")[2], []).append(number)
        numbers = [*self._inits, *(number for last in lasts for number in self._by_last.get(last, ()))]
        return [self._scanned[number] for number in sorted(numbers)]


class ClassScans:
    """`classscan.quick_index` of the files of a round, as the answers keep it (by the file's bytes, path, module
    name, and the attention-class names ``known`` when the round began)."""

    def __init__(self, known: frozenset[str], reading: Reading) -> None:
        self.known = known
        self.reading = reading
        # The question's terms are the names (the same for each file of the round) and the file's path and module
        # name, spelled in that order (`answers.spell` sorts them: "class ..." < "module ..." < "path ..."):
        # hashed once for the names (`answers.question`).
        names = "\0".join(sorted(f"class {name}" for name in known))
        self._names = keyhash.new(f"{names}\0".encode("utf-8", "surrogateescape") if names else b"")

    def question(self, path: str) -> str:
        """`answers.question` of the scan of the file of ``path``."""
        from vllm_attn_compat.codemods.index.names import guess_module_name

        spelled = self._names.copy()
        spelled.update(f"module {guess_module_name(path)}\0path {path}".encode("utf-8", "surrogateescape"))
        return f"scan {spelled.hexdigest()[:32]}"

    def scan(self, s: Scanned) -> classscan.ScannedIndex | None:
        """The file's `classscan.ScannedIndex`, or None where it must be parsed."""
        from vllm_attn_compat.codemods.index import records

        path = s.source_file.path
        return self.reading.recall(
            s,
            self.question(path),
            lambda: classscan.quick_index(s.source, path, self.known),
            lambda spared: None if spared is None else records.scan_to_data(spared),
            lambda data: None if data is None else records.scan_from_data(data),
        )


def index_key(cache: Cache, s: Scanned) -> str:
    """The cache's key of the file's index."""
    from vllm_attn_compat.codemods.index.names import guess_module_name

    path = s.source_file.path
    return cache.index_key(path, guess_module_name(path), digest_of(s))
