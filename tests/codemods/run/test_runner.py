"""The runner on real trees: the funnel, the cross-file hierarchy, the pool, and what it refuses to write."""

from __future__ import annotations

import os
import stat

import pytest

from vllm_attn_compat.codemods.engine import safety
from vllm_attn_compat.codemods.findings import Status
from vllm_attn_compat.codemods.run import parallel, worker
from vllm_attn_compat.codemods.run.runner import Options, run_paths

from runner_trees import BASE, IMPL, IMPL_MIGRATED, MANUAL, PLAIN_BACKEND, PLATFORM, UNRELATED, write_tree


def test_the_funnel_parses_only_files_with_tokens(tmp_path, plugin):
    write_tree(plugin, {f"plugin/plain{n}.py": "def f(x):\n    return x\n" for n in range(6)})
    report = run_paths([str(plugin)], Options(mode="check", jobs=1))
    assert report.scanned == 10
    assert report.parsed == 2  # base.py (hierarchy) and impl.py; helpers.py lacks a scope token
    assert [os.path.basename(p) for p in report.changed] == ["impl.py"]


def test_a_hierarchy_spread_over_three_files_is_found_in_rounds(tmp_path):
    middle = "from plugin.base import PluginImplBase\n\n\nclass Middle(PluginImplBase):\n    pass\n"
    leaf = IMPL.replace("from plugin.base import PluginImplBase", "from plugin.middle import Middle").replace(
        "MyImpl(PluginImplBase)", "MyImpl(Middle)"
    )
    write_tree(
        tmp_path, {"plugin/__init__.py": "", "plugin/base.py": BASE, "plugin/middle.py": middle, "plugin/leaf.py": leaf}
    )
    report = run_paths([str(tmp_path)], Options(jobs=1))
    assert report.errors == [] and report.exit_code() == 0
    assert "assert output is not None" not in (tmp_path / "plugin/leaf.py").read_text()


def test_a_class_named_attention_outside_vllm_joins_the_hierarchy_through_its_base(tmp_path):
    # Not indexed in the first round (it never mentions vLLM), found in the second by its base's name.
    named = IMPL.replace("class MyImpl(PluginImplBase):", "class Attention(PluginImplBase):")
    write_tree(tmp_path, {"plugin/__init__.py": "", "plugin/base.py": BASE, "models/attention.py": named})
    report = run_paths([str(tmp_path)], Options(mode="check", jobs=1))
    assert report.errors == [] and report.changed == [str(tmp_path / "models/attention.py")]


def test_a_fork_of_vllm_is_indexed_by_its_package_even_where_no_line_says_vllm(tmp_path):
    layer = (
        "from .base import AttentionLayerBase\n\n\nclass MLAAttention(AttentionLayerBase):\n"
        "    def forward_impl(self, query, output=None):\n        assert output is not None\n        return output\n"
        "\n    def forward(self, query):\n        return self.forward_impl(query)\n"
    )
    layout = {"vllm/__init__.py": "", "vllm/attention/__init__.py": "", "vllm/attention/layer.py": layer}
    write_tree(tmp_path, layout | {"vllm/attention/base.py": "class AttentionLayerBase:\n    pass\n"})
    report = run_paths([str(tmp_path)], Options(mode="check", jobs=1))
    assert report.errors == []
    # Found (so indexed); withheld, since the layer's own `forward` omits `output` (and fails at the assert).
    found = sorted((path, finding.line, finding.code, finding.status.value) for path, finding in report.findings)
    layer_path = str(tmp_path / "vllm/attention/layer.py")
    withheld = Status.UNSAFE_FIX_AVAILABLE.value
    assert found == [(layer_path, 5, "VAC002", withheld), (layer_path, 6, "VAC001", withheld)]


