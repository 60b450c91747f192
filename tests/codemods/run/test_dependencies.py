"""libcst missing or broken: the command names it once, with the install command, and exits 2, whether the
import fails in this process, the worker forked early or the process pool. Run for real: the command in a
subprocess whose environment cannot import libcst."""

from __future__ import annotations

import ast
import os
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_attn_compat.codemods.run import dependencies

from runner_trees import BASE, IMPL, MANUAL, write_tree

REPO = Path(__file__).resolve().parents[3]

# Importing libcst fails as it does where it is not installed: the import system finds no such module.
NOT_INSTALLED = """\
import sys


class NoLibcst:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "libcst":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoLibcst())
"""
NOT_INSTALLED_LINE = (
    r"vllm-attn-compat: error: the module 'libcst' is not installed \(vllm-attn-compat needs it\); "
    r"install it: pip install '?libcst(>=[0-9.]+)?'?"
)
# libcst is there, but what it imports is not (installed with --no-deps).
BROKEN_LINE = (
    r"vllm-attn-compat: error: the module 'libcst' cannot be imported \(ModuleNotFoundError: No module named "
    r"'libcst_needs_this'\); reinstall it with its dependencies: pip install --force-reinstall '?libcst(>=[0-9.]+)?'?"
)


@pytest.fixture
def without_libcst(tmp_path):
    """A PYTHONPATH entry under which libcst cannot be imported: ``not installed`` or ``broken``."""

    def make(kind: str) -> Path:
        site = tmp_path / f"site-{kind}"
        if kind == "not installed":
            write_tree(site, {"sitecustomize.py": NOT_INSTALLED})
        else:
            write_tree(site, {"libcst/__init__.py": "import libcst_needs_this\n"})
        return site

    return make


def _tree(root: Path, copies: int) -> Path:
    """A plugin of ``copies`` impl files that each need libcst: enough (20) for the early worker and a pool."""
    return write_tree(root, {f"plugin/impl_{i}.py": MANUAL.replace("OtherImpl", f"Impl{i}") for i in range(copies)})


def _migrate(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
    # A worker left behind would hold the output pipes open: the timeout turns that hang into a failure.
    return subprocess.run(
        [sys.executable, "-m", "vllm_attn_compat", "migrate", *args], capture_output=True, text=True, env=env,
        cwd=cwd, timeout=60, check=False,
    )  # fmt: skip


def _left_behind(marker: str) -> list[str]:
    """Processes still running whose command line names ``marker`` (a pool worker never shut down)."""
    if not os.path.isdir("/proc"):
        return []
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in command:
            found.append(f"{pid}: {command}")
    return found


@pytest.mark.parametrize(
    ("kind", "copies", "jobs", "line"),
    [
        ("not installed", 1, "1", NOT_INSTALLED_LINE),  # this process
        ("not installed", 20, "2", NOT_INSTALLED_LINE),  # the early worker and the pool
        ("broken", 20, "2", BROKEN_LINE),
    ],
    ids=["in-process", "workers", "broken-in-workers"],
)
def test_migrate_names_the_missing_module_once_and_exits_2(tmp_path, without_libcst, kind, copies, jobs, line):
    root = _tree(tmp_path / "project", copies)
    before = {path: path.read_bytes() for path in root.rglob("*.py")}

    result = _migrate(without_libcst(kind), "--jobs", jobs, str(root / "plugin"), cwd=root)

    assert result.returncode == 2, result.stderr
    assert re.fullmatch(line, result.stderr.strip()), result.stderr
    assert result.stdout == ""
    assert {path: path.read_bytes() for path in root.rglob("*.py")} == before
    assert _left_behind(str(root)) == []


def test_standard_input_names_it_too(tmp_path, without_libcst):
    env = {**os.environ, "PYTHONPATH": f"{without_libcst('not installed')}{os.pathsep}{REPO}"}
    source = BASE.replace("pass", "def forward(self, output):\n        assert output is not None")
    result = subprocess.run(
        [sys.executable, "-m", "vllm_attn_compat", "migrate", "-"], input=source, capture_output=True, text=True,
        env=env, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and re.fullmatch(NOT_INSTALLED_LINE, result.stderr.strip()), result.stderr


# A task in the pool's workers, called directly: every outcome is the missing dependency, as a value.
PATHS = textwrap.dedent(
    """\
    import sys
    from vllm_attn_compat.codemods.run import parallel, worker; from vllm_attn_compat.codemods import registry
    from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module

    base, impl = (open(f"plugin/{name}.py", "rb").read() for name in ("base", "impl"))
    hierarchy = ClassHierarchy.build([index_module(base, "plugin/base.py"), index_module(impl, "plugin/impl.py")])
    settings = __import__("pickle").dumps((registry.all_rules(), hierarchy, False))
    tasks = [(i, (settings, impl, "plugin/impl.py")) for i in range(parallel.IN_PROCESS_BELOW + 2)]
    pool = parallel.Pool(2, worker.preload)
    outcomes = list(pool.map(worker.migrate_with, tasks))
    pool.close()
    print("pool", sorted({type(outcome).__name__ + ": " + str(outcome) for _, outcome in outcomes}))
    """
)


def test_the_pool_hands_the_missing_dependency_back(tmp_path, without_libcst):
    write_tree(tmp_path, {"paths.py": PATHS, "plugin/base.py": BASE, "plugin/impl.py": IMPL})
    env = {**os.environ, "PYTHONPATH": f"{without_libcst('not installed')}{os.pathsep}{REPO}"}
    result = subprocess.run(
        [sys.executable, "paths.py"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["pool"]
    for line in lines:
        (outcome,) = ast.literal_eval(line.split(" ", 1)[1])
        assert outcome.startswith("MissingDependency: the module 'libcst' is not installed"), line


def test_a_failed_import_of_this_package_stays_a_bug():
    ours = ImportError("cannot import name 'x' from 'vllm_attn_compat.codemods'", name="vllm_attn_compat.codemods")
    assert dependencies.missing(ours) is None
    assert dependencies.missing(ValueError("not an import")) is None


def test_missing_dependency_travels_between_processes():
    missing = dependencies.missing(ModuleNotFoundError("No module named 'yaml'", name="yaml"))
    assert missing is not None and not missing.installed
    again = pickle.loads(pickle.dumps(missing))
    assert (type(again), str(again)) == (dependencies.MissingDependency, str(missing))
    assert str(missing).endswith("install it: pip install pyyaml")  # the distribution, not the import name
