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
