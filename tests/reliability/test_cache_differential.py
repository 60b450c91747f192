"""The cache against no cache: after any edit, a run with ``--cache-dir`` reports and rewrites exactly what a run
without it does.

A cached migration serves a later run only if that run's class hierarchy answers every question the
migration asked the same (`codemods/index/questions.py`). The oracle here knows nothing of that: it runs the
real runner twice over the same edited tree, once with the cache left by a run over the tree before the
edit and once without any, and compares their reports and diffs. The trees are generated plugins whose
methods callers in another file use in every way (`legacy_callers`), so the edits move, add and remove the
calls that withhold fixes; an edit replaces the backend, the callers or both with another plugin's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hypothesis import given, note
from hypothesis import strategies as st

from vllm_attn_compat.codemods.run.runner import Options, run_paths

from .legacy_callers import STUBS, GeneratedPlugin, plugins_with_callers
from .profile import reliability_settings

EDITABLE = ("plugin/backend.py", "plugin/callers.py")


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _run(tree: Path, mode: str, cache: Path | None) -> tuple[list, list, list, list[str]]:
    diffs: list[str] = []
    options = Options(mode=mode, jobs=1, cache_dir=None if cache is None else str(cache))
    report = run_paths([str(tree)], options, emit_diff=diffs.append)
    return sorted(report.findings), sorted(report.changed), sorted(report.errors), diffs


@reliability_settings(ci=15, long=800)
@given(
    before=plugins_with_callers(),
    after=plugins_with_callers(),
    edited=st.sets(st.sampled_from(EDITABLE), min_size=1),
    mode=st.sampled_from(["check", "diff"]),
)
def test_after_an_edit_a_cached_run_reports_what_an_uncached_run_does(
    before: GeneratedPlugin, after: GeneratedPlugin, edited: set[str], mode: str, tmp_path_factory
) -> None:
    root = tmp_path_factory.mktemp("cached")
    _write(root / "stubs", STUBS)
    tree = root / "tree"
    _write(tree, before.files)
    cache = root / "cache"
    _run(tree, mode, cache)
    _write(tree, {path: after.files[path] for path in edited})
    for path in sorted(edited):
        note(f"--- {path}\n{after.files[path]}")
    assert _run(tree, mode, cache) == _run(tree, mode, None)
    shutil.rmtree(root)
