"""Fixtures of the runner's tests."""

from __future__ import annotations

import os

import pytest

from vllm_attn_compat.codemods.run import sources


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """Every file read as source, by any part of the run."""
    read: list[str] = []
    original = sources.read_source

    def recording(path: str):
        read.append(os.path.basename(path))
        return original(path)

    monkeypatch.setattr(sources, "read_source", recording)
    return read
