"""The run's pool (`run/parallel.py`): results for every task, small jobs at home, workers started early and
prepared once, and a worker that dies costs only its own file."""

from __future__ import annotations

import functools
import os
import time

from vllm_attn_compat.codemods.run.parallel import IN_PROCESS_BELOW, Pool, WorkerCrashed

from pool_tasks import remember_pid, square_or_die, tasks, touch, wait_for


def _map(pool: Pool, count: int, **more: bool) -> dict[str, object]:
    try:
        return dict(pool.map(square_or_die, tasks(count), **more))
    finally:
        pool.close()


def test_small_jobs_run_in_this_process():
    remember_pid()
    results = _map(Pool(2, remember_pid), IN_PROCESS_BELOW - 1)
    assert results == {f"file{n}.py": (n * n, os.getpid()) for n in range(IN_PROCESS_BELOW - 1)}


def test_large_jobs_run_in_initialized_worker_processes():
    results = _map(Pool(2, remember_pid), 12)
    assert {key: value[0] for key, value in results.items()} == {f"file{n}.py": n * n for n in range(12)}  # type: ignore[index]
    assert os.getpid() not in {pid for _, pid in results.values()}  # type: ignore[misc]


def test_a_started_pool_takes_even_a_few_tasks_unless_told_to_keep_them_here():
    remember_pid()
    pool = Pool(2, remember_pid)
    pool.start(1)
    try:
        [(_, there)] = pool.map(square_or_die, tasks(1))
        [(_, here)] = pool.map(square_or_die, tasks(1), few_here=True)
    finally:
        pool.close()
    assert there[1] != os.getpid() and here[1] == os.getpid()  # type: ignore[index]


def test_one_job_runs_everything_here_and_starts_no_process():
    remember_pid()
    pool = Pool(1, remember_pid)
    pool.start()
    assert not pool.started
    assert {pid for _, pid in _map(pool, 12).values()} == {os.getpid()}  # type: ignore[misc]


def test_tasks_given_as_they_are_made_are_submitted_as_they_come():
    """A generator of tasks (a round's class scan finds the files to index one by one): the first ones are at work
    in the pool while the generator makes the others."""
    made: list[int] = []

    def making():
        for key, arguments in tasks(12):
            made.append(len(made))
            yield key, arguments

    pool = Pool(2, remember_pid)
    try:
        results = dict(pool.map(square_or_die, making()))
    finally:
        pool.close()
    assert made == list(range(12)) and {key: value[0] for key, value in results.items()} == {  # type: ignore[index]
        f"file{n}.py": n * n for n in range(12)
    }
    assert os.getpid() not in {pid for _, pid in results.values()}  # type: ignore[misc]


def test_a_started_pool_has_the_first_task_at_work_before_the_next_is_made(tmp_path):
    """Migration hands each file to the workers as soon as the run finds it needs libcst: the first is migrated while
    the run looks at the others, not once a handful were found."""
    first = tmp_path / "first"
    ran_first: list[bool] = []

    def making():
        yield "first", (str(first),)
        deadline = time.monotonic() + 10
        while not first.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        ran_first.append(first.exists())
        yield "second", (str(tmp_path / "second"),)

    pool = Pool(2)
    pool.start()
    try:
        results = dict(pool.map(touch, making()))
    finally:
        pool.close()
    assert ran_first == [True] and set(results) == {"first", "second"}
    assert os.getpid() not in results.values()


def test_a_dying_worker_costs_only_the_file_it_was_processing():
    results = _map(Pool(2, remember_pid), 30)
    assert set(results) == {f"file{n}.py" for n in range(30)}
    assert isinstance(results.pop("file13.py"), WorkerCrashed)
    assert {key: value[0] for key, value in results.items()} == {f"file{n}.py": n * n for n in range(30) if n != 13}  # type: ignore[index]


def test_the_pool_forks_whatever_the_interpreter_s_default(monkeypatch):
    # Python 3.14 starts pool workers from a fork server by default on Linux: they would import libcst anew.
    # Here the default is made "spawn"; the workers still start forked, with what this process holds.
    import multiprocessing

    import pool_tasks

    spawn = multiprocessing.get_context("spawn")
    monkeypatch.setattr(multiprocessing.context._default_context, "_actual_context", spawn)
    monkeypatch.setitem(pool_tasks.state, "setup_pid", "made in the parent, before the pool")
    results = _map(Pool(2), 12)
    assert {pid for _, pid in results.values()} == {"made in the parent, before the pool"}  # type: ignore[misc]


def test_a_pool_breaking_while_its_tasks_are_submitted_leaves_the_rest_to_the_retry(monkeypatch):
    """A worker can die on the first task before the last is submitted (`submit` then raises BrokenProcessPool):
    the tasks not submitted are retried like those the death took down, and every one gets its result."""
    import concurrent.futures
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    class BreaksAtTheSecondSubmit:
        def __init__(self, *args, **kwargs):
            self.submitted = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            return False

        def submit(self, function, *arguments):
            self.submitted += 1
            if self.submitted == 2:
                raise BrokenProcessPool("A child process terminated abruptly")
            future = Future()
            future.set_result(function(*arguments))
            return future

        def shutdown(self, wait=True, cancel_futures=False):
            pass

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", BreaksAtTheSecondSubmit)
    remember_pid()  # the set-up the fake pool's "workers" (this process) would have run
    results = _map(Pool(2, remember_pid), IN_PROCESS_BELOW + 2)
    assert {key: result[0] for key, result in results.items()} == {  # type: ignore[index]
        f"file{n}.py": n * n for n in range(IN_PROCESS_BELOW + 2)
    }


def test_tasks_to_keep_here_run_here_while_every_worker_is_still_preparing(tmp_path):
    """The rounds index their files in the run's process while the workers import libcst, rather than wait."""
    remember_pid()
    flag = tmp_path / "prepared"
    pool = Pool(2, remember_pid)
    try:
        pool.prepare(functools.partial(wait_for, str(flag)), 1)
        here = dict(pool.map(square_or_die, tasks(12), few_here=True))
        assert not pool.ready
        flag.touch()
        while not pool.ready:
            time.sleep(0.01)
        there = dict(pool.map(square_or_die, tasks(12), few_here=True))
    finally:
        flag.touch()
        pool.close()
    assert {pid for _, pid in here.values()} == {os.getpid()}  # type: ignore[misc]
    assert os.getpid() not in {pid for _, pid in there.values()}  # type: ignore[misc]
    assert {key: value[0] for key, value in there.items()} == {f"file{n}.py": n * n for n in range(12)}  # type: ignore[index]
