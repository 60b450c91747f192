"""Backends by name, imported on first use."""

from __future__ import annotations

import pytest

from vllm_attn_compat.backends import AttentionBackend, available_backends, get_backend, register_backend
from vllm_attn_compat.backends.registry import _BACKENDS


def test_builtin_backends_resolve_to_their_classes():
    assert {"sdpa", "flex", "flash", "mla_reference"} <= set(available_backends())
    for name in ("sdpa", "flex", "flash", "mla_reference"):
        backend = get_backend(name)
        assert issubclass(backend, AttentionBackend) and backend.get_name() == name
    assert not hasattr(get_backend("sdpa"), "accept_output_buffer")  # removed in vLLM 0.20


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"backend: expected one of \[.*'sdpa'.*\], got 'sdpa2'"):
        get_backend("sdpa2")


def test_registered_path_must_name_a_backend_class(monkeypatch):
    monkeypatch.setitem(_BACKENDS, "x", "")  # restored afterwards
    register_backend("x", "vllm_attn_compat.backends.sdpa:SDPAImpl")
    with pytest.raises(TypeError, match=r"backend 'x': expected .*SDPAImpl to be an AttentionBackend subclass"):
        get_backend("x")
    with pytest.raises(ValueError, match=r"class_path: expected 'package.module:ClassName', got 'nocolon'"):
        register_backend("x", "nocolon")
