"""The worker forked before its tasks are known: it runs them after its set-up, in order, and its death,
a task's exception or an unpicklable result cost only the task concerned."""

from __future__ import annotations

import contextlib
import os
import time

import pytest

from vllm_attn_compat.codemods.run import parallel
from vllm_attn_compat.codemods.run.parallel import WorkerCrashed
from vllm_attn_compat.codemods.run.prefork import PreforkedWorker

from pool_tasks import (
    configure,
    configured_or_die,
    die_at_once,
    large_answer,
    refuse_forks,
    remember_pid,
    square_or_die,
    state,
    whoami,
    write_pid,
)

pytestmark = pytest.mark.skipif(not parallel.forks_safely(), reason="no safe fork on this platform")


def refuse(number: int) -> tuple[int, object]:
    raise ValueError(f"{number} is not welcome")


def unpicklable(_: int):
    return lambda: None


def wait_for_flag(flag: str) -> None:
    """Set-up that lasts until the test creates ``flag`` (at most 30 s), and remembers whether it came."""
    remember_pid()
    deadline = time.monotonic() + 30
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)
    state["flag_seen_during_setup"] = os.path.exists(flag)


def flag_seen(payload: bytes) -> tuple[int, object]:
    return len(payload), state["flag_seen_during_setup"]


def slow_setup() -> None:
    time.sleep(60)  # a worker still importing libcst when the run finds it needs none


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_tasks_run_in_the_forked_worker_after_its_set_up_and_come_back_in_order():
    worker = PreforkedWorker(remember_pid)
    pid = worker.pid
    for n in (3, 1, 2):
        worker.submit(f"file{n}.py", square_or_die, (n,))
    assert list(worker.results()) == [(f"file{n}.py", (n * n, pid)) for n in (3, 1, 2)]
    assert pid != os.getpid() and worker.pid is None and _gone(pid)  # stopped and reaped


def test_an_exception_comes_back_as_that_task_s_failure_and_the_others_go_on():
    worker = PreforkedWorker(remember_pid)
    for n in (6, 7, 8):
        worker.submit(n, refuse if n == 7 else square_or_die, (n,))
    worker.submit(9, unpicklable, (9,))
    results = dict(worker.results())
    assert isinstance(results[7], WorkerCrashed) and "ValueError: 7 is not welcome" in str(results[7])
    assert isinstance(results[9], WorkerCrashed)  # a result that cannot travel back
    assert results[6][0] == 36 and results[8][0] == 64


def test_a_task_that_kills_the_worker_costs_only_itself():
    worker = PreforkedWorker(remember_pid)
    for n in range(10, 17):
        worker.submit(n, square_or_die, (n,))
    results = dict(worker.results())
    assert set(results) == set(range(10, 17))
    assert isinstance(results.pop(13), WorkerCrashed)
    assert {key: value[0] for key, value in results.items()} == {n: n * n for n in range(10, 17) if n != 13}


def test_a_worker_dying_with_tasks_still_buffered_leaves_no_traceback(monkeypatch):
    """The writer thread meets a closed pipe with frames still in its buffer: closing the stream would
    flush them and raise BrokenPipeError in the thread, printed to stderr by threading's hook."""
    raised = []
    monkeypatch.setattr("threading.excepthook", raised.append)
    worker = PreforkedWorker(remember_pid)
    for n in range(60):
        worker.submit(n, die_at_once, (b"x" * 2_000,))  # frames the stream buffers until flushed
    results = dict(worker.results())
    assert set(results) == set(range(60)) and all(isinstance(r, WorkerCrashed) for r in results.values())
    worker._writer.join(10)
    assert not worker._writer.is_alive() and raised == []


def test_tasks_submitted_while_the_worker_sets_up_never_wait_for_it(tmp_path):
    # Far more than a pipe holds: were submit() to write them itself, it would block until the
    # worker's set-up ended, and the set-up ends only once all were submitted (or after 30 s).
    flag = str(tmp_path / "submitted")
    worker = PreforkedWorker(wait_for_flag, (flag,))
    for n in range(16):
        worker.submit(n, flag_seen, (bytes(1 << 20),))
    open(flag, "w").close()
    assert dict(worker.results()) == {n: (1 << 20, True) for n in range(16)}


def test_a_set_up_step_runs_before_the_tasks_after_it_and_its_answer_is_not_yielded():
    worker = PreforkedWorker(remember_pid)
    worker.submit(1, configured_or_die, (1,))
    worker.configure(configure, ("first",))
    worker.submit(2, configured_or_die, (2,))
    worker.configure(configure, ("second",))
    worker.submit(3, configured_or_die, (3,))
    assert list(worker.results()) == [(1, (1, None)), (2, (2, "first")), (3, (3, "second"))]


