"""Files whose migration is settled go to the early workers while the hierarchy rounds go on."""

from __future__ import annotations

import os

from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module
from vllm_attn_compat.codemods.run import prefork, worker
from vllm_attn_compat.codemods.run.handoff import Handoff, settles
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

    def index_file(source, path, keep=False):
        events.append(("index", path.rsplit("/", 1)[1]))
        return real_index(source, path, keep)

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


def _sends(monkeypatch) -> list[str]:
    """The files sent to an early worker to migrate, in order (by their names), from now on."""
    sent: list[str] = []
    real_send = Handoff.send

    def send(self, path, source, pickled, to):
        sent.append(path.rsplit("/", 1)[1])
        real_send(self, path, source, pickled, to)

    monkeypatch.setattr(Handoff, "send", send)
    return sent


def _relative(report, root) -> list[tuple[object, ...]]:
    """The report's findings, the paths in them relative to ``root``, in order (workers finish in any)."""
    return sorted(
        (os.path.relpath(path, root), f.line, f.column, f.code, f.message.replace(str(root), ""), f.status.value)
        for path, f in report.findings
    )


# `output=None` on a backend, and a caller that does not pass it in a file that names nothing of vLLM: the caller
# is read only once the rounds have settled (`rounds.index_hierarchy`), so the file is sent ahead of it.
CALLER = "def step(impl, q):\n    return impl.forward()\n"


def test_a_file_sent_ahead_of_the_last_round_is_migrated_again_when_a_later_round_changes_its_answers(
    tmp_path, monkeypatch
):
    sent = _sends(monkeypatch)
    layout = {"plugin/__init__.py": "", "plugin/base.py": BASE_WITH_DEFAULT, "plugin/runner.py": CALLER}
    ahead, alone = write_tree(tmp_path / "a", layout), write_tree(tmp_path / "b", layout)
    report = run_paths([str(ahead)], Options(mode="check", jobs=2))
    # Sent while the worker was idle, with the first round's hierarchy (no caller: the fix looked safe), then
    # again with the last round's.
    assert sent == ["base.py", "base.py"]
    expected = run_paths([str(alone)], Options(mode="check", jobs=1))
    assert report.errors == expected.errors == []
    assert _relative(report, ahead) == _relative(expected, alone)
    assert report.changed == [] and expected.changed == []
    (withheld,) = [f for path, f in report.findings if path.endswith("base.py")]
    assert withheld.code == "VAC002" and "runner.py:2 does not pass `output`" in withheld.message


def test_a_file_sent_ahead_whose_answers_the_last_round_gives_alike_is_migrated_once(tmp_path, monkeypatch):
    sent = _sends(monkeypatch)
    caller = CALLER.replace("impl.forward()", "impl.forward(output=q)")
    layout = {"plugin/__init__.py": "", "plugin/base.py": BASE_WITH_DEFAULT, "plugin/runner.py": caller}
    ahead, alone = write_tree(tmp_path / "a", layout), write_tree(tmp_path / "b", layout)
    report = run_paths([str(ahead)], Options(jobs=2))
    assert sent == ["base.py"]
    expected = run_paths([str(alone)], Options(jobs=1))
    assert report.errors == expected.errors == []
    assert _relative(report, ahead) == _relative(expected, alone)
    assert report.changed == [str(ahead / "plugin/base.py")]
    migrated = (ahead / "plugin/base.py").read_bytes()
    assert migrated == (alone / "plugin/base.py").read_bytes() != BASE_WITH_DEFAULT.encode()


def test_with_more_jobs_than_early_workers_a_file_sent_ahead_in_vain_is_migrated_again_in_this_process(
    tmp_path, monkeypatch
):
    """The other jobs take a share (`runner._early_share`), the early workers' answers come last
    (`Handoff.results`): a file whose answers changed is left to `runner._from_early`, which migrates it."""
    # Eight more candidates, none of which the rounds send anywhere (no class: the scan spares them, and only
    # a rule acting anywhere reads them), so that the base alone goes ahead, whatever order the rounds end in.
    layout = {"plugin/__init__.py": "", "plugin/base.py": BASE_WITH_DEFAULT, "plugin/runner.py": CALLER}
    layout |= {f"plugin/ops{n}.py": "from vllm_attn_compat.compat import adapt_legacy_impl\n" for n in range(8)}
    ahead, alone = write_tree(tmp_path / "a", layout), write_tree(tmp_path / "b", layout)
    sent = _sends(monkeypatch)
    left: list[str] = []
    real_results = Handoff.results

    def results(self, hierarchy):
        yield from real_results(self, hierarchy)
        left.extend(os.path.basename(path) for path, _ in self.left)

    monkeypatch.setattr(Handoff, "results", results)
    report = run_paths([str(ahead)], Options(mode="check", jobs=3))
    # Ahead, before the others' share: once (it is migrated again here, not sent again).
    assert sent[0] == "base.py" and sent.count("base.py") == 1 and left == ["base.py"]
    expected = run_paths([str(alone)], Options(mode="check", jobs=1))
    assert report.errors == expected.errors == []
    assert _relative(report, ahead) == _relative(expected, alone)
    (withheld,) = [f for path, f in report.findings if path.endswith("base.py")]
    assert "runner.py:2 does not pass `output`" in withheld.message


