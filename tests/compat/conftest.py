"""Fixtures for the compat tests: isolated warn-once state, layers of this package's backends, copy counting."""

from __future__ import annotations

import collections
import itertools
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vllm_attn_compat.compat  # noqa: F401  (installs the removed flags on this package's classes)
from vllm_attn_compat.backends import Attention, AttentionMetadata, MLAAttention, set_forward_context
from vllm_attn_compat.compat import deprecation, forwarders

_names = itertools.count()


@pytest.fixture(autouse=True)
def fresh_warning_state(monkeypatch):
    """Each test starts with no call site reported yet and the default warning mode."""
    monkeypatch.setattr(deprecation, "_reported", set())
    monkeypatch.delenv(deprecation.ENV_WARNINGS, raising=False)


@pytest.fixture(autouse=True)
def package_route():
    """Forwarders go to this package's backends (a vLLM-tier test may have routed them to vLLM)."""
    previous = forwarders.set_route(forwarders.Route())
    yield
    forwarders.set_route(previous)


@pytest.fixture
def layers():
    """A private layer registry; ``make(...)`` builds an Attention in it, ``context(...)`` activates it."""

    class Layers(dict):
        def attention(self, num_heads=4, head_size=16, num_kv_heads=2, head_size_v=None, backend="sdpa"):
            return Attention(
                num_heads, head_size, 1 / math.sqrt(head_size), num_kv_heads, prefix=f"compat.attn.{next(_names)}",
                head_size_v=head_size_v, attn_backend=backend, static_forward_context=self,
            )

        def mla(self, num_heads=4, qk_nope=8, qk_rope=4, v_head_dim=6, kv_lora_rank=12):
            pytest.importorskip("vllm_attn_compat.backends.mla", reason="the MLA reference backend is not there")
            return MLAAttention(
                num_heads, 0.3, qk_nope, qk_rope, v_head_dim, kv_lora_rank,
                prefix=f"compat.mla.{next(_names)}", static_forward_context=self,
            )

        def context(self, query_lens):
            return set_forward_context(AttentionMetadata.from_lengths(query_lens), self)

    return Layers()


def random_inputs(layer, num_tokens, seed=0):
    """2-D ``[T, heads * size]`` query, key and value for ``layer``, as the old no-output path passed them."""
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(num_tokens, heads * size, generator=gen)
        for heads, size in (
            (layer.num_heads, layer.head_size),
            (layer.num_kv_heads, layer.head_size),
            (layer.num_kv_heads, layer.head_size_v),
        )
    ]


def causal_attention(q, k, v, scale):
    """float64 causal softmax(QK^T)V of one sequence: q ``[T, H, D]``, k ``[T, Hkv, D]``, v ``[T, Hkv, Dv]``."""
    q, k, v = (x.double() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    T = q.shape[0]
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).float()


class CopiesInto(TorchDispatchMode):
    """Counts the ops that write into ``target``'s storage: ``copies`` (aten.copy_) and ``direct`` (any other)."""

    def __init__(self, target: torch.Tensor):
        super().__init__()
        self.storage = target.untyped_storage().data_ptr()
        self.writes = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema_args = func._schema.arguments
        values = list(args) + [kwargs.get(a.name) for a in schema_args[len(args):]]
        for arg, value in zip(schema_args, values):
            if (
                arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.Tensor)
                and value.untyped_storage().data_ptr() == self.storage
            ):
                self.writes["copies" if func.overloadpacket is torch.ops.aten.copy_ else "direct"] += 1
        return func(*args, **kwargs)