def test_tasks_retried_after_the_worker_died_run_after_their_set_up_step_again():
    worker = PreforkedWorker(remember_pid)
    worker.configure(configure, ("settings",))
    for n in range(10, 17):
        worker.submit(n, configured_or_die, (n,))
    results = dict(worker.results())
    assert isinstance(results.pop(13), WorkerCrashed)
    assert results == {n: (n, "settings") for n in range(10, 17) if n != 13}


def test_a_worker_finishes_its_tasks_while_nobody_asks_for_their_answers_yet(tmp_path):
    # Answers far larger than a pipe holds: were they read only by results(), the worker would block
    # on the first one, and never reach the last task (which creates the flag).
    flag = tmp_path / "done"
    worker = PreforkedWorker(remember_pid)
    for n in range(8):
        worker.submit(n, large_answer, (1 << 20, str(flag) if n == 7 else None))
    deadline = time.monotonic() + 30
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert flag.exists()
    assert [(key, len(answer)) for key, answer in worker.results()] == [(n, 1 << 20) for n in range(8)]


def test_results_without_tasks_stop_the_worker():
    worker = PreforkedWorker(remember_pid)
    pid = worker.pid
    assert list(worker.results()) == [] and _gone(pid)


def test_closing_stops_a_worker_still_setting_up_at_once():
    worker = PreforkedWorker(slow_setup)
    pid = worker.pid
    assert not _gone(pid)
    worker.close()  # without a kill, this would wait for the minute-long set-up
    assert _gone(pid)
    worker.close()  # and a second close is harmless


def test_a_sibling_runs_tasks_with_the_first_worker_s_set_up_made_once():
    first = PreforkedWorker(remember_pid, sibling=True)
    second = first.sibling()
    assert second is not None and first.sibling() is None  # one sibling
    for n in range(3):
        first.submit(n, whoami, (n,))
        second.submit(n, whoami, (n,))
    ours = dict(first.results())
    theirs = dict(second.results())
    first_pid = ours[0][0]
    assert {pid for pid, _ in ours.values()} == {first_pid} and {setup for _, setup in ours.values()} == {first_pid}
    sibling_pid = theirs[0][0]
    assert {pid for pid, _ in theirs.values()} == {sibling_pid} and sibling_pid not in (first_pid, os.getpid())
    assert {setup for _, setup in theirs.values()} == {first_pid}  # inherited, not run again
    deadline = time.monotonic() + 10
    while not (_gone(first_pid) and _gone(sibling_pid)) and time.monotonic() < deadline:
        time.sleep(0.01)  # the sibling is reaped by the system, not by us
    assert _gone(first_pid) and _gone(sibling_pid)


def test_a_worker_started_without_a_sibling_forks_none():
    worker = PreforkedWorker(remember_pid)
    assert worker.sibling() is None
    assert list(worker.results()) == []


def test_a_task_that_kills_the_sibling_costs_only_itself():
    first = PreforkedWorker(remember_pid, sibling=True)
    second = first.sibling()
    assert second is not None
    for n in range(10, 17):
        second.submit(n, square_or_die, (n,))
    results = dict(second.results())
    assert isinstance(results.pop(13), WorkerCrashed)
    assert {key: value[0] for key, value in results.items()} == {n: n * n for n in range(10, 17) if n != 13}
    assert list(first.results()) == []


