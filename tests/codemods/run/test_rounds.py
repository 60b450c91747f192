"""The hierarchy's rounds (`run/rounds.py`); how a run's rounds find files is tested on whole runs too
(`test_runner.py`, `test_handoff.py`, `test_bystanders.py`)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_attn_compat.codemods.index.names import guess_module_name
from vllm_attn_compat.codemods.run.answers import question
from vllm_attn_compat.codemods.run.rounds import ClassScans, _Stems

from runner_trees import BASE, IMPL, MANUAL, UNRELATED, write_tree


@pytest.mark.parametrize("known", [frozenset(), frozenset({"Impl"}), frozenset({"B", "A", "Ünïcode"})])
def test_the_class_scan_of_a_round_is_asked_as_its_terms_spell_it(tmp_path, known):
    """The round hashes the names once (`rounds.ClassScans`): the question is `answers.question` of its terms."""
    root = write_tree(tmp_path, {"plugin/__init__.py": "", "plugin/impl.py": IMPL, "loose.py": UNRELATED})
    for path in (str(root / "plugin/impl.py"), "loose.py", "plugin/impl.py"):
        terms = [f"path {path}", f"module {guess_module_name(path)}", *(f"class {name}" for name in known)]
        assert ClassScans(known, None).question(path) == question("scan", terms)  # type: ignore[arg-type]


def test_a_round_with_nothing_to_index_hands_the_settled_files_out_before_it_loads_its_indexes(tmp_path, monkeypatch):
    """A rerun's later rounds find every index in the cache: the file the last round settled (or sends ahead)
    goes to an early worker first, and migrates while the round's indexes load."""
    from vllm_attn_compat.codemods.run import handoff, stats
    from vllm_attn_compat.codemods.run.cache import Cache
    from vllm_attn_compat.codemods.run.runner import Options, run_paths

    monkeypatch.setattr(stats, "RACY_NS", 0)
    layout = {"plugin/__init__.py": "", "plugin/base.py": BASE, "plugin/impl.py": IMPL, "plugin/manual.py": MANUAL}
    tree = write_tree(tmp_path / "tree", layout)
    options = Options(mode="check", jobs=2, cache_dir=str(tmp_path / "cache"))
    run_paths([str(tree)], options)
    events: list[str] = []
    after_round, load_index = handoff.Handoff.after_round, Cache.load_index

    def recording_after_round(self, *args):
        events.append("after_round")
        return after_round(self, *args)

    def recording_load_index(self, key):
        index = load_index(self, key)
        events.append(f"load {os.path.basename(index.path)}" if index is not None else "load nothing")
        return index

    monkeypatch.setattr(handoff.Handoff, "after_round", recording_after_round)
    monkeypatch.setattr(Cache, "load_index", recording_load_index)
    (tree / "plugin/manual.py").write_text("# edited\n" + MANUAL)
    report = run_paths([str(tree)], options)
    # The first round loads base.py's index and indexes manual.py; the second finds impl.py's in the cache.
    assert events[:3] == ["load base.py", "after_round", "load impl.py"]
    uncached = run_paths([str(tree)], Options(mode="check", jobs=1))
    assert sorted(report.findings) == sorted(uncached.findings) and report.changed == uncached.changed


_PARTS = st.sampled_from(["a", "b", "x.b", "__init__", "x.__init__", "b.c", "ops", "layer.ops"])


@given(
    stems=st.lists(st.tuples(st.sampled_from(["", "pkg/", "pkg/sub/"]), _PARTS), max_size=12),
    lasts=st.sets(st.sampled_from(["a", "b", "c", "__init__", "ops", "layer"]), max_size=3),
)
def test_the_files_that_may_define_a_module_are_those_named_for_it_and_every_package(stems, lasts):
    """`rounds._Stems` finds the files a walk over all of them would (a file ``x.b.py`` is a module ``b``, as
    `guess_module_name` takes it), in the run's order."""
    scanned = [SimpleNamespace(source_file=SimpleNamespace(path=f"{folder}{stem}.py")) for folder, stem in stems]

    def named(path: str) -> bool:
        stem = os.path.basename(path).rsplit(".", 1)[0]
        return stem == "__init__" or stem.rpartition(".")[2] in lasts

    found = _Stems(scanned).named(lasts)  # type: ignore[arg-type]
    assert found == [s for s in scanned if named(s.source_file.path)]
