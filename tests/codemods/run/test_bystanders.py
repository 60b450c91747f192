"""After an edit of files that took no part in the run (not indexed, scanned, parsed or reported), the rerun
reads only them, asks them the run's questions again, and reports the run before's report when each answer is
the same; any other edit is the runner's. Every outcome is checked against a run without a cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_attn_compat.codemods.run import rerun, stats
from vllm_attn_compat.codemods.run.runner import Options, run_paths

from reruns import STUB_VLLM, cached, outcome
from runner_trees import BASE, IMPL, MANUAL, UNRELATED, write_tree

SCHEDULER = "import heapq\n\n\ndef pop(queue):\n    return heapq.heappop(queue)\n"
# `output` defaults to None: whether making it required is safe depends on every call of `prefill` in the run.
PREFILL = """\
from vllm.v1.attention.backend import AttentionImpl


class PrefillImpl(AttentionImpl):
    def prefill(self, query, output=None):
        assert output is not None
        output.copy_(query)
"""


@pytest.fixture
def tree(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr(stats, "RACY_NS", 0)  # files written by the test are trusted at once: the worst case
    return write_tree(
        tmp_path / "tree",
        {**STUB_VLLM, "plugin/base.py": BASE, "plugin/impl.py": IMPL, "plugin/manual.py": MANUAL,
         "plugin/helpers.py": UNRELATED, "plugin/prefill.py": PREFILL, "engine/scheduler.py": SCHEDULER,
         "engine/queue.py": SCHEDULER},
    )  # fmt: skip


def _rerun(tree: Path, options: Options):
    """The rerun's report, or None when it is left to the runner."""
    prepared = rerun.prepare([str(tree)], options)
    report = prepared.report(options.mode)
    return outcome(report) if rerun.replay(prepared, options.mode, report) else None


def _uncached(tree: Path):
    return outcome(run_paths([str(tree)], Options(mode="check", jobs=1)))


def test_an_edit_of_a_file_taking_no_part_reads_it_alone_and_reports_what_an_uncached_run_does(tree, tmp_path, reads):
    options = cached(tmp_path)
    before = outcome(run_paths([str(tree)], options))
    (tree / "engine/scheduler.py").write_text(SCHEDULER + "\n\ndef push(queue, item):\n    heapq.heappush(queue, 1)\n")
    reads.clear()
    assert _rerun(tree, options) == before
    assert reads == ["scheduler.py"]
    assert before == _uncached(tree)


def test_a_run_of_edits_is_found_edit_after_edit(tree, tmp_path, reads):
    options = cached(tmp_path)
    before = outcome(run_paths([str(tree)], options))
    helpers = tree / "plugin/helpers.py"
    for number in range(3):
        helpers.write_text(UNRELATED + f"\n\nLIMIT = {number}\n")
        reads.clear()
        assert _rerun(tree, options) == before
        assert reads == ["helpers.py"]
        assert before == _uncached(tree)


@pytest.mark.parametrize(
    ("path", "text"),
    [
        # The scheduler now defines an attention impl: it holds a rule's tokens (the prefilter's answer changes).
        ("engine/scheduler.py", MANUAL.replace("OtherImpl", "SchedulerImpl")),
        # It reads the flag vLLM 0.20 removed: whether deleting the flag's declarations is safe depends on it.
        ("engine/scheduler.py", SCHEDULER + "\n\ndef legacy(backend):\n    return backend.accept_output_buffer\n"),
        # It names an attention class of the run: the hierarchy's rounds index it.
        ("engine/scheduler.py", "from plugin.impl import MyImpl\n\n\nclass Faster(MyImpl):\n    pass\n"),
        # It calls a method whose fix the call-site analysis decides (`prefill` without `output`).
        ("engine/scheduler.py", SCHEDULER + "\n\ndef run(impl, q):\n    return impl.prefill(q)\n"),
        # A file that took part, its answers the same: its finding is suppressed now.
        ("plugin/impl.py", IMPL.replace('"Output tensor must be provided."', '""  # noqa: VAC001')),
    ],
    ids=["attention-code", "flag-read", "names-a-class", "calls-a-method", "took-part"],
)
def test_an_edit_that_may_give_a_file_a_part_is_left_to_the_runner(tree, tmp_path, path, text):
    options = cached(tmp_path)
    run_paths([str(tree)], options)
    (tree / path).write_text(text)
    assert _rerun(tree, options) is None
    assert outcome(run_paths([str(tree)], options)) == _uncached(tree)


def test_answers_written_by_another_run_since_leave_the_edit_to_the_runner(tree, tmp_path):
    options = cached(tmp_path)
    run_paths([str(tree)], options)
    run_paths([str(tree)], cached(tmp_path, mode="diff"))  # the answers file now holds that run's answers
    (tree / "engine/scheduler.py").write_text(SCHEDULER + "\nQUEUED = 0\n")
    assert _rerun(tree, options) is None
    assert outcome(run_paths([str(tree)], options)) == _uncached(tree)
    (tree / "engine/scheduler.py").write_text(SCHEDULER + "\nQUEUED = 1\n")
    assert _rerun(tree, options) == _uncached(tree)  # that run was this one's: found again


