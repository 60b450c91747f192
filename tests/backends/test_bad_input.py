"""Bad input raises a clear error (argument, expected, actual) and leaves ``output`` unwritten."""

from __future__ import annotations

import pytest
import torch

from vllm_attn_compat.backends import AttentionMetadata, set_forward_context

from backend_helpers import random_qkv

SENTINEL = -5.0
T, H, DV = 4, 4, 8  # layer: 4 heads, head_size 16, 2 kv heads, head_size_v 8


def _buffer(shape, **kw):
    return torch.full(shape, SENTINEL, **kw)


BAD_BUFFERS = {
    "shape": (
        lambda: _buffer((T, H, DV + 1)),
        ValueError,
        r"output: expected shape \[4, 4, 8\] or \[4, 32\], got \[4, 4, 9\]",
    ),
    "tokens": (
        lambda: _buffer((T + 1, H * DV)),
        ValueError,
        r"expected shape \[4, 4, 8\] or \[4, 32\], got \[5, 32\]",
    ),
    "dtype": (
        lambda: _buffer((T, H, DV), dtype=torch.float64),
        TypeError,
        r"output: expected dtype torch.float32 \(the query's\), got torch.float64",
    ),
    "device": (
        lambda: torch.empty((T, H, DV), device="meta"),
        ValueError,
        r"output: expected device cpu \(the query's\), got meta",
    ),
    "last-dim": (
        lambda: _buffer((T, H, 2 * DV))[..., ::2],
        ValueError,
        r"output: expected a contiguous last dimension \(stride 1\), got strides \[64, 16, 2\]",
    ),
    "heads-apart": (
        lambda: _buffer((T, H, 2 * DV))[..., :DV],
        ValueError,
        r"expected the heads of each token packed together \(head stride 8\), got strides \[64, 16, 1\]",
    ),
}


@pytest.mark.parametrize("case", BAD_BUFFERS, ids=list(BAD_BUFFERS))
def test_bad_output_buffer(make_layer, case):
    make, error, message = BAD_BUFFERS[case]
    layer = make_layer(4, 16, 2, 8)
    q, k, v = random_qkv(layer, T)
    output = make()
    before = output.clone() if output.device.type != "meta" else None
    with (
        set_forward_context({layer.layer_name: AttentionMetadata.from_lengths([T])}),
        pytest.raises(error, match=message),
    ):
        layer(q, k, v, output=output)
    if before is not None:
        assert torch.equal(output, before)


def test_row_slice_of_a_wider_buffer_is_accepted(make_layer):
    layer = make_layer(4, 16, 2, 8)
    q, k, v = random_qkv(layer, T)
    wide = _buffer((T, 48))
    with set_forward_context({layer.layer_name: AttentionMetadata.from_lengths([T])}):
        out = layer(q, k, v, output=wide[:, 8:40])
    assert out.data_ptr() == wide[:, 8:].data_ptr()
    assert torch.all(wide[:, :8] == SENTINEL) and torch.all(wide[:, 40:] == SENTINEL)
    assert not torch.any(wide[:, 8:40] == SENTINEL)


def test_bad_query_shape(make_layer):
    layer = make_layer(4, 16, 2, 8)
    with pytest.raises(ValueError, match=r"query: expected shape \[T, 64\] or \[T, 4, 16\], got \[4, 60\]"):
        layer(torch.randn(4, 60), torch.randn(4, 32), torch.randn(4, 16))


