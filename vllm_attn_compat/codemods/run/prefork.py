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
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import queue

from vllm_attn_compat.codemods.run.parallel import WorkerCrashed, forks_safely, retry

_LENGTH = 8  # bytes of the length prefix of each frame; a frame of length 0 asks the worker to stop


def worth_starting(jobs: int) -> bool:
    """Whether a run allowed ``jobs`` processes should fork a worker before it knows it needs one."""
    return jobs > 1 and forks_safely()


def start(
    initializer: Callable[..., None], initargs: tuple[object, ...] = (), *, sibling: bool = False
) -> PreforkedWorker | None:
    """A worker, or None when the system refuses another process (the run then goes without). With
    ``sibling``, it can fork one more worker later (:meth:`PreforkedWorker.sibling`)."""
    try:
        return PreforkedWorker(initializer, initargs, sibling=sibling)
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

    def __init__(
        self, initializer: Callable[..., None], initargs: tuple[object, ...] = (), *, sibling: bool = False
    ) -> None:
        task_read, task_write = os.pipe()
        result_read, result_write = os.pipe()
        # The pipes of the sibling this worker may fork (`sibling`): made now, so that both processes hold their ends.
        spare = (*os.pipe(), *os.pipe()) if sibling else ()
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            for descriptor in (task_read, task_write, result_read, result_write, *spare):
                os.close(descriptor)
            raise
        if pid == 0:  # the worker: never returns
            for descriptor in (task_write, result_read, *spare[1:3]):
                os.close(descriptor)
            _serve(
                _Ends(task_read, result_write, parent, (spare[0], spare[3]) if spare else None), initializer, initargs
            )
        for descriptor in (task_read, result_write, *spare[0:4:3]):
            os.close(descriptor)
        self._spare = (spare[1], spare[2]) if spare else None
        self._connect(pid, task_write, result_read, initializer, initargs)

    def _connect(
        self,
        pid: int | None,
        task_write: int,
        result_read: int,
        initializer: Callable[..., None],
        initargs: tuple[object, ...],
    ) -> None:
        self.initializer, self.initargs = initializer, initargs
        self.used = False  # set once it has tasks
        # Our child; None for a sibling (a child of the first worker) until its first frame names it.
        self.pid: int | None = pid
        self._is_sibling = self._awaiting_pid = pid is None
        self._sibling: PreforkedWorker | None = None  # the one it forked, if it was asked to
        self._stop_sent = self._stopped = self._gone = False
        self._read_ahead: list[tuple[Any, bytes]] = []  # answers read by `answers` for `results`
        self._tasks = os.fdopen(task_write, "wb")
        self._results = os.fdopen(result_read, "rb")
        # Each task sent and not yet yielded: key, function, arguments, and the set-up step before it.
        self._pending: deque[_Task] = deque()
        self._configuration: tuple[Callable[..., object], tuple[object, ...]] | None = None
        # Frames for the worker (None ends the writer thread) and answers from it (None: no more), from the
        # first task on, with the threads that move them.
        self._outbox: queue.SimpleQueue[bytes | None] | None = None
        self._inbox: queue.SimpleQueue[bytes | None] | None = None
        # Called by the reader thread after each frame it reads (`Handoff.stream` waits on several workers).
        self.on_frame: Callable[[], object] | None = None

    def running(self) -> bool:
        """Whether it may take more tasks: not stopped, and not found gone (seen as its answers are read)."""
        return not (self._gone or self._stopped) and (self._is_sibling or self.pid is not None)

    def sibling(self) -> PreforkedWorker | None:
        """A second worker, forked by this one once its set-up has run (its imports are made once, and
        shared), or None if this worker was not started with ``sibling`` or asked for one already. It runs
        tasks like this one; were its tasks to be retried, a new process would run this worker's set-up."""
        if self._spare is None or self.pid is None:
            return None
        task_write, result_read = self._spare
        self._spare = None
        other = type(self).__new__(type(self))
        other._spare = None
        other._connect(None, task_write, result_read, self.initializer, self.initargs)
        other._pending.append(_Task(_HELLO, os.getpid, (), None))  # its first frame: its pid
        self._send(_Task(_SIBLING, _fork_sibling, (), None))
        self._sibling = other
        return other

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
            self._reader = threading.Thread(target=_read_frames, args=(self._results, self._inbox, self), daemon=True)
            self._writer.start()
            self._reader.start()
        self._pending.append(task)
        self._outbox.put(pickle.dumps((task.function, task.arguments), pickle.HIGHEST_PROTOCOL))

    def answers(self, keys: Collection[Any]) -> Iterator[tuple[Any, Any]]:
        """``(key, result)`` of the submitted tasks ``keys``, as they come, the worker going on with the
        others: their answers, read meanwhile, wait for :meth:`results`. Were the worker to die, the tasks
        of ``keys`` it left are retried (it takes no more tasks; :meth:`results` retries the others)."""
        wanted = set(keys)
        while wanted and (answer := self._next_answer()) is not None:
            key, frame = answer
            if key in wanted:
                wanted.discard(key)
                yield key, pickle.loads(frame)
            else:
                self._read_ahead.append((key, frame))
        if wanted:
            left = [task for task in self._pending if task.key in wanted]
            self._pending = deque(task for task in self._pending if task.key not in wanted)
            yield from self._retry(left)

    def unanswered(self) -> int:
        """How many submitted tasks it has not answered yet (or whose answers were not read yet)."""
        return sum(task.key not in _CONTROL for task in self._pending)

    def ready(self) -> list[tuple[Any, Any]]:
        """``(key, result)`` of the tasks answered so far and not yet yielded, without waiting; once it is
        found gone, its unanswered tasks wait for :meth:`results`, which retries them."""
        found = [(key, pickle.loads(frame)) for key, frame in self._read_ahead]
        self._read_ahead.clear()
        while (answer := self._next_answer(block=False)) is not None:
            found.append((answer[0], pickle.loads(answer[1])))
        return found

    def results(self) -> Iterator[tuple[Any, Any]]:
        """``(key, result)`` of every submitted task; the worker is stopped once all are answered."""
        if not self.used and self._sibling is None:
            self.close()
            return
        # Tasks are pending, so the first of them started the threads.
        assert self._outbox is not None and self._inbox is not None
        self._send_stop()
        yield from self.ready()
        while (answer := self._next_answer()) is not None:
            yield answer[0], pickle.loads(answer[1])
        unanswered = [task for task in self._pending if task.key not in _CONTROL]
        self._pending.clear()
        if self._sibling is not None:
            # This worker waits for its sibling before it exits (so that its own parent reaps nothing
            # half done): the sibling must have its stop frame, after its tasks, before we wait.
            self._sibling._send_stop()
        self._reap(kill=bool(unanswered))
        yield from self._retry(unanswered)

    def _next_answer(self, block: bool = True) -> tuple[Any, bytes] | None:
        """The key and answer of the next task that is not a control step; None once all are answered, once
        the worker is gone (its unanswered tasks stay pending), or, not to ``block``, when none has come."""
        while self._pending and not self._gone and self._inbox is not None:  # no inbox: nothing was sent yet
            if not block and self._inbox.empty():
                return None
            frame = self._inbox.get()
            if frame is None:
                self._gone = True
                if self._is_sibling:  # gone, and maybe reaped already: its pid may be another's soon
                    self.pid, self._awaiting_pid = None, False
                return None
            task = self._pending.popleft()
            if task.key is _HELLO:
                self.pid, self._awaiting_pid = pickle.loads(frame), False
            elif task.key not in _CONTROL:
                return task.key, frame
        return None

    def _retry(self, unanswered: Sequence[_Task]) -> Iterator[tuple[Any, Any]]:
        """Run ``unanswered`` tasks in new processes (set up as this one was), finding one that kills them."""
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
        import signal

        if self._spare is not None:  # no sibling was asked for: it will never be forked
            for descriptor in self._spare:
                os.close(descriptor)
            self._spare = None
        if self._is_sibling:
            self._reap_sibling(kill)
            return
        if self.pid is None:
            return
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        self.pid = None
        self._close_pipes()

    def _reap_sibling(self, kill: bool) -> None:
        """A sibling is not our child (the first worker reaps it): it is stopped, killed if need be, and its
        pipes closed."""
        import signal

        if self._stopped:
            return
        self._stopped = True
        if kill and self._awaiting_pid and self._inbox is not None:
            frame = self._inbox.get()  # its first frame comes at once, or its end (never forked, or gone)
            self.pid, self._awaiting_pid = None if frame is None else pickle.loads(frame), False
        if kill and self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.pid = None
        self._send_stop()  # a pipe end held by processes forked since would keep an idle one waiting
        self._close_pipes()

    def _send_stop(self) -> None:
        """Tell the worker to stop once it has done the tasks sent so far (once; it may be gone already)."""
        if self._stop_sent:
            return
        self._stop_sent = True
        if self._outbox is not None:
            self._outbox.put(b"")
            return
        with contextlib.suppress(OSError):
            _write_frame(self._tasks, b"")
            self._tasks.flush()

    def _close_pipes(self) -> None:
        if self._outbox is None:
            with contextlib.suppress(OSError):  # a stop frame still buffered, for a worker gone
                self._tasks.close()
            self._results.close()
        else:
            # The threads end (at once, the worker being gone) and close their pipes.
            self._outbox.put(None)
            self._reader.join()


