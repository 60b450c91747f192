"""The hierarchy's rounds (`run/rounds.py`); how a run's rounds find files is tested on whole runs too
(`test_runner.py`, `test_handoff.py`, `test_bystanders.py`)."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.index.names import guess_module_name
from vllm_attn_compat.codemods.run.answers import question
from vllm_attn_compat.codemods.run.rounds import ClassScans

from runner_trees import IMPL, UNRELATED, write_tree


@pytest.mark.parametrize("known", [frozenset(), frozenset({"Impl"}), frozenset({"B", "A", "Ünïcode"})])
def test_the_class_scan_of_a_round_is_asked_as_its_terms_spell_it(tmp_path, known):
    """The round hashes the names once (`rounds.ClassScans`): the question is `answers.question` of its terms."""
    root = write_tree(tmp_path, {"plugin/__init__.py": "", "plugin/impl.py": IMPL, "loose.py": UNRELATED})
    for path in (str(root / "plugin/impl.py"), "loose.py", "plugin/impl.py"):
        terms = [f"path {path}", f"module {guess_module_name(path)}", *(f"class {name}" for name in known)]
        assert ClassScans(known, None).question(path) == question("scan", terms)  # type: ignore[arg-type]