def test_the_sibling_of_a_worker_closed_before_forking_it_has_its_tasks_retried(tmp_path):
    flag = str(tmp_path / "set-up may end")
    first = PreforkedWorker(wait_for_flag, (flag,), sibling=True)
    second = first.sibling()
    assert second is not None
    second.submit("a", square_or_die, (4,))
    first.close()  # still in its set-up: the sibling is never forked
    open(flag, "w").close()  # a retry's set-up ends at once
    results = dict(second.results())
    assert results["a"][0] == 16 and results["a"][1] not in (first.pid, os.getpid())


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc")
def test_closing_a_sibling_stops_it_in_the_middle_of_a_task(tmp_path):
    first = PreforkedWorker(remember_pid, sibling=True)
    second = first.sibling()
    assert second is not None
    flag = str(tmp_path / "pid")
    second.submit("pid", write_pid, (flag,))
    second.submit("slow", slow_setup, ())
    deadline = time.monotonic() + 20
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)
    with open(flag) as written:
        sibling_pid = int(written.read())
    second.close()  # without a kill, this would wait for the minute-long task
    deadline = time.monotonic() + 10
    while _running(sibling_pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _running(sibling_pid)  # until the first worker reaps it, it is a zombie
    assert list(first.results()) == []
    assert _gone(sibling_pid)  # reaped by the first worker as it stopped


def test_a_first_worker_without_tasks_of_its_own_waits_for_its_sibling_s():
    first = PreforkedWorker(remember_pid, sibling=True)
    first_pid, second = first.pid, first.sibling()
    assert second is not None
    second.submit("a", whoami, (1,))
    assert list(first.results()) == []  # does not kill it: the sibling is its child
    [(key, (pid, setup))] = list(second.results())
    assert key == "a" and setup == first_pid and _gone(pid)


ORPHAN = """
import os, sys, time
from vllm_attn_compat.codemods.run.prefork import PreforkedWorker

worker = PreforkedWorker(time.sleep, (0.2,))
holder = os.fork()  # like a pool forked later: it holds the task pipe open after this process is gone
if holder == 0:
    time.sleep(30)
    os._exit(0)
with open(sys.argv[1], "w") as pids:
    pids.write(f"{worker.pid} {holder}")
os._exit(0)  # dies without stopping its worker
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc")
def test_a_worker_whose_parent_died_exits_even_while_another_process_holds_its_pipe(tmp_path):
    import subprocess
    import sys

    pids = tmp_path / "pids"
    subprocess.run([sys.executable, "-c", ORPHAN, str(pids)], stdout=subprocess.DEVNULL, check=True)
    _exits_while_the_holder_runs(*map(int, pids.read_text().split()))


def _exits_while_the_holder_runs(worker_pid: int, holder_pid: int) -> None:
    """The orphaned worker ends within 20 s, while the process holding its pipe still runs; both are killed after."""
    import signal

    try:
        deadline = time.monotonic() + 20
        while _running(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(worker_pid) and _running(holder_pid)
    finally:
        for pid in (worker_pid, holder_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


SIBLING_ORPHAN = """
import os, sys, time
from vllm_attn_compat.codemods.run.prefork import PreforkedWorker
sys.path.insert(0, sys.argv[2])
from pool_tasks import write_pid

worker = PreforkedWorker(time.sleep, (0.2,), sibling=True)
sibling = worker.sibling()
sibling.submit(0, write_pid, (sys.argv[1],))
holder = os.fork()  # like a pool forked later: it holds the task pipes open after this process is gone
if holder == 0:
    time.sleep(30)
    os._exit(0)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
with open(sys.argv[1] + ".holder", "w") as out:
    out.write(str(holder))
os._exit(0)  # dies without stopping its workers
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc")
def test_a_sibling_whose_run_died_exits_even_while_another_process_holds_its_pipe(tmp_path):
    import subprocess
    import sys

    pid_file = tmp_path / "sibling"
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", SIBLING_ORPHAN, str(pid_file), here], stdout=subprocess.DEVNULL, check=True)
    _exits_while_the_holder_runs(int(pid_file.read_text()), int((tmp_path / "sibling.holder").read_text()))


def test_answers_come_for_the_tasks_asked_while_the_others_wait_for_results():
    worker = PreforkedWorker(remember_pid)
    for n in range(6):
        worker.submit(n, square_or_die, (n,))
    assert {key: value[0] for key, value in worker.answers([1, 3])} == {1: 1, 3: 9}
    worker.submit(6, square_or_die, (6,))  # the worker goes on: more tasks, then more answers
    assert {key: value[0] for key, value in worker.answers([6])} == {6: 36}
    assert {key: value[0] for key, value in worker.results()} == {0: 0, 2: 4, 4: 16, 5: 25}


def test_tasks_asked_for_are_retried_when_the_worker_dies_and_the_others_at_results():
    worker = PreforkedWorker(remember_pid)
    for n in (11, 12, 13, 14, 15):
        worker.submit(n, square_or_die, (n,))  # 13 kills the worker
    asked = dict(worker.answers([12, 14]))
    assert {key: value[0] for key, value in asked.items()} == {12: 144, 14: 196}
    rest = dict(worker.results())
    assert isinstance(rest.pop(13), WorkerCrashed)
    assert {key: value[0] for key, value in rest.items()} == {11: 121, 15: 225}


def test_a_sibling_the_system_refuses_has_its_tasks_retried_and_nothing_waits_for_it():
    first = PreforkedWorker(refuse_forks, sibling=True)
    second = first.sibling()
    assert second is not None
    for n in (2, 3):
        first.submit(n, square_or_die, (n,))
        second.submit(n, square_or_die, (n,))
    # The sibling's answers first: had the first worker kept its pipe open, this would wait for it to stop.
    assert {key: value[0] for key, value in second.results()} == {2: 4, 3: 9}  # in a new process each
    assert {key: value[0] for key, value in first.results()} == {2: 4, 3: 9}
