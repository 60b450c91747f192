"""The pytest plugin, run the way a downstream suite runs it: pytest in a subprocess, over a real test file that
uses deprecated APIs, with the plugin loaded by ``-p`` or by its ``pytest11`` entry point, with pytest-xdist,
``-W error`` and ``VLLM_ATTN_COMPAT_WARNINGS``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ["-p", "vllm_attn_compat.pytest_plugin", "-p", "no:cacheprovider"]

# A downstream test file: an old-API backend module and its tests. Reads of the removed flag at one line
# (three calls over two tests) and a backend class still declaring it (one use, reported at the class).
BACKEND = """\
from vllm_attn_compat import compat
from vllm_attn_compat.backends import AttentionBackend

compat.install_into_backends()


class RedundantBackend(AttentionBackend):
    accept_output_buffer = True

    @staticmethod
    def get_name():
        return "redundant"

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError


def read_flag():
    return AttentionBackend.accept_output_buffer
"""
TESTS = """\
from vllm_attn_compat.compat.flags import check_backend_flag

from old_backend import RedundantBackend, read_flag


def test_reads_the_flag_twice():
    assert read_flag() and read_flag()


def test_reads_the_flag_again():
    assert read_flag()


def test_declares_the_flag():
    check_backend_flag(RedundantBackend)
"""
FLAG_LINE = BACKEND.splitlines().index("    return AttentionBackend.accept_output_buffer") + 1
CLASS_LINE = BACKEND.splitlines().index("class RedundantBackend(AttentionBackend):") + 1
VAC005_FIX = "vllm-attn-compat migrate --select VAC005 --unsafe-fixes old_backend.py"
VAC004_FIX = "vllm-attn-compat migrate --select VAC004 old_backend.py"


@pytest.fixture
def downstream(pytester, monkeypatch):
    """A downstream project importing this tree's package; no plugin loads by itself but xdist."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("VLLM_ATTN_COMPAT_WARNINGS", raising=False)
    # Run under `pytest -n`, the downstream session must not take itself for an xdist worker (plugins such as
    # pytest-benchmark then warn at start-up, which `-W error` turns into an internal error).
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(old_backend=BACKEND, test_old_backend=TESTS)
    return pytester


def _uses(report_path: Path) -> list[tuple[str, str, int, int]]:
    document = json.loads(report_path.read_text())
    assert document["schema"] == "vllm-attn-compat/deprecated-uses/1"
    assert document["total"] == sum(use["count"] for use in document["uses"])
    return [(use["rule"], use["path"], use["line"], use["count"]) for use in document["uses"]]


def test_summary_lists_each_use_with_its_fix_and_the_report_holds_them(downstream):
    result = downstream.runpytest_subprocess(*PLUGIN, "--vllm-attn-compat-report=ci/uses.json")
    assert result.ret == 0  # the default mode reports and fails nothing
    result.stdout.fnmatch_lines([
        "*= vllm-attn-compat: 4 deprecated uses at 2 places =*",
        f"VAC004  old_backend.py:{CLASS_LINE}: `RedundantBackend.accept_output_buffer = True` (1 call)",
        f"        fix: {VAC004_FIX}",
        f"VAC005  old_backend.py:{FLAG_LINE}: `AttentionBackend.accept_output_buffer` (3 calls)",
        f"        fix: {VAC005_FIX}",
    ])  # fmt: skip
    assert "the session fails" not in result.stdout.str()
    report = downstream.path / "ci" / "uses.json"
    assert _uses(report) == [("VAC004", "old_backend.py", CLASS_LINE, 1), ("VAC005", "old_backend.py", FLAG_LINE, 3)]
    (flag_use,) = [use for use in json.loads(report.read_text())["uses"] if use["rule"] == "VAC005"]
    assert set(flag_use) == {"old_api", "rule", "path", "line", "count", "message", "command"}
    assert flag_use["command"] == VAC005_FIX and flag_use["old_api"] == "`AttentionBackend.accept_output_buffer`"
    assert flag_use["message"].startswith("`AttentionBackend.accept_output_buffer` was removed in vLLM 0.20; ")