def test_an_unrelated_hierarchy_is_left_alone(tmp_path):
    unrelated = IMPL.replace(
        "from plugin.base import PluginImplBase", "from mylib.attention import AttentionImpl"
    ).replace("MyImpl(PluginImplBase)", "MyImpl(AttentionImpl)")
    write_tree(tmp_path, {"other.py": unrelated})
    report = run_paths([str(tmp_path)], Options(jobs=1))
    assert report.findings == [] and (tmp_path / "other.py").read_text() == unrelated


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_backend_a_platform_names_by_its_path_is_checked_whatever_its_module_imports(tmp_path, jobs):
    """vLLM imports the backend the platform names and calls its impl with the buffer, which this impl leaves
    unwritten (VAC009), and with `output_scale` and `output_block_scale`, which it cannot take (VAC012); vLLM 0.34
    never calls the layout hook (VAC010). Without the platform, nothing says the classes are vLLM's: nothing is
    reported."""
    layout = {"plugin/__init__.py": "", "plugin/attention.py": PLAIN_BACKEND}
    write_tree(tmp_path, layout)
    assert run_paths([str(tmp_path)], Options(mode="check", jobs=jobs)).findings == []
    write_tree(tmp_path, layout | {"plugin/platform.py": PLATFORM})
    report = run_paths([str(tmp_path)], Options(mode="check", jobs=jobs))
    assert report.errors == []
    found = sorted((os.path.basename(path), finding.line, finding.code) for path, finding in report.findings)
    assert found == [("attention.py", 11, "VAC010"), ("attention.py", 16, "VAC009"), ("attention.py", 16, "VAC012")]


@pytest.mark.parametrize("jobs", [1, 2])
def test_excluded_files_take_part_in_the_hierarchy_but_are_never_changed_nor_reported(tmp_path, jobs):
    # The base class lives in an excluded folder, next to a backend of its own holding a fix and a file
    # that does not parse: the covered backend is still attention code; the excluded ones stay as they are.
    broken = "def f(:\n"
    impl = IMPL.replace("from plugin.base import", "from vendored.base import")
    layout = {"plugin/__init__.py": "", "plugin/impl.py": impl, "vendored/__init__.py": ""}
    write_tree(tmp_path, layout | {"vendored/base.py": BASE, "vendored/other.py": impl, "vendored/bad.py": broken})
    options = Options(exclude=("vendored",), jobs=jobs, base=str(tmp_path))
    report = run_paths([str(tmp_path)], options)
    assert report.errors == [] and report.scanned == 2
    assert [finding.code for path, finding in report.findings] == ["VAC001"]
    assert {path for path, _ in report.findings} == {str(tmp_path / "plugin/impl.py")}
    assert report.changed == [str(tmp_path / "plugin/impl.py")]
    assert "assert output is not None" not in (tmp_path / "plugin/impl.py").read_text()
    assert "assert output is not None" in (tmp_path / "vendored/other.py").read_text()
    assert (tmp_path / "vendored/bad.py").read_text() == broken


_PREFILL = """
    def prefill(self, query, output=None):
        if output is None:
            output = torch.empty_like(query)
        return output
"""


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_file_importing_nothing_is_read_for_the_calls_of_a_method_once_a_fix_of_it_is_still_safe(tmp_path, jobs):
    # Round 1 finds `PluginBase.prefill`, whose fixes a call in its own file withholds; round 2 finds
    # `OtherImpl.prefill` (its file names the base, never vLLM), whose fixes are still safe: so `runner.py`,
    # which imports nothing, is read for its call of `prefill`, though the name's first method needed none.
    base = "from vllm.v1.attention.backend import AttentionImpl\n\n\nclass PluginBase(AttentionImpl):" + _PREFILL
    base += "\n\ndef warm(query):\n    return PluginBase.prefill(PluginBase(), query)\n"
    other = "from plugin.base import PluginBase\n\n\nclass OtherImpl(PluginBase):" + _PREFILL
    runner = "def warm(engine, query):\n    return engine.impl.prefill(query)\n"
    layout = {"plugin/__init__.py": "", "plugin/base.py": base, "plugin/other.py": other, "runner.py": runner}
    write_tree(tmp_path, layout)
    # (the 0.20 rules' call-site accounting: these toy impls lack what later releases' rules report)
    report = run_paths([str(tmp_path)], Options(mode="check", jobs=jobs, ignore=("VAC01",)))
    assert report.errors == [] and report.changed == []
    found = sorted((os.path.relpath(path, tmp_path), f.line, f.code, f.status) for path, f in report.findings)
    withheld = [(path, line, code) for path, line, code, status in found if status == Status.UNSAFE_FIX_AVAILABLE]
    assert withheld == [(f"plugin/{name}.py", line, code) for name in ("base", "other") for line, code in _FIXES]
    assert [status for *_, status in found if status == Status.MANUAL] == []  # the calls are named, no findings
    assert "runner.py:2 does not pass `output`" in next(
        f.message for path, f in report.findings if path.endswith("other.py")
    )


