"""Helpers of the compat tests (and of benchmarks/bench_compat.py): inputs, a reference, copy counting.

A uniquely named module rather than conftest.py: several test folders have a conftest, and a plain
``from conftest import`` may get another folder's.
"""

from __future__ import annotations

import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode


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


# Counting writes into a tensor's memory, to show how many copies reach an output buffer. A storage-aware
# dispatch mode: it reads each op's schema (alias_info.is_write), so matmul(..., out=output.T) counts as a direct
# write and output.copy_(x) as a copy. Custom ops are opaque to it: run Python-level code (an impl's forward).
class CopiesInto(TorchDispatchMode):
    """Counts the ops that write into ``target``'s storage: ``copies`` (aten.copy_) and ``direct`` (any other)."""

    def __init__(self, target: torch.Tensor):
        super().__init__()
        self.storage = target.untyped_storage().data_ptr()
        self.writes = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema_args = func._schema.arguments
        values = list(args) + [kwargs.get(a.name) for a in schema_args[len(args) :]]
        for arg, value in zip(schema_args, values, strict=True):
            if (
                arg.alias_info is not None
                and arg.alias_info.is_write
                and isinstance(value, torch.Tensor)
                and value.untyped_storage().data_ptr() == self.storage
            ):
                self.writes["copies" if func.overloadpacket is torch.ops.aten.copy_ else "direct"] += 1
        return func(*args, **kwargs)
