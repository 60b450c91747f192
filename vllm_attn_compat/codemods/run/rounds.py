"""The class hierarchy of a run, built round after round: the run's one conversation with `index/`.

The first round indexes the files that can define a vLLM attention class by themselves, and every file reading
`accept_output_buffer`; each later round the files naming (as a whole identifier) an attention class found so
far, those the class scan spared that a later round needs, and those whose module may define a class a fix
depends on. Once no new name appears, the files holding a name whose fix is still safe are indexed, a few at a
time (then the rounds go on as before): every use of what a fix changes is accounted for (#50). The class scan
(`index.classscan`) spares the parse of files whose class headers show nothing.

What this module asks of `index/`: `classscan.quick_index`, `hierarchy.ClassHierarchy.build` (its
``attention_class_names``, ``calls.methods``, ``missing_classes`` and ``accounting_terms``),
`hierarchy.unparsed_index`, `calltext`'s scans for uses and names, and the module names of `names`. Indexing a
file is the caller's (``index``: the cache, worker processes); each question about a file's bytes is asked
through `reading`, which keeps the answers.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set

from vllm_attn_compat.codemods.index import classscan
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, ModuleIndex, unparsed_index, uses_read
from vllm_attn_compat.codemods.index.names import FLAG_BYTES
from vllm_attn_compat.codemods.run import parallel, reading
from vllm_attn_compat.codemods.run.reading import RunFile
from vllm_attn_compat.codemods.run.report import FileError

# What indexes a round's files (given as the class scan finds them), recording the uses of the attribute names given
# (`calls.CallIndex.names`): ``(path, outcome)`` for each, the outcome a `ModuleIndex` or why there is none.
Index = Callable[[Iterable[RunFile], frozenset[str]], Iterable[tuple[str, object]]]


def build_hierarchy(
    files: Sequence[RunFile], worth: Iterable[RunFile], index: Index, prefilter: Set[bytes] = frozenset()
) -> tuple[ClassHierarchy, dict[str, object]]:
    """The class hierarchy of the run over ``files`` (``worth``: those the prefilter kept, the files holding one of
    the texts ``prefilter``, iterated twice at most: `reading.Kept`, whose files the first round indexes as they
    are found), with what each file that took part gave: its `ModuleIndex`, its
    `classscan.ScannedIndex` (spared), or why it has none (whatever ``index`` gave for it). ``index(files, names)``
    yields ``(path, outcome)`` for each file of ``files`` (an iterator: each file comes once the class scan has found
    that it must be parsed), recording the uses of the attribute ``names``: those the analysis of the files indexed
    so far reads (`hierarchy.uses_read`). A file indexed before a name joined them, which uses it, is indexed again
    with it (uses are a file's most numerous records: a run keeps those it reads alone)."""
    from vllm_attn_compat.codemods.index.names import guess_module_name

    indexes: dict[str, object] = {}
    # The files that did not parse, by their text's occurrences of names (`hierarchy.unparsed_index`): a use of
    # what a fix changes there withholds the fix (#50).
    unparsed: dict[str, ModuleIndex] = {}
    by_path = {f.path: f for f in files}
    run_modules = frozenset(f.module for f in files)
    # How many files the accounting reads next (`accounting_terms`): doubled after each time. The first few are
    # indexed in this process (a worker may still be importing libcst): on torch's tree, they are all it reads.
    accounted = parallel.IN_PROCESS_BELOW // 2
    queue: list[RunFile] = []  # the files the accounting may read, the smallest first
    looked_at = 0  # how far into it
    looked_for: frozenset[str] = frozenset()  # the names it looked for there
    names_vllm = reading.asking("vllm", [], lambda: lambda source: b"vllm" in source)
    reads_flag = reading.asking("flag", [], lambda: lambda source: FLAG_BYTES in source)

    def first_round() -> Iterator[RunFile]:
        first = set()
        for f in worth:
            if names_vllm(f) or guess_module_name(f.path).partition(".")[0] == "vllm":
                first.add(f.path)
                yield f
        # A read of `accept_output_buffer` anywhere in the run decides whether deleting a declaration is safe
        # (`ClassHierarchy.flag_readers`), whatever the file imports or the rules selected. (Where the prefilter
        # looked for a part of it, only the files it kept can hold it.)
        holders = worth if any(token in FLAG_BYTES for token in prefilter) else files
        yield from (f for f in holders if f.path not in first and reads_flag(f))

    found = first_round()
    opening = next(found, None)
    pending: Iterable[RunFile] = [] if opening is None else itertools.chain([opening], found)
    known_names: frozenset[str] = frozenset()
    must_parse: set[str] = set()  # files the class scan spared once, which later rounds need indexed
    checked_methods: frozenset[str] = frozenset()  # the methods each file spared in earlier rounds was checked for
    built = ClassHierarchy.build([], run_modules)
    read = uses_read(built)
    stems = _Stems(files)
    while pending:
        # Files whose class headers show no class that can be an attention class (nor a patch, nor a
        # backend's shape) skip the parse until a later round needs them (below).
        spared_now: dict[str, classscan.ScannedIndex] = {}
        indexed = dict(index(_to_parse(pending, must_parse, known_names, spared_now), read))
        indexes.update(spared_now)
        indexes.update(indexed)
        for path, outcome in indexed.items():
            if isinstance(outcome, FileError):
                unparsed[path] = unparsed_index(by_path[path].source, path)
        built = _built(indexes, unparsed, run_modules)
        read = uses_read(built)
        lacking = [
            by_path[path]
            for path, outcome in indexes.items()
            if isinstance(outcome, ModuleIndex) and outcome.calls.lacks(read)
        ]
        if lacking:  # (indexed again, a file gives the same classes and methods: `read` stays)
            indexes.update(index(lacking, read))
            built = _built(indexes, unparsed, run_modules)
        new_names = built.scope_class_names() - known_names
        known_names |= new_names
        has_name = _words(new_names)
        later = [f for f in files if f.path not in indexes and has_name(f)]
        # A spared file is indexed once a name it uses in a class header or a patch, or defines, is an
        # attention class or patched code found since (`ScannedIndex.names_any`), or once it may use a
        # method whose fix the call-site analysis decides (`callsites`: its calls would be missed).
        # (A file spared before this round was checked for the methods known then: only the others count.)
        methods = frozenset(name for _, name in built.calls.methods)
        new_methods = methods - checked_methods
        checked_methods = methods
        uses, new_uses = _may_use(methods), _may_use(new_methods)
        for f in files:
            spared = indexes.get(f.path)
            if not isinstance(spared, classscan.ScannedIndex):
                continue
            if spared.names_any(new_names) or (uses(f) if f.path in spared_now else new_uses(f)):
                must_parse.add(f.path)
                later.append(f)
        later += _defining_files(built.missing_classes(), stems, indexes, later, must_parse)
        if not later:
            # Every use in the run counts, whatever its file imports (`runner.py` calling `engine.impl.prefill(x)`,
            # reflection in a tool): once the rounds have settled, a file not indexed is parsed if it holds a name
            # whose fixes are still safe (`accounting_terms`). Asked only then, so that what is read depends on the
            # files alone, not on the order the rounds found things in; and a few files at a time, the smallest
            # first (by size, then path), each time twice as many: once a use withholds every fix a name decides,
            # the name is looked for no more, so a tree holding thousands of `forward`s (torch's) parses a handful
            # of small files. (A file that held none of the names looked for holds none of fewer names: the queue
            # is read on from where it stopped, unless a name was added.)
            terms = built.accounting_terms()
            if not terms <= looked_for:
                queue, looked_at = sorted(files, key=_smallest_first), 0
            looked_for = terms
            holds = _holds_names(terms)
            while terms and looked_at < len(queue) and len(later) < accounted:
                f = queue[looked_at]
                looked_at += 1
                if _unread(f.path, indexes) and holds(f):
                    later.append(f)
            accounted *= 2
            must_parse.update(f.path for f in later)
        pending = later
    return built, indexes


def _built(indexes: Mapping[str, object], unparsed: Mapping[str, ModuleIndex], modules: Set[str]) -> ClassHierarchy:
    """The hierarchy of the files indexed so far."""
    found = [index for index in indexes.values() if isinstance(index, ModuleIndex)]
    return ClassHierarchy.build([*found, *unparsed.values()], modules)


def _smallest_first(f: RunFile) -> tuple[int, str]:
    """The order the accounting reads files in: a small file costs little to parse, and a use that withholds every
    fix (reflection) is as likely there as in a large one. Decided by the files alone (sizes, then paths)."""
    return f.stat.st_size, f.path


def _unread(path: str, indexes: Mapping[str, object]) -> bool:
    """Whether the accounting may still read the file: not indexed, or spared by the class scan."""
    return path not in indexes or isinstance(indexes[path], classscan.ScannedIndex)


def _to_parse(
    pending: Iterable[RunFile], must_parse: Set[str], known: frozenset[str], spared: dict[str, classscan.ScannedIndex]
) -> Iterator[RunFile]:
    """The files of a round to parse, as the class scan finds them (they are indexed meanwhile); those it spares
    go to ``spared``."""
    for f in pending:
        scanned = None if f.path in must_parse else _class_scan(f, known)
        if scanned is None:
            yield f
        else:
            spared[f.path] = scanned


def _class_scan(f: RunFile, known: frozenset[str]) -> classscan.ScannedIndex | None:
    """`classscan.quick_index` of the file with the attention-class names ``known`` (None: it must be parsed)."""
    from vllm_attn_compat.codemods.index import records

    return f.ask(
        reading.question("scan", [f"class {name}" for name in known]),
        lambda source: classscan.quick_index(source, f.path, known),
        lambda spared: None if spared is None else records.scan_to_data(spared),
        lambda data: None if data is None else records.scan_from_data(data),
        by_module=True,
    )


def _words(names: frozenset[str]) -> Callable[[RunFile], bool]:
    """Whether a file names one of ``names`` as a whole identifier."""

    def make() -> Callable[[bytes], bool]:
        from vllm_attn_compat.codemods.engine.scan import TokenScan

        return TokenScan([name.encode() for name in names], whole_words=True)

    return reading.asking("words", names, make)


def _may_use(methods: frozenset[str]) -> Callable[[RunFile], bool]:
    """`calltext.may_use` of a file, for the methods ``methods``."""

    def make() -> Callable[[bytes], bool]:
        from vllm_attn_compat.codemods.index import calltext

        pattern = calltext.uses_pattern(methods)
        return lambda source: calltext.may_use(source, methods, pattern)

    return reading.asking("uses", methods, make)


def _holds_names(names: frozenset[str]) -> Callable[[RunFile], bool]:
    """`calltext.holds_names` of a file: whether it holds one of ``names`` whose fixes the accounting decides."""

    def make() -> Callable[[bytes], bool]:
        from vllm_attn_compat.codemods.index import calltext

        needles = calltext.names_needles(names)
        return lambda source: calltext.holds_names(source, needles)

    return reading.asking("names", names, make)


def _defining_files(
    names: Set[str], stems: _Stems, indexes: dict[str, object], pending: Sequence[RunFile], must_parse: set[str]
) -> list[RunFile]:
    """The files not indexed yet whose module may define one of the classes ``names`` (dotted); those the class
    scan spared are parsed this time (``must_parse``)."""
    if not names:
        return []
    from vllm_attn_compat.codemods.index.names import guess_module_name, may_define

    queued = {f.path for f in pending}
    # A module that may define ``a.b.C`` ends in ``b`` (`names_match`): its file is ``b.py`` (or a package's
    # ``__init__.py``). Looked at first, so that a module name (a look for ``__init__.py`` in each folder above)
    # is guessed only for those files.
    lasts = {name.rpartition(".")[0].rpartition(".")[2] for name in names}
    found = []
    for f in stems.named(lasts):
        index = indexes.get(f.path)
        if f.path in queued or not (index is None or isinstance(index, classscan.ScannedIndex)):
            continue
        module = guess_module_name(f.path)
        if any(may_define(module, name) for name in names):
            must_parse.add(f.path)
            found.append(f)
    return found


class _Stems:
    """The files of a run by the last part of their module's name as `guess_module_name` takes it from the file's
    name (``b`` for ``a/b.py`` and ``a/x.b.py``), and its packages' ``__init__.py`` files apart; made when first
    asked (a round looks for the modules that may define a class)."""

    def __init__(self, files: Sequence[RunFile]) -> None:
        self._files = files
        self._by_last: dict[str, list[int]] | None = None
        self._inits: list[int] = []

    def named(self, lasts: Set[str]) -> list[RunFile]:
        """The files whose name ends a module name in ``lasts``, and every ``__init__.py``, in the run's order."""
        if self._by_last is None:
            self._by_last = {}
            for number, f in enumerate(self._files):
                stem = os.path.basename(f.path).rsplit(".", 1)[0]  # as `guess_module_name` takes it
                if stem == "__init__":
                    self._inits.append(number)
                else:
                    self._by_last.setdefault(stem.rpartition(".")[2], []).append(number)
        numbers = [*self._inits, *(number for last in lasts for number in self._by_last.get(last, ()))]
        return [self._files[number] for number in sorted(numbers)]
