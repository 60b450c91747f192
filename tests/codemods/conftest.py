"""Fixtures for the runner and CLI tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner_trees import BASE, IMPL, UNRELATED, write_tree


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    """A plugin whose impl needs a safe fix, next to a file no rule may touch."""
    return write_tree(
        tmp_path / "proj",
        {"plugin/__init__.py": "", "plugin/base.py": BASE, "plugin/impl.py": IMPL, "plugin/helpers.py": UNRELATED},
    )
