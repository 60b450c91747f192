"""A vLLM ``AttentionBackend`` for one impl class, as an out-of-tree plugin declares it (for the ``vllm`` tier).

Imports vLLM only when called, so test modules of the other tiers can import it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


def backend_for(impl_cls: type, **flags: object) -> type:
    """A fresh subclass of vLLM's ``AttentionBackend`` whose impl is ``impl_cls``, with ``flags`` (e.g.
    ``accept_output_buffer=False``) set as class attributes."""
    from vllm.v1.attention.backend import AttentionBackend

    class Backend(AttentionBackend):
        @staticmethod
        def get_name():
            return "CUSTOM"

        @staticmethod
        def get_impl_cls():
            return impl_cls

        @staticmethod
        def get_builder_cls():
            raise NotImplementedError

        @staticmethod
        def get_kv_cache_shape(*args, **kwargs):
            raise NotImplementedError

        @classmethod
        def supports_head_size(cls, head_size):
            return True

    for name, value in flags.items():
        setattr(Backend, name, value)
    return Backend


# MLA. vLLM's MLAAttention takes no attn_backend (since 0.20): it asks the platform (get_attn_backend(use_mla=True)),
# and neither platform of a CPU machine gives one (CpuPlatform raises "MLA is not supported on CPU."; a CUDA wheel
# on a machine without a GPU resolves to UnspecifiedPlatform, whose empty answer vLLM rejects). An out-of-tree
# platform plugin answers with its backend's class path; `answer_mla_as_a_platform` does the same.
MLA_HEADS, QK_NOPE, QK_ROPE, V_DIM, KV_LORA = 4, 8, 4, 6, 12
_ChosenMLABackend: type | None = None  # what the platform answers, by this path
_CHOSEN = f"{__name__}._ChosenMLABackend"


def mla_backend_for(impl_cls: type) -> type:
    """`backend_for` ``impl_cls``, an MLA backend."""

    class MLABackend(backend_for(impl_cls)):
        @classmethod
        def is_mla(cls):
            return True

    return MLABackend


class UnusedPrefillBackend:
    """A prefill backend the test impls never call (they compute prefill in forward_mha)."""

    def __init__(self, *args, **kwargs):
        pass


def answer_mla_as_a_platform(monkeypatch) -> object:
    """Make the current platform answer MLA backends as an out-of-tree platform does; returns ``use(backend)``,
    which picks the class it answers. (The caller clears vLLM's backend cache when done.)"""
    import sys

    from vllm.model_executor.layers.attention import mla_attention
    from vllm.platforms import current_platform
    from vllm.v1.attention import selector

    module = sys.modules[__name__]
    monkeypatch.setattr(module, "_ChosenMLABackend", None)
    monkeypatch.setattr(
        type(current_platform), "get_attn_backend_cls", classmethod(lambda cls, *a, **k: _CHOSEN), raising=False
    )
    # vLLM 0.21-0.23's MLAAttention also builds a prefill backend for the platform, and the one a GPU-less
    # machine gets needs flash-attn; the test impls compute prefill themselves, so the layer gets a stand-in.
    if hasattr(mla_attention, "get_mla_prefill_backend"):
        monkeypatch.setattr(mla_attention, "get_mla_prefill_backend", lambda vllm_config: UnusedPrefillBackend)

    def use(backend: type) -> None:
        module._ChosenMLABackend = backend
        selector._cached_get_attn_backend.cache_clear()

    return use


def mla_layer(vllm_config, prefix: str, layer_cls: type | None = None):
    """vLLM's ``MLAAttention`` (or ``layer_cls``, a subclass) of the sizes above, built as a model builds it."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    with set_current_vllm_config(vllm_config):
        return (layer_cls or MLAAttention)(
            MLA_HEADS,
            0.3,
            QK_NOPE,
            QK_ROPE,
            V_DIM,
            None,
            KV_LORA,
            kv_b_proj=torch.nn.Linear(KV_LORA, MLA_HEADS * (QK_NOPE + V_DIM)),
            prefix=prefix,
        )


def mla_inputs(n: int):
    """``q, kv_c_normed, k_pe`` of ``n`` tokens (seeded) and metadata of a prefill-only step."""
    from types import SimpleNamespace

    import torch

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(n, MLA_HEADS, QK_NOPE + QK_ROPE, generator=gen)
    kv_c, k_pe = torch.randn(n, KV_LORA, generator=gen), torch.randn(n, 1, QK_ROPE, generator=gen)
    return q, kv_c, k_pe, SimpleNamespace(num_actual_tokens=n, num_decodes=0, num_prefills=1, num_decode_tokens=0)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def plugin_log_lines() -> Iterator[list[str]]:
    """The lines this package's vLLM plugin logs while the block runs, INFO included: from 0.31, importing vLLM
    no longer configures its "vllm" logger (the engine does), so the root logger's WARNING would drop them."""
    from vllm_attn_compat.compat import plugin

    lines = _Lines()
    plugin.logger.addHandler(lines)
    level = plugin.logger.level
    plugin.logger.setLevel(logging.INFO)
    try:
        yield lines.lines
    finally:
        plugin.logger.setLevel(level)
        plugin.logger.removeHandler(lines)
