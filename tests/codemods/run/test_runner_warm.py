"""Workers started before the class-hierarchy pass: same results as in-process, and started only when useful."""

from __future__ import annotations

from vllm_attn_compat.codemods.run import parallel, prefork
from vllm_attn_compat.codemods.run.runner import Options, run_paths
from vllm_attn_compat.codemods.run.worker import index_file as ORIGINAL_INDEX_FILE

from runner_trees import IMPL, IMPL_MIGRATED, write_tree

DIRECT = IMPL.replace("from plugin.base import PluginImplBase", "from vllm.v1.attention.backend import AttentionImpl")
DIRECT = DIRECT.replace("MyImpl(PluginImplBase)", "MyImpl(AttentionImpl)")
DIRECT_MIGRATED = IMPL_MIGRATED.replace(
    "from plugin.base import PluginImplBase", "from vllm.v1.attention.backend import AttentionImpl"
).replace("MyImpl(PluginImplBase)", "MyImpl(AttentionImpl)")

# torch's case: a class named Attention that is no vLLM class, and a scoped rule's token.
TORCH_LIKE = (
    "import torch.nn as nn\n\n\nclass Attention(nn.Module):\n    def forward(self, x, output: int):\n        return x\n"
)


def _record_warm_pools(monkeypatch) -> list:
    started = []

    class Recorded(prefork.PreforkedWorker):
        def _connect(self, *args, **kwargs) -> None:  # a worker forked by this process, or a sibling
            super()._connect(*args, **kwargs)
            self.submitted: list[str] = []
            self.functions: list[str] = []
            started.append(self)

        def submit(self, key, function, arguments) -> None:
            self.submitted.append(key)
            self.functions.append(function.__name__)
            super().submit(key, function, arguments)

    monkeypatch.setattr(prefork, "PreforkedWorker", Recorded)
    return started


def test_a_few_files_in_early_started_workers_match_an_in_process_run(tmp_path, monkeypatch):
    started = _record_warm_pools(monkeypatch)
    layout = {f"impl{n}.py": DIRECT for n in range(3)} | {"unrelated.py": TORCH_LIKE}
    pooled, alone = write_tree(tmp_path / "a", layout), write_tree(tmp_path / "b", layout)
    pooled_report = run_paths([str(pooled)], Options(jobs=2))
    assert len(started) == 1 and started[0].used  # three files: not worth a second worker
    alone_report = run_paths([str(alone)], Options(jobs=1))
    assert len(started) == 1
    assert pooled_report.errors == alone_report.errors == []
    assert len(pooled_report.changed) == len(alone_report.changed) == 3
    assert sorted(f for _, f in pooled_report.findings) == sorted(f for _, f in alone_report.findings)
    assert all((pooled / f"impl{n}.py").read_text() == DIRECT_MIGRATED for n in range(3))
    assert (pooled / "unrelated.py").read_text() == TORCH_LIKE


def test_a_second_early_worker_starts_once_the_files_read_show_enough_work(tmp_path, monkeypatch):
    started = _record_warm_pools(monkeypatch)
    write_tree(tmp_path / "few", {f"impl{n}.py": DIRECT for n in range(parallel.IN_PROCESS_BELOW - 1)})
    run_paths([str(tmp_path / "few")], Options(mode="check", jobs=2))
    assert len(started) == 1
    write_tree(tmp_path / "many", {f"impl{n}.py": DIRECT for n in range(parallel.IN_PROCESS_BELOW)})
    report = run_paths([str(tmp_path / "many")], Options(mode="check", jobs=2))
    assert len(started) == 3 and started[1].used and started[2].used  # they share the files
    assert started[2]._is_sibling  # forked by the first, once it had imported libcst
    assert report.errors == [] and len(report.changed) == parallel.IN_PROCESS_BELOW


def test_no_workers_start_for_a_class_that_is_merely_named_attention(tmp_path, monkeypatch):
    started = _record_warm_pools(monkeypatch)
    write_tree(tmp_path, {"model.py": TORCH_LIKE})
    report = run_paths([str(tmp_path)], Options(mode="check", jobs=2))
    # Not even indexed: nothing in it mentions vLLM, so its Attention cannot derive from vLLM.
    assert started == [] and report.findings == [] and report.parsed == 0


