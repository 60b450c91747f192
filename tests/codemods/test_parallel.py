"""The process pool: results for every task, and a worker that dies costs only its own file."""

from __future__ import annotations

import os
import time

from vllm_attn_compat.codemods.parallel import IN_PROCESS_BELOW, WarmPool, WorkerCrashed, parallel_map

_state: dict[str, int] = {}


def remember_pid() -> None:
    _state["setup_pid"] = os.getpid()


def square_or_die(number: int) -> tuple[int, int]:
    if number == 13:
        os._exit(3)  # what an out-of-memory kill or a segfault looks like to the pool
    return number * number, _state["setup_pid"]


def tasks(count: int):
    return [(f"file{n}.py", (n,)) for n in range(count)]


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
    assert {key: value[0] for key, value in results.items()} == {
        f"file{n}.py": n * n for n in range(30) if n != 13
    }


def slow_setup() -> None:
    remember_pid()
    time.sleep(60)  # a worker still starting up (importing libcst) when the run finds it needs none


def run_in(warm: WarmPool, function, submitted) -> dict:
    for key, arguments in submitted:
        warm.submit(key, function, arguments)
    return dict(warm.results())


def test_a_warm_pool_runs_even_a_few_tasks_in_its_started_workers():
    warm = WarmPool(2, remember_pid)
    results = run_in(warm, square_or_die, tasks(3))
    assert {key: value[0] for key, value in results.items()} == {f"file{n}.py": n * n for n in range(3)}
    assert os.getpid() not in {pid for _, pid in results.values()}


def test_a_worker_dying_in_a_warm_pool_costs_only_its_file():
    warm = WarmPool(2, remember_pid)
    results = run_in(warm, square_or_die, tasks(20))
    assert isinstance(results.pop("file13.py"), WorkerCrashed)
    assert {key: value[0] for key, value in results.items()} == {f"file{n}.py": n * n for n in range(20) if n != 13}


def test_closing_an_unused_warm_pool_stops_workers_that_are_still_starting():
    warm = WarmPool(2, slow_setup)
    processes = list(warm.executor._processes.values())
    assert processes and all(process.is_alive() for process in processes)
    warm.close()
    # The executor's manager thread also joins its workers: while it reaps one, is_alive() can still say
    # True for a moment in this thread (the other waitpid got the status), so allow it a short while.
    deadline = time.monotonic() + 10
    while any(process.is_alive() for process in processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(process.is_alive() for process in processes)
