"""Running one function over many files in worker processes, surviving a worker that dies.

A worker killed on one file (out of memory, a crash in a native parser) must cost that file, not the
run: ``concurrent.futures`` reports it as ``BrokenProcessPool`` for every unfinished task, so the
unfinished ones are retried in small batches, and a batch that breaks again is retried file by file,
until the file that kills its worker is known. Small jobs stay in-process, where pool start-up would
cost more than the work.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import Future
    from multiprocessing.context import BaseContext

Key = TypeVar("Key")
Result = TypeVar("Result")

# Below this many tasks, starting processes costs more than it saves (measured in the research notes).
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


def _run_pool(
    function: Callable[..., Result],
    tasks: Sequence[tuple[Key, tuple[object, ...]]],
    jobs: int,
    initializer: Callable[..., None],
    initargs: tuple[object, ...],
) -> Iterator[tuple[Key, Result | WorkerCrashed]]:
    """Yield ``(key, result)`` for every task that finished; stop quietly when the pool breaks."""
    # Imported here: most runs never start a pool, and this import is a third of the CLI's start-up.
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    workers = min(jobs, len(tasks))
    with ProcessPoolExecutor(workers, _start_method(), initializer=initializer, initargs=initargs) as pool:
        futures: dict[Future[Result], Key] = {}
        try:
            for key, arguments in tasks:
                futures[pool.submit(function, *arguments)] = key
        except BrokenProcessPool:
            pass  # a worker died on a task submitted first: the tasks not submitted are left, as those it took down
        for future in as_completed(futures):
            result = _outcome(future)
            if not isinstance(result, _Broken):
                yield futures[future], result


def forks_safely() -> bool:
    """Whether this platform can fork a worker safely: not on Windows (no fork), nor on macOS, whose
    system libraries are not fork-safe (why ``multiprocessing`` spawns there)."""
    return hasattr(os, "fork") and sys.platform != "darwin"


def _start_method() -> BaseContext | None:
    """Fork, where this platform forks safely: the workers start with what this process imported and holds, as the
    preforked worker does (`prefork`). Python 3.14 makes ``forkserver`` the default on Linux: each worker would
    import libcst again and be sent the run's hierarchy as a pickle. Elsewhere, the default."""
    import multiprocessing

    return multiprocessing.get_context("fork") if forks_safely() else None


class _Broken:
    """What `_outcome` returns for a task whose worker process died (the pool is broken)."""


_BROKEN = _Broken()


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


def retry(
    function: Callable[..., Result],
    tasks: Sequence[tuple[Key, tuple[object, ...]]],
    jobs: int,
    initializer: Callable[..., None],
    initargs: tuple[object, ...],
) -> Iterator[tuple[Key, Result | WorkerCrashed]]:
    """The tasks a broken pool left unfinished: in small batches, then alone, to find the one that kills
    its worker without losing the others."""
    pending = list(tasks)
    while pending:
        batch, pending = pending[:jobs], pending[jobs:]
        unfinished = dict(batch)
        for key, result in _run_pool(function, batch, jobs, initializer, initargs):
            del unfinished[key]
            yield key, result
        for key, arguments in unfinished.items():
            alone = list(_run_pool(function, [(key, arguments)], 1, initializer, initargs))
            yield key, alone[0][1] if alone else WorkerCrashed("the worker process died while processing it")


def parallel_map(
    function: Callable[..., Result],
    tasks: Sequence[tuple[Key, tuple[object, ...]]],
    *,
    jobs: int,
    initializer: Callable[..., None],
    initargs: tuple[object, ...] = (),
) -> Iterator[tuple[Key, Result | WorkerCrashed]]:
    """Yield ``(key, function(*arguments))`` for each task, in completion order.

    ``initializer(*initargs)`` prepares each worker (or this process, when running in-process). A task
    whose worker process died yields a :class:`WorkerCrashed` instead of a result. (A worker started
    before its tasks are known is :class:`prefork.PreforkedWorker`.)
    """
    if jobs <= 1 or len(tasks) < IN_PROCESS_BELOW:
        initializer(*initargs)
        for key, arguments in tasks:
            yield key, function(*arguments)
        return
    remaining = dict(tasks)
    for key, result in _run_pool(function, tasks, jobs, initializer, initargs):
        del remaining[key]
        yield key, result
    yield from retry(function, list(remaining.items()), jobs, initializer, initargs)