BAD_METADATA = {
    "decreasing": (
        dict(num_actual_tokens=3, query_start_loc=[0, 4, 3], seq_lens=[4, 1], max_query_len=4, max_seq_len=4),
        r"query_start_loc: expected non-decreasing cumulative lengths, got \[0, 4, 3\] "
        r"\(entry 2 = 3 < entry 1 = 4\)",
    ),
    "sum": (
        dict(num_actual_tokens=4, query_start_loc=[0, 2, 3], seq_lens=[2, 1], max_query_len=2, max_seq_len=2),
        r"query_start_loc: the query lengths must sum to num_actual_tokens=4, but they sum to 3",
    ),
    "seq-shorter-than-query": (
        dict(num_actual_tokens=3, query_start_loc=[0, 3], seq_lens=[2], max_query_len=3, max_seq_len=3),
        r"seq_lens: sequence 0 has 3 query tokens, so expected seq_lens\[0\] >= 3, got 2",
    ),
    "max-too-small": (
        dict(num_actual_tokens=3, query_start_loc=[0, 3], seq_lens=[3], max_query_len=2, max_seq_len=3),
        r"max_query_len: expected at least 3, got 2",
    ),
    "block-table-too-short": (
        dict(num_actual_tokens=1, query_start_loc=[0, 1], seq_lens=[9], max_query_len=1, max_seq_len=9,
             block_table=[[0, 1]], slot_mapping=[8], block_size=4),
        r"block_table: sequence 0 has 9 tokens, which need 3 blocks of 4, but the block table has 2 columns",
    ),
    "slot-not-in-block-table": (
        dict(num_actual_tokens=2, query_start_loc=[0, 2], seq_lens=[6], max_query_len=2, max_seq_len=6,
             block_table=[[3, 1]], slot_mapping=[4, 18], block_size=4),
        r"slot_mapping: token 1 \(sequence 0, position 5\) expected slot 5 from the block table, got 18",
    ),
    "context-without-cache": (
        dict(num_actual_tokens=1, query_start_loc=[0, 1], seq_lens=[5], max_query_len=1, max_seq_len=5),
        r"block_table: sequences with earlier context .* need a paged KV cache",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_METADATA, ids=list(BAD_METADATA))
def test_inconsistent_metadata_is_refused_when_built(case):
    fields, message = BAD_METADATA[case]
    fields = {k: torch.tensor(v) if isinstance(v, list) else v for k, v in fields.items()}
    with pytest.raises(ValueError, match=message):
        AttentionMetadata(**fields)


def test_block_table_too_short_from_lengths():
    message = r"block_table: sequence 1 has 6 tokens, which need 2 blocks of 4, but the block table has 1 columns"
    with pytest.raises(ValueError, match=message):
        AttentionMetadata.from_lengths([2, 6], block_table=torch.tensor([[0], [1]]), block_size=4)


@pytest.mark.parametrize("backend", [("sdpa", {}), ("flex", {"compile_kernel": False})], ids=["sdpa", "flex"])
def test_metadata_that_does_not_fit_the_step_leaves_output_and_cache_unwritten(make_layer, backend):
    name, options = backend
    layer = make_layer(4, 16, 2, 8, backend=name, **options)
    metadata_cls = layer.attn_backend.get_metadata_cls()
    q, k, v = random_qkv(layer, T)
    output = _buffer((T, H, DV))
    # more tokens in the metadata than rows in the query
    with set_forward_context({layer.layer_name: metadata_cls.from_lengths([3, 2])}):
        message = r"query: attn_metadata.num_actual_tokens=5, expected at most the number of query rows, got 4 rows"
        with pytest.raises(ValueError, match=message):
            layer(q, k, v, output=output)
    # a block table that points past the end of the cache
    layer.allocate_kv_cache(num_blocks=2, block_size=4)
    md = metadata_cls.from_lengths([T], block_table=torch.tensor([[5]]), block_size=4)
    with set_forward_context({layer.layer_name: md}):
        message = r"kv_cache: the block table uses block 5 and slot_mapping slot 23, but the cache has 2 blocks of 4"
        with pytest.raises(ValueError, match=message):
            layer(q, k, v, output=output)
    assert torch.all(output == SENTINEL) and torch.all(layer.kv_cache == 0)


def test_output_quantization_is_refused_before_writing(make_layer):
    layer = make_layer(4, 16, 2, 8)
    q, k, v = random_qkv(layer, T)
    output = _buffer((T, H, DV))
    with set_forward_context({layer.layer_name: AttentionMetadata.from_lengths([T])}):
        message = (
            r"output_scale: the sdpa backend writes unquantized output, expected None, got a tensor of shape \[1\]"
        )
        with pytest.raises(NotImplementedError, match=message):
            torch.ops.vllm_attn_compat.unified_attention_with_output(
                q, k, v, output, layer.layer_name, output_scale=torch.ones(1)
            )
    assert torch.all(output == SENTINEL)
