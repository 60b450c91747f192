"""The run's worker processes: one `concurrent.futures.ProcessPoolExecutor`, which the runner starts and stops.

The pool forks where the platform forks safely (`forks_safely`), else spawns. The runner starts it once it has
read files that will probably need libcst (one worker for every `IN_PROCESS_BELOW` of them), and has each worker
import libcst at once (`prepare`: `worker.preload`) while the class hierarchy's rounds go on. Small jobs stay in
the run's process while the pool is not started (starting processes costs more), and the rounds' while every
worker is still importing libcst.

A worker killed on one file (out of memory, a crash in a native parser) must cost that file, not the run:
``concurrent.futures`` reports it as ``BrokenProcessPool`` for every unfinished task, so the unfinished ones are
retried in small batches in fresh pools, and a batch that breaks again is retried file by file, until the file
that kills its worker is known.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import Future, ProcessPoolExecutor
    from multiprocessing.context import BaseContext

Key = TypeVar("Key")
Result = TypeVar("Result")

# Below this many tasks, starting processes costs more than it saves.
IN_PROCESS_BELOW = 8


def available_cores() -> int:
    """The cores this process may run on (a container or `taskset` may allow fewer than the machine has)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class WorkerCrashed(Exception):
    """The process running a task died (the task's own exceptions are the function's to handle)."""

    @classmethod
    def of(cls, error: BaseException) -> WorkerCrashed:
        """What a task's exception, or a result that could not travel back, comes back as."""
        return cls(f"{type(error).__name__}: {error}")


def forks_safely() -> bool:
    """Whether this platform can fork a worker safely: not on Windows (no fork), nor on macOS, whose
    system libraries are not fork-safe (why ``multiprocessing`` spawns there)."""
    return hasattr(os, "fork") and sys.platform != "darwin"


def _context() -> BaseContext | None:
    """Fork where this platform forks safely: the workers start with what the run's process imported (Python 3.14
    makes ``forkserver`` the default on Linux, where each worker would import everything again). Elsewhere, the
    platform's default."""
    import multiprocessing

    return multiprocessing.get_context("fork") if forks_safely() else None


