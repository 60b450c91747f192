"""Property test: any valid batch (lengths, context, block placement) matches the reference."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_attn_compat.backends import (
    STATIC_FORWARD_CONTEXT,
    Attention,
    AttentionMetadata,
    set_forward_context,
)

from backend_helpers import TOLERANCES, reference_attention

BLOCK_SIZE, BLOCKS_PER_SEQ = 4, 4


@st.composite
def batches(draw):
    num_seqs = draw(st.integers(1, 3))
    seqs = []
    for _ in range(num_seqs):
        total = draw(st.integers(1, BLOCK_SIZE * BLOCKS_PER_SEQ))
        seqs.append((draw(st.integers(1, total)), total))  # (new tokens, tokens after this step)
    placement = draw(st.permutations(range(num_seqs * BLOCKS_PER_SEQ)))
    padding = draw(st.integers(0, 2))
    heads = draw(st.sampled_from([(2, 2), (4, 2), (4, 1)]))
    return seqs, placement, padding, heads


@settings(max_examples=25, deadline=None)
@given(batches(), st.integers(0, 2**16))
def test_paged_sdpa_matches_reference(batch, seed):
    seqs, placement, padding, (num_heads, num_kv_heads) = batch
    layer = Attention(num_heads, 8, 1 / math.sqrt(8), num_kv_heads, prefix="property.attn", head_size_v=4)
    try:
        gen = torch.Generator().manual_seed(seed)
        layer.allocate_kv_cache(len(placement), BLOCK_SIZE)
        table = torch.tensor(placement).view(len(seqs), BLOCKS_PER_SEQ)
        shapes = ((num_heads, 8), (num_kv_heads, 8), (num_kv_heads, 4))  # q, k, v: heads, size
        full = [[torch.randn(total, h, d, generator=gen) for h, d in shapes] for _, total in seqs]
        # earlier context goes in first, through the same layer, as one prefill step
        context = [total - new for new, total in seqs]
        if any(context):
            md = AttentionMetadata.from_lengths(context, context, block_table=table, block_size=BLOCK_SIZE)
            with set_forward_context(md):
                layer(*(torch.cat([s[j][:c] for s, c in zip(full, context, strict=True)]) for j in range(3)))
        md = AttentionMetadata.from_lengths(
            [n for n, _ in seqs], [t for _, t in seqs], block_table=table, block_size=BLOCK_SIZE
        )
        q, k, v = (torch.cat([s[j][c:] for s, c in zip(full, context, strict=True)]) for j in range(3))
        output = torch.full((len(q) + padding, num_heads, 4), 7.0)
        pad = lambda x: torch.cat([x, x[:1].expand(padding, *x.shape[1:])])  # noqa: E731
        with set_forward_context(md):
            layer(pad(q), pad(k), pad(v), output=output)
        expected = torch.cat(
            [reference_attention(s[0][c:], s[1], s[2], layer.scale, True) for s, c in zip(full, context, strict=True)]
        )
        torch.testing.assert_close(output[: len(q)].double(), expected, **TOLERANCES[torch.float32])
        assert torch.all(output[len(q) :] == 7.0)
    finally:
        STATIC_FORWARD_CONTEXT.pop("property.attn", None)