def test_files_that_shared_their_bytes_keep_their_answers_when_one_is_edited(tree, tmp_path):
    options = cached(tmp_path)
    run_paths([str(tree)], options)
    (tree / "engine/scheduler.py").write_text(SCHEDULER + "\nQUEUED = 0\n")  # queue.py had the same bytes
    assert _rerun(tree, options) == _uncached(tree)
    (tree / "engine/queue.py").write_text(SCHEDULER + "\nLENGTH = 0\n")
    assert _rerun(tree, options) == _uncached(tree)


def test_an_edit_just_before_the_run_is_found_from_the_run_before(tree, tmp_path, monkeypatch, reads):
    # Every file modified "just now" (pre-commit right after an edit): none is trusted by its status, each is
    # read and hashed, and the edited one is asked the run's questions.
    monkeypatch.setattr(stats, "RACY_NS", 3600 * 10**9)
    options = cached(tmp_path)
    run_paths([str(tree)], options)
    (tree / "engine/scheduler.py").write_text(SCHEDULER + "\nQUEUED = 0\n")
    reads.clear()
    found = _rerun(tree, options)
    assert "scheduler.py" in reads
    assert found == _uncached(tree)


def test_the_rerun_found_is_kept_as_a_run_of_its_own(tree, tmp_path, reads):
    options = cached(tmp_path)
    run_paths([str(tree)], options)
    (tree / "engine/scheduler.py").write_text(SCHEDULER + "\nQUEUED = 0\n")
    found = _rerun(tree, options)
    reads.clear()
    assert _rerun(tree, options) == found and reads == []  # by the statuses alone


@pytest.mark.parametrize(
    "spoil",
    [
        lambda entry: {**entry, "involved": "plugin"},
        lambda entry: {**entry, "asked": [["words", "MyImpl"]]},
        lambda entry: {**entry, "answered": "../run"},
        lambda entry: {**entry, "answers": {"0" * 64: {"words 0": "yes"}}},
    ],
    ids=["involved-not-a-list", "terms-not-a-list", "answered-not-a-key", "answer-not-a-boolean"],
)
def test_a_basis_not_trusted_is_ignored_with_a_warning(tree, tmp_path, spoil, capsys):
    options = cached(tmp_path)
    run_paths([str(tree)], options)
    spoiled = 0
    for path in (tmp_path / "cache").rglob("*"):
        entry = json.loads(path.read_bytes()) if path.is_file() and path.read_bytes().startswith(b"{") else None
        if isinstance(entry, dict) and entry.get("kind") == "basis":
            path.write_text(json.dumps(spoil(entry)))
            spoiled += 1
    assert spoiled == 1
    (tree / "engine/scheduler.py").write_text(SCHEDULER + "\nQUEUED = 0\n")
    capsys.readouterr()
    assert _rerun(tree, options) is None
    assert "warning: ignoring the cache entry" in capsys.readouterr().err
    assert outcome(run_paths([str(tree)], options)) == _uncached(tree)


def test_a_file_added_that_takes_no_part_is_read_alone(tree, tmp_path, reads):
    options = cached(tmp_path)
    run_paths([str(tree)], options)
    (tree / "engine/limits.py").write_text("MAX_BATCH = 256\n")
    reads.clear()
    found = _rerun(tree, options)
    assert reads == ["limits.py"]
    assert found == _uncached(tree) and found[3] == 10  # one more file scanned, the same findings


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("engine/limits.py", MANUAL.replace("OtherImpl", "LimitsImpl")),  # attention code
        ("engine/limits.py", "from plugin.impl import MyImpl\n"),  # names an attention class
        ("engine/limits.py", "def run(impl, q):\n    return impl.prefill(q)\n"),  # a call whose fix is decided
        ("engine/limits.py", "def legacy(backend):\n    return backend.accept_output_buffer\n"),  # a flag read
        ("engine/__init__.py", ""),  # the package's modules get other names
    ],
    ids=["attention-code", "names-a-class", "calls-a-method", "flag-read", "package-marker"],
)
def test_a_file_added_that_may_take_part_is_left_to_the_runner(tree, tmp_path, path, text):
    options = cached(tmp_path)
    run_paths([str(tree)], options)
    (tree / path).write_text(text)
    assert _rerun(tree, options) is None
    assert outcome(run_paths([str(tree)], options)) == _uncached(tree)


def test_a_file_added_where_the_run_looked_for_a_base_class_is_left_to_the_runner(tree, tmp_path):
    # The flag is declared on a backend whose base, the project's own `CommonBackend`, no file of the run
    # defines: the run looked for it by the files' paths (a module named `common`).
    (tree / "plugin/flagged.py").write_text(
        "from plugin.common import CommonBackend\n\n\n"
        "class FlaggedBackend(CommonBackend):\n    accept_output_buffer = True\n"
    )
    options = cached(tmp_path)
    run_paths([str(tree)], options)
    (tree / "engine/common.py").write_text("MAX_BATCH = 256\n")
    assert _rerun(tree, options) is None
    assert outcome(run_paths([str(tree)], options)) == _uncached(tree)
    (tree / "engine/limits.py").write_text("MAX_BATCH = 256\n")  # a module named otherwise: no part
    assert _rerun(tree, options) == _uncached(tree)
