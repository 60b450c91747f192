"""A rerun over unchanged files replays the cached run's report without reading a file; anything else is a miss,
and the run the runner then does reports what an uncached run does."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from vllm_attn_compat.codemods.run import rerun, stats
from vllm_attn_compat.codemods.run.runner import Options, run_paths

from reruns import STUB_VLLM, cached, outcome
from runner_trees import BASE, IMPL, MANUAL, UNRELATED, write_tree


@pytest.fixture
def tree(tmp_path: Path, monkeypatch) -> Path:
    # Files written by the test are "racy" for `RACY_NS`: trusted at once here, the worst case for staleness.
    monkeypatch.setattr(stats, "RACY_NS", 0)
    return write_tree(
        tmp_path / "tree",
        {**STUB_VLLM, "plugin/base.py": BASE, "plugin/impl.py": IMPL, "plugin/manual.py": MANUAL,
         "plugin/helpers.py": UNRELATED},
    )  # fmt: skip


def _replayed(tree: Path, options: Options) -> bool:
    prepared = rerun.prepare([str(tree)], options)
    return rerun.replay(prepared, options.mode, prepared.report(options.mode))


def test_a_rerun_over_unchanged_files_reads_none_and_reports_the_same(tree, tmp_path, reads):
    options = cached(tmp_path)
    cold = outcome(run_paths([str(tree)], options))
    assert reads
    reads.clear()
    assert outcome(run_paths([str(tree)], options)) == cold
    assert reads == []


def test_files_whose_status_changed_but_not_their_bytes_are_read_and_the_run_replayed(tree, tmp_path, reads):
    options = cached(tmp_path)
    run_paths([str(tree)], options)
    reads.clear()
    earlier = time.time_ns() - 3600 * 10**9
    os.utime(tree / "plugin/impl.py", ns=(earlier, earlier))  # `touch`, or a checkout writing the same bytes back
    assert _replayed(tree, options)
    assert reads == ["impl.py"]
    reads.clear()
    assert _replayed(tree, options) and reads == []  # its new status was recorded


@pytest.mark.parametrize(
    "change",
    [
        lambda tree: (tree / "plugin/impl.py").write_text(IMPL.replace("is not None", "is not Nope")),  # same size
        lambda tree: (tree / "plugin/new.py").write_text(IMPL),
        lambda tree: (tree / "plugin/helpers.py").unlink(),
        lambda tree: (tree / "plugin/base.py").write_text("class PluginImplBase:\n    pass\n"),
    ],
    ids=["same-size-edit", "file-added", "file-removed", "base-edited"],
)
def test_any_change_misses_and_the_run_reports_what_an_uncached_run_does(tree, tmp_path, change):
    options = cached(tmp_path)
    run_paths([str(tree)], options)
    change(tree)
    assert not _replayed(tree, options)
    assert outcome(run_paths([str(tree)], options)) == outcome(run_paths([str(tree)], cached(tmp_path / "none")))


def test_options_and_mode_key_the_run(tree, tmp_path):
    run_paths([str(tree)], cached(tmp_path))
    assert _replayed(tree, cached(tmp_path))
    assert not _replayed(tree, Options(mode="diff", jobs=1, cache_dir=str(tmp_path / "cache")))
    assert not _replayed(tree, cached(tmp_path, select=("VAC001",)))
    assert not _replayed(tree, cached(tmp_path, unsafe_fixes=True))


def test_an_edit_of_an_excluded_file_misses(tree, tmp_path):
    options = cached(tmp_path, exclude=("base.py",), base=str(tree))
    run_paths([str(tree)], options)
    assert _replayed(tree, options)
    (tree / "plugin/base.py").write_text("class PluginImplBase:\n    pass\n")
    assert not _replayed(tree, options)


def test_a_file_that_cannot_be_read_as_source_is_never_replayed_over(tree, tmp_path):
    (tree / "plugin/binary.py").write_bytes(b"x = 1\n\0")
    options = cached(tmp_path)
    first = outcome(run_paths([str(tree)], options))
    assert [error.path for error in first[2]] == [str(tree / "plugin/binary.py")]
    assert not _replayed(tree, options)  # the runner reads it, and reports it again
    assert outcome(run_paths([str(tree)], options)) == first


def test_a_tree_with_nothing_to_migrate_is_replayed_too(tmp_path, reads, monkeypatch):
    monkeypatch.setattr(stats, "RACY_NS", 0)
    tree = write_tree(tmp_path / "plain", {f"pkg/m{n}.py": UNRELATED for n in range(5)})
    options = cached(tmp_path)
    assert outcome(run_paths([str(tree)], options)) == ([], [], [], 5, 0)
    reads.clear()
    assert _replayed(tree, options) and reads == []


def test_a_rerun_over_the_same_statuses_needs_neither_the_table_nor_a_read(tree, tmp_path, reads, monkeypatch):
    options = cached(tmp_path)
    cold = outcome(run_paths([str(tree)], options))  # records the run's statuses (no file is racy here)
    reads.clear()

    def no_table(root: str) -> stats.StatTable:
        raise AssertionError("the statuses alone find the run")

    monkeypatch.setattr(stats, "StatTable", no_table)
    prepared = rerun.prepare([str(tree)], options)
    report = prepared.report(options.mode)
    assert rerun.replay(prepared, options.mode, report)
    assert outcome(report) == cold and reads == []


def test_a_first_run_takes_no_status_of_its_files_to_look_for_a_run_to_replay(tree, tmp_path, monkeypatch):
    """Without a status table (every run with a cache saves one) there is no run to replay: the rerun's pass over
    the files' statuses is skipped, and taken again once the table exists."""
    taken = []
    real_statuses = rerun._statuses

    def statuses(prepared):
        taken.append(len(prepared.found.files))
        return real_statuses(prepared)

    monkeypatch.setattr(rerun, "_statuses", statuses)
    options = cached(tmp_path)
    first = outcome(run_paths([str(tree)], options))
    assert taken == [] and first == outcome(run_paths([str(tree)], Options(mode="check", jobs=1)))
    assert _replayed(tree, options) and taken == [len(list(tree.rglob("*.py")))]