def test_more_files_than_the_early_workers_can_take_are_shared_with_the_other_jobs(tmp_path, monkeypatch):
    from runner_trees import BASE

    started = _record_warm_pools(monkeypatch)
    # Eight files are probable before the hierarchy pass (they import vLLM): two early workers. Twelve
    # more turn out to derive from the plugin's base. With three jobs, the two early workers take their
    # share of the rest and the third job (here, this process) the others.
    layout = {f"direct{n}.py": DIRECT for n in range(8)} | {"plugin/__init__.py": "", "plugin/base.py": BASE}
    filler = "# filler\n" * 5_000  # 45 kB a file: worth a job of its own, past its import of libcst
    layout |= {f"plugin/impl{n}.py": IMPL + filler for n in range(12)}
    write_tree(tmp_path, layout)
    report = run_paths([str(tmp_path)], Options(jobs=3))
    assert len(started) == 2 and all(early.submitted for early in started)
    assert sum(len(early.submitted) for early in started) < 20  # the third job migrated some
    assert report.errors == [] and len(report.changed) == 20
    assert all((tmp_path / f"plugin/impl{n}.py").read_text() == IMPL_MIGRATED + filler for n in range(12))


def test_the_early_workers_index_the_files_when_they_are_all_the_jobs(tmp_path, monkeypatch):
    from runner_trees import BASE

    started = _record_warm_pools(monkeypatch)
    layout = {f"direct{n}.py": DIRECT for n in range(8)} | {"plugin/__init__.py": "", "plugin/base.py": BASE}
    layout |= {f"plugin/impl{n}.py": IMPL for n in range(12)}
    pooled, alone = write_tree(tmp_path / "a", layout), write_tree(tmp_path / "b", layout)
    report = run_paths([str(pooled)], Options(jobs=2))
    assert len(started) == 2 and all("index_file" in early.functions for early in started)
    indexed = [
        key for early in started for key, f in zip(early.submitted, early.functions, strict=True) if f == "index_file"
    ]
    assert len(indexed) == len(set(indexed)) >= 20  # each file once, in one of them
    alone_report = run_paths([str(alone)], Options(jobs=1))
    assert report.errors == alone_report.errors == [] and len(report.changed) == len(alone_report.changed) == 20
    assert sorted(f for _, f in report.findings) == sorted(f for _, f in alone_report.findings)
    assert all((pooled / f"plugin/impl{n}.py").read_text() == IMPL_MIGRATED for n in range(12))


def test_the_early_workers_share_goes_by_size_largest_first():
    from vllm_attn_compat.codemods.run.runner import _IMPORT_IN_BYTES, _early_share

    class Item:
        def __init__(self, size: int) -> None:
            self.source = b"x" * size

    items = [Item(size) for size in (200_000, 500_000, 300_000, 400_000)]

    def sizes(share):
        return [(len(item.source), to) for item, to in share]

    mine, theirs = _early_share(items, [0], others=1)
    # 500k to the early worker (it has imported libcst), 400k to the other (which has not), 300k to the
    # other (480k against 500k), 200k to the early worker.
    assert sizes(mine) == [(500_000, 0), (200_000, 0)]
    assert [len(i.source) for i in theirs] == [400_000, 300_000]
    assert _IMPORT_IN_BYTES < 200_000
    # Two early workers and no other job: each file to the worker with less work so far.
    mine, theirs = _early_share(items, [0, 0], others=0)
    assert sizes(mine) == [(500_000, 0), (400_000, 1), (300_000, 1), (200_000, 0)] and theirs == []
    # Work already sent counts: two other jobs take everything from a busy early worker.
    mine, theirs = _early_share(items, [10**6], others=2)
    assert mine == [] and len(theirs) == 4


def _die_on_direct3(source: bytes, path: str, keep: bool = False):
    """`worker.index_file` in a process that dies on one file (out of memory, a crash in a parser)."""
    import os

    if path.endswith("direct3.py"):
        os._exit(3)
    return ORIGINAL_INDEX_FILE(source, path, keep)


def test_an_early_worker_that_died_takes_no_more_files_and_the_run_goes_on(tmp_path, monkeypatch):
    from vllm_attn_compat.codemods.run import worker

    from runner_trees import BASE

    started = _record_warm_pools(monkeypatch)
    monkeypatch.setattr(worker, "index_file", _die_on_direct3)  # forked workers inherit it
    layout = {f"direct{n}.py": DIRECT for n in range(8)} | {"plugin/__init__.py": "", "plugin/base.py": BASE}
    layout |= {f"plugin/impl{n}.py": IMPL for n in range(12)}
    write_tree(tmp_path, layout)
    report = run_paths([str(tmp_path)], Options(jobs=2))
    [dead] = [early for early in started if any(key.endswith("direct3.py") for key in early.submitted)]
    assert "migrate_file" not in dead.functions  # nothing after its death, in this round or later ones
    assert [error.path for error in report.errors] == [str(tmp_path / "direct3.py")]  # retried alone, died again
    assert len(report.changed) == 19 and (tmp_path / "direct0.py").read_text() == DIRECT_MIGRATED
    assert all((tmp_path / f"plugin/impl{n}.py").read_text() == IMPL_MIGRATED for n in range(12))


