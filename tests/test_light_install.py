"""The hook's environment as pre-commit builds it: a fresh venv, ``pip install`` of the repository, no torch.

pre-commit (``language: python``), pipx, uvx and a CI job that installs the tool only to run ``migrate --check``
all do this. The venv must stay torch-free and small, the hook's entry must work there, and so must ``rules`` and
the pytest plugin; the runtime half must refuse with what to install, and the vLLM entry point must not raise.

Needs the package registries pip is configured with (pip's cache makes a rerun quick); offline, deselect it with
``-m "not install"``. tests/test_without_torch.py checks the import side offline.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_attn_compat.codemods.registry import all_rules

pytestmark = pytest.mark.install

ROOT = Path(__file__).resolve().parents[1]
# Decimal megabytes, as the target (<= 40 MB) and pip's download sizes count.
MB = 1_000_000
TARGET_MB = 40

OLD_BACKEND = """from typing import Optional

import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl


class MyBackend(AttentionBackend):
    accept_output_buffer: bool = True

    @staticmethod
    def get_name():
        return "MY_BACKEND"

    @staticmethod
    def get_impl_cls():
        return MyImpl

    @staticmethod
    def get_builder_cls():
        raise NotImplementedError


class MyImpl(AttentionImpl):
    def __init__(self, num_heads, head_size, scale, *args, **kwargs):
        self.scale = scale

    def forward(self, layer, query, key, value, kv_cache, attn_metadata,
                output: Optional[torch.Tensor] = None, output_scale=None, output_block_scale=None):
        assert output is not None, "Output tensor must be provided."
        output.copy_(query)
        return output
"""


def _env(venv: Path | None = None) -> dict[str, str]:
    """This process's environment without what would leak its packages into the venv's Python."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    if venv is not None:  # pre-commit puts the hook environment's scripts first on PATH
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(cmd: list[str], cwd: Path, venv: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=_env(venv), capture_output=True, text=True, timeout=timeout, check=False)


def _checked(cmd: list[str], cwd: Path, venv: Path | None = None) -> subprocess.CompletedProcess:
    out = _run(cmd, cwd, venv)
    assert out.returncode == 0, f"{shlex.join(cmd)} exited {out.returncode}:\n{out.stdout[-2000:]}{out.stderr[-4000:]}"
    return out


def disk_usage(path: Path) -> int:
    """Bytes the files under ``path`` take on disk, as ``du`` counts them: allocated blocks, each inode once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            info = os.lstat(os.path.join(folder, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


def _repository_copy(dest: Path) -> Path:
    """The repository's files as a clone holds them (tracked and not ignored), from the working tree."""
    out = _checked(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT)
    for name in out.stdout.split("\0"):
        source = ROOT / name
        if name and source.is_file() and not source.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest / name)
    return dest


def _distribution_names(python: Path) -> list[str]:
    code = "import json, importlib.metadata as m; print(json.dumps([d.metadata['Name'] for d in m.distributions()]))"
    return json.loads(_checked([str(python), "-c", code], python.parent).stdout)


def _gpu_stack(names: list[str]) -> list[str]:
    """The names of torch, triton, and NVIDIA / CUDA distributions among ``names``."""
    normalized = [name.lower().replace("_", "-") for name in names]
    return [n for n in normalized if n in ("torch", "triton") or n.startswith(("nvidia-", "cuda-"))]


class HookEnv:
    def __init__(self, repo: Path, venv: Path, resolution: list[str], bare: int, installed: int):
        self.repo = repo  # the copy installed, where the README's first command runs
        self.venv = venv
        self.python = venv / "bin" / "python"
        self.resolution = resolution  # what `pip install --dry-run --report` would install
        self.bare = bare  # bytes on disk of the fresh venv (Python's venv: pip, and setuptools before 3.12)
        self.installed = installed  # bytes on disk after `pip install` of the repository


@pytest.fixture(scope="module")
def hook_env(tmp_path_factory) -> HookEnv:
    base = tmp_path_factory.mktemp("hook-env")
    repo = _repository_copy(base / "repo")
    venv = base / "venv"
    _checked([sys.executable, "-m", "venv", str(venv)], base)
    python = str(venv / "bin" / "python")
    bare = disk_usage(venv)
    # The resolution first, downloading nothing: a torch in it would be gigabytes of CUDA wheels.
    report = base / "resolution.json"
    _checked([python, "-m", "pip", "install", "-q", "--dry-run", "--report", str(report), str(repo)], base)
    resolution = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert not _gpu_stack(resolution), f"pip would install {_gpu_stack(resolution)}: {resolution}"
    _checked([python, "-m", "pip", "install", "-q", str(repo)], base)  # what pre-commit runs
    return HookEnv(repo, venv, resolution, bare, disk_usage(venv))


def test_the_resolution_is_the_package_and_its_light_dependencies(hook_env):
    names = {name.lower().replace("_", "-") for name in hook_env.resolution}
    assert {"vllm-attn-compat", "libcst", "tqdm", "typing-extensions"} <= names
    assert not _gpu_stack(hook_env.resolution)


def test_no_torch_and_no_nvidia_distribution_is_installed(hook_env):
    names = _distribution_names(hook_env.python)
    assert "vllm-attn-compat" in [name.lower() for name in names] and not _gpu_stack(names)
    out = _run([str(hook_env.python), "-c", "import torch"], hook_env.venv)
    assert out.returncode == 1 and "No module named 'torch'" in out.stderr


