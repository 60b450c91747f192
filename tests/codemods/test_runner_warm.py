"""Workers started before the class-hierarchy pass: same results as in-process, and started only when useful."""

from __future__ import annotations

from runner_trees import IMPL, IMPL_MIGRATED, write_tree

from vllm_attn_compat.codemods import parallel, prefork
from vllm_attn_compat.codemods.runner import Options, run_paths

DIRECT = IMPL.replace("from plugin.base import PluginImplBase", "from vllm.v1.attention.backend import AttentionImpl")
DIRECT = DIRECT.replace("MyImpl(PluginImplBase)", "MyImpl(AttentionImpl)")
DIRECT_MIGRATED = IMPL_MIGRATED.replace(
    "from plugin.base import PluginImplBase", "from vllm.v1.attention.backend import AttentionImpl"
).replace("MyImpl(PluginImplBase)", "MyImpl(AttentionImpl)")

# torch's case: a class named Attention that is no vLLM class, and a scoped rule's token.
TORCH_LIKE = "import torch.nn as nn\n\n\nclass Attention(nn.Module):\n    def forward(self, x, output: int):\n        return x\n"


def _record_warm_pools(monkeypatch) -> list:
    started = []

    class Recorded(prefork.PreforkedWorker):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.submitted: list[str] = []
            started.append(self)

        def submit(self, key, function, arguments) -> None:
            self.submitted.append(key)
            super().submit(key, function, arguments)

    monkeypatch.setattr(prefork, "PreforkedWorker", Recorded)
    return started


def test_a_few_files_in_early_started_workers_match_an_in_process_run(tmp_path, monkeypatch):
    started = _record_warm_pools(monkeypatch)
    layout = {f"impl{n}.py": DIRECT for n in range(3)} | {"unrelated.py": TORCH_LIKE}
    pooled, alone = write_tree(tmp_path / "a", layout), write_tree(tmp_path / "b", layout)
    pooled_report = run_paths([str(pooled)], Options(jobs=2))
    assert len(started) == 1 and started[0].used
    alone_report = run_paths([str(alone)], Options(jobs=1))
    assert len(started) == 1
    assert pooled_report.errors == alone_report.errors == []
    assert len(pooled_report.changed) == len(alone_report.changed) == 3
    assert sorted(f for _, f in pooled_report.findings) == sorted(f for _, f in alone_report.findings)
    assert all((pooled / f"impl{n}.py").read_text() == DIRECT_MIGRATED for n in range(3))
    assert (pooled / "unrelated.py").read_text() == TORCH_LIKE


def test_no_workers_start_for_a_class_that_is_merely_named_attention(tmp_path, monkeypatch):
    started = _record_warm_pools(monkeypatch)
    write_tree(tmp_path, {"model.py": TORCH_LIKE})
    report = run_paths([str(tmp_path)], Options(mode="check", jobs=2))
    # Not even indexed: nothing in it mentions vLLM, so its Attention cannot derive from vLLM.
    assert started == [] and report.findings == [] and report.parsed == 0


def test_more_files_than_the_early_workers_can_take_go_to_a_full_pool(tmp_path, monkeypatch):
    from runner_trees import BASE

    started = _record_warm_pools(monkeypatch)
    # Three files are probable before the hierarchy pass (they import vLLM); twelve more turn out
    # to derive from the plugin's base: one early worker would be too few for fifteen files, so it
    # takes the first few that are settled and a full pool the rest.
    layout = {f"direct{n}.py": DIRECT for n in range(3)} | {"plugin/__init__.py": "", "plugin/base.py": BASE}
    layout |= {f"plugin/impl{n}.py": IMPL for n in range(12)}
    write_tree(tmp_path, layout)
    report = run_paths([str(tmp_path)], Options(jobs=2))
    assert len(started) == 1 and started[0].workers == 1
    assert 0 < len(started[0].submitted) <= parallel.IN_PROCESS_BELOW
    assert report.errors == [] and len(report.changed) == 15
    assert all((tmp_path / f"plugin/impl{n}.py").read_text() == IMPL_MIGRATED for n in range(12))


def test_the_cli_forks_its_worker_before_reading_when_given_a_folder(tmp_path, monkeypatch):
    from vllm_attn_compat.codemods import cli, sources

    started = _record_warm_pools(monkeypatch)
    workers_when_read: list[int] = []
    real_read = sources.read_source

    def read_source(path):
        workers_when_read.append(len(started))
        return real_read(path)

    monkeypatch.setattr(sources, "read_source", read_source)
    write_tree(tmp_path, {"impl.py": DIRECT, "model.py": TORCH_LIKE})
    assert cli.main(["migrate", "--check", "--quiet", "-j", "2", str(tmp_path)]) == 1
    assert len(started) == 1 and started[0].submitted == [str(tmp_path / "impl.py")]
    assert workers_when_read == [1, 1]  # forked before the first file was read
    # One job, or files named one by one: no worker before a file shows it needs one (this one does not).
    assert cli.main(["migrate", "--check", "--quiet", "-j", "1", str(tmp_path)]) == 1
    assert cli.main(["migrate", "--check", "--quiet", "-j", "2", str(tmp_path / "model.py")]) == 0
    assert len(started) == 1
