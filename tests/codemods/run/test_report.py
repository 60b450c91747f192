"""Report renderings and exit codes, from a run report built by hand."""

from __future__ import annotations

import json

import pytest

from vllm_attn_compat.codemods.findings import Finding, Status
from vllm_attn_compat.codemods.run.report import FileError, RunReport, render
from vllm_attn_compat.codemods.target_version import Target


def report(mode: str = "write", statuses=(Status.FIXED,), errors=()) -> RunReport:
    findings = [("pkg/b.py", Finding(3, 5, f"VAC00{i + 1}", f"message {i}", s)) for i, s in enumerate(statuses)]
    return RunReport(
        mode=mode,
        scanned=10,
        parsed=2,
        changed=["pkg/b.py"] if Status.FIXED in statuses else [],
        findings=findings,
        errors=list(errors),
    )


@pytest.mark.parametrize(
    ("mode", "statuses", "errors", "expected"),
    [
        ("write", (), (), 0),
        ("write", (Status.FIXED, Status.SUPPRESSED), (), 0),
        ("check", (Status.FIXED,), (), 1),
        ("diff", (Status.FIXED,), (), 1),
        ("write", (Status.MANUAL,), (), 1),
        ("write", (Status.UNSAFE_FIX_AVAILABLE,), (), 1),
        ("check", (Status.SUPPRESSED,), (), 0),
        ("write", (Status.MANUAL,), (FileError("x.py", 1, 1, "boom"),), 2),
    ],
)
def test_exit_codes(mode, statuses, errors, expected):
    assert report(mode, statuses, errors).exit_code() == expected


def test_text_marks_fixes_hides_suppressed_and_summarises():
    text = render(
        report(
            "check",
            (Status.FIXED, Status.UNSAFE_FIX_AVAILABLE, Status.MANUAL, Status.SUPPRESSED),
            (FileError("bad.py", 4, 2, "could not parse: invalid syntax"),),
        ),
        "text",
    )
    lines = text.splitlines()
    assert lines[:4] == [
        "bad.py:4:2: could not parse: invalid syntax",
        "pkg/b.py:3:5: VAC001 [*] message 0",
        "pkg/b.py:3:5: VAC002 [unsafe] message 1",
        "pkg/b.py:3:5: VAC003 message 2",
    ]
    assert "Scanned 10 files: 2 parsed, 1 would change." in lines
    assert "Findings: 1 fixable, 2 left (1 manual, 1 unsafe fix withheld), 1 suppressed by noqa." in lines
    assert "Left by rule: VAC002 1, VAC003 1" in lines
    assert "1 unsafe fix available with --unsafe-fixes (review them)." in lines
    assert "1 file(s) could not be processed (see the errors above)." in lines


def test_quiet_text_keeps_findings_and_errors_only():
    text = render(report("write", (Status.MANUAL,)), "text", quiet=True)
    assert text == "pkg/b.py:3:5: VAC001 message 0\n"


def test_json_has_one_record_per_site_and_the_summary():
    document = json.loads(render(report("write", (Status.FIXED, Status.SUPPRESSED, Status.MANUAL)), "json"))
    assert document["findings"][1] == {
        "file": "pkg/b.py",
        "line": 3,
        "column": 5,
        "code": "VAC002",
        "message": "message 1",
        "status": "suppressed",
        "release": None,
    }
    assert [f["status"] for f in document["findings"]] == ["fixed", "suppressed", "manual"]
    summary = document["summary"]
    assert summary["files_scanned"] == 10 and summary["files_changed"] == 1 and summary["files_would_change"] == 0
    assert summary["findings"] == {"fixed": 1, "fixable": 0, "unsafe-fix-available": 0, "manual": 1, "suppressed": 1}
    assert summary["left_by_code"] == {"VAC003": 1} and summary["exit_code"] == 1


def test_github_annotations_escape_their_fields():
    run = report("check", (Status.MANUAL,), (FileError("a,b:c.py", 2, 1, "100% bad\nreally"),))
    lines = render(run, "github", quiet=True).splitlines()
    assert lines == [
        "::error file=a%2Cb%3Ac.py,line=2,col=1,title=vllm-attn-compat::100%25 bad%0Areally",
        "::error file=pkg/b.py,line=3,col=5,title=VAC001::message 0",
    ]


def test_the_summary_says_which_release_was_targeted_and_why():
    target = Target("0.34.0", "0.30.0", ("0.30.0", "0.34.0"), "from pyproject.toml: vllm>=0.30,<0.35", None)
    run = RunReport(mode="check", target=target)
    lines = render(run, "text").splitlines()
    assert lines[0] == (
        "Target: vLLM 0.34.0, from pyproject.toml: vllm>=0.30,<0.35; fixes must hold from vLLM 0.30.0 on."
    )
    explicit = RunReport(target=Target("0.27.1", "0.27.1", ("0.27.1",), "from --target-version 0.27", None))
    assert render(explicit, "text").splitlines()[0] == "Target: vLLM 0.27.1, from --target-version 0.27."
    assert json.loads(render(run, "json"))["target"] == {
        "release": "0.34.0",
        "oldest": "0.30.0",
        "reason": "from pyproject.toml: vllm>=0.30,<0.35",
    }
    assert json.loads(render(RunReport(), "json"))["target"] is None


def test_findings_left_are_grouped_by_the_release_that_caused_them():
    findings = [
        ("a.py", Finding(1, 1, "VAC010", "dead", Status.MANUAL, "0.34.0")),
        ("a.py", Finding(2, 1, "VAC010", "dead", Status.MANUAL, "0.29.0")),
        ("b.py", Finding(3, 1, "VAC011", "gone", Status.UNSAFE_FIX_AVAILABLE, "0.29.0")),
        ("b.py", Finding(4, 1, "VAC002", "fixed", Status.FIXED, "0.20.0")),  # not left
        ("b.py", Finding(5, 1, "VAC008", "no release", Status.MANUAL)),
    ]
    run = RunReport(mode="check", findings=findings)
    assert (
        "Left by the vLLM release that caused them: vLLM 0.29.0: 2 (VAC010 1, VAC011 1); vLLM 0.34.0: 1 (VAC010 1)."
        in render(run, "text").splitlines()
    )
    document = json.loads(render(run, "json"))
    assert document["summary"]["left_by_release"] == {"0.29.0": {"VAC010": 1, "VAC011": 1}, "0.34.0": {"VAC010": 1}}
    assert [f["release"] for f in document["findings"]] == ["0.34.0", "0.29.0", "0.29.0", "0.20.0", None]