def test_the_environment_is_small(hook_env, capsys):
    added = hook_env.installed - hook_env.bare
    line = (
        f"hook environment: {hook_env.installed / MB:.1f} MB on disk = a bare venv {hook_env.bare / MB:.1f} MB "
        f"(Python {sys.version_info[0]}.{sys.version_info[1]}'s venv: pip"
        f"{', setuptools' if sys.version_info < (3, 12) else ''}) + the install {added / MB:.1f} MB "
        f"({', '.join(sorted(hook_env.resolution, key=str.lower))}, with the bytecode pip compiles)"
    )
    with capsys.disabled():  # shown in CI's log, not only on failure
        print(f"\n{line}")
    assert added <= TARGET_MB * MB, line


def _hooks() -> dict[str, dict]:
    with open(ROOT / ".pre-commit-hooks.yaml", encoding="utf-8") as handle:
        return {hook["id"]: hook for hook in yaml.safe_load(handle)}


@pytest.fixture
def old_repository(tmp_path) -> Path:
    """A user's repository with an old-API backend, where pre-commit runs the hook (its root)."""
    (tmp_path / "my_plugin").mkdir()
    (tmp_path / "my_plugin" / "__init__.py").write_text("")
    (tmp_path / "my_plugin" / "backend.py").write_text(OLD_BACKEND)
    return tmp_path


def _hook_command(hook_env: HookEnv, hook_id: str) -> list[str]:
    program, *args = shlex.split(_hooks()[hook_id]["entry"])
    found = shutil.which(program, path=_env(hook_env.venv)["PATH"])
    assert found == str(hook_env.venv / "bin" / program), f"{program} resolves to {found}, not the hook env's"
    return [found, *args]


def test_the_check_hook_fails_naming_the_findings_and_changes_nothing(hook_env, old_repository):
    out = _run(_hook_command(hook_env, "vllm-attn-compat-check"), old_repository, hook_env.venv)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = OLD_BACKEND.splitlines()
    for code, text in (("VAC004", "accept_output_buffer"), ("VAC002", "output: Optional"), ("VAC001", "assert")):
        line = next(number for number, found in enumerate(lines, 1) if text in found)
        assert f"my_plugin/backend.py:{line}:" in out.stdout and code in out.stdout, out.stdout
    assert (old_repository / "my_plugin" / "backend.py").read_text() == OLD_BACKEND


def test_the_fix_hook_migrates_and_the_check_hook_then_passes(hook_env, old_repository):
    _run(_hook_command(hook_env, "vllm-attn-compat"), old_repository, hook_env.venv)
    migrated = (old_repository / "my_plugin" / "backend.py").read_text()
    assert "accept_output_buffer" not in migrated and "assert output is not None" not in migrated
    assert "output: torch.Tensor," in migrated
    out = _run(_hook_command(hook_env, "vllm-attn-compat-check"), old_repository, hook_env.venv)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_readmes_first_command_needs_no_torch(hook_env):
    (command,) = [
        line.strip()
        for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("    ") and "vllm-attn-compat migrate --diff examples/legacy_plugin" in line
    ]
    install, migrate = command.split(" && ")
    assert install == "pip install ."  # the plain install, done by the fixture
    program, *args = shlex.split(migrate)
    out = _run([str(hook_env.venv / "bin" / program), *args], hook_env.repo, hook_env.venv)
    assert out.returncode == 1, out.stdout + out.stderr  # 1: there are fixes to apply
    assert "+++ b/examples/legacy_plugin/legacy_attn_plugin/sdpa_backend.py" in out.stdout


def test_rules_lists_and_explains_the_rules(hook_env, tmp_path):
    cli = str(hook_env.venv / "bin" / "vllm-attn-compat")
    listing = _checked([cli, "rules"], tmp_path).stdout
    assert [line.split()[0] for line in listing.splitlines()] == [rule.code for rule in all_rules()]
    assert _checked([cli, "rules", "VAC004"], tmp_path).stdout.startswith("## VAC004")


@pytest.mark.parametrize("part", ["compat", "backends"])
def test_the_runtime_half_says_to_install_torch(hook_env, tmp_path, part):
    out = _run([str(hook_env.python), "-c", f"import vllm_attn_compat.{part}"], tmp_path)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ModuleNotFoundError: vllm_attn_compat.{part} needs torch, which is not installed")
    assert "pip install 'vllm-attn-compat[torch]'" in last


def test_the_vllm_entry_point_logs_instead_of_raising(hook_env, tmp_path):
    code = (
        "import logging; logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')\n"
        "from importlib.metadata import entry_points\n"
        "(ep,) = [ep for ep in entry_points(group='vllm.general_plugins') if ep.name == 'vllm_attn_compat']\n"
        "ep.load()()\n"
        "print('returned')\n"
    )
    out = _checked([str(hook_env.python), "-c", code], tmp_path)
    assert out.stdout == "returned\n"
    assert out.stderr.startswith("WARNING vllm-attn-compat: nothing installed (ModuleNotFoundError: ")
    assert "pip install 'vllm-attn-compat[torch]'" in out.stderr


def test_the_pytest_plugin_loads_and_reports(hook_env, tmp_path):
    """pytest is the downstream project's (not a dependency): installed next to the package, after the size."""
    _checked([str(hook_env.python), "-m", "pip", "install", "-q", "pytest"], tmp_path)
    (tmp_path / "test_downstream.py").write_text("def test_passes():\n    pass\n")
    args = ["-p", "no:cacheprovider", "--vllm-attn-compat=error", "--vllm-attn-compat-report=uses.json"]
    out = _run([str(hook_env.python), "-m", "pytest", *args, "test_downstream.py"], tmp_path, hook_env.venv)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((tmp_path / "uses.json").read_text())
    assert (report["mode"], report["total"], report["uses"]) == ("error", 0, [])
    assert not _gpu_stack(_distribution_names(hook_env.python))
