"""Indexing a round's files (`hierarchy.index_module`) as the class scan of the round finds them.

The main process reads each file of a round with the class scan (`index.classscan`, about a millisecond a
file) before it knows which files need the parser: in the first round of a fork's tree, a quarter of a second
for a few hundred files. Where the early workers are all the jobs there are, each file goes to them as soon
as the scan says it needs the parser, so that they index the round while the scan goes on, instead of
idling until it ends. Otherwise the round's files are indexed once all are known: in a pool, or in this
process when they are few (a pool's start-up costs more than it saves).

(Scanning in the workers too was tried: on vLLM 0.19.1's tree the cold run took 7% longer and 9% more CPU,
for reasons not found; the main process scans.)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.run import parallel, worker

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.index.hierarchy import ModuleIndex
    from vllm_attn_compat.codemods.run.handoff import Handoff
    from vllm_attn_compat.codemods.run.report import FileError


class RoundIndexing:
    """The files of one round to index: :meth:`add` each, then read :meth:`outcomes`. They go to the ``early``
    workers where there are at least two and they are all the ``jobs``, once the round has enough files to be
    worth it (`parallel.IN_PROCESS_BELOW`: a rerun's round often indexes one file, which this process indexes
    sooner than a worker still importing libcst)."""

    def __init__(self, jobs: int, early: Handoff | None) -> None:
        self.jobs = jobs
        self._running = early.running() if early else []  # one that died takes no more
        self._early = early if len(self._running) >= 2 and jobs <= len(self._running) else None
        self._tasks: list[tuple[str, tuple[bytes, str]]] = []
        self._sent = 0  # how many of the tasks went to the early workers
        self._loads = dict.fromkeys(self._running, 0)
        self._keys: dict[int, list[str]] = {number: [] for number in self._running}

    def add(self, path: str, source: bytes) -> None:
        """Index the file: in the early worker with the least work so far (which keeps its syntax tree if it will
        probably migrate it: `Handoff.holders`) once the round is worth it, else with the others once all are
        added."""
        self._tasks.append((path, (source, path)))
        if self._early is not None and len(self._tasks) >= parallel.IN_PROCESS_BELOW:
            for task_path, (task_source, _) in self._tasks[self._sent :]:
                self._send(self._early, task_path, task_source)
            self._sent = len(self._tasks)

    def _send(self, early: Handoff, path: str, source: bytes) -> None:
        to = min(self._running, key=self._loads.__getitem__)
        keep = early.will_migrate(source)
        early.workers[to].submit(path, worker.index_file, (source, path, keep))
        if keep:
            early.holders[path] = to
        self._keys[to].append(path)
        self._loads[to] += len(source)

    def __len__(self) -> int:
        return len(self._tasks)

    def outcomes(self) -> Iterable[tuple[str, ModuleIndex | FileError | parallel.WorkerCrashed]]:
        """``(path, outcome)`` of :func:`worker.index_file` for each file added, as they come."""
        if self._early is None or not self._sent:
            return parallel.parallel_map(worker.index_file, self._tasks, jobs=self.jobs, initializer=worker.no_setup)
        workers = self._early.workers
        return itertools.chain.from_iterable(workers[number].answers(self._keys[number]) for number in self._running)