_CONFIGURATION = object()  # the key of a set-up step (`PreforkedWorker.configure`), whose answer is dropped
_SIBLING = object()  # the key of the request to fork a sibling (`PreforkedWorker.sibling`)
_HELLO = object()  # the key of a sibling's first frame, its pid
_CONTROL = (_CONFIGURATION, _SIBLING, _HELLO)  # tasks whose answers are not yielded, nor retried


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


def _read_frames(stream: IO[bytes], inbox: queue.SimpleQueue[bytes | None], owner: PreforkedWorker) -> None:
    """The parent's reader thread: the worker's answers into ``inbox`` as they come, then None once it
    has stopped or died; ``owner.on_frame``, if set, after each."""
    try:
        while (frame := _read_frame(stream)) is not None:
            inbox.put(frame)
            if (notify := owner.on_frame) is not None:
                notify()
    except (OSError, ValueError):  # the worker is gone
        pass
    finally:
        inbox.put(None)
        if (notify := owner.on_frame) is not None:
            notify()
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


@dataclass
class _Ends:
    """A worker's ends of its pipes, the pid of the run's process, and the ends for a sibling, if it may fork one."""

    tasks: int
    results: int
    parent: int
    sibling: tuple[int, int] | None = None
    is_sibling: bool = False
    sibling_pid: int | None = None  # once forked


