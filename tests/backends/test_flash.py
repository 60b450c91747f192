"""The flash backend: a clear error where it cannot run, numerics and zero copies where it can."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from vllm_attn_compat.backends import AttentionMetadata, set_forward_context
from vllm_attn_compat.backends.flash import FlashUnavailableError

from backend_helpers import expected_prefill, random_qkv, reference_attention

HAS_CUDA = torch.cuda.is_available()
HAS_FLASH = importlib.util.find_spec("flash_attn") is not None
needs_flash = pytest.mark.skipif(
    not (HAS_CUDA and HAS_FLASH),
    reason=f"needs a CUDA device ({'found' if HAS_CUDA else 'none'}) and flash-attn "
    f"({'installed' if HAS_FLASH else 'not installed'})",
)


@pytest.mark.skipif(HAS_CUDA and HAS_FLASH, reason="flash-attn and CUDA are both present here")
def test_missing_pieces_are_named(make_layer):
    with pytest.raises(FlashUnavailableError) as info:
        make_layer(4, 16, backend="flash")
    message = str(info.value)
    assert ("CUDA device" in message) == (not HAS_CUDA)
    assert ("flash-attn package" in message) == (not HAS_FLASH)


@pytest.mark.cuda
@needs_flash
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_flash_prefill_writes_into_output(make_layer, dtype):
    layer = make_layer(8, 64, 2, backend="flash")
    query_lens = [17, 3, 40]
    q, k, v = (x.cuda() for x in random_qkv(layer, sum(query_lens) + 4, dtype))
    buffer = torch.full((len(q), 8, 64), 5.0, dtype=dtype, device="cuda")
    md = AttentionMetadata.from_lengths(query_lens, device="cuda")
    with set_forward_context({layer.layer_name: md}):
        out = layer(q, k, v, output=buffer)
    assert out.data_ptr() == buffer.data_ptr()
    expected = expected_prefill(layer, q.cpu(), k.cpu(), v.cpu(), query_lens, causal=True)
    torch.testing.assert_close(buffer[:60].double().cpu(), expected, atol=2e-2, rtol=2e-2)
    assert torch.all(buffer[60:] == 5.0)


@pytest.mark.cuda
@needs_flash
def test_flash_decode_from_paged_cache(make_layer):
    layer = make_layer(8, 64, 2, backend="flash")
    layer.allocate_kv_cache(num_blocks=4, block_size=256, dtype=torch.bfloat16, device="cuda")
    block_table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32, device="cuda")
    seqs = [[x.cuda() for x in random_qkv(layer, n, torch.bfloat16, seed=i)] for i, n in enumerate([300, 9])]
    done = [0, 0]
    for step in ([299, 8], [1, 1]):
        seq_lens = [d + s for d, s in zip(done, step, strict=True)]
        md = AttentionMetadata.from_lengths(step, seq_lens, block_table=block_table, block_size=256, device="cuda")
        q, k, v = (torch.cat([s[j][d:e] for s, d, e in zip(seqs, done, seq_lens, strict=True)]) for j in range(3))
        with set_forward_context({layer.layer_name: md}):
            out = layer(q, k, v).view(-1, 8, 64)
        expected = torch.cat(
            [reference_attention(s[0][d:e].cpu(), s[1][:e].cpu(), s[2][:e].cpu(), 1 / math.sqrt(64), True)
             for s, d, e in zip(seqs, done, seq_lens, strict=True)]
        )  # fmt: skip
        torch.testing.assert_close(out.double().cpu(), expected, atol=2e-2, rtol=2e-2)
        done = seq_lens


def test_result_returned_elsewhere_is_copied_in_and_aliased_result_is_not():
    from vllm_attn_compat.backends.flash import _ensure_written

    out = torch.zeros(3, 2, 8)
    aliased = [out, torch.empty(2, 3)]  # what varlen_fwd returns when it wrote into out
    out.fill_(1.0)
    _ensure_written(out, aliased)
    assert torch.all(out == 1.0)
    elsewhere = torch.full((3, 2, 8), 2.0)  # flash-attn 2's swapped GQA decode path
    _ensure_written(out, [elsewhere, torch.empty(2, 3)])
    assert torch.equal(out, elsewhere)
