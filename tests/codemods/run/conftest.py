"""Fixtures of the runner's tests."""

from __future__ import annotations

import os

import pytest

from vllm_attn_compat.codemods.run import sources, worker


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


@pytest.fixture
def indexed(monkeypatch) -> list[str]:
    """The names of the files the hierarchy pass parsed in this process."""
    done: list[str] = []
    real = worker.index_file

    def counted(source: bytes, path: str, *more: bool):
        done.append(os.path.basename(path))
        return real(source, path, *more)

    monkeypatch.setattr(worker, "index_file", counted)
    return done
