"""Tasks for the process-pool tests (test_parallel): they record the process their
set-up ran in, and one number kills its worker. Module-level, so that workers can unpickle them."""

from __future__ import annotations

import os

# Per process: what the set-up and the tasks left there.
state: dict[str, object] = {}


def remember_pid() -> None:
    state["setup_pid"] = os.getpid()


def square_or_die(number: int) -> tuple[int, object]:
    if number == 13:
        os._exit(3)  # what an out-of-memory kill or a segfault looks like to the parent
    return number * number, state["setup_pid"]


def tasks(count: int):
    return [(f"file{n}.py", (n,)) for n in range(count)]


def wait_for(path: str) -> None:
    """A worker's preparation that lasts until ``path`` exists."""
    import time

    while not os.path.exists(path):
        time.sleep(0.01)


def touch(path: str) -> int:
    """Create ``path``: the parent sees that the task ran."""
    with open(path, "w"):
        pass
    return os.getpid()