class Pool:
    """Up to ``jobs`` worker processes, each prepared by ``initializer()``; started by `start`, `submit`, or the
    first `map` with enough tasks, and stopped by `close`."""

    def __init__(self, jobs: int, initializer: Callable[[], object] = int) -> None:
        self.jobs = jobs
        self.initializer = initializer
        self._executor: ProcessPoolExecutor | None = None
        self._preparing: list[Future[object]] = []  # `prepare`'s tasks

    @property
    def started(self) -> bool:
        return self._executor is not None

    def start(self, workers: int | None = None) -> None:
        """Start ``workers`` (at most ``jobs``, all by default) now, when there is more than one job, so that they
        are ready when the tasks come."""
        if self._executor is None and self.jobs > 1:
            workers = self.jobs if workers is None else max(1, min(workers, self.jobs))
            self._executor = self._new(workers)
            from concurrent.futures.process import BrokenProcessPool

            try:
                for _ in range(workers):  # (a pool that forks starts all its workers at the first task)
                    self._executor.submit(int)
            except BrokenProcessPool:
                pass  # a worker died starting: `map` finds the pool broken, and retries its tasks in fresh ones

    def _new(self, workers: int) -> ProcessPoolExecutor:
        # Imported here: most runs never start a pool, and this import is a third of the CLI's start-up.
        from concurrent.futures import ProcessPoolExecutor

        return ProcessPoolExecutor(workers, _context(), initializer=self.initializer)

    def prepare(self, function: Callable[[], object], workers: int) -> None:
        """Start ``workers`` and have each run ``function()`` (import what the tasks need) before any task."""
        if workers:
            self.start(workers)
            for _ in range(min(workers, self.jobs)):
                future = self.submit(function)
                if future is not None:
                    self._preparing.append(future)

    @property
    def ready(self) -> bool:
        """Whether a worker is done preparing (`prepare`), or none was asked to."""
        return not self._preparing or any(future.done() for future in self._preparing)

    def submit(self, function: Callable[..., Result], *arguments: object) -> Future[Result] | None:
        """``function(*arguments)`` in a worker, the pool started if it is not; None with one job, or once the pool
        broke (the caller does the work itself)."""
        from concurrent.futures.process import BrokenProcessPool

        self.start()
        try:
            return None if self._executor is None else self._executor.submit(function, *arguments)
        except BrokenProcessPool:
            return None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
            self._preparing = []

    def map(
        self,
        function: Callable[..., Result],
        tasks: Iterable[tuple[Key, tuple[object, ...]]],
        *,
        few_here: bool = False,
        meanwhile: Callable[[], object] = int,
    ) -> Iterator[tuple[Key, Result | WorkerCrashed]]:
        """Yield ``(key, function(*arguments))`` for each task, in completion order: in this process while the
        pool is not started and the tasks are few (or there is one job), else in the workers, each task submitted
        as soon as ``tasks`` yields it (whatever makes them overlaps the work). With ``few_here``, a few tasks stay
        in this process even with the workers started, and so do the first tasks while every worker is still
        preparing (`prepare`: importing libcst), rather than wait for one. ``meanwhile()`` runs once the workers
        have every task (in this process, before them). A task whose worker died yields a :class:`WorkerCrashed`
        instead of a result."""
        stream = iter(tasks)
        while few_here and not self.ready:
            task = next(stream, None)
            if task is None:
                meanwhile()
                return
            yield task[0], function(*task[1])
        # Whether the tasks are few enough to stay here is asked only where it can be so: to the workers started,
        # the first task goes as soon as it comes (a file found to need libcst while the run looks at the others).
        first = [] if self._executor is not None and not few_here else list(itertools.islice(stream, IN_PROCESS_BELOW))
        if self.jobs <= 1 or (len(first) < IN_PROCESS_BELOW and (few_here or self._executor is None)):
            meanwhile()
            for key, arguments in itertools.chain(first, stream):
                yield key, function(*arguments)
            return
        self.start()
        assert self._executor is not None
        every: dict[Key, tuple[object, ...]] = {}
        stream = itertools.chain(first, stream)

        def recorded() -> Iterator[tuple[Key, tuple[object, ...]]]:
            for key, arguments in stream:
                every[key] = arguments
                yield key, arguments

        done = set()
        for key, result in _finished(self._executor, function, recorded(), meanwhile):
            done.add(key)
            yield key, result
        every.update(stream)  # (those not submitted when the pool broke)
        remaining = [(key, arguments) for key, arguments in every.items() if key not in done]
        if remaining:  # the pool broke: what it left is retried apart, and a later map starts a fresh pool
            self.close()
            yield from self._retry(function, remaining)

    def _retry(
        self, function: Callable[..., Result], tasks: Sequence[tuple[Key, tuple[object, ...]]]
    ) -> Iterator[tuple[Key, Result | WorkerCrashed]]:
        """The tasks a broken pool left unfinished: in small batches, then alone, to find the one that kills its
        worker without losing the others."""
        pending = list(tasks)
        while pending:
            batch, pending = pending[: self.jobs], pending[self.jobs :]
            unfinished = dict(batch)
            with self._new(len(batch)) as executor:
                for key, result in _finished(executor, function, batch, int):
                    del unfinished[key]
                    yield key, result
            for key, arguments in unfinished.items():
                with self._new(1) as executor:
                    alone = list(_finished(executor, function, [(key, arguments)], int))
                yield key, alone[0][1] if alone else WorkerCrashed("the worker process died while processing it")


class _Broken:
    """What `_outcome` returns for a task whose worker process died (the pool is broken)."""


_BROKEN = _Broken()


def _finished(
    executor: ProcessPoolExecutor,
    function: Callable[..., Result],
    tasks: Iterable[tuple[Key, tuple[object, ...]]],
    meanwhile: Callable[[], object],
) -> Iterator[tuple[Key, Result | WorkerCrashed]]:
    """Yield ``(key, result)`` for every task that finished, ``meanwhile()`` run once all are submitted; stop
    quietly when the pool breaks."""
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    futures: dict[Future[Result], Key] = {}
    try:
        for key, arguments in tasks:
            futures[executor.submit(function, *arguments)] = key
    except BrokenProcessPool:
        pass  # a worker died on a task submitted first: the tasks not submitted are left, as those it took down
    meanwhile()
    for future in as_completed(futures):
        result = _outcome(future)
        if not isinstance(result, _Broken):
            yield futures[future], result


def _outcome(future: Future[Result]) -> Result | WorkerCrashed | _Broken:
    """A finished task's result; a :class:`WorkerCrashed` for an exception it could not hand back (e.g.
    a result that cannot be pickled), or ``_BROKEN`` when its worker process died."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        return future.result()
    except BrokenProcessPool:
        return _BROKEN
    except Exception as error:  # noqa: BLE001 - see the docstring
        return WorkerCrashed.of(error)