def test_a_file_sent_ahead_is_answered_only_where_the_last_rounds_hierarchy_gives_its_answers_alike(tmp_path):
    """`Handoff.results` (the workers are not all the jobs): a file whose answers changed is left to migrate again."""
    from vllm_attn_compat.codemods.registry import all_rules

    layout = {"plugin/__init__.py": "", "plugin/base.py": BASE_WITH_DEFAULT, "plugin/runner.py": CALLER}
    root = write_tree(tmp_path, layout)
    path, source = str(root / "plugin/base.py"), BASE_WITH_DEFAULT.encode()
    first = ClassHierarchy.build([_index(BASE_WITH_DEFAULT, path)])
    last = ClassHierarchy.build([_index(BASE_WITH_DEFAULT, path), _index(CALLER, str(root / "plugin/runner.py"))])
    for settled, answered, left in ((first, [path], []), (last, [], [(path, source)])):
        early = Handoff([prefork.PreforkedWorker(worker.preload)], all_rules(), False, limit=None)
        early.ahead[path] = source
        early.send(path, source, early.settings(first), 0)
        assert [key for key, _ in early.results(settled)] == answered
        assert early.left == left


def test_the_last_files_go_to_the_worker_that_is_free_not_by_their_size(monkeypatch):
    from vllm_attn_compat.codemods.registry import all_rules
    from vllm_attn_compat.codemods.run.handoff import Handoff

    from pool_tasks import remember_pid, slow_by_name

    monkeypatch.setattr(worker, "migrate_file", slow_by_name)
    early = Handoff([prefork.PreforkedWorker(remember_pid) for _ in range(2)], all_rules(), False, limit=None)
    # The largest file costs the most time, whatever its size says: by size, the worker taking it would take
    # two or three of the others too; handed out as the workers finish, one waits behind it, at most.
    files = [("slow-1.5.py", bytes(50_000))] + [(f"fast{n}.py", bytes(10_000)) for n in range(8)]
    answers = dict(early.stream(files, ClassHierarchy.build([])))
    assert sorted(answers) == sorted(path for path, _ in files) and early.left == []
    slow_pid = answers["slow-1.5.py"][1]
    assert sum(pid == slow_pid for _, pid in answers.values()) == 2
    assert not any(process.running() for process in early.workers)  # stopped


def test_a_worker_takes_the_files_it_holds_the_tree_of_first_then_nobodys_then_the_others():
    from collections import deque

    from vllm_attn_compat.codemods.registry import all_rules
    from vllm_attn_compat.codemods.run.handoff import Handoff

    early = Handoff([], all_rules(), False, limit=None)
    early.holders = {"a.py": 0, "b.py": 1, "c.py": 0}
    queue = deque([("b.py", b"333"), ("x.py", b"22"), ("a.py", b"11"), ("c.py", b"0")])  # largest first
    taken = [early._next(queue, 0, [0, 1])[0] for _ in range(4)]
    assert taken == ["a.py", "c.py", "x.py", "b.py"] and not queue
    # A holder that runs no more holds nothing: its files are anybody's, largest first.
    queue = deque([("b.py", b"1"), ("x.py", b"0")])
    assert early._next(queue, 0, [0])[0] == "b.py"


def test_a_file_is_migrated_where_it_was_indexed_on_the_tree_the_index_parsed(tmp_path, monkeypatch):
    import os

    from vllm_attn_compat.codemods.engine import statements

    log = tmp_path / "parses.log"
    real_keep, real_parse = statements.keep, statements.parse

    def write(line: str) -> None:
        with open(log, "a") as out:  # one short append per line: the processes do not interleave
            out.write(line + "\n")

    def keep(source, tree):
        real_keep(source, tree)
        write(f"keep {os.getpid()} {hash(source)}")  # the forked workers share the parent's hash seed

    def parse(source):
        kept = source in statements._kept
        write(f"{'kept' if kept else 'parse'} {os.getpid()} {hash(source)}")
        return real_parse(source)

    monkeypatch.setattr(statements, "keep", keep)  # the forked workers inherit both
    monkeypatch.setattr(statements, "parse", parse)
    # Backends deriving from vLLM's base: all indexed in the first round, by both early workers.
    direct = IMPL.replace("from plugin.base import", "from vllm.v1.attention.backend import AttentionImpl as")
    root = write_tree(tmp_path / "tree", {f"impl{n}.py": direct + f"\n# {n}\n" for n in range(10)})
    report = run_paths([str(root)], Options(mode="check", jobs=2))
    assert report.errors == [] and len(report.changed) == 10
    lines = [line.split() for line in log.read_text().splitlines()]
    kept = {source: pid for event, pid, source in lines if event == "keep"}
    used = [(pid, source) for event, pid, source in lines if event == "kept"]
    assert len(kept) == 10 and len({pid for pid in kept.values()}) == 2  # indexed in both early workers
    # Every file kept was migrated by the worker that kept it, without a second parse.
    assert sorted(used) == sorted((pid, source) for source, pid in kept.items())
    assert not [source for event, _, source in lines if event == "parse" and source in kept]


def test_a_file_declaring_the_flag_waits_for_the_last_round(tmp_path):
    """Whether its deletion is safe depends on every subclass and base of the run (`flag_readers`), which later
    rounds may add to."""
    flagged = BASE.replace("    pass\n", "    accept_output_buffer = True\n")
    write_tree(tmp_path, {"plugin/__init__.py": "", "plugin/base.py": flagged})
    index = _index(flagged, str(tmp_path / "plugin/base.py"))
    assert not settles(index, ClassHierarchy.build([index]))
    assert settles(_index(BASE, str(tmp_path / "plugin/base.py")), ClassHierarchy.build([index]))
