"""Files sent to the early workers ahead of the last round (`run/handoff.py`) migrate exactly as after it:
generated plugins whose methods callers in other files use in every way (`legacy_callers`; callers that
name nothing of vLLM are read only once the rounds settle) give the same findings and the same rewritten
files with early workers as in one process without them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import event, given, note

from vllm_attn_compat.codemods.run import handoff
from vllm_attn_compat.codemods.run.runner import Options, run_paths

from .legacy_callers import STUBS, GeneratedPlugin, plugins_with_callers
from .profile import reliability_settings


def _run(root: Path, jobs: int) -> tuple[list[object], list[str], dict[str, bytes]]:
    report = run_paths([str(root)], Options(mode="write", jobs=jobs))
    assert report.errors == []
    findings = sorted(
        (os.path.relpath(path, root), f.line, f.column, f.code, f.message.replace(str(root), ""), f.status)
        for path, f in report.findings
    )
    files = {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*.py"))}
    return findings, sorted(os.path.relpath(path, root) for path in report.changed), files


@reliability_settings(ci=12, long=300)
@given(plugin=plugins_with_callers())
def test_early_workers_migrate_every_file_as_one_process_does(
    plugin: GeneratedPlugin, tmp_path_factory: pytest.TempPathFactory
) -> None:
    roots = {jobs: tmp_path_factory.mktemp(f"jobs{jobs}") for jobs in (1, 2)}
    for root in roots.values():
        for relative, text in {**STUBS, **plugin.files}.items():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_text(text)
    for relative, text in plugin.files.items():
        note(f"--- {relative} ---\n{text}")
    sent_ahead, again = [], []
    real_after_round, real_holds = handoff.Handoff.after_round, handoff.Handoff._holds

    def after_round(self, *args):
        real_after_round(self, *args)
        sent_ahead.extend(self.ahead)

    def holds(self, key, result, hierarchy):
        if not real_holds(self, key, result, hierarchy):
            again.append(key)
            return False
        return True

    with pytest.MonkeyPatch.context() as patched:  # (a fixture would last across hypothesis's examples)
        patched.setattr(handoff.Handoff, "after_round", after_round)
        patched.setattr(handoff.Handoff, "_holds", holds)
        assert _run(roots[2], jobs=2) == _run(roots[1], jobs=1)
    # (`--hypothesis-show-statistics`: in CI's examples, each sends a file ahead, and some migrate it again;
    # test_handoff.py takes both paths on purpose.)
    event("a file sent ahead" if sent_ahead else "none sent ahead")
    event("migrated again" if again else "none migrated again")