_FIXES = [(5, "VAC002"), (6, "VAC003")]


def test_pool_and_in_process_runs_agree(tmp_path):
    layout = {"plugin/__init__.py": "", "plugin/base.py": BASE}
    layout |= {f"plugin/impl{n}.py": IMPL for n in range(10)}
    first, second = write_tree(tmp_path / "a", layout), write_tree(tmp_path / "b", layout)
    pooled = run_paths([str(first)], Options(jobs=2))
    alone = run_paths([str(second)], Options(jobs=1))
    assert len(pooled.changed) == len(alone.changed) == 10
    assert sorted(f for _, f in pooled.findings) == sorted(f for _, f in alone.findings)
    assert all((first / f"plugin/impl{n}.py").read_text() == IMPL_MIGRATED for n in range(10))


_migrate_file = worker.migrate_file


def crash_on_impl3(source: bytes, path: str):
    if path.endswith("impl3.py"):
        os._exit(9)  # as if the kernel killed the worker for running out of memory
    return _migrate_file(source, path)


def test_a_worker_dying_on_one_file_costs_only_that_file(tmp_path, monkeypatch):
    layout = {"plugin/__init__.py": "", "plugin/base.py": BASE}
    layout |= {f"plugin/impl{n}.py": IMPL for n in range(10)}
    write_tree(tmp_path, layout)
    monkeypatch.setattr(worker, "migrate_file", crash_on_impl3)
    report = run_paths([str(tmp_path)], Options(jobs=2))
    assert [(os.path.basename(e.path), "internal error" in e.message) for e in report.errors] == [("impl3.py", True)]
    assert report.exit_code() == 2
    assert (tmp_path / "plugin/impl3.py").read_text() == IMPL
    assert all((tmp_path / f"plugin/impl{n}.py").read_text() == IMPL_MIGRATED for n in range(10) if n != 3)


def test_a_rewrite_failing_a_safety_check_is_not_written(plugin, monkeypatch):
    monkeypatch.setattr(safety, "layout_problems", lambda old, new: ["line 3 ends with LF, expected CRLF"])
    report = run_paths([str(plugin)], Options(jobs=1))
    assert report.exit_code() == 2 and report.changed == []
    [error] = report.errors
    assert (
        error.path.endswith("impl.py") and "failed a safety check (line 3 ends with LF, expected CRLF)" in error.message
    )
    assert (plugin / "plugin/impl.py").read_text() == IMPL
    diff = run_paths([str(plugin)], Options(mode="diff", jobs=1))
    assert diff.exit_code() == 2 and diff.changed == [] and len(diff.errors) == 1  # no diff of an unsafe rewrite


def test_check_mode_writes_nothing_so_it_skips_the_safety_checks(plugin, monkeypatch):
    checked = []
    monkeypatch.setattr(safety, "check_rewrite", lambda *args: checked.append(args) or ["never consulted"])
    report = run_paths([str(plugin)], Options(mode="check", jobs=1))
    assert checked == [] and report.errors == [] and [os.path.basename(p) for p in report.changed] == ["impl.py"]
    assert (plugin / "plugin/impl.py").read_text() == IMPL


def test_written_files_keep_permissions_line_endings_and_bom(tmp_path):
    crlf = ("\ufeff" + IMPL).replace("\n", "\r\n").encode()
    write_tree(tmp_path, {"plugin/__init__.py": "", "plugin/base.py": BASE, "plugin/impl.py": crlf})
    (tmp_path / "plugin/impl.py").chmod(0o750)
    report = run_paths([str(tmp_path)], Options(jobs=1))
    assert report.exit_code() == 0 and len(report.changed) == 1
    assert (tmp_path / "plugin/impl.py").read_bytes() == ("\ufeff" + IMPL_MIGRATED).replace("\n", "\r\n").encode()
    assert stat.S_IMODE(os.stat(tmp_path / "plugin/impl.py").st_mode) == 0o750