def test_with_a_cache_the_early_workers_migrate_during_the_rounds_only_files_it_holds_nothing_of(tmp_path, monkeypatch):
    from vllm_attn_compat.codemods.run import stats

    monkeypatch.setattr(stats, "RACY_NS", 0)
    started = _record_warm_pools(monkeypatch)
    tree = write_tree(tmp_path / "tree", {f"direct{n}.py": DIRECT for n in range(8)})
    options = Options(mode="check", jobs=2, cache_dir=str(tmp_path / "cache"))

    def sent() -> list[str]:
        return sorted(
            key.rpartition("/")[2]
            for early in started
            for key, function in zip(early.submitted, early.functions, strict=True)
            if function == "migrate_file"
        )

    def outcome(report):
        return sorted(report.findings), sorted(report.changed), report.errors

    uncached = outcome(run_paths([str(tree)], Options(mode="check", jobs=1)))
    started.clear()
    assert outcome(run_paths([str(tree)], options)) == uncached
    assert sent() == [f"direct{n}.py" for n in range(8)]  # an empty cache: all of them, as without one
    (tree / "direct3.py").write_text("# edited\n" + DIRECT)
    started.clear()
    edited = outcome(run_paths([str(tree)], options))
    assert sent() == ["direct3.py"]  # the others' migrations come from the cache, each once
    assert edited == outcome(run_paths([str(tree)], Options(mode="check", jobs=1)))
    assert len(edited[0]) == len(uncached[0])


def test_a_rerun_forks_a_second_early_worker_only_for_enough_files_edited_since(tmp_path, monkeypatch):
    """Files whose bytes a run before read are done with (their migration, or finding they need none, is in the
    cache): a rerun after an edit of one file forks no second worker for the others, whose fork would delay the
    edited file's migration."""
    from vllm_attn_compat.codemods.run import stats

    monkeypatch.setattr(stats, "RACY_NS", 0)  # the files were just written: trusted by their status at once
    started = _record_warm_pools(monkeypatch)
    many = parallel.IN_PROCESS_BELOW
    tree = write_tree(tmp_path / "tree", {f"direct{n}.py": DIRECT for n in range(many)})
    options = Options(mode="check", jobs=2, cache_dir=str(tmp_path / "cache"))

    def rerun_after_editing(count: int) -> int:
        for n in range(count):
            (tree / f"direct{n}.py").write_text(f"# edit {count}\n" + DIRECT)
        started.clear()
        report = run_paths([str(tree)], options)
        uncached = run_paths([str(tree)], Options(mode="check", jobs=1))
        assert (sorted(report.findings), report.changed) == (sorted(uncached.findings), uncached.changed)
        assert len(report.findings) == many and report.errors == []
        return len(started)

    assert rerun_after_editing(0) == 2  # a first run: the second forked by the first
    assert rerun_after_editing(1) == 1
    assert rerun_after_editing(many) == 2


HELPER = (
    "from vllm.v1.attention.backend import AttentionImpl\n\n\nclass Helper(AttentionImpl):\n"
    "    def size(self):\n        return 1\n"
)


def test_a_rerun_after_an_edit_reads_no_other_file_to_hand_files_to_the_early_workers(tmp_path, monkeypatch, reads):
    """Whether a settled file needs libcst is kept with the other answers: the rounds of a rerun do not read the
    attention code the cache holds no migration of (it needs none) to tell."""
    from vllm_attn_compat.codemods.run import stats

    monkeypatch.setattr(stats, "RACY_NS", 0)
    started = _record_warm_pools(monkeypatch)
    helpers = {f"helper{n}.py": HELPER.replace("Helper", f"Helper{n}") for n in range(4)}
    tree = write_tree(tmp_path / "tree", {f"direct{n}.py": DIRECT for n in range(2)} | helpers)
    options = Options(mode="check", jobs=2, cache_dir=str(tmp_path / "cache"))
    run_paths([str(tree)], options)
    (tree / "direct1.py").write_text("# edited\n" + DIRECT)
    reads.clear()
    started.clear()
    report = run_paths([str(tree)], options)
    assert started  # the rerun had an early worker to hand files to
    assert reads == ["direct1.py"]
    uncached = run_paths([str(tree)], Options(mode="check", jobs=1))
    assert sorted(report.findings) == sorted(uncached.findings) and report.changed == uncached.changed