def test_a_racy_file_keeps_the_run_from_being_found_by_its_statuses(tree, tmp_path, reads, monkeypatch):
    monkeypatch.setattr(stats, "RACY_NS", 3600 * 10**9)  # every file was modified "just now"
    options = cached(tmp_path)
    cold = outcome(run_paths([str(tree)], options))
    for _ in range(2):  # no status is trusted: each file is read and hashed again, and found to be the same
        reads.clear()
        assert _replayed(tree, options) and sorted(reads) == sorted(path.name for path in tree.rglob("*.py"))
    monkeypatch.setattr(stats, "RACY_NS", 0)  # old enough now: read, hashed, the run's entry found, statuses kept
    assert outcome(run_paths([str(tree)], options)) == cold
    reads.clear()
    assert _replayed(tree, options) and reads == []


@pytest.mark.parametrize("exclude", [("impl.py",), ("helpers.py",)])
def test_other_excludes_miss_and_the_run_reports_what_an_uncached_run_does(tree, tmp_path, exclude):
    # The same files and bytes, another split between the files to migrate and those read for context only.
    run_paths([str(tree)], cached(tmp_path, base=str(tree)))
    excluding = cached(tmp_path, exclude=exclude, base=str(tree))
    assert not _replayed(tree, excluding)
    uncached = outcome(run_paths([str(tree)], cached(tmp_path / "none", exclude=exclude, base=str(tree))))
    assert outcome(run_paths([str(tree)], excluding)) == uncached
    assert _replayed(tree, excluding)


