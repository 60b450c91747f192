"""Parallel runs give exactly the result of `--jobs 1`; a worker that dies on one file costs that file only."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from .cli_run import LEGACY, PLAIN, legacy_variant, run_cli, snapshot

# Imported at interpreter start-up in the tool's process and, through fork or spawn, in its workers:
# wraps the engine so that one chosen file kills (or breaks) the process migrating it.
_SITECUSTOMIZE = textwrap.dedent("""
    import os
    import vllm_attn_compat.codemods.engine.migrate as _engine

    _migrate_source = _engine.migrate_source

    def migrate_source(source, *, path, **kwargs):
        if "crash_me" in path:
            os._exit(70)  # a worker dying without a word, as a segfault or the OOM killer would
        if "raise_me" in path:
            raise RuntimeError("injected failure")
        return _migrate_source(source, path=path, **kwargs)

    _engine.migrate_source = migrate_source
""")


def _tree(root: Path, extra: dict[str, bytes] = {}) -> dict[str, bytes]:  # noqa: B006 - read only
    files = {f"pkg{i % 3}/backend_{i}.py": legacy_variant(i) for i in range(20)}
    files.update({f"pkg{i % 3}/plain_{i}.py": PLAIN for i in range(5)})
    files.update(extra)
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    return files


def _records(output: bytes) -> tuple[list, dict]:
    report = json.loads(output)
    records = sorted(json.dumps(r, sort_keys=True) for r in report.get("findings", report.get("records", [])))
    summary = {k: v for k, v in report.items() if k not in ("findings", "records")}
    return records, summary


@pytest.mark.parametrize("mode", [(), ("--check", "--unsafe-fixes")], ids=["write", "check-unsafe"])
def test_parallel_run_equals_serial_run(tmp_path: Path, mode: tuple[str, ...]) -> None:
    _tree(tmp_path / "serial")
    shutil.copytree(tmp_path / "serial", tmp_path / "parallel")
    serial = run_cli("migrate", ".", "--jobs", "1", "--format", "json", *mode, cwd=tmp_path / "serial")
    parallel = run_cli("migrate", ".", "--jobs", "3", "--format", "json", *mode, cwd=tmp_path / "parallel")
    assert serial.returncode == parallel.returncode, (serial.stderr + parallel.stderr).decode()
    assert snapshot(tmp_path / "serial") == snapshot(tmp_path / "parallel")
    assert _records(serial.stdout) == _records(parallel.stdout)


@pytest.mark.parametrize("victim", ["crash_me", "raise_me"])
def test_a_failing_worker_costs_one_file(tmp_path: Path, victim: str) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    tree = tmp_path / "tree"
    files = _tree(tree, {f"pkg1/{victim}.py": LEGACY})

    result = run_cli("migrate", ".", "--jobs", "2", cwd=tree, extra_pythonpath=str(hooks), timeout=120)
    report = (result.stdout + result.stderr).decode(errors="replace")

    assert result.returncode == 2, report
    assert f"pkg1/{victim}.py:" in report, f"the failing file is not named:\n{report}"
    after = snapshot(tree)
    assert after[f"pkg1/{victim}.py"] == LEGACY, "the file whose worker failed was changed"
    unmigrated = [n for n, c in files.items() if n.startswith("pkg") and "backend_" in n and after[n] == c]
    assert not unmigrated, f"files lost with the failing worker: {unmigrated}\n{report}"
    assert all(after[n] == PLAIN for n in files if "plain_" in n)