def _install_entry_point(site: Path) -> None:
    """A distribution declaring this tree's ``pytest11`` entry point, as ``pip install`` would write it."""
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    dist_info = site / "vllm_attn_compat_under_test-0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-attn-compat-under-test\nVersion: 0\n")
    lines = [f"{name} = {target}" for name, target in entry_points.items()]
    (dist_info / "entry_points.txt").write_text("[pytest11]\n" + "\n".join(lines) + "\n")


def test_error_mode_from_addopts_fails_a_passing_session(downstream, monkeypatch, tmp_path):
    _install_entry_point(tmp_path / "site")  # loaded by its entry point: no -p
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'site'}:{ROOT}")
    addopts = "--vllm-attn-compat=error -p no:cacheprovider"
    downstream.makepyprojecttoml(f'[tool.pytest.ini_options]\naddopts = "{addopts}"\n')
    result = downstream.runpytest_subprocess()
    result.assert_outcomes(passed=3)
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*= vllm-attn-compat: 4 deprecated uses at 2 places =*",
        "vllm-attn-compat: the session fails: 4 deprecated uses (--vllm-attn-compat=error)",
    ])  # fmt: skip


def test_ini_option_sets_the_mode_and_the_command_line_overrides_it(downstream):
    downstream.makepyprojecttoml('[tool.pytest.ini_options]\nvllm_attn_compat = "error"\n')
    assert downstream.runpytest_subprocess(*PLUGIN).ret == 1
    overridden = downstream.runpytest_subprocess(*PLUGIN, "--vllm-attn-compat=summary")
    assert overridden.ret == 0 and "4 deprecated uses" in overridden.stdout.str()


def test_off_counts_nothing_and_a_bad_ini_value_is_a_usage_error(downstream):
    off = downstream.runpytest_subprocess(*PLUGIN, "--vllm-attn-compat=off", "--vllm-attn-compat-report=uses.json")
    assert off.ret == pytest.ExitCode.USAGE_ERROR
    off.stderr.fnmatch_lines(["*--vllm-attn-compat-report needs the uses counted: not with --vllm-attn-compat=off*"])
    off = downstream.runpytest_subprocess(*PLUGIN, "--vllm-attn-compat=off")
    assert off.ret == 0 and "VllmAttnCompatDeprecationWarning" in off.stdout.str()  # warnings are pytest's
    assert "deprecated use" not in off.stdout.str()
    downstream.makepyprojecttoml('[tool.pytest.ini_options]\nvllm_attn_compat = "loud"\n')
    bad = downstream.runpytest_subprocess(*PLUGIN)
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*ini option vllm_attn_compat must be one of summary, error, off; found 'loud'*"])


def test_a_session_without_deprecated_uses_is_untouched(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_new="def test_nothing_old():\n    assert True\n")
    result = pytester.runpytest_subprocess(*PLUGIN, "--vllm-attn-compat=error", "--vllm-attn-compat-report=uses.json")
    # (pytest's header may name the installed plugin among "plugins:"; nothing else may mention it)
    lines = [line for line in result.stdout.lines if not line.startswith("plugins:")]
    assert result.ret == 0 and not any("vllm-attn-compat" in line for line in lines)
    assert _uses(pytester.path / "uses.json") == []


def test_xdist_workers_uses_add_up_on_the_controller(downstream):
    result = downstream.runpytest_subprocess(
        *PLUGIN, "-n", "2", "--vllm-attn-compat=error", "--vllm-attn-compat-report=uses.json"
    )
    result.assert_outcomes(passed=3)
    assert result.ret == 1
    assert "2 workers" in result.stdout.str()
    expected = [("VAC004", "old_backend.py", CLASS_LINE, 1), ("VAC005", "old_backend.py", FLAG_LINE, 3)]
    assert _uses(downstream.path / "uses.json") == expected
    result.stdout.fnmatch_lines([f"VAC005  old_backend.py:{FLAG_LINE}: * (3 calls)"])


