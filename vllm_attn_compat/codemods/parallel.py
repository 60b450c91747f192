"""Running one function over many files in worker processes, surviving a worker that dies.

A worker killed on one file (out of memory, a crash in a native parser) must cost that file, not the
run: ``concurrent.futures`` reports it as ``BrokenProcessPool`` for every unfinished task, so the
unfinished ones are retried in small batches, and a batch that breaks again is retried file by file,
until the file that kills its worker is known. Small jobs stay in-process, where pool start-up would
cost more than the work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

Key = TypeVar("Key")

# Below this many tasks, starting processes costs more than it saves (measured in the research notes).
IN_PROCESS_BELOW = 8


class WorkerCrashed(Exception):
    """The process running a task died (the task's own exceptions are the function's to handle)."""


class WarmPool:
    """Worker processes started ahead of their tasks, so that their start-up (``initializer``: importing
    libcst, a third of a second) overlaps the parent's own work. Tasks must then carry their settings,
    since the pool starts before those are known; they can be handed over as soon as each is known
    (:meth:`submit`), and :meth:`results` collects them all. Closing an unused pool stops its workers at once.
    """

    def __init__(self, jobs: int, initializer: Callable[..., None], initargs: tuple[Any, ...] = ()) -> None:
        from concurrent.futures import ProcessPoolExecutor

        self.workers = jobs
        self.initializer, self.initargs = initializer, initargs
        self.used = False  # set once it has tasks: results() shuts it down when done
        self.executor = ProcessPoolExecutor(max_workers=jobs, initializer=initializer, initargs=initargs)
        self.executor.submit(_nothing)  # processes start on the first submission, not before
        self._submitted: dict[Any, tuple[Key, Callable[..., Any], tuple[Any, ...]]] = {}

    def submit(self, key: Key, function: Callable[..., Any], arguments: tuple[Any, ...]) -> None:
        from concurrent.futures.process import BrokenProcessPool

        self.used = True
        try:
            future = self.executor.submit(function, *arguments)
        except BrokenProcessPool:  # a worker died already: the task is retried by results()
            future = _broken_future()
        self._submitted[future] = (key, function, arguments)

    def results(self) -> Iterator[tuple[Key, Any]]:
        """``(key, result)`` of every submitted task, in completion order; shuts the pool down after."""
        from concurrent.futures import as_completed

        unfinished: list[tuple[Key, Callable[..., Any], tuple[Any, ...]]] = []
        with self.executor:
            for future in as_completed(self._submitted):
                key, function, arguments = self._submitted[future]
                result = _outcome(future)
                if result is _BROKEN:
                    unfinished.append((key, function, arguments))
                else:
                    yield key, result
        for function in dict.fromkeys(function for _, function, _ in unfinished):
            tasks = [(key, arguments) for key, task_function, arguments in unfinished if task_function is function]
            yield from _retry(function, tasks, self.workers, self.initializer, self.initargs)

    def close(self) -> None:
        processes = list((self.executor._processes or {}).values())  # private, no public way to stop them
        self.executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()  # without this, exit waits for the workers to finish starting up
        for process in processes:
            process.join()


def _broken_future():
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    future: Future = Future()
    future.set_exception(BrokenProcessPool("the pool broke before the task could be submitted"))
    return future


def _nothing() -> None:
    pass


def _run_pool(
    function: Callable[..., Any],
    tasks: Sequence[tuple[Key, tuple[Any, ...]]],
    jobs: int,
    initializer: Callable[..., None],
    initargs: tuple[Any, ...],
) -> Iterator[tuple[Key, Any]]:
    """Yield ``(key, result)`` for every task that finished; stop quietly when the pool breaks."""
    # Imported here: most runs never start a pool, and this import is a third of the CLI's start-up.
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), initializer=initializer, initargs=initargs) as pool:
        futures = {pool.submit(function, *arguments): key for key, arguments in tasks}
        for future in as_completed(futures):
            result = _outcome(future)
            if result is not _BROKEN:
                yield futures[future], result


# What `_outcome` returns for a task whose worker process died (the pool is broken).
_BROKEN = object()


def _outcome(future) -> Any:
    """A finished task's result; a :class:`WorkerCrashed` for an exception it could not hand back (e.g.
    a result that cannot be pickled), or ``_BROKEN`` when its worker process died."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        return future.result()
    except BrokenProcessPool:
        return _BROKEN
    except Exception as error:  # noqa: BLE001 - see the docstring
        return WorkerCrashed(f"{type(error).__name__}: {error}")


def _retry(
    function: Callable[..., Any],
    tasks: Sequence[tuple[Key, tuple[Any, ...]]],
    jobs: int,
    initializer: Callable[..., None],
    initargs: tuple[Any, ...],
) -> Iterator[tuple[Key, Any]]:
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
    function: Callable[..., Any],
    tasks: Sequence[tuple[Key, tuple[Any, ...]]],
    *,
    jobs: int,
    initializer: Callable[..., None],
    initargs: tuple[Any, ...] = (),
) -> Iterator[tuple[Key, Any]]:
    """Yield ``(key, function(*arguments))`` for each task, in completion order.

    ``initializer(*initargs)`` prepares each worker (or this process, when running in-process). A task
    whose worker process died yields a :class:`WorkerCrashed` instead of a result. (Tasks for a
    :class:`WarmPool` go through its own ``submit`` and ``results``.)
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
    yield from _retry(function, list(remaining.items()), jobs, initializer, initargs)