_ends: _Ends | None = None  # in a worker: its own


def _fork_sibling() -> None:
    """In the first worker: fork the sibling on the spare pipes (`PreforkedWorker.sibling`)."""
    if _ends is None or _ends.sibling is None:
        return
    spare, _ends.sibling = _ends.sibling, None
    try:
        pid = os.fork()
    except OSError:
        for descriptor in spare:  # the run then reads the end of the sibling's answers: its tasks are retried
            os.close(descriptor)
        raise
    if pid == 0:  # the sibling: never returns
        os.close(_ends.tasks)  # the first worker's pipes: their ends must close when it ends
        os.close(_ends.results)
        _serve(_Ends(*spare, _ends.parent, is_sibling=True), lambda: None, ())
    _ends.sibling_pid = pid
    for descriptor in spare:
        os.close(descriptor)


class _OrphanReader:
    """The worker's end of the task pipe. Waiting for a task, it checks now and then that the run's
    process still runs: processes forked later by the parent (a full pool) hold the pipe's other end too,
    so the parent's death need not close it. (A sibling's parent is the first worker, which may end
    before it: it asks whether the run's process is there.)"""

    def __init__(self, descriptor: int, parent: int, is_sibling: bool = False) -> None:
        self.descriptor = descriptor
        self.parent = parent
        self.is_sibling = is_sibling

    def _orphaned(self) -> bool:
        if not self.is_sibling:
            return os.getppid() != self.parent
        try:
            os.kill(self.parent, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # a process of another user took its pid
            return True
        return False

    def read(self, size: int) -> bytes:
        import select

        chunks: list[bytes] = []
        while size:
            while not select.select([self.descriptor], [], [], 1.0)[0]:
                if self._orphaned():
                    return b""
            chunk = os.read(self.descriptor, size)
            if not chunk:
                break
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)


def _serve(ends: _Ends, initializer: Callable[..., None], initargs: tuple[object, ...]) -> None:
    """The worker's life: set up, then answer each task in order until told to stop; exits the process.
    A sibling first sends its pid."""
    global _ends
    _ends = ends
    status = 0
    try:
        initializer(*initargs)
        tasks, results = _OrphanReader(ends.tasks, ends.parent, ends.is_sibling), os.fdopen(ends.results, "wb")
        if ends.is_sibling:
            _write_frame(results, pickle.dumps(os.getpid(), pickle.HIGHEST_PROTOCOL))
            results.flush()
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
        if ends.sibling_pid is not None:
            # Our child: reaped here, once it has stopped (the run sends it its stop frame before it waits for
            # us), so that no process is left behind and its CPU time counts among the run's.
            with contextlib.suppress(OSError):
                os.waitpid(ends.sibling_pid, 0)
        os._exit(status)  # never the parent's exit handlers or buffered output
