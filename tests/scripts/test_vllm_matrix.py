"""scripts/vllm_matrix.py's pure parts: which releases it picks, which of vLLM's requirements it installs, how a
release's result reads. (The matrix itself installs vLLM releases; it is run by CI for the newest one.)"""

from __future__ import annotations

import importlib.util
import json
import sys
from importlib.metadata import PackageNotFoundError, requires
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "vllm_matrix.py"
_spec = importlib.util.spec_from_file_location("vllm_matrix", _PATH)
matrix = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = matrix  # dataclasses look their module up there
_spec.loader.exec_module(matrix)

# What `pip index versions vllm` printed on 2026-12-01 (shortened), with a pre-release added.
PUBLISHED = matrix.parse_index_versions("""vllm (0.33.0)
Available versions: 0.33.0, 0.32.0, 0.31.0, 0.30.0, 0.29.0, 0.28.0, 0.27.1, 0.27.0, 0.26.0, 0.25.1, 0.25.0, 0.24.0, \
0.23.0, 0.22.1, 0.22.0, 0.21.0, 0.20.2, 0.20.1, 0.20.0, 0.19.1, 0.19.0, 0.34.0rc1, 0.9.2
""")


def test_the_latest_patch_of_each_minor_release_from_0_20_oldest_first():
    assert matrix.select(PUBLISHED, all_patches=False) == [
        "0.20.2",
        "0.21.0",
        "0.22.1",
        "0.23.0",
        "0.24.0",
        "0.25.1",
        "0.26.0",
        "0.27.1",
        "0.28.0",
        "0.29.0",
        "0.30.0",
        "0.31.0",
        "0.32.0",
        "0.33.0",
    ]


def test_all_patches_keeps_every_final_release_from_0_20():
    selected = matrix.select(PUBLISHED, all_patches=True)
    assert selected[:3] == ["0.20.0", "0.20.1", "0.20.2"] and selected[-1] == "0.33.0" and len(selected) == 19
    assert "0.34.0rc1" not in selected and "0.19.1" not in selected


def test_oldest_and_newest_of_the_named_releases(capsys):
    assert matrix.main(["0.25.1", "0.33.0", "0.20.2", "--oldest", "--newest", "--list"]) == 0
    assert capsys.readouterr().out.split() == ["0.20.2", "0.33.0"]
    assert matrix.main(["0.25.1", "0.33.0", "0.20.2", "--newest", "--list"]) == 0
    assert capsys.readouterr().out.split() == ["0.33.0"]


def test_cuda_part_starts_at_the_torch_pin_with_numba_before_it():
    requirements = [
        "regex",
        "fastapi[standard]>=0.115.0",
        "xgrammar==0.2.8",
        "triton-kernels==1.0",
        "numba==0.65.0",
        "torch==2.11.0",
        "torchaudio==2.11.0",
        "flashinfer-python==0.6.8",
        "apache-tvm-ffi==0.1.9",
        "quack-kernels>=0.3.3",
    ]
    common, cuda = matrix.split_cuda_part(requirements)
    assert common == ["regex", "fastapi[standard]>=0.115.0", "xgrammar==0.2.8"]
    assert cuda == ["triton-kernels==1.0", *requirements[4:]]  # a GPU-only name before the pin is moved too


def test_without_a_torch_pin_only_gpu_only_names_are_left_out():
    assert matrix.split_cuda_part(["numpy", "nvidia-nvtx", "Flash_Attn>=2"]) == (
        ["numpy"],
        ["nvidia-nvtx", "Flash_Attn>=2"],
    )


def test_the_installed_vllms_own_requirements_split():
    try:
        listed = requires("vllm") or []
    except PackageNotFoundError:
        pytest.skip("vLLM is not installed; its requirements are what this checks (scripts/install-vllm-tier.sh)")
    no_extras = [r for r in listed if "extra ==" not in r]
    common, cuda = matrix.split_cuda_part(no_extras)
    assert no_extras[: len(common)] == common  # the common part is a prefix: nothing reordered
    common_names = {matrix.requirement_name(r) for r in common}
    cuda_names = {matrix.requirement_name(r) for r in cuda}
    assert {"torch", "torchvision", "torchaudio"} <= cuda_names and not common_names & set(matrix.TORCH_STACK)
    assert not any(name.startswith(matrix.GPU_ONLY_PREFIXES) for name in common_names)
    assert {"pydantic", "transformers", "pyzmq"} <= common_names


def _result(**counts):
    return matrix.Result("0.30.0", "/venvs/vllm-0.30.0", install_ok=True, **counts)


def test_a_release_is_ok_with_skips_not_with_failures_or_nothing_passed():
    assert _result(passed=15, skipped=1, skips=["t::x: reason"]).tier_ok
    assert not _result(passed=15, failed=1).tier_ok
    assert not _result(passed=15, errors=1).tier_ok
    assert not _result().tier_ok
    assert not _result(passed=15, import_error="No module named 'fastapi'").tier_ok
    assert not matrix.Result("0.30.0", "/venvs/x", install_error="vllm: no matching distribution").tier_ok


