"""The reference MLA backend against a float64 decompress-then-attend reference."""

from __future__ import annotations

import pytest
import torch

from vllm_attn_compat.backends import AttentionMetadata, MLAAttention, set_forward_context

from backend_helpers import TOLERANCES, reference_attention

SENTINEL = 99.0
H, NOPE, ROPE, V, LORA = 4, 8, 4, 6, 12


@pytest.fixture
def mla_layer(layer_name):
    def make(dtype):
        torch.manual_seed(0)
        layer = MLAAttention(H, (NOPE + ROPE) ** -0.5, NOPE, ROPE, V, LORA, prefix=layer_name("test.mla"))
        return layer.to(dtype)

    return make


def _inputs(num_tokens, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(num_tokens, H, NOPE + ROPE), (num_tokens, LORA), (num_tokens, 1, ROPE)]
    return [torch.randn(s, generator=gen).to(dtype) for s in shapes]


def _reference(layer, q, kv_c, k_pe):
    """One sequence: decompress in float64 with the layer's weight, then softmax(QK^T)V."""
    weight = layer.kv_b_proj.weight.double()
    kv = (kv_c.double() @ weight.T).view(-1, H, NOPE + V)
    key = torch.cat([kv[..., :NOPE], k_pe.double().expand(-1, H, ROPE)], -1)
    return reference_attention(q, key, kv[..., NOPE:], layer.scale, causal=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_mla_prefill_then_decode_from_latent_cache(mla_layer, dtype):
    layer = mla_layer(dtype)
    assert (layer.num_heads, layer.v_head_dim, layer.head_size) == (H, V, LORA + ROPE)
    layer.allocate_kv_cache(num_blocks=6, block_size=4, dtype=dtype)
    block_table = torch.tensor([[3, 1], [0, 5]], dtype=torch.int32)
    seqs = [_inputs(7, dtype, seed=1), _inputs(5, dtype, seed=2)]
    done = [0, 0]
    for step in ([6, 4], [1, 1]):
        seq_lens = [d + s for d, s in zip(done, step, strict=True)]
        md = AttentionMetadata.from_lengths(step, seq_lens, block_table=block_table, block_size=4)
        q, kv_c, k_pe = (torch.cat([s[j][d:e] for s, d, e in zip(seqs, done, seq_lens, strict=True)]) for j in range(3))
        output = torch.full((len(q) + 2, H * V), SENTINEL, dtype=dtype)
        pad = lambda x: torch.cat([x, x[:2]])  # noqa: E731  two padding rows
        with set_forward_context({layer.layer_name: md}):
            result = layer(pad(q), pad(kv_c), pad(k_pe), output=output)
        assert result.data_ptr() == output.data_ptr() and result.shape == (len(q) + 2, H * V)
        expected = torch.cat(
            [_reference(layer, s[0][d:e], s[1][:e], s[2][:e]) for s, d, e in zip(seqs, done, seq_lens, strict=True)]
        ).flatten(1)
        torch.testing.assert_close(output[: len(q)].double(), expected, **TOLERANCES[dtype])
        assert torch.all(output[len(q) :] == SENTINEL)
        done = seq_lens


def test_mla_layer_rejects_a_standard_backend(layer_name):
    with pytest.raises(TypeError, match="expected a backend with an MLAAttentionImpl, got 'sdpa'"):
        MLAAttention(H, 1.0, NOPE, ROPE, V, LORA, prefix=layer_name(), attn_backend="sdpa")
