"""A test session gets the vLLM plugin's shim as vLLM's own processes do: downstream suites run with pytester in a
subprocess against the real vLLM (the ``vllm`` tier), and a session that never imports vLLM, which pays nothing."""

from __future__ import annotations

import importlib.util
import json
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from vllm_attn_compat import session_shim

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ["-p", "vllm_attn_compat.pytest_plugin", "-p", "no:cacheprovider"]

# The issue's test, as a new user would write it.
ISSUE_TEST = """\
from vllm.v1.attention.backend import AttentionBackend


def test_reads_flag():
    assert AttentionBackend.accept_output_buffer
"""
# A conftest that reads the flag as it is imported: before any test, before pytest_configure.
CONFTEST = """\
from vllm.v1.attention.backend import AttentionBackend

OUTPUT_BUFFER = AttentionBackend.accept_output_buffer
"""
VAC005 = "`AttentionBackend.accept_output_buffer`"
# Issue 49's module: vLLM's loader runs the plugin while the session's import hook watches (it hung for ever).
LOADS_PLUGINS = """\
import vllm.plugins

vllm.plugins.load_general_plugins()


def test_nothing():
    assert True
"""

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="the real vLLM package is not installed"
)  # fmt: skip
needs_entry_point = pytest.mark.skipif(
    not any(ep.value == session_shim.TARGET for ep in entry_points(group=session_shim.GROUP)),
    reason="vllm-attn-compat is not pip-installed, so vLLM cannot find its entry point (pip install -e .)",
)


@pytest.fixture(scope="module")  # imported before pytester's snapshot of sys.modules, which would drop it after
def new_vllm():
    """vLLM's AttentionBackend, when it has the >= 0.20 API (no accept_output_buffer of its own)."""
    from vllm.v1.attention.backend import AttentionBackend

    from vllm_attn_compat.compat import plugin

    if plugin.old_api_reason(AttentionBackend) is not None:
        pytest.skip("needs vLLM >= 0.20; the installed vLLM has the old attention API")
    return AttentionBackend