def test_markdown_rows_sorted_by_release_with_what_failed():
    rows = matrix.markdown(
        [
            _result(
                passed=14,
                failed=1,
                failures=["test_a::t: boom | bang"],
                missing_names=["CompilationConfig._attention_ops"],
            ),
            matrix.Result("0.21.0", "/venvs/x", install_error="vllm: no matching distribution"),
            _result(passed=16, left_out=["torch==2.11.0"], gpu_left_out=["triton"]),
        ],
        "abc1234",
        "2026-12-01",
    ).splitlines()
    assert rows[0].startswith("Measured 2026-12-01 on commit `abc1234`")
    table = [row for row in rows if row.startswith("| 0.")]
    assert [row.split(" | ")[0] for row in table] == ["| 0.21.0", "| 0.30.0", "| 0.30.0"]
    assert "failed: vllm: no matching distribution" in table[0] and "not run (install failed)" in table[0]
    assert "14 passed, 1 failed" in table[1] and "test_a::t: boom \\| bang" in table[1]
    assert "CompilationConfig._attention_ops" in table[1]
    assert table[2].split(" | ")[2] == "ok: 16 passed"
    assert "`torch`" in rows[-2] and "`triton`" in rows[-1]


def test_results_serialise_for_the_json_report():
    result = _result(passed=3)
    assert json.loads(json.dumps(matrix.asdict(result)))["passed"] == 3


def test_pip_output_without_a_version_list_gives_none():
    assert len(PUBLISHED) == 23 and PUBLISHED[0] == "0.33.0"
    assert matrix.parse_index_versions("ERROR: No matching distribution found for vllm\n") == []


def test_the_venvs_get_the_packages_own_dependencies_and_test_extra_without_torch():
    names = {matrix.requirement_name(r) for r in matrix.package_requirements()}
    assert {"libcst", "pytest", "hypothesis", "hypothesmith"} <= names and "torch" not in names


def test_a_torch_other_than_the_default_gets_venvs_of_its_own_the_defaults_keep_their_names():
    python = f"py{sys.version_info[0]}.{sys.version_info[1]}"
    assert matrix.venv_name("0.34.0", matrix.DEFAULT_TORCH) == f"vllm-0.34.0-{python}"
    assert matrix.venv_name("0.34.0", "2.14.1") == f"vllm-0.34.0-torch2.14.1-{python}"


@pytest.mark.parametrize(
    ("recorded", "asked", "reused"),
    [
        (None, matrix.DEFAULT_TORCH, True),  # a venv built before `--torch`: the default's
        (None, "2.14.1", False),
        ("2.14.1", "2.14.1", True),
        ("2.14.1", matrix.DEFAULT_TORCH, False),
    ],
)
def test_a_venv_is_reused_only_with_the_torch_it_was_built_with(tmp_path, monkeypatch, recorded, asked, reused):
    venv = tmp_path / matrix.venv_name("0.34.0", asked)
    venv.mkdir()
    marker = {"recipe": matrix.RECIPE, "vllm": "0.34.0", "left_out": [], "not_installable": {}, "gpu_left_out": []}
    if recorded is not None:
        marker["torch"] = recorded
    (venv / matrix.MARKER).write_text(json.dumps(marker))
    built = []
    monkeypatch.setattr(matrix, "build", lambda version, venv, python, result: built.append(result.torch))
    monkeypatch.setattr(matrix, "pip", lambda venv, *args, **kwargs: matrix.subprocess.CompletedProcess(args, 0))
    result = matrix.prepare("0.34.0", tmp_path, sys.executable, rebuild=False, torch=asked)
    assert result.install_ok and result.reused is reused and result.torch == asked
    assert built == ([] if reused else [asked])


def test_the_table_names_the_torch_of_its_venvs_and_what_the_tier_ran():
    default = matrix.markdown([_result(passed=3)], "abc1234", "2026-12-05").splitlines()
    assert f"torch {matrix.DEFAULT_TORCH} CPU" in default[0] and "| `vllm` tier |" in default[2]
    other = _result(passed=3, torch="2.14.1", left_out=["numba==0.61.2", "torch==2.14.0"])
    rows = matrix.markdown([other], "abc1234", "2026-12-05", runtime=True).splitlines()
    assert "torch 2.14.1," in rows[0] and "CPU" not in rows[0]
    assert "| `vllm` tier and the runtime half's other tests |" in rows[2]
    assert "torch 2.14.1;" in rows[-1]
    assert matrix.summary_line(other).startswith("vllm 0.30.0 with torch 2.14.1 (it pins torch==2.14.0): install ok")


