"""A safe fix never breaks a call the run can see: run a small plugin before and after `migrate`.

The plugin's methods default ``output`` to None and allocate a buffer when it is missing; its own
warm-up path, a subclass (``super()``, ``Base.m(self, ...)``), a callback built with
``functools.partial``, a ``getattr`` and a smoke test in another file call them without ``output``.
A stub ``vllm`` package (the base classes only) stands in for vLLM, so the code really runs. Each
version is imported and called in its own interpreter, so module caches never mix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from vllm_attn_compat.codemods.findings import Status
from vllm_attn_compat.codemods.run.runner import Options, run_paths

# The plugin's code allocates its buffers with torch, in interpreters of this environment.
pytest.importorskip("torch", reason="the plugin the tests run allocates with torch")

REPO_ROOT = Path(__file__).resolve().parents[3]

STUB_VLLM = {
    "vllm/__init__.py": "",
    "vllm/v1/__init__.py": "",
    "vllm/v1/attention/__init__.py": "",
    "vllm/v1/attention/backend.py": "class AttentionBackend:\n    pass\n\n\nclass AttentionImpl:\n    pass\n",
}

BACKEND = """
import functools

import torch
from vllm.v1.attention.backend import AttentionImpl


class MyImpl(AttentionImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        if output is None:
            output = torch.empty_like(query)
        return self.prefill(query, key, value, output)

    def prefill(self, query, key, value, output=None):
        if output is None:
            output = torch.empty_like(query)
        output.copy_(query + key + value)
        return output

    def warm_up(self, query):
        return self.prefill(query, query, query)

    def decode(self, query, output=None):
        if output is None:
            output = torch.zeros_like(query)
        output.copy_(query * 2)
        return output

    def scaled(self, factor, query, output=None):
        if output is None:
            output = torch.empty_like(query)
        output.copy_(query * factor)
        return output

    def callbacks(self):
        return [functools.partial(self.scaled, 3.0)]

    def by_name(self, query):
        return getattr(self, "decode")(query)

    def fused(self, query, output=None):
        if output is None:
            output = torch.empty_like(query)
        output.copy_(query - 1)
        return output

    def run_fused(self, query):
        output = torch.empty_like(query)
        self.fused(query, output)
        return self.fused(query, output=output)

    def reshaped(self, query, output=None):
        if output is None:
            output = torch.empty_like(query)
        output = output.view(-1)
        output.copy_(query.view(-1) * 3)
        return output

    def run_reshaped(self, query):
        return self.reshaped(query, output=torch.empty_like(query))
"""

SUBCLASS = """
from plugin.backend import MyImpl


class SubImpl(MyImpl):
    def decode(self, query, output=None):
        return super().decode(query=query)

    def warm(self, query):
        return MyImpl.prefill(self, query, query, query)
"""

# As vLLM <= 0.19's layer module and its `unified_attention` op: the op takes the layer from a registry, so the
# run cannot tell what its `impl` is.
OLD_OP = """
from plugin.backend import MyImpl

LAYERS = {}


class Layer:
    def __init__(self):
        self.impl = MyImpl()


def attention(query, layer_name):
    layer = LAYERS[layer_name]
    return layer.impl.forward(layer, query, query, query, None, None)
"""

SMOKE_TEST = """
import torch

from plugin.backend import MyImpl


def smoke():
    q = torch.arange(8.0).view(2, 4)
    impl = MyImpl()
    return impl.forward(None, q, q, q, None, None)


def smoke_kwargs(with_output=False):
    q = torch.arange(8.0).view(2, 4)
    impl = MyImpl()
    extra = {}
    if with_output:
        extra["output"] = torch.empty_like(q)
    return impl.forward(None, q, q, q, None, None, **extra)
"""

# Outside the migrated tree: calls every entry point and prints what each returned or raised.
PROBE = """
import json
import sys

import torch

sys.path[:0] = [sys.argv[1], sys.argv[2]]
from plugin.backend import MyImpl
from plugin import ops
from plugin.sub import SubImpl
from tests_plugin.test_smoke import smoke, smoke_kwargs

ops.LAYERS["layer0"] = ops.Layer()

q = torch.arange(8.0).view(2, 4)
calls = {
    "forward with output": lambda: MyImpl().forward(None, q, q, q, None, None, torch.empty_like(q)),
    "smoke test": smoke,
    "smoke test, **kwargs": smoke_kwargs,
    "warm_up": lambda: MyImpl().warm_up(q),
    "subclass super()": lambda: SubImpl().decode(q),
    "Base.m(self)": lambda: SubImpl().warm(q),
    "partial callback": lambda: MyImpl().callbacks()[0](q),
    "getattr": lambda: MyImpl().by_name(q),
    "fused": lambda: MyImpl().run_fused(q),
    "reshaped": lambda: MyImpl().run_reshaped(q),
    "old op": lambda: ops.attention(q, "layer0"),
}
results = {}
for name, call in calls.items():
    try:
        results[name] = ["returned", call().tolist()]
    except Exception as error:
        results[name] = ["raised", type(error).__name__ + ": " + str(error)]
print(json.dumps(results))
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    _write(tmp_path / "stubs", STUB_VLLM)
    _write(
        tmp_path / "tree",
        {
            "plugin/__init__.py": "",
            "plugin/backend.py": BACKEND,
            "plugin/sub.py": SUBCLASS,
            "plugin/ops.py": OLD_OP,
            "tests_plugin/__init__.py": "",
            "tests_plugin/test_smoke.py": SMOKE_TEST,
        },
    )
    (tmp_path / "probe.py").write_text(PROBE)
    return tmp_path


def _probe(root: Path) -> dict[str, list]:
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    completed = subprocess.run(
        [sys.executable, str(root / "probe.py"), str(root / "tree"), str(root / "stubs")],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        check=True,
    )
    return json.loads(completed.stdout)


def _migrate(root: Path, *extra: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    # The fixes of vLLM 0.20's output buffer, which these calls exercise (this small plugin is no full backend: the
    # rules of later releases' interface would report what it leaves out).
    rules = ("--ignore", "VAC01")
    return subprocess.run(
        [sys.executable, "-m", "vllm_attn_compat", "migrate", "--jobs", "1", *rules, *extra, "tree"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        check=False,
    )


def test_every_call_that_worked_still_works_after_the_safe_fixes(plugin: Path) -> None:
    before = _probe(plugin)
    assert all(outcome == "returned" for outcome, _ in before.values()), before

    completed = _migrate(plugin)
    assert completed.returncode == 1, completed.stdout + completed.stderr  # the callers are left to a person
    after = _probe(plugin)
    assert after == before

    backend = (plugin / "tree/plugin/backend.py").read_text()
    # Only `fused` and `reshaped` are called with `output` everywhere: their fixes are applied, the others' withheld
    # (`reshaped` assigns `output` after its fallback: the fallback goes all the same).
    assert "def fused(self, query, output: torch.Tensor):" in backend
    assert "def reshaped(self, query, output: torch.Tensor):\n        output = output.view(-1)\n" in backend
    assert backend.count("if output is None:") == 4
    for kept in (
        "def prefill(self, query, key, value, output=None):",
        "def decode(self, query, output=None):",
        "def scaled(self, factor, query, output=None):",
        "def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):",
    ):
        assert kept in backend


def test_each_withheld_fix_names_a_use_that_withheld_it_and_no_use_is_a_finding_of_its_own(plugin: Path) -> None:
    """#50: one finding per withheld fix, at the code it would change, naming the first use that withheld it (the
    plainest: a call omitting `output` before one handing the method on) and how many more there are."""
    completed = _migrate(plugin, "--check")
    lines = completed.stdout.splitlines()
    assert [line for line in lines if line.startswith("tree/") and " [" not in line] == [], completed.stdout
    named = {
        "tree/plugin/backend.py:8:": "withheld: `layer.impl.forward(...)` at tree/plugin/ops.py:13 does not pass",
        "tree/plugin/backend.py:13:": "withheld: `self.prefill(...)` at line 20 does not pass `output` (and 1 more)",
        "tree/plugin/backend.py:22:": "withheld: `super().decode(...)` at tree/plugin/sub.py:6 does not pass",
        "tree/plugin/backend.py:28:": "withheld: `self.scaled` at line 35 hands it on as a value",
        "tree/plugin/sub.py:5:": 'withheld: `getattr(self, "decode")` at tree/plugin/backend.py:38 hands it on',
    }
    for where, text in named.items():
        line = next(line for line in lines if line.startswith(where) and "VAC002" in line)
        assert "[unsafe]" in line and text in line, line


def test_the_withheld_fixes_are_what_would_break_those_calls(plugin: Path) -> None:
    before = _probe(plugin)
    completed = _migrate(plugin, "--unsafe-fixes")
    assert completed.returncode == 0, completed.stdout + completed.stderr  # every fix taken; their findings name
    after = _probe(plugin)
    broken = {name for name, (outcome, _) in after.items() if outcome == "raised"}
    assert broken == {
        "smoke test",
        "smoke test, **kwargs",
        "warm_up",
        "subclass super()",
        "Base.m(self)",
        "partial callback",
        "getattr",
        "old op",
    }, after
    assert {name: after[name] for name in after if name not in broken} == {
        name: before[name] for name in before if name not in broken
    }


def test_after_the_unsafe_fixes_a_check_still_fails_at_each_call_they_broke(plugin: Path) -> None:
    """`--unsafe-fixes` made `output` required where calls omit it; the next `--check` (a CI gate) must not pass:
    each call that now raises TypeError is reported (the smoke test's `impl.forward(...)` too, `impl` bound once
    to `MyImpl()`, and the old op's `layer.impl.forward(...)`, whose receiver the run cannot tell; not through the
    `partial` callback or the `getattr`). A call whose `**kwargs` lack `output` is named by the unsafe run's finding
    alone: whether they hold it cannot be seen (docs/migrate.md, what "safe" means)."""
    unsafe = _migrate(plugin, "--unsafe-fixes")
    assert "tree/tests_plugin/test_smoke.py" not in unsafe.stdout, unsafe.stdout  # the fixes' findings name them
    completed = _migrate(plugin, "--check")
    assert completed.returncode == 1, completed.stdout + completed.stderr
    broken = [line for line in completed.stdout.splitlines() if "the call raises TypeError" in line]
    assert sorted(line.split(":", 1)[0] for line in broken) == [
        "tree/plugin/backend.py",  # self.prefill(query, query, query) in warm_up
        "tree/plugin/ops.py",  # layer.impl.forward(layer, query, query, query, None, None)
        "tree/plugin/sub.py",  # super().decode(query=query)
        "tree/plugin/sub.py",  # MyImpl.prefill(self, query, query, query)
        "tree/tests_plugin/test_smoke.py",  # impl = MyImpl(); impl.forward(None, q, q, q, None, None)
    ], completed.stdout
    assert all("VAC002" in line and "pass " in line and "output=`" in line for line in broken)


def test_a_noqa_comment_at_a_use_releases_no_fix(plugin: Path) -> None:
    """A noqa written at a call out of habit must not release the fix that breaks the call: the use is no finding to
    silence, and the fix stays withheld, naming it."""
    smoke = plugin / "tree/tests_plugin/test_smoke.py"
    text = smoke.read_text().replace("None, None)", "None, None)  # noqa: VAC002")
    smoke.write_text(text.replace("**extra)", "**extra)  # noqa: VAC002"))
    report = run_paths([str(plugin / "tree")], Options(mode="check", jobs=1))
    assert [finding for path, finding in report.findings if path.endswith("test_smoke.py")] == []
    forward = [
        finding
        for path, finding in report.findings
        if path.endswith("backend.py") and finding.line == 8 and finding.code == "VAC002"
    ]
    assert [finding.status for finding in forward] == [Status.UNSAFE_FIX_AVAILABLE]


def test_a_caller_in_an_excluded_folder_still_withholds_the_fix_it_would_break(plugin: Path) -> None:
    # Excluding the tests from the migration must not let a fix break them: they are read, never changed.
    before = _probe(plugin)
    completed = _migrate(plugin, "--exclude", "tests_plugin")
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert _probe(plugin) == before
    assert (plugin / "tree/tests_plugin/test_smoke.py").read_text() == textwrap.dedent(SMOKE_TEST).lstrip("\n")
    lines = completed.stdout.splitlines()
    assert not [line for line in lines if line.startswith("tree/tests_plugin/")]  # nothing reported there
    forward = next(line for line in lines if line.startswith("tree/plugin/backend.py:8:") and "VAC002" in line)
    # The message names the old op's call; the two more uses are the smoke test's, excluded, still counted.
    assert "[unsafe]" in forward and "at tree/plugin/ops.py:13 does not pass `output` (and 2 more)" in forward


def _hook_command(hook_id: str, staged: list[str]) -> list[str]:
    """The command pre-commit runs for the shipped hook ``hook_id`` on a commit of ``staged`` files: its
    entry, its args, then the files unless the hook declines them (``pass_filenames: false``)."""
    with open(REPO_ROOT / ".pre-commit-hooks.yaml") as handle:
        hook = next(hook for hook in yaml.safe_load(handle) if hook["id"] == hook_id)
    files = staged if hook.get("pass_filenames", True) else []
    return [*hook["entry"].split(), *hook.get("args", []), *files]


@pytest.mark.parametrize("hook_id", ["vllm-attn-compat", "vllm-attn-compat-check"])
def test_the_pre_commit_hooks_keep_every_call_working_when_the_commit_holds_the_backend_alone(
    plugin: Path, hook_id: str
) -> None:
    # The fixes the callers in sub.py and the smoke test withhold must stay withheld when those files are not
    # part of the commit: pre-commit runs the hook from the repository's root.
    before = _probe(plugin)
    program, *arguments = _hook_command(hook_id, ["plugin/backend.py"])
    assert program == "vllm-attn-compat"  # the console script; run here as the module, from this checkout
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    completed = subprocess.run(
        [sys.executable, "-m", "vllm_attn_compat", *arguments, "--jobs", "1"],
        cwd=plugin / "tree",
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        check=False,
    )
    assert completed.returncode == 1, completed.stdout + completed.stderr  # the callers are left to a person
    assert _probe(plugin) == before
    report = completed.stdout
    forward = next(line for line in report.splitlines() if line.startswith("plugin/backend.py:8:") and "VAC002" in line)
    assert "[unsafe]" in forward and "(and 2 more)" in forward  # the old op's call, and the smoke test's two


# A method only files importing neither vLLM nor the plugin call: through a receiver the run cannot resolve
# (`runner.py`), and through `self` in a mixin the impl derives from (`mixin.py`). Both files are read for
# their calls all the same.
CHUNKED = """
import torch
from vllm.v1.attention.backend import AttentionImpl

from plugin.mixin import WarmMixin


class ChunkImpl(AttentionImpl, WarmMixin):
    def prefill(self, query, key, value, output=None):
        if output is None:
            output = torch.empty_like(query)
        output.copy_(query + key + value)
        return output
"""

RUNNER = """
def warm(engine, x):
    return engine.attn_impl.prefill(x, x, x)
"""

MIXIN = """
class WarmMixin:
    def warm_up(self, x):
        return self.prefill(x, x, x)
"""

RUNNER_PROBE = """
import json
import sys
import types

import torch

sys.path[:0] = [sys.argv[1], sys.argv[2]]
from plugin.chunked import ChunkImpl
from runner import warm

q = torch.arange(8.0).view(2, 4)
calls = {
    "runner": lambda: warm(types.SimpleNamespace(attn_impl=ChunkImpl()), q),
    "mixin": lambda: ChunkImpl().warm_up(q),
}
results = {}
for name, call in calls.items():
    try:
        results[name] = ["returned", call().tolist()]
    except Exception as error:
        results[name] = ["raised", type(error).__name__ + ": " + str(error)]
print(json.dumps(results))
"""


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("caller", ["runner", "mixin"])
def test_a_caller_importing_neither_vllm_nor_the_class_withholds_the_fix_it_would_break(
    tmp_path: Path, caller: str, jobs: str
) -> None:
    _write(tmp_path / "stubs", STUB_VLLM)
    # Only one of the two files calls `prefill` (the other's call is commented out): it alone withholds the fix.
    runner = RUNNER if caller == "runner" else RUNNER.replace("return engine", "pass  # engine")
    mixin = MIXIN if caller == "mixin" else MIXIN.replace("return self", "pass  # self")
    layout = {"plugin/__init__.py": "", "plugin/chunked.py": CHUNKED, "plugin/mixin.py": mixin, "runner.py": runner}
    _write(tmp_path / "tree", layout)
    (tmp_path / "probe.py").write_text(RUNNER_PROBE)

    def probe() -> list:
        environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        command = [sys.executable, str(tmp_path / "probe.py"), str(tmp_path / "tree"), str(tmp_path / "stubs")]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment, check=True)
        return json.loads(completed.stdout)[caller]

    before = probe()
    assert before[0] == "returned", before
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    completed = subprocess.run(
        [sys.executable, "-m", "vllm_attn_compat", "migrate", "--jobs", jobs, "--ignore", "VAC01", "tree"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        check=False,
    )
    assert completed.returncode == 1, completed.stdout + completed.stderr  # the caller is left to a person
    assert probe() == before
    assert (tmp_path / "tree/plugin/chunked.py").read_text() == textwrap.dedent(CHUNKED).lstrip("\n")
    lines = completed.stdout.splitlines()
    site, call = ("tree/runner.py:2:12:", "`engine.attn_impl.prefill(...)`")
    if caller == "mixin":
        site, call = ("tree/plugin/mixin.py:3:16:", "`self.prefill(...)`")
    assert [line for line in lines if line.startswith(site.rsplit(":", 3)[0] + ":")] == [], lines  # no finding there
    withheld = [line for line in lines if line.startswith("tree/plugin/chunked.py:")]
    where = site.rsplit(":", 2)[0]
    assert len(withheld) == 2, lines
    assert all("[unsafe]" in line and f"{call} at {where} does not pass `output`" in line for line in withheld), lines