@pytest.fixture
def downstream(pytester, monkeypatch):
    """A downstream project importing this tree's package, with the issue's test; its own environment."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    for name in (
        "PYTEST_ADDOPTS", "VLLM_ATTN_COMPAT_WARNINGS", "VLLM_ATTN_COMPAT_DISABLE_PLUGIN", "VLLM_PLUGINS",
        "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(test_flag=ISSUE_TEST)
    return pytester


def _uses(path: Path) -> tuple[int, set[tuple[str, str, int, int]]]:
    document = json.loads(path.read_text())
    return document["total"], {(use["old_api"], use["path"], use["line"], use["count"]) for use in document["uses"]}


@pytest.mark.vllm
@needs_vllm
@needs_entry_point
def test_the_issues_test_passes_and_its_use_fails_the_session_in_error_mode(downstream, new_vllm):
    result = downstream.runpytest_subprocess(*PLUGIN, "--vllm-attn-compat=error", "--vllm-attn-compat-report=uses.json")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # because of the use, not of an exception in the test
    assert "AttributeError" not in result.stdout.str()
    result.stdout.fnmatch_lines([
        f"VAC005  test_flag.py:5: {VAC005} (1 call)",
        "vllm-attn-compat: the session fails: 1 deprecated use (--vllm-attn-compat=error)",
    ])  # fmt: skip
    assert _uses(downstream.path / "uses.json") == (1, {(VAC005, "test_flag.py", 5, 1)})


@pytest.mark.vllm
@needs_vllm
@needs_entry_point
def test_each_xdist_worker_and_the_controller_get_the_shim_and_their_uses_add_up(downstream, new_vllm):
    downstream.makeconftest(CONFTEST)  # imported by the controller and by each worker
    result = downstream.runpytest_subprocess(
        *PLUGIN, "-n", "2", "--dist", "each", "--vllm-attn-compat=error", "--vllm-attn-compat-report=uses.json"
    )
    result.assert_outcomes(passed=2)  # the issue's test, once on each worker
    assert result.ret == pytest.ExitCode.TESTS_FAILED and "2 workers" in result.stdout.str()
    assert "AttributeError" not in result.stdout.str()
    assert _uses(downstream.path / "uses.json") == (5, {(VAC005, "conftest.py", 3, 3), (VAC005, "test_flag.py", 5, 2)})


@pytest.mark.vllm
@needs_vllm
@needs_entry_point
@pytest.mark.parametrize(
    "args", [[], ["-n", "2"], ["--vllm-attn-compat-check-output"]], ids=["plain", "xdist", "check-output"]
)
def test_a_module_that_loads_vllms_plugins_passes(downstream, new_vllm, args):
    downstream.makepyfile(test_loads_plugins=LOADS_PLUGINS)
    result = downstream.runpytest_subprocess(*PLUGIN, *args, "test_loads_plugins.py", timeout=600)
    result.assert_outcomes(passed=1)


@pytest.mark.vllm
@needs_vllm
@needs_entry_point
@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--vllm-attn-compat=off"], {}),
        (["-p", "no:vllm_attn_compat.pytest_plugin"], {}),
        ([], {"VLLM_ATTN_COMPAT_DISABLE_PLUGIN": "1"}),
        ([], {"VLLM_PLUGINS": "some_other_plugin"}),  # vLLM would not load ours either
    ],
    ids=["off", "unloaded", "disabled", "not-in-VLLM_PLUGINS"],
)
def test_each_opt_out_leaves_vllm_as_it_is(downstream, monkeypatch, new_vllm, args, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = downstream.runpytest_subprocess(*PLUGIN, *args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*AttributeError*accept_output_buffer*"])
    assert "deprecated use" not in result.stdout.str()


@pytest.mark.vllm
@needs_vllm
@needs_entry_point
@pytest.mark.parametrize(
    ("allowed", "loads"),
    [
        (None, True),
        ("vllm_attn_compat", True),
        ("some_other_plugin,vllm_attn_compat", True),
        ("", False),
        ("some_other_plugin", False),
        ("vllm_attn_compat ", False),
    ],
    ids=["unset", "ours", "among-others", "empty", "others", "not-whole"],
)
def test_entry_point_selected_as_vllms_loader_selects_it(monkeypatch, new_vllm, allowed, loads):
    import vllm.plugins

    if allowed is None:
        monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("VLLM_PLUGINS", allowed)
    ours = session_shim.selected()
    assert [ep.value for ep in ours] == ([session_shim.TARGET] if loads else [])
    # The same answer as vLLM's own loader (which loads what it selects: every allowed plugin of the group).
    vllms = vllm.plugins.load_plugins_by_group(session_shim.GROUP)
    assert ("vllm_attn_compat" in vllms) is loads


@pytest.mark.vllm
@needs_vllm
def test_each_feature_waits_for_modules_this_vllm_has(new_vllm):
    """A feature installs once one path of each of its needs is imported: a path this vLLM lacks would leave it
    waiting for ever, so each need must name a module of this release, and the classes patched live there."""
    import importlib

    from vllm_attn_compat.compat import vllm_install

    for feature in vllm_install.FEATURES:
        for paths in feature.needs:
            assert any(importlib.util.find_spec(path) is not None for path in paths), (feature.name, paths)
    layer = vllm_install.require(vllm_install.ATTENTION_MODULES, "Attention")
    mla = vllm_install.require(vllm_install.MLA_MODULES, "MLAAttention")
    assert new_vllm.__module__ in vllm_install.BACKEND_MODULES
    assert layer.__module__ in vllm_install.ATTENTION_MODULES and mla.__module__ in vllm_install.MLA_MODULES


# At the session's end: which heavy packages the process imported, and whether the hook was watching.
RECORD_MODULES = """\
import sys

from vllm_attn_compat.import_hook import watched_packages


def pytest_sessionfinish(session):
    heavy = sorted(name for name in ("vllm", "torch", "libcst") if name in sys.modules)
    watching = watched_packages() == ["vllm"]
    print(f"\\nimported: {heavy}; watching: {watching}")
"""


def test_a_session_that_never_imports_vllm_imports_neither_vllm_nor_torch(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    pytester.makeconftest(RECORD_MODULES)
    pytester.makepyfile(test_plain="import json\n\n\ndef test_plain():\n    assert json.loads('[1]') == [1]\n")
    result = pytester.runpytest_subprocess(*PLUGIN, "-s", "--vllm-attn-compat=error")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["imported: []; watching: True"])


def test_the_shim_calls_the_entry_point_pyproject_declares():
    """The shim selects this package's entry point by its value: a value pyproject.toml no longer declares would
    select nothing, and the session would silently get no shim (the tier's tests skip without the entry point)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"]
    assert declared[session_shim.GROUP] == {"vllm_attn_compat": session_shim.TARGET}
