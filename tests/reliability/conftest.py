"""Fixtures shared by the reliability suites."""

from __future__ import annotations

import ast

import pytest

from .cli_run import LEGACY, run_cli


@pytest.fixture(scope="session")
def migrated_legacy(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """What `migrate` makes of cli_run.LEGACY on its own: the outcome bad neighbours must not change."""
    tree = tmp_path_factory.mktemp("reference")
    (tree / "legacy.py").write_bytes(LEGACY)
    result = run_cli("migrate", "legacy.py", "--jobs", "1", cwd=tree)
    assert result.returncode in (0, 1), result.stdout.decode() + result.stderr.decode()
    migrated = (tree / "legacy.py").read_bytes()
    ast.parse(migrated)
    return migrated