def _edit(path: Path, text: str) -> None:
    """Write ``text`` with a status unlike the one before (a later ``mtime_ns``, whatever the clock's grain)."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    later = max(path.stat().st_mtime_ns, before + 10**9)
    os.utime(path, ns=(later, later))


@pytest.mark.parametrize("mode", ["check", "diff"])
def test_a_rerun_that_misses_reads_only_the_files_whose_bytes_it_needs(tree, tmp_path, reads, mode):
    """A file that takes part edited (the runner runs): the others' answers and entries are kept, so their bytes
    are not read again; the report is an uncached run's."""
    options = cached(tmp_path, mode=mode)
    run_paths([str(tree)], options)
    _edit(tree / "plugin/impl.py", IMPL.replace("# the buffer comes from the layer", "# edited"))
    reads.clear()
    report = run_paths([str(tree)], options)
    assert reads == ["impl.py"]  # by the rerun, which hands its bytes on
    assert outcome(report) == outcome(run_paths([str(tree)], Options(mode=mode, jobs=1)))


@pytest.mark.parametrize(("before", "after"), [("check", "diff"), ("diff", "check")])
def test_after_a_run_in_another_mode_a_rerun_reads_and_indexes_only_the_file_edited(
    tree, tmp_path, reads, indexed, before, after
):
    """What a run asks of a file's bytes and its class index depend on neither mode nor options: a ``--check``
    in pre-commit after a ``--diff`` (and the other way round) reads, and indexes, the edited file alone."""
    run_paths([str(tree)], cached(tmp_path, mode=after))
    run_paths([str(tree)], cached(tmp_path, mode=before))  # (the answers file is this run's now)
    _edit(tree / "plugin/impl.py", IMPL.replace("# the buffer comes from the layer", "# edited"))
    reads.clear()
    indexed.clear()
    report = run_paths([str(tree)], cached(tmp_path, mode=after))
    assert reads == ["impl.py"] and indexed == ["impl.py"]
    assert outcome(report) == outcome(run_paths([str(tree)], Options(mode=after, jobs=1)))


def test_a_run_that_writes_reads_every_file_before_writing_any(tree, tmp_path, reads):
    options = cached(tmp_path, mode="write")
    copy = write_tree(tmp_path / "copy", {p: (tree / p).read_text() for p in ("plugin/base.py", "plugin/impl.py")})
    run_paths([str(copy)], options)  # (the tree itself keeps its findings for the runs below)
    run_paths([str(tree)], cached(tmp_path))
    _edit(tree / "plugin/manual.py", MANUAL + "\n# edited\n")
    reads.clear()
    run_paths([str(tree)], options)
    assert sorted(reads) == sorted(["manual.py", *(p.name for p in tree.rglob("*.py"))])


def test_a_file_edited_during_a_rerun_has_the_run_start_again_reading_every_file(tree, tmp_path, monkeypatch):
    """The rerun took the statuses; the file changes before the runner asks for its bytes: what was asked of it
    may mix two versions, so the run reads every file anew (`reading.Changed`)."""
    from vllm_attn_compat.codemods.run import runner

    first = run_paths([str(tree)], cached(tmp_path, select=["VAC001"]))
    assert any(path.endswith("impl.py") for path, _ in first.findings)
    # Other rules: the table knows every file, but no answer of the run below is kept: it asks for every file's bytes.
    real_replay, real_run = rerun.replay, runner._run
    runs = []

    def replay(prepared, mode, report):
        replayed = real_replay(prepared, mode, report)
        assert not replayed and prepared.known
        _edit(tree / "plugin/impl.py", IMPL.replace('assert output is not None, "Output tensor must be provided."', ""))
        return replayed

    def counted(*args):
        runs.append(len(args[0].known))
        return real_run(*args)

    monkeypatch.setattr(rerun, "replay", replay)
    monkeypatch.setattr(runner, "_run", counted)
    report = run_paths([str(tree)], cached(tmp_path))
    assert runs == [len(list(tree.rglob("*.py"))), 0]
    monkeypatch.setattr(rerun, "replay", real_replay)
    assert outcome(report) == outcome(run_paths([str(tree)], Options(mode="check", jobs=1)))
    assert not any(path.endswith("impl.py") for path, _ in report.findings)  # its assert is gone: the new bytes
