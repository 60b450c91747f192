"""One worker process forked before the run knows its work, so that its start-up overlaps the parent's.

A migration worker spends its first third of a second importing libcst; the parent, meanwhile, lists,
reads and prefilters the files. The earlier the fork, the sooner the worker is ready, so it is a bare
``os.fork`` with two pipes rather than a ``concurrent.futures`` pool: importing that (with
``multiprocessing``) would cost the parent 40 ms before the fork, on the path of both processes.

Tasks and results travel as length-prefixed pickles, in order (one worker runs its tasks one after
the other). A thread in the parent writes the tasks, so a worker still importing never blocks the
parent. If the worker dies, the tasks it had not answered go to :func:`parallel.retry`, which finds
the one that kills a worker and runs the others, as for any pool.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import queue

from vllm_attn_compat.codemods.run.parallel import WorkerCrashed, retry

_LENGTH = 8  # bytes of the length prefix of each frame; a frame of length 0 asks the worker to stop


def available() -> bool:
    """Whether this platform can fork a worker safely: not on Windows (no fork), nor on macOS, whose
    system libraries are not fork-safe (why ``multiprocessing`` spawns there)."""
    return hasattr(os, "fork") and sys.platform != "darwin"


def worth_starting(jobs: int) -> bool:
    """Whether a run allowed ``jobs`` processes should fork a worker before it knows it needs one."""
    return jobs > 1 and available()


def start(initializer: Callable[..., None], initargs: tuple[object, ...] = ()) -> PreforkedWorker | None:
    """A worker, or None when the system refuses another process (the run then goes without)."""
    try:
        return PreforkedWorker(initializer, initargs)
    except OSError:
        return None


class PreforkedWorker:
    """A worker process running ``initializer(*initargs)`` at once, then each submitted task in turn.

    :meth:`submit` hands a task over as soon as it is known; :meth:`results` yields ``(key, result)``
    for every task, in the order submitted, then stops the worker. A task raising an exception yields
    a :class:`WorkerCrashed` holding it, like :func:`parallel.parallel_map`. :meth:`configure` runs a
    set-up step in the worker before the tasks submitted after it (the run's settings, known only later).
    :meth:`close` stops the worker at once, even in the middle of its start-up.

    A thread reads the answers as they come: a worker whose answers nobody reads yet (the parent is busy
    with the hierarchy rounds, or with another worker's answers) would otherwise block on a full pipe.
    """

    def __init__(self, initializer: Callable[..., None], initargs: tuple[object, ...] = ()) -> None:
        self.initializer, self.initargs = initializer, initargs
        self.used = False  # set once it has tasks
        task_read, task_write = os.pipe()
        result_read, result_write = os.pipe()
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            for descriptor in (task_read, task_write, result_read, result_write):
                os.close(descriptor)
            raise
        if pid == 0:  # the worker: never returns
            os.close(task_write)
            os.close(result_read)
            _serve(task_read, result_write, parent, initializer, initargs)
        os.close(task_read)
        os.close(result_write)
        self.pid: int | None = pid
        self._tasks = os.fdopen(task_write, "wb")
        self._results = os.fdopen(result_read, "rb")
        # Each task sent and not yet yielded: key, function, arguments, and the set-up step before it.
        self._pending: deque[_Task] = deque()
        self._configuration: tuple[Callable[..., object], tuple[object, ...]] | None = None
        # Frames for the worker (None ends the writer thread) and answers from it (None: no more), from the
        # first task on, with the threads that move them.
        self._outbox: queue.SimpleQueue[bytes | None] | None = None
        self._inbox: queue.SimpleQueue[bytes | None] | None = None

    def configure(self, function: Callable[..., object], arguments: tuple[object, ...]) -> None:
        """Run ``function(*arguments)`` in the worker before the tasks submitted from now on; its answer
        is not yielded, and a worker started again to retry those tasks runs it too."""
        self._configuration = (function, arguments)
        self._send(_Task(_CONFIGURATION, function, arguments, None))

    def submit(self, key: Any, function: Callable[..., object], arguments: tuple[object, ...]) -> None:
        self.used = True
        self._send(_Task(key, function, arguments, self._configuration))

    def _send(self, task: _Task) -> None:
        if self._outbox is None:
            import queue
            import threading

            self._outbox, self._inbox = queue.SimpleQueue(), queue.SimpleQueue()
            self._writer = threading.Thread(target=_write_frames, args=(self._tasks, self._outbox), daemon=True)
            self._reader = threading.Thread(target=_read_frames, args=(self._results, self._inbox), daemon=True)
            self._writer.start()
            self._reader.start()
        self._pending.append(task)
        self._outbox.put(pickle.dumps((task.function, task.arguments), pickle.HIGHEST_PROTOCOL))

    def results(self) -> Iterator[tuple[Any, Any]]:
        """``(key, result)`` of every submitted task; the worker is stopped once all are answered."""
        if not self.used:
            self.close()
            return
        # Tasks are pending, so the first of them started the threads.
        assert self._outbox is not None and self._inbox is not None
        self._outbox.put(b"")  # the stop frame, after the tasks
        while self._pending:
            frame = self._inbox.get()
            if frame is None:  # the worker died: the unanswered tasks are retried below
                break
            task = self._pending.popleft()
            if task.key is not _CONFIGURATION:
                yield task.key, pickle.loads(frame)
        unanswered = [task for task in self._pending if task.key is not _CONFIGURATION]
        self._pending.clear()
        self._reap(kill=bool(unanswered))
        for function, configuration in dict.fromkeys((task.function, task.configuration) for task in unanswered):
            tasks = [
                (task.key, task.arguments)
                for task in unanswered
                if task.function is function and task.configuration == configuration
            ]
            initializer, initargs = self.initializer, self.initargs
            if configuration is not None:
                initializer, initargs = _set_up_then, (self.initializer, self.initargs, *configuration)
            yield from retry(function, tasks, 1, initializer, initargs)

    def close(self) -> None:
        """Stop the worker now, whatever it is doing (a no-op once :meth:`results` has finished)."""
        self._pending.clear()
        self._reap(kill=True)

    def _reap(self, kill: bool) -> None:
        if self.pid is None:
            return
        import signal

        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        self.pid = None
        if self._outbox is None:
            self._tasks.close()
            self._results.close()
        else:
            # The threads end (at once, the worker being gone) and close their pipes.
            self._outbox.put(None)
            self._reader.join()


_CONFIGURATION = object()  # the key of a set-up step (`PreforkedWorker.configure`), whose answer is dropped


@dataclass(frozen=True)
class _Task:
    key: Any
    function: Callable[..., object]
    arguments: tuple[object, ...]
    configuration: tuple[Callable[..., object], tuple[object, ...]] | None


def _set_up_then(
    initializer: Callable[..., None],
    initargs: tuple[object, ...],
    configure: Callable[..., object],
    arguments: tuple[object, ...],
) -> None:
    """The initializer of a worker retrying tasks that came after a set-up step: the first worker's, then that step."""
    initializer(*initargs)
    configure(*arguments)


class _Reader(Protocol):
    def read(self, size: int, /) -> bytes: ...


def _write_frame(stream: IO[bytes], frame: bytes) -> None:
    stream.write(len(frame).to_bytes(_LENGTH, "little") + frame)


def _read_frame(stream: _Reader) -> bytes | None:
    """The next frame; None at the end of the stream (the other side is gone) or on a stop frame."""
    header = stream.read(_LENGTH)
    if len(header) < _LENGTH:
        return None
    length = int.from_bytes(header, "little")
    if length == 0:
        return None
    frame = stream.read(length)
    return frame if len(frame) == length else None


def _read_frames(stream: IO[bytes], inbox: queue.SimpleQueue[bytes | None]) -> None:
    """The parent's reader thread: the worker's answers into ``inbox`` as they come, then None once it
    has stopped or died."""
    try:
        while (frame := _read_frame(stream)) is not None:
            inbox.put(frame)
    except (OSError, ValueError):  # the worker is gone
        pass
    finally:
        inbox.put(None)
        with contextlib.suppress(OSError):
            stream.close()


def _write_frames(stream: IO[bytes], outbox: queue.SimpleQueue[bytes | None]) -> None:
    """The parent's writer thread: frames to the worker until ``None``; stops quietly if it died."""
    try:
        while (frame := outbox.get()) is not None:
            _write_frame(stream, frame)
            stream.flush()
    except OSError:  # BrokenPipeError: the worker is gone, and `results` retries what it left
        pass
    finally:
        # Closing flushes what is still buffered, into the same closed pipe (and closes it anyway).
        with contextlib.suppress(OSError):
            stream.close()


class _OrphanReader:
    """The worker's end of the task pipe. Waiting for a task, it checks now and then that its parent
    still runs: processes forked later by the parent (a full pool) hold the pipe's other end too, so
    the parent's death need not close it."""

    def __init__(self, descriptor: int, parent: int) -> None:
        self.descriptor = descriptor
        self.parent = parent

    def read(self, size: int) -> bytes:
        import select

        chunks: list[bytes] = []
        while size:
            while not select.select([self.descriptor], [], [], 1.0)[0]:
                if os.getppid() != self.parent:
                    return b""
            chunk = os.read(self.descriptor, size)
            if not chunk:
                break
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)


def _serve(
    task_fd: int, result_fd: int, parent: int, initializer: Callable[..., None], initargs: tuple[object, ...]
) -> None:
    """The worker's life: set up, then answer each task in order until told to stop; exits the process."""
    status = 0
    try:
        initializer(*initargs)
        tasks, results = _OrphanReader(task_fd, parent), os.fdopen(result_fd, "wb")
        while (frame := _read_frame(tasks)) is not None:
            function, arguments = pickle.loads(frame)
            try:
                result = function(*arguments)
            except Exception as error:  # noqa: BLE001 - handed back, as a pool would
                result = WorkerCrashed.of(error)
            try:
                answer = pickle.dumps(result, pickle.HIGHEST_PROTOCOL)
            except Exception as error:  # noqa: BLE001 - a result that cannot travel
                answer = pickle.dumps(WorkerCrashed.of(error))
            _write_frame(results, answer)
            results.flush()
    except BaseException:  # noqa: BLE001 - interrupted, or the parent is gone: nothing to report to
        status = 1
    finally:
        os._exit(status)  # never the parent's exit handlers or buffered output