def test_a_symlink_out_of_the_given_paths_is_neither_read_nor_written(tmp_path):
    write_tree(tmp_path / "outside", {"plugin/__init__.py": "", "plugin/base.py": BASE, "plugin/impl.py": IMPL})
    project = write_tree(tmp_path / "project", {"helpers.py": UNRELATED})
    (project / "impl.py").symlink_to(tmp_path / "outside/plugin/impl.py")
    (project / "base.py").symlink_to(tmp_path / "outside/plugin/base.py")
    report = run_paths([str(project)], Options(jobs=1))
    assert sorted(os.path.basename(path) for path, _ in report.skipped) == ["base.py", "impl.py"]
    assert (tmp_path / "outside/plugin/impl.py").read_text() == IMPL
    assert report.exit_code() == 0


def test_findings_keep_their_statuses_per_file(plugin):
    report = run_paths([str(plugin)], Options(mode="diff", jobs=1))
    assert [(os.path.basename(p), f.code, f.status) for p, f in report.findings] == [
        ("impl.py", "VAC001", Status.FIXED)
    ]
    assert (plugin / "plugin/impl.py").read_text() == IMPL


# --- issue #25: what decides whether deleting `accept_output_buffer` is safe is read wherever it is -------

_FLAGGED_BACKEND = """
from vllm.v1.attention.backend import AttentionBackend


class MyBackend(AttentionBackend):
    accept_output_buffer = True
"""


@pytest.mark.parametrize("select", [(), ("VAC004",)])
def test_a_read_of_the_flag_in_a_file_naming_neither_vllm_nor_the_class_withholds_its_deletion(tmp_path, select):
    reader = "def flag_of(backend):\n    return getattr(backend, 'accept_output_buffer', False)\n"
    write_tree(tmp_path, {"plugin/__init__.py": "", "plugin/backend.py": _FLAGGED_BACKEND, "tools/flags.py": reader})
    report = run_paths([str(tmp_path)], Options(jobs=1, select=select))
    assert report.errors == [] and report.changed == []
    (finding,) = [f for _, f in report.findings if f.code == "VAC004"]
    assert finding.status is Status.UNSAFE_FIX_AVAILABLE and "tools/flags.py:2" in finding.message


def test_a_projects_own_base_behind_a_class_no_round_would_index_keeps_the_flag_its_own(tmp_path):
    """The own base declaring the flag is two levels up, behind a class in a file that names neither vLLM nor
    an attention class: the run indexes that file because a class declaring the flag derives from it."""
    own = "from abc import ABC\n\n\nclass OwnBase(ABC):\n    accept_output_buffer = False\n"
    middle = "from plugin.own import OwnBase\n\n\nclass Middle(OwnBase):\n    pass\n"
    leaf = (
        "from vllm.logger import init_logger\n\nfrom plugin.middle import Middle\n\n\nclass Leaf(Middle):\n"
        "    accept_output_buffer = True\n\n    @staticmethod\n    def get_name():\n        return 'LEAF'\n\n"
        "    @staticmethod\n    def get_impl_cls():\n        return None\n"
    )
    layout = {"plugin/__init__.py": "", "plugin/own.py": own, "plugin/middle.py": middle, "plugin/leaf.py": leaf}
    write_tree(tmp_path, layout)
    report = run_paths([str(tmp_path)], Options(jobs=1))
    assert report.errors == [] and report.changed == [] and report.findings == []


@pytest.mark.parametrize("entry", ["paths", "source"])
def test_a_run_leaves_no_guess_of_module_names_behind(tmp_path, monkeypatch, entry):
    """A run guesses module names from the folders it sees, a relative path as given: what it found is not kept for
    a later run, or another caller, in another working directory or after the folders changed."""
    from vllm_attn_compat.codemods.index.names import guess_module_name
    from vllm_attn_compat.codemods.run.runner import run_source

    package = write_tree(
        tmp_path / "package", {"plugin/__init__.py": "", "plugin/base.py": BASE, "plugin/impl.py": IMPL}
    )
    loose = write_tree(tmp_path / "loose", {"plugin/base.py": BASE, "plugin/impl.py": IMPL})
    monkeypatch.chdir(package)
    if entry == "paths":
        report = run_paths(["plugin"], Options(mode="check", jobs=1))
    else:
        report, _, _ = run_source(MANUAL.encode(), "plugin/impl.py", Options(mode="check", jobs=1))
    assert report.findings  # the run read plugin/impl.py, as the module plugin.impl
    monkeypatch.chdir(loose)
    assert guess_module_name("plugin/impl.py") == "impl"