def test_each_pytest_run_of_a_release_adds_its_outcomes_to_the_result(tmp_path):
    """Two runs in one venv (the tier, then `--runtime`'s): each one's passes, failures, errors and skips count,
    and a run that writes no report is an error named by pytest's last line."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    tests = tmp_path / "cases"
    tests.mkdir()
    (tests / "test_first.py").write_text(
        "import pytest\n"
        "def test_passes(): pass\n"
        "def test_fails(): assert 1 == 2, 'one is not two'\n"
        "@pytest.mark.skip(reason='not here')\n"
        "def test_skipped(): pass\n"
    )
    (tests / "test_second.py").write_text(
        "import pytest\n"
        "@pytest.fixture\n"
        "def broken(): raise RuntimeError('fixture broke')\n"
        "def test_errors(broken): pass\n"
        "def test_passes_too(): pass\n"
    )
    result = matrix.Result("0.34.0", str(venv), install_ok=True)
    reports = tmp_path / "reports"
    reports.mkdir()
    matrix.run_pytest(result, reports / "vllm-0.34.0", [str(tests / "test_first.py")])
    matrix.run_pytest(result, reports / "vllm-0.34.0-runtime", [str(tests / "test_second.py")])
    assert (result.passed, result.failed, result.errors, result.skipped) == (2, 1, 1, 1)
    assert any("test_fails" in f and "one is not two" in f for f in result.failures)
    assert any("test_errors" in f and "fixture broke" in f for f in result.failures)
    assert result.skips == ["test_first::test_skipped: not here"]
    assert sorted(path.name for path in reports.iterdir()) == [
        "vllm-0.34.0-runtime.log",
        "vllm-0.34.0-runtime.xml",
        "vllm-0.34.0.log",
        "vllm-0.34.0.xml",
    ]
    # A usage error (exit 4) writes a report without a test case: it counts all the same.
    matrix.run_pytest(result, reports / "vllm-0.34.0", [str(tests / "no_such_file.py")])
    assert result.errors == 2 and result.failures[-1].startswith("pytest exited 4: ")
    assert "no_such_file.py" in result.failures[-1]
    matrix.run_pytest(result, reports / "third", ["-p", "no_such_plugin"])  # pytest fails before any report
    assert result.errors == 3 and "pytest produced no report (exit 1)" in result.failures[-1]


# scripts/torch_matrix.py: the same venvs and counts, without vLLM.
_TORCH_PATH = _PATH.with_name("torch_matrix.py")
_torch_spec = importlib.util.spec_from_file_location("torch_matrix", _TORCH_PATH)
torch_matrix = importlib.util.module_from_spec(_torch_spec)
_torch_spec.loader.exec_module(torch_matrix)


def _made_venv(cmd, **kwargs):
    """`run` of ``python -m venv DIR``: the folder made, as the real one makes it."""
    Path(cmd[-1]).mkdir(parents=True)
    return matrix.subprocess.CompletedProcess(cmd, 0)


def test_a_torch_venv_is_reused_only_when_complete_and_of_that_torch(tmp_path, monkeypatch):
    calls = []

    def pip(venv, *args, **kwargs):
        calls.append(args)
        return matrix.subprocess.CompletedProcess(args, 0)

    monkeypatch.setattr(matrix, "pip", pip)
    monkeypatch.setattr(matrix, "run", _made_venv)
    first = torch_matrix.prepare("2.12.0", tmp_path, sys.executable, rebuild=False)
    assert first.install_ok and not first.reused and first.torch == "2.12.0"
    assert calls[0] == ("torch==2.12.0",) and calls[1][0] == "torch==2.12.0" and "libcst>=1.5" in calls[1]
    assert calls[-1][:2] == ("--no-deps", "-e")  # this tree, every time
    calls.clear()
    again = torch_matrix.prepare("2.12.0", tmp_path, sys.executable, rebuild=False)
    assert again.install_ok and again.reused and calls == [("--no-deps", "-e", str(matrix.REPO))]
    (tmp_path / torch_matrix.venv_name("2.12.0") / matrix.MARKER).write_text('{"recipe": 0, "torch": "2.12.0"}')
    assert not torch_matrix.prepare("2.12.0", tmp_path, sys.executable, rebuild=False).reused


def test_a_torch_that_fails_to_install_is_named_with_pips_error(tmp_path, monkeypatch):
    def pip(venv, *args, **kwargs):
        failed = args == ("torch==9.9.9",)
        return matrix.subprocess.CompletedProcess(args, int(failed), "", "ERROR: No matching distribution" * failed)

    monkeypatch.setattr(matrix, "pip", pip)
    monkeypatch.setattr(matrix, "run", _made_venv)
    result = torch_matrix.prepare("9.9.9", tmp_path, sys.executable, rebuild=False)
    assert not result.install_ok and not result.tier_ok
    assert torch_matrix.summary_line(result) == (
        "torch 9.9.9: install FAILED (built in 0s): torch: ERROR: No matching distribution"
    )
