"""The process pool: results for every task, and a worker that dies costs only its own file."""

from __future__ import annotations

import os

from vllm_attn_compat.codemods.run.parallel import IN_PROCESS_BELOW, WorkerCrashed, parallel_map

from pool_tasks import remember_pid, square_or_die, tasks


def test_small_jobs_run_in_this_process():
    results = dict(parallel_map(square_or_die, tasks(IN_PROCESS_BELOW - 1), jobs=2, initializer=remember_pid))
    assert results == {f"file{n}.py": (n * n, os.getpid()) for n in range(IN_PROCESS_BELOW - 1)}


def test_large_jobs_run_in_initialized_worker_processes():
    results = dict(parallel_map(square_or_die, tasks(12), jobs=2, initializer=remember_pid))
    assert {key: value[0] for key, value in results.items()} == {f"file{n}.py": n * n for n in range(12)}
    assert os.getpid() not in {pid for _, pid in results.values()}


def test_a_dying_worker_costs_only_the_file_it_was_processing():
    results = dict(parallel_map(square_or_die, tasks(30), jobs=2, initializer=remember_pid))
    assert set(results) == {f"file{n}.py" for n in range(30)}
    assert isinstance(results.pop("file13.py"), WorkerCrashed)
    assert {key: value[0] for key, value in results.items()} == {f"file{n}.py": n * n for n in range(30) if n != 13}


def test_the_pool_forks_whatever_the_interpreter_s_default(monkeypatch):
    # Python 3.14 starts pool workers from a fork server by default on Linux: they would import libcst anew and be
    # sent the run's hierarchy as a pickle. Here the default is made "spawn"; the workers still start forked.
    import multiprocessing

    import pool_tasks

    spawn = multiprocessing.get_context("spawn")
    monkeypatch.setattr(multiprocessing.context._default_context, "_actual_context", spawn)
    monkeypatch.setitem(pool_tasks.state, "setup_pid", "made in the parent, before the pool")
    results = dict(parallel_map(square_or_die, tasks(12), jobs=2, initializer=lambda: None))
    assert {pid for _, pid in results.values()} == {"made in the parent, before the pool"}


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

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", BreaksAtTheSecondSubmit)
    remember_pid()  # the set-up the fake pool's "workers" (this process) would have run
    results = dict(parallel_map(square_or_die, tasks(IN_PROCESS_BELOW + 2), jobs=2, initializer=remember_pid))
    assert {key: result[0] for key, result in results.items()} == {
        f"file{n}.py": n * n for n in range(IN_PROCESS_BELOW + 2)
    }