def test_uses_raised_by_warning_filters_are_still_counted(downstream):
    # -W error turns the first warning at each place into an exception (the test fails); the later
    # calls at that place warn no more, and all are uses.
    result = downstream.runpytest_subprocess(*PLUGIN, "-W", "error", "--vllm-attn-compat-report=uses.json")
    result.assert_outcomes(passed=1, failed=2)
    assert result.ret == 1
    assert _uses(downstream.path / "uses.json") == [
        ("VAC004", "old_backend.py", CLASS_LINE, 1), ("VAC005", "old_backend.py", FLAG_LINE, 2)
    ]  # fmt: skip
    result.stdout.fnmatch_lines(["*VllmAttnCompatDeprecationWarning*", "*= vllm-attn-compat: 3 deprecated uses*"])


def test_uses_silenced_by_the_environment_are_still_counted(downstream, monkeypatch):
    monkeypatch.setenv("VLLM_ATTN_COMPAT_WARNINGS", "ignore")
    result = downstream.runpytest_subprocess(*PLUGIN, "-W", "error", "--vllm-attn-compat=error")
    result.assert_outcomes(passed=3)  # silenced: not even -W error sees a warning
    assert result.ret == 1
    assert "VllmAttnCompatDeprecationWarning" not in result.stdout.str()
    result.stdout.fnmatch_lines([f"VAC005  old_backend.py:{FLAG_LINE}: * (3 calls)"])