@pytest.mark.parametrize("derives", [False, True], ids=["another-class", "a-subclass"])
def test_a_read_of_an_instance_s_flag_is_resolved_through_a_file_that_names_no_vllm(tmp_path, derives):
    """`Backend0().accept_output_buffer` where `Backend0` lives in a file naming no vLLM (so not indexed for
    itself): the runner indexes the file defining it, so the read counts only for the classes `Backend0` is
    (found by the generated-flags property in long mode: the read withheld the deletion of every flag)."""
    base = "from plugin.backends import Backend1 as Base" if derives else "from plugin.own import OwnBackend as Base"
    layout = {
        "plugin/__init__.py": "",
        "plugin/own.py": "class OwnBackend:\n    pass\n",
        "plugin/backends.py": (
            "from vllm.v1.attention.backend import AttentionBackend\n\n\n"
            "class Backend1(AttentionBackend):\n    accept_output_buffer = True\n"
        ),
        "plugin/m1.py": f"{base}\n\n\nclass Backend0(Base):\n    pass\n",
        "plugin/callers.py": (
            "from plugin.m1 import Backend0\n\n\ndef read():\n    return Backend0().accept_output_buffer\n"
        ),
    }
    write_tree(tmp_path, layout)
    report = run_paths([str(tmp_path)], Options(mode="check", jobs=1))
    [finding] = [finding for _, finding in report.findings if finding.code == "VAC004"]  # (VAC013: a toy backend)
    assert finding.status is (Status.UNSAFE_FIX_AVAILABLE if derives else Status.FIXED)


_OLD_OP_CALL = "import torch\n\n\ndef attend(q):\n    return torch.ops.vllm.unified_attention(q)\n"


@pytest.mark.parametrize(("needing", "workers"), [(1, 1), (parallel.IN_PROCESS_BELOW - 1, 1), (20, 2)])
def test_one_worker_imports_libcst_for_every_few_files_that_need_it(tmp_path, monkeypatch, needing, workers):
    """A worker's import of libcst costs as much as migrating a few files: a first run over a tree where a handful
    need libcst (torch's, with a plugin in it) starts one worker once it has read them all, and one with many
    starts every worker once it has read a few."""
    asked: list[int] = []
    prepare = parallel.Pool.prepare

    def recording(pool: parallel.Pool, function, count: int) -> None:
        asked.append(count)
        prepare(pool, function, count)

    monkeypatch.setattr(parallel.Pool, "prepare", recording)
    layout = {f"pkg/op{n}.py": _OLD_OP_CALL for n in range(needing)}
    write_tree(tmp_path, layout | {f"pkg/plain{n}.py": "def f(x):\n    return x\n" for n in range(10)})
    report = run_paths([str(tmp_path)], Options(mode="check", jobs=2))
    assert len({path for path, _ in report.findings}) == needing
    assert [count for count in asked if count] == [workers]


def test_a_first_run_starts_its_one_worker_a_few_hundred_files_past_the_few_that_need_it(tmp_path, monkeypatch, reads):
    """A plugin's files lie together: past a few hundred files without enough of them, the worker starts at once
    (importing libcst while the run reads on) rather than once every file is read."""
    asked: list[tuple[int, int]] = []
    prepare = parallel.Pool.prepare

    def recording(pool: parallel.Pool, function, count: int) -> None:
        asked.append((count, len(reads)))
        prepare(pool, function, count)

    monkeypatch.setattr(parallel.Pool, "prepare", recording)
    layout = {f"a/op{n}.py": _OLD_OP_CALL for n in range(3)}
    write_tree(tmp_path, layout | {f"b/plain{n:03}.py": "x = 1\n" for n in range(700)})
    report = run_paths([str(tmp_path)], Options(mode="check", jobs=2))
    assert len({path for path, _ in report.findings}) == 3
    [(count, read)] = [(count, read) for count, read in asked if count]
    assert count == 1 and 3 + 500 < read < 3 + 700
