"""Handing files to the workers started early as soon as their migration is settled, or ahead of it.

The class hierarchy grows round after round (see :mod:`runner`), and a file's migration depends on it
only through whether the file's own classes are attention classes. That answer only ever turns from
no to yes as rounds add classes, so a file whose classes are all attention classes already, or which
defines none, migrates now exactly as it would after the last round: it goes to an early worker at once,
and its migration overlaps the rounds still to come instead of waiting for them.

A file whose migration later rounds may still change (a backend whose fix its callers decide, a flag's
declaration) goes ahead all the same when a worker has nothing else to do: a rerun after a backend was
edited has the one file to migrate, and the worker would idle through the rounds. A migration records
every question it asked of the hierarchy (`index.questions`); where the last round's hierarchy answers
them all alike, the file migrates with it exactly so (the argument the cache rests on), else it is
migrated again with it.
"""

from __future__ import annotations

import collections
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from vllm_attn_compat.codemods.engine import migrate
from vllm_attn_compat.codemods.engine.rule import Rule
from vllm_attn_compat.codemods.index.classscan import ScannedIndex
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, ModuleIndex
from vllm_attn_compat.codemods.index.questions import still_holds
from vllm_attn_compat.codemods.run import worker
from vllm_attn_compat.codemods.run.prefork import PreforkedWorker


def settles(index: ModuleIndex, hierarchy: ClassHierarchy) -> bool:
    """Whether later rounds can no longer change how the file of ``index`` migrates. A method whose fix
    calls in other files can withhold (`callsites`) waits for them: later rounds may find more."""
    from vllm_attn_compat.codemods.index import callsites

    if isinstance(index, ScannedIndex):  # its classes were not indexed: a later round may parse it
        return False
    if callsites.has_methods(index):
        return False
    if any(entry.declares_flag for entry in index.classes):
        # Whether deleting the flag is safe depends on every class of the run deriving from these classes, and on
        # all their bases (`ClassHierarchy.flag_readers`, `own_flag_base`): later rounds may find more.
        return False
    return hierarchy.patches_decided(index) and all(
        hierarchy.is_attention_class(f"{index.module}.{entry.qualname}") for entry in index.classes
    )


def candidate_rules(
    rules: Sequence[type[Rule]], index: object, hierarchy: ClassHierarchy, path: str
) -> Sequence[type[Rule]]:
    """The rules that can act in a file: all of them where its index shows an attention class, else
    only those that act anywhere."""
    if isinstance(index, ModuleIndex) and hierarchy.has_attention_classes(path):
        return rules
    return [rule for rule in rules if not rule.scoped]


# Whether the file at a path needs libcst for some of the rules that can act in it, the attention classes of the
# run being those named (`migrate.needs_parsing` of its bytes).
NeedsParsing = Callable[[str, Sequence[type[Rule]], frozenset[str]], bool]


