"""A first run's digests taken in a process of their own (`run/hasher.py`): what it hands the run is the digest of
the bytes it read with the status it gives, it stops when the run needs the digests, and a run using it leaves
the cache as one hashing every file itself."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from vllm_attn_compat.codemods.run import cachedir, hasher, parallel, stats
from vllm_attn_compat.codemods.run.reading import Reading
from vllm_attn_compat.codemods.run.runner import Options, run_paths

from reruns import STUB_VLLM, cached, outcome
from runner_trees import BASE, IMPL, MANUAL, UNRELATED, write_tree


def _files(tmp_path: Path, count: int) -> list[str]:
    paths = []
    for number in range(count):
        path = tmp_path / f"m{number}.py"
        path.write_text(f"x = {number}\n" * (number + 1))
        paths.append(str(path))
    return paths


def _finished(process: hasher.Hasher, count: int) -> None:
    """Wait for ``process`` to have hashed its ``count`` files (it runs at the lowest priority)."""
    deadline = time.monotonic() + 60
    while process.hashed < count:
        assert time.monotonic() < deadline, f"the hasher did {process.hashed} files of {count} in 60 s"
        time.sleep(0.005)


def _gone(pid: int) -> bool:
    """Whether the process ``pid`` has exited and been reaped."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def _running(pid: int) -> bool:
    """Whether our child ``pid`` still runs (reaped if it does not)."""
    return os.waitpid(pid, os.WNOHANG) == (0, 0)


def test_each_record_is_the_status_and_digest_of_the_bytes_read_and_a_file_not_text_is_marked(tmp_path):
    paths = _files(tmp_path, 6)
    (tmp_path / "binary.py").write_bytes(b"x = 1\0\n")
    (tmp_path / "latin.py").write_bytes(b"x = '\xe9'\n")  # no coding declaration: not UTF-8 text
    paths += [str(tmp_path / "binary.py"), str(tmp_path / "gone.py"), str(tmp_path / "latin.py")]
    process = hasher.Hasher(paths)
    pid = process._pid
    _finished(process, len(paths))
    os.kill(pid, signal.SIGINT)  # Ctrl-C is the run's to handle, which then ends the process
    time.sleep(0.05)
    assert _running(pid)  # its work done, it waits for the run: its pid stays its own until the run signals it
    found = process.records()
    assert found == {
        **{path: (*stats.status_of(os.stat(path)), stats.raw_digest(Path(path).read_bytes())) for path in paths[:6]},
        **{path: (-1, 0, 0, 0, bytes(32)) for path in paths[6:]},  # not text, missing, not UTF-8 without a coding
    }
    assert _gone(pid)


def test_stopped_at_once_it_gives_only_what_it_had_hashed(tmp_path):
    paths = _files(tmp_path, 300)
    process = hasher.Hasher(paths)
    found = process.records()  # most likely before it read a file: it runs at the lowest priority
    assert set(found) == set(paths[: len(found)])
    for path, (*status, digest) in found.items():
        assert tuple(status) == stats.status_of(os.stat(path)) and digest == stats.raw_digest(Path(path).read_bytes())
    assert process.records() == found  # stopped: nothing more comes
    process.close()  # and closing again is harmless


def test_it_starts_only_where_it_pays_and_may_fork(tmp_path, monkeypatch):
    paths = _files(tmp_path, 3)
    monkeypatch.setattr(hasher, "may_fork", lambda: True)
    monkeypatch.setattr(hasher, "FROM_FILES", 4)
    assert hasher.start(paths) is None  # fewer files than pay for a process
    monkeypatch.setattr(hasher, "FROM_FILES", 3)
    process = hasher.start(paths)
    assert process is not None
    process.close()
    monkeypatch.setattr(hasher, "may_fork", lambda: False)
    assert hasher.start(paths) is None


def test_it_may_not_fork_while_another_thread_runs(monkeypatch):
    monkeypatch.setattr(threading, "active_count", lambda: 1)  # (tests before may leave threads: torch's, say)
    assert hasher.may_fork() == parallel.forks_safely()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    monkeypatch.undo()
    try:
        assert not hasher.may_fork()  # a thread of this process might hold a lock the forked one needs
    finally:
        stop.set()
        thread.join()
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(parallel, "forks_safely", lambda: False)
    assert not hasher.may_fork()


# --- through a run: the cache it leaves is the one a run hashing every file itself leaves ---


@pytest.fixture
def tree(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr(stats, "RACY_NS", 0)  # files written by the test are trusted at once
    files = {**STUB_VLLM, "plugin/base.py": BASE, "plugin/impl.py": IMPL, "plugin/manual.py": MANUAL}
    files.update({f"engine/m{number}.py": UNRELATED + f"\nN = {number}\n" for number in range(12)})
    return write_tree(tmp_path / "tree", files)


def _first_run(tree: Path, folder: Path, monkeypatch, *, apart: bool) -> tuple[object, dict[str, object]]:
    """A first run over ``tree`` with its cache in ``folder``, its files hashed ``apart`` (the process waited for,
    so that its digests are the ones taken) or in the run: its outcome, and the cache's table and answers."""
    monkeypatch.setattr(hasher, "FROM_FILES", 0 if apart else 10**9)
    monkeypatch.setattr(hasher, "may_fork", parallel.forks_safely)  # whatever threads tests before left running
    started = []
    real_settle = Reading.settle

    def settle(reading: Reading) -> None:
        if reading.hasher is not None:
            started.append(reading.hasher._pid)
            _finished(reading.hasher, len(reading.hasher._paths))
        real_settle(reading)

    monkeypatch.setattr(Reading, "settle", settle)
    report = outcome(run_paths([str(tree)], cached(folder, jobs=2)))
    assert len(started) == int(apart)
    assert all(_gone(pid) for pid in started)  # the run leaves no process behind
    entries = cachedir.entries_folder(str(folder / "cache"))
    with open(os.path.join(entries, "stats.json")) as handle:
        rows = {os.path.relpath(path, tree): row[-1] for path, row in json.load(handle)["rows"].items()}
    with open(os.path.join(entries, "answers.json")) as handle:
        answers = json.load(handle)["files"]
    return report, {"rows": rows, "answers": answers}


def test_a_first_run_hashing_apart_leaves_the_table_and_answers_of_one_hashing_in_the_run(
    tree, tmp_path, monkeypatch, reads
):
    apart = _first_run(tree, tmp_path / "apart", monkeypatch, apart=True)
    within = _first_run(tree, tmp_path / "within", monkeypatch, apart=False)
    assert apart == within
    assert len(apart[1]["rows"]) == len(list(tree.rglob("*.py")))
    reads.clear()
    assert outcome(run_paths([str(tree)], cached(tmp_path / "apart"))) == apart[0]
    assert reads == []  # replayed from the files' statuses: nothing read


def test_a_first_run_hashing_apart_reports_what_an_uncached_run_does(tree, tmp_path, monkeypatch):
    report, _ = _first_run(tree, tmp_path / "apart", monkeypatch, apart=True)
    assert report == outcome(run_paths([str(tree)], Options(mode="check", jobs=1)))


def test_a_run_allowed_one_process_hashes_in_the_run(tree, tmp_path, monkeypatch):
    monkeypatch.setattr(hasher, "FROM_FILES", 0)
    monkeypatch.setattr(hasher, "may_fork", lambda: True)
    started = []
    monkeypatch.setattr(hasher, "start", lambda paths: started.append(paths))
    run_paths([str(tree)], cached(tmp_path, jobs=1))  # --jobs 1: no process but the run's own
    assert started == []
