"""Files whose migration is settled go to the early workers while the hierarchy rounds go on."""

from __future__ import annotations

from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module
from vllm_attn_compat.codemods.run import prefork, worker
from vllm_attn_compat.codemods.run.handoff import settles
from vllm_attn_compat.codemods.run.runner import Options, run_paths

from runner_trees import BASE, IMPL, IMPL_MIGRATED, write_tree

# An attention class next to a helper class that derives from nothing vLLM: a later round could
# still turn the helper into an attention class, so this file waits for the last round.
MIXED = IMPL.replace("class MyImpl(PluginImplBase):", "class Helper:\n    pass\n\n\nclass MyImpl(PluginImplBase):")
BASE_WITH_FIX = BASE.replace("    pass\n", "    def forward(self, output):\n        assert output is not None\n")
# `output=None`: calls found in later rounds may withhold the fix that makes it required (callsites).
BASE_WITH_DEFAULT = BASE.replace("    pass\n", "    def forward(self, output=None):\n        return output\n")


def _index(source: str, path: str):
    return index_module(source.encode(), path)


def test_a_file_settles_when_its_classes_are_all_attention_classes_or_it_has_none(tmp_path):
    write_tree(tmp_path, {"plugin/__init__.py": "", "plugin/base.py": BASE, "plugin/impl.py": IMPL})
    base = _index(BASE, str(tmp_path / "plugin/base.py"))
    impl = _index(IMPL, str(tmp_path / "plugin/impl.py"))
    mixed = _index(MIXED, str(tmp_path / "plugin/mixed.py"))
    hierarchy = ClassHierarchy.build([base, impl, mixed])
    assert settles(base, hierarchy) and settles(impl, hierarchy)
    assert not settles(mixed, hierarchy)
    assert settles(_index("X = 1\n", str(tmp_path / "plain.py")), hierarchy)
    with_default = _index(BASE_WITH_DEFAULT, str(tmp_path / "plugin/base.py"))
    assert not settles(with_default, ClassHierarchy.build([with_default]))
    # Before impl.py's own round, its class is not known to derive from anything.
    assert not settles(impl, ClassHierarchy.build([impl]))


def test_settled_files_are_sent_before_the_later_rounds_and_the_result_is_the_same(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_index, real_submit = worker.index_file, prefork.PreforkedWorker.submit

    def index_file(source, path):
        events.append(("index", path.rsplit("/", 1)[1]))
        return real_index(source, path)

    def submit(self, key, function, arguments):
        events.append(("send", key.rsplit("/", 1)[1]))
        real_submit(self, key, function, arguments)

    monkeypatch.setattr(worker, "index_file", index_file)
    monkeypatch.setattr(prefork.PreforkedWorker, "submit", submit)
    layout = {"plugin/__init__.py": "", "plugin/base.py": BASE_WITH_FIX, "plugin/impl.py": IMPL}
    layout["plugin/mixed.py"] = MIXED
    pooled, alone = write_tree(tmp_path / "a", layout), write_tree(tmp_path / "b", layout)

    pooled_report = run_paths([str(pooled)], Options(jobs=2))
    assert events.index(("send", "base.py")) < events.index(("index", "impl.py"))  # round 1, then round 2
    assert events.index(("send", "impl.py")) > events.index(("index", "impl.py"))
    assert events[-1] == ("send", "mixed.py")  # after the last round

    alone_report = run_paths([str(alone)], Options(jobs=1))
    assert pooled_report.errors == alone_report.errors == []
    assert pooled_report.changed == [str(pooled / f"plugin/{n}.py") for n in ("base", "impl", "mixed")]
    assert sorted(f for _, f in pooled_report.findings) == sorted(f for _, f in alone_report.findings)
    for relative in layout:
        assert (pooled / relative).read_bytes() == (alone / relative).read_bytes()
    assert (pooled / "plugin/impl.py").read_text() == IMPL_MIGRATED


def test_the_last_files_go_to_the_worker_that_is_free_not_by_their_size(monkeypatch):
    from vllm_attn_compat.codemods.registry import all_rules
    from vllm_attn_compat.codemods.run.handoff import Handoff

    from pool_tasks import remember_pid, slow_by_name

    monkeypatch.setattr(worker, "migrate_file", slow_by_name)
    early = Handoff([prefork.PreforkedWorker(remember_pid) for _ in range(2)], all_rules(), False, limit=None)
    # The largest file costs the most time, whatever its size says: by size, the worker taking it would take
    # two or three of the others too; handed out as the workers finish, one waits behind it, at most.
    files = [("slow-1.5.py", bytes(50_000))] + [(f"fast{n}.py", bytes(10_000)) for n in range(8)]
    answers = dict(early.stream(files, early.settings(ClassHierarchy.build([]))))
    assert sorted(answers) == sorted(path for path, _ in files) and early.left == []
    slow_pid = answers["slow-1.5.py"][1]
    assert sum(pid == slow_pid for _, pid in answers.values()) == 2
    assert not any(process.running() for process in early.workers)  # stopped
