"""Every backend against the float64 softmax(QK^T)V reference, through the layer and the op."""

from __future__ import annotations

import pytest
import torch

from vllm_attn_compat.backends import set_forward_context

from backend_helpers import TOLERANCES, expected_prefill, random_qkv, reference_attention

# flex runs its eager kernel here (compile_kernel=False): compiling flex takes ~20 s per
# shape on a small CPU; the compiled kernel has its own test in test_flex.py.
BACKENDS = [
    pytest.param(("sdpa", {}), id="sdpa"),
    pytest.param(("flex", {"compile_kernel": False}), id="flex-eager"),
]
DTYPES = [torch.float32, torch.bfloat16]
SENTINEL = 1234.5  # exactly representable in bf16: padding rows must still hold it afterwards


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(
    "heads",
    [(4, 4, 16, 16), (4, 2, 16, 8), (6, 1, 8, 12)],
    ids=["mha", "gqa-dv<d", "mqa-dv>d"],
)
def test_packed_prefill_mixed_lengths(make_layer, backend, dtype, causal, heads):
    num_heads, num_kv_heads, head_size, head_size_v = heads
    name, options = backend
    layer = make_layer(num_heads, head_size, num_kv_heads, head_size_v, backend=name, **options)
    query_lens = [3, 7, 1, 5]
    padded_tokens = sum(query_lens) + 3  # CUDA-graph-style padding rows after the real tokens
    q, k, v = random_qkv(layer, padded_tokens, dtype)
    output = torch.full((padded_tokens, num_heads * layer.head_size_v), SENTINEL, dtype=dtype)
    md = layer.attn_backend.get_metadata_cls().from_lengths(query_lens, causal=causal)

    with set_forward_context({layer.layer_name: md}):
        result = layer(q.flatten(1), k.flatten(1), v.flatten(1), output=output)

    assert result.data_ptr() == output.data_ptr()
    n = md.num_actual_tokens
    expected = expected_prefill(layer, q, k, v, query_lens, causal).flatten(1)
    torch.testing.assert_close(result[:n].double(), expected, **TOLERANCES[dtype])
    assert torch.all(output[n:] == SENTINEL), "rows beyond num_actual_tokens were written"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_reads_the_paged_cache(make_layer, backend, dtype):
    """Prefill writes each sequence into scattered cache blocks; the decode step then passes
    only the new token and must read the earlier ones back from the cache."""
    name, options = backend
    layer = make_layer(4, 16, 2, 8, backend=name, **options)
    block_size = 4
    layer.allocate_kv_cache(num_blocks=8, block_size=block_size, dtype=dtype)
    block_table = torch.tensor([[5, 0, 7], [2, 6, 1]], dtype=torch.int32)
    prompt_lens, steps = [6, 9], [[1, 1], [1, 2]]  # decode, then decode mixed with a 2-token chunk
    total = [p + sum(s[i] for s in steps) for i, p in enumerate(prompt_lens)]
    seqs = [random_qkv(layer, n, dtype, seed=10 + i) for i, n in enumerate(total)]

    done = [0, 0]
    for step_lens in [prompt_lens, *steps]:
        seq_lens = [d + n for d, n in zip(done, step_lens, strict=True)]
        md = layer.attn_backend.get_metadata_cls().from_lengths(
            step_lens, seq_lens, block_table=block_table, block_size=block_size
        )
        q, k, v = (torch.cat([s[j][d:e] for s, d, e in zip(seqs, done, seq_lens, strict=True)]) for j in range(3))
        output = torch.full((len(q) + 1, layer.num_heads, layer.head_size_v), SENTINEL, dtype=dtype)
        padding = lambda x: torch.cat([x, x[:1]])  # noqa: E731  one padding row after the real tokens
        with set_forward_context({layer.layer_name: md}):
            layer(padding(q), padding(k), padding(v), output=output)
        expected = torch.cat(
            [
                reference_attention(s[0][d:e], s[1][:e], s[2][:e], layer.scale, causal=True)
                for s, d, e in zip(seqs, done, seq_lens, strict=True)
            ]
        )
        torch.testing.assert_close(output[: len(q)].double(), expected, **TOLERANCES[dtype])
        assert torch.all(output[len(q) :] == SENTINEL)
        done = seq_lens