class Handoff:
    """Sends settled candidates to the early workers after each round, each file to the worker that indexed
    it (and kept its syntax tree: `holders`), else to the one with the least work so far. Where other jobs
    will start besides them, they take at most ``limit`` files in all during the rounds (a few early workers
    should not take on a whole fork's worth of files: a full pool shares the rest); where they are all the
    jobs there are, ``limit`` is None. ``needs_parsing`` answers whether a file needs libcst (the runner's
    answers keep it: a rerun reads no file for that); by default, from the bytes `after_round` is given."""

    def __init__(
        self, workers: Sequence[PreforkedWorker], rules: Sequence[type[Rule]], unsafe_fixes: bool, limit: int | None,
        old_op_calls: str = "with-output", verify: bool = True, needs_parsing: NeedsParsing | None = None,
    ) -> None:  # fmt: skip
        self.workers = list(workers)
        self.rules = rules
        self.needs_parsing = needs_parsing
        self.unsafe_fixes = unsafe_fixes
        self.old_op_calls = old_op_calls
        self.verify = verify
        self.limit = limit
        self.sent: set[str] = set()
        self.loads = [0] * len(self.workers)  # bytes of source sent to each worker
        self._configured: list[bytes | None] = [None] * len(self.workers)  # the settings each worker has
        self._pickled: tuple[ClassHierarchy, bytes] | None = None  # the last hierarchy pickled, and its settings
        self.left: list[tuple[str, bytes]] = []  # files `stream` could not hand out (no worker ran any more)
        # The worker that indexed a file it will probably migrate, and kept its syntax tree for that.
        self.holders: dict[str, int] = {}
        # The files sent before the rounds settled them (path -> source), until their answer is judged.
        self.ahead: dict[str, bytes] = {}

    def will_migrate(self, source: bytes) -> bool:
        """Whether a file being indexed will probably be migrated (a rule's tokens: `migrate.needs_parsing`)."""
        return migrate.needs_parsing(source, self.rules)

    def settings(self, hierarchy: ClassHierarchy) -> bytes:
        """The pickled settings of :func:`worker.setup` (sent to each worker once per round that sends it files);
        pickled once per hierarchy (the last round's serves the files sent after it too)."""
        if self._pickled is None or self._pickled[0] is not hierarchy:
            settings = (self.rules, hierarchy, self.unsafe_fixes, self.old_op_calls, self.verify)
            self._pickled = hierarchy, pickle.dumps(settings)
        return self._pickled[1]

    def running(self) -> list[int]:
        """The numbers of the workers that may take more files (`PreforkedWorker.running`)."""
        return [number for number, early in enumerate(self.workers) if early.running()]

    def least_loaded(self) -> int | None:
        """The running worker with the least work, to take another file during the rounds; None past the
        limit, or when none runs."""
        if self.limit is not None and len(self.sent) >= self.limit:
            return None
        running = self.running()
        return min(running, key=self.loads.__getitem__) if running else None

    def idle(self) -> int | None:
        """A running worker with no file to index or migrate, to take a file ahead of the last round; None
        past the limit, or when none is idle."""
        if self.limit is not None and len(self.sent) >= self.limit:
            return None
        return next((number for number in self.running() if not self.workers[number].unanswered()), None)

    def send(self, path: str, source: bytes, pickled: bytes, to: int) -> None:
        """Migrate ``source`` in worker number ``to``, with the settings ``pickled``."""
        if self._configured[to] != pickled:
            self.workers[to].configure(worker.setup_pickled, (pickled,))
            self._configured[to] = pickled
        self.workers[to].submit(path, worker.migrate_file, (source, path))
        self.sent.add(path)
        self.loads[to] += len(source)

    def after_round(
        self, hierarchy: ClassHierarchy, indexes: Mapping[str, object], sources: Mapping[str, bytes]
    ) -> None:
        """Send the candidates this round settles, and, to a worker that is idle, one it does not; ``sources``
        holds the files the run may migrate (an excluded file is indexed for the others' sake, never migrated)."""
        names = hierarchy.attention_class_names()
        needs_parsing = self.needs_parsing or (
            lambda path, acting, known: migrate.needs_parsing(sources[path], acting, known)
        )
        for path, index in indexes.items():
            if path in self.sent or path not in sources or not isinstance(index, ModuleIndex):
                continue
            settled = settles(index, hierarchy)
            # (A file the class scan spared is no candidate yet: a later round may have it parsed.)
            idle = None if settled or isinstance(index, ScannedIndex) else self.idle()
            if not settled and idle is None:
                continue
            if not needs_parsing(path, candidate_rules(self.rules, index, hierarchy, path), names):
                continue
            to = self.least_loaded() if settled else idle
            if to is None:
                return
            held = self.holders.get(path)
            if held is not None and self.workers[held].running() and (settled or not self.workers[held].unanswered()):
                to = held
            if not settled:
                self.ahead[path] = sources[path]
            self.send(path, sources[path], self.settings(hierarchy), to)

    def stream(self, files: Sequence[tuple[str, bytes]], hierarchy: ClassHierarchy) -> Iterator[tuple[Any, Any]]:
        """The answers of every worker, while ``files`` (migrated with the last round's ``hierarchy``) go to
        them largest first, each to a worker that is down to one unanswered file: the workers end together
        however the files' costs differ from their sizes. A worker takes the files it holds the tree of
        first, then those nobody holds, then the others'. A file sent ahead whose migration that hierarchy
        would not give again goes with them. The files left once no worker runs any more are in
        :attr:`left`; the workers are stopped."""
        import threading

        pickled = self.settings(hierarchy)
        answered = threading.Event()
        for early in self.workers:
            early.on_frame = answered.set
        queue = collections.deque(sorted(files, key=lambda file: -len(file[1])))
        try:
            while True:
                # Read what has come (before the wait below, or before this stream began: no event for that).
                for early in self.workers:
                    for key, result in early.ready():
                        if self._holds(key, result, hierarchy):
                            yield key, result
                        else:
                            queue.appendleft((key, self.ahead.pop(key)))
                running = self.running()
                for number in running:
                    while queue and self.workers[number].unanswered() < 2:  # one at work, one waiting
                        path, source = self._next(queue, number, running)
                        self.send(path, source, pickled, number)
                if not any(self.workers[number].unanswered() for number in running):
                    break
                answered.wait()
                answered.clear()  # a frame read after this is read at the top; one coming later sets it again
        finally:
            for early in self.workers:
                early.on_frame = None
        self.left = list(queue)
        yield from self.results(hierarchy)

    def _next(self, queue: collections.deque[tuple[str, bytes]], number: int, running: list[int]) -> tuple[str, bytes]:
        """The file of ``queue`` (largest first) for worker ``number`` to take: its own, else one no running
        worker holds the tree of, else the largest."""
        others = None
        for at, (path, _) in enumerate(queue):
            held = self.holders.get(path)
            if held == number:
                break
            if others is None and held not in running:
                others = at
        else:
            at = others if others is not None else 0
        file = queue[at]
        del queue[at]
        return file

    def results(self, hierarchy: ClassHierarchy) -> Iterator[tuple[Any, Any]]:
        """The answers of every worker that was sent files, worker after worker (each drains its own pipe
        meanwhile); the others are stopped. A file sent ahead whose migration the last round's ``hierarchy``
        would not give again is added to :attr:`left`, to be migrated with it."""
        for early in self.workers:
            for key, result in early.results():
                if self._holds(key, result, hierarchy):
                    yield key, result
                else:
                    self.left.append((key, self.ahead.pop(key)))

    def _holds(self, key: str, result: object, hierarchy: ClassHierarchy) -> bool:
        """Whether ``result`` is the file's migration with ``hierarchy``: it was sent once settled, or it
        records its questions and ``hierarchy`` answers each alike. (Only a `worker.Migrated` records them:
        a file that failed ahead is migrated again.)"""
        if key not in self.ahead:
            return True
        if not (isinstance(result, worker.Migrated) and result.answers is not None):
            return False
        if not still_holds(result.answers, hierarchy):
            return False
        del self.ahead[key]
        return True
