"""The hierarchy's rounds (`run/rounds.py`); how a run's rounds find files is tested on whole runs too
(`test_runner.py`, `test_cache.py`)."""

from __future__ import annotations

import os
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from vllm_attn_compat.codemods.run.rounds import _Stems

_PARTS = st.sampled_from(["a", "b", "x.b", "__init__", "x.__init__", "b.c", "ops", "layer.ops"])


@given(
    stems=st.lists(st.tuples(st.sampled_from(["", "pkg/", "pkg/sub/"]), _PARTS), max_size=12),
    lasts=st.sets(st.sampled_from(["a", "b", "c", "__init__", "ops", "layer"]), max_size=3),
)
def test_the_files_that_may_define_a_module_are_those_named_for_it_and_every_package(stems, lasts):
    """`rounds._Stems` finds the files a walk over all of them would (a file ``x.b.py`` is a module ``b``, as
    `guess_module_name` takes it), in the run's order."""
    scanned = [SimpleNamespace(path=f"{folder}{stem}.py") for folder, stem in stems]

    def named(path: str) -> bool:
        stem = os.path.basename(path).rsplit(".", 1)[0]
        return stem == "__init__" or stem.rpartition(".")[2] in lasts

    found = _Stems(scanned).named(lasts)  # type: ignore[arg-type]
    assert found == [s for s in scanned if named(s.path)]
