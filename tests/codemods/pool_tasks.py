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


def die_at_once(_: bytes) -> None:
    os._exit(3)


def configure(value: object) -> None:
    state["configured"] = value


def configured_or_die(number: int) -> tuple[int, object]:
    if number == 13:
        os._exit(3)
    return number, state.get("configured")


def large_answer(size: int, flag: str | None) -> bytes:
    """``size`` bytes back; creates ``flag`` once done (the answer is then on its way)."""
    if flag is not None:
        open(flag, "w").close()
    return bytes(size)


def whoami(_: int) -> tuple[int, object]:
    """The process running the task, and the one its set-up ran in."""
    return os.getpid(), state.get("setup_pid")


def write_pid(path: str) -> None:
    with open(path + ".part", "w") as out:
        out.write(str(os.getpid()))
    os.replace(path + ".part", path)


def refuse_forks() -> None:
    """Set-up of a worker whose system refuses it another process (its sibling)."""

    def refused() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    remember_pid()
    os.fork = refused


def slow_by_name(source: bytes, path: str) -> tuple[str, int]:
    """A migration whose cost is in the file's name (``slow-0.5.py`` takes half a second), not its size."""
    import time

    name = os.path.basename(path)
    if name.startswith("slow-"):
        time.sleep(float(name[len("slow-") : -len(".py")]))
    return path, os.getpid()