def test_loading_the_plugin_imports_neither_torch_nor_libcst():
    script = (
        "import sys, vllm_attn_compat.pytest_plugin; "
        "print(sorted(m for m in ('torch', 'libcst', 'vllm_attn_compat.compat') if m in sys.modules))"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert run.stdout.strip() == "[]"


# Backends whose deprecated use is reported at their class: an impl kept alive by `adapt_legacy_impl`, and
# one whose returned result the plugin's rule copies into `output` (nothing in its source marks it).
CLASS_USES = """\
import torch

from vllm_attn_compat.compat import adapt_legacy_impl
from vllm_attn_compat.compat.adopt import adopt_returned_result


@adapt_legacy_impl
class AdaptedImpl:
    def forward(self, layer, query, key, value, kv_cache, attn_metadata):
        return query * 2


class ReturningImpl:
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None,
                output_block_scale=None):
        return query * 3


adopt_returned_result(ReturningImpl, "forward", 6)
"""
CLASS_TESTS = """\
import torch

from class_uses import AdaptedImpl, ReturningImpl


def test_each_call_counts():
    query = torch.ones(2, 1, 4)
    for impl, factor in ((AdaptedImpl(), 2), (ReturningImpl(), 3)):
        for _ in range(3):
            output = torch.zeros(2, 1, 4)
            impl.forward(None, query, query, query, None, None, output=output)
            assert output.eq(factor).all()
"""


def test_uses_reported_at_a_class_count_every_call_and_by_hand_ones_get_no_migrate_command(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("VLLM_ATTN_COMPAT_WARNINGS", raising=False)
    pytester.makepyfile(class_uses=CLASS_USES, test_class_uses=CLASS_TESTS)
    result = pytester.runpytest_subprocess(*PLUGIN, "--vllm-attn-compat-report=uses.json")
    assert result.ret == 0
    adapted = CLASS_USES.splitlines().index("@adapt_legacy_impl") + 1  # a decorated class starts at its decorator
    returning = CLASS_USES.splitlines().index("class ReturningImpl:") + 1
    report = json.loads((pytester.path / "uses.json").read_text())
    uses = {(use["line"], use["count"], use["command"]) for use in report["uses"]}
    assert uses == {
        (adapted, 3, "vllm-attn-compat migrate --select VAC004 class_uses.py"),
        (returning, 3, None),  # found at run time only: migrate cannot find it, so no command is offered
    }
    result.stdout.fnmatch_lines(["*fix by hand (migrate cannot find it): write the result into the `output` tensor*"])


# The output guard's switch, as a test (or the vLLM plugin installing in a test's process) reads it.
SWITCH_TESTS = """\
import os


def test_reads_the_switch():
    assert os.environ.get("VLLM_ATTN_COMPAT_CHECK_OUTPUT", "unset") == os.environ["EXPECTED_SWITCH"]
    assert os.environ.get("PYTEST_XDIST_WORKER") == os.environ.get("EXPECTED_WORKER")
"""
# pytest in a process of its own, then what that process's environment holds once the session is over.
SESSION_THEN_SWITCH = """\
import os, sys, pytest
code = pytest.main(sys.argv[1:])
print("exit", int(code), "switch after:", os.environ.get("VLLM_ATTN_COMPAT_CHECK_OUTPUT", "unset"))
"""


@pytest.fixture
def switch_session(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(test_switch=SWITCH_TESTS)
    return pytester


@pytest.mark.parametrize(
    ("args", "ini", "before", "during"),
    [
        (["--vllm-attn-compat-check-output"], "", None, "error"),
        ([], "vllm_attn_compat_check_output = true", "warn", "error"),  # the user's value comes back after
        ([], "vllm_attn_compat_check_output = false", "warn", "warn"),
        ([], "", None, None),
    ],
    ids=["option", "ini", "ini-false", "neither"],
)
def test_check_output_sets_the_switch_for_the_session_and_puts_it_back(
    switch_session, monkeypatch, args, ini, before, during
):
    if before is None:
        monkeypatch.delenv("VLLM_ATTN_COMPAT_CHECK_OUTPUT", raising=False)
    else:
        monkeypatch.setenv("VLLM_ATTN_COMPAT_CHECK_OUTPUT", before)
    monkeypatch.setenv("EXPECTED_SWITCH", during or "unset")
    switch_session.makepyprojecttoml(f"[tool.pytest.ini_options]\n{ini}\n")
    run = switch_session.run(sys.executable, "-c", SESSION_THEN_SWITCH, *PLUGIN, *args, "-q")
    assert run.ret == 0, run.stdout.str()
    run.stdout.fnmatch_lines(["*1 passed*", f"exit 0 switch after: {before or 'unset'}"])


@pytest.mark.parametrize(
    "workers",
    [["-n", "2"], ["--tx", "2*popen//env:VLLM_ATTN_COMPAT_CHECK_OUTPUT=warn"]],
    # The second gives each worker another value as it starts: the worker's own plugin (which parses the
    # controller's arguments) sets the switch, not only the environment the controller hands down.
    ids=["inherited", "set-by-the-worker"],
)
def test_check_output_reaches_each_xdist_worker(switch_session, monkeypatch, workers):
    monkeypatch.delenv("VLLM_ATTN_COMPAT_CHECK_OUTPUT", raising=False)
    monkeypatch.setenv("EXPECTED_SWITCH", "error")
    switch_session.makepyfile(
        test_switch=SWITCH_TESTS.replace('os.environ.get("EXPECTED_WORKER")', 'os.environ["PYTEST_XDIST_WORKER"]')
    )
    result = switch_session.runpytest_subprocess(*PLUGIN, *workers, "--dist", "each", "--vllm-attn-compat-check-output")
    result.assert_outcomes(passed=2)  # the one test, run by each worker
    assert result.ret == 0 and "2 workers" in result.stdout.str()


def test_check_output_is_a_usage_error_with_off(switch_session):
    result = switch_session.runpytest_subprocess(*PLUGIN, "--vllm-attn-compat=off", "--vllm-attn-compat-check-output")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*--vllm-attn-compat-check-output (or ini vllm_attn_compat_check_output) needs the shim this plugin installs: "
        "not with --vllm-attn-compat=off*"
    ])  # fmt: skip
