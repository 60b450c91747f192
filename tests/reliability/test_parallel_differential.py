"""Worker processes change nothing: generated plugins whose methods callers in other files use in every way
(`legacy_callers`; callers that name nothing of vLLM are read only once the rounds settle) give the same findings
and the same rewritten files when every file is indexed and migrated in the run's pool as in one process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, note

from vllm_attn_compat.codemods.run import parallel
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
def test_worker_processes_migrate_every_file_as_one_process_does(
    plugin: GeneratedPlugin, tmp_path_factory: pytest.TempPathFactory
) -> None:
    roots = {jobs: tmp_path_factory.mktemp(f"jobs{jobs}") for jobs in (1, 2)}
    for root in roots.values():
        for relative, text in {**STUBS, **plugin.files}.items():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_text(text)
    for relative, text in plugin.files.items():
        note(f"--- {relative} ---\n{text}")
    with pytest.MonkeyPatch.context() as patched:  # (a fixture would last across hypothesis's examples)
        patched.setattr(parallel, "IN_PROCESS_BELOW", 1)  # the pool, however few the files
        assert _run(roots[2], jobs=2) == _run(roots[1], jobs=1)
