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
    since the pool starts before those are known. Closing an unused pool stops its workers at once.
    """

    def __init__(self, jobs: int, initializer: Callable[..., None], initargs: tuple[Any, ...] = ()) -> None:
        from concurrent.futures import ProcessPoolExecutor

        self.workers = jobs
        self.used = False  # set by whoever hands it tasks: parallel_map shuts it down when done
        self.executor = ProcessPoolExecutor(max_workers=jobs, initializer=initializer, initargs=initargs)
        self.executor.submit(_nothing)  # processes start on the first submission, not before

    def close(self) -> None:
        processes = list((self.executor._processes or {}).values())  # private, no public way to stop them
        self.executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()  # without this, exit waits for the workers to finish starting up
        for process in processes:
            process.join()


def _nothing() -> None:
    pass


def _run_pool(
    function: Callable[..., Any],
    tasks: Sequence[tuple[Key, tuple[Any, ...]]],
    jobs: int,
    initializer: Callable[..., None],
    initargs: tuple[Any, ...],
    warm: WarmPool | None = None,
) -> Iterator[tuple[Key, Any]]:
    """Yield ``(key, result)`` for every task that finished; stop quietly when the pool breaks."""
    # Imported here: most runs never start a pool, and this import is a third of the CLI's start-up.
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    if warm is None:
        pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), initializer=initializer, initargs=initargs)
    else:
        pool = warm.executor
    with pool:
        futures = {pool.submit(function, *arguments): key for key, arguments in tasks}
        for future in as_completed(futures):
            try:
                result = future.result()
            except BrokenProcessPool:
                continue
            except Exception as error:  # noqa: BLE001 - e.g. a result that cannot be pickled
                result = WorkerCrashed(f"{type(error).__name__}: {error}")
            yield futures[future], result


def parallel_map(
    function: Callable[..., Any],
    tasks: Sequence[tuple[Key, tuple[Any, ...]]],
    *,
    jobs: int,
    initializer: Callable[..., None],
    initargs: tuple[Any, ...] = (),
    warm: WarmPool | None = None,
) -> Iterator[tuple[Key, Any]]:
    """Yield ``(key, function(*arguments))`` for each task, in completion order.

    ``initializer(*initargs)`` prepares each worker (or this process, when running in-process). A task
    whose worker process died yields a :class:`WorkerCrashed` instead of a result. With ``warm`` (started
    with the same initializer), the tasks run there whatever their number, and the pool is used up.
    """
    if warm is None and (jobs <= 1 or len(tasks) < IN_PROCESS_BELOW):
        initializer(*initargs)
        for key, arguments in tasks:
            yield key, function(*arguments)
        return
    remaining = dict(tasks)
    for key, result in _run_pool(function, tasks, jobs, initializer, initargs, warm):
        del remaining[key]
        yield key, result
    pending = list(remaining.items())
    while pending:  # the pool broke: find the file that breaks it without losing the others
        batch, pending = pending[:jobs], pending[jobs:]
        unfinished = dict(batch)
        for key, result in _run_pool(function, batch, jobs, initializer, initargs):
            del unfinished[key]
            yield key, result
        for key, arguments in unfinished.items():
            alone = list(_run_pool(function, [(key, arguments)], 1, initializer, initargs))
            yield key, alone[0][1] if alone else WorkerCrashed("the worker process died while processing it")
