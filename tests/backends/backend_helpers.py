"""Test helpers for the backends: a float64 softmax(QK^T)V reference and input factories."""

from __future__ import annotations

import torch

# Tolerances against the float64 reference: fp32 kernels agree to ~1e-6; bf16 inputs are
# exact in float64, so the error is bf16 rounding of intermediates and of the output
# (8 mantissa bits: ~4e-3 relative, a few units of that after softmax and accumulation).
TOLERANCES = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


def reference_attention(q, k, v, scale, causal):
    """float64 softmax(QK^T)V for one sequence: q [Tq, H, D], k [S, Hkv, D], v [S, Hkv, Dv].

    The query's rows are the sequence's last Tq positions (so S - Tq earlier ones are context).
    """
    q, k, v = (x.double() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if causal:
        rows = torch.arange(q.shape[0])[:, None] + (k.shape[0] - q.shape[0])
        scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > rows, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def random_qkv(layer, num_tokens, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [
        (num_tokens, layer.num_heads, layer.head_size),
        (num_tokens, layer.num_kv_heads, layer.head_size),
        (num_tokens, layer.num_kv_heads, layer.head_size_v),
    ]
    return [torch.randn(s, generator=gen).to(dtype) for s in shapes]


def expected_prefill(layer, q, k, v, query_lens, causal):
    """Reference output rows for a packed prefill batch (no earlier context)."""
    rows, start = [], 0
    for n in query_lens:
        end = start + n
        rows.append(reference_attention(q[start:end], k[start:end], v[start:end], layer.scale, causal))
        start = end
    return torch.cat(rows)
