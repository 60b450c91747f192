"""Backends by name. Entries are import paths, so a backend module (and its optional
dependency, e.g. flash-attn) is imported only when a layer asks for it."""

from __future__ import annotations

import importlib

from vllm_attn_compat.backends.abstract import AttentionBackend

_BACKENDS: dict[str, str] = {
    "sdpa": "vllm_attn_compat.backends.sdpa:SDPABackend",
    "flex": "vllm_attn_compat.backends.flex:FlexAttentionBackend",
    "flash": "vllm_attn_compat.backends.flash:FlashAttentionBackend",
    "mla_reference": "vllm_attn_compat.backends.mla:ReferenceMLABackend",
}


def register_backend(name: str, class_path: str) -> None:
    """Add (or replace) a backend, given as ``"package.module:ClassName"``."""
    if ":" not in class_path:
        raise ValueError(f"class_path: expected 'package.module:ClassName', got {class_path!r}")
    _BACKENDS[name] = class_path


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def get_backend(name: str | type[AttentionBackend]) -> type[AttentionBackend]:
    """The backend class for ``name``; a backend class passes through unchanged."""
    if isinstance(name, type) and issubclass(name, AttentionBackend):
        return name
    if name not in _BACKENDS:
        raise ValueError(f"backend: expected one of {available_backends()}, got {name!r}")
    module_name, _, class_name = _BACKENDS[name].partition(":")
    backend = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(backend, type) and issubclass(backend, AttentionBackend)):
        raise TypeError(
            f"backend {name!r}: expected {_BACKENDS[name]} to be an AttentionBackend subclass, got {backend!r}"
        )
    return backend
