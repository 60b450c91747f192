"""A two-sequence prefill, then a decode step from the paged cache, through the layer and the op.

Run: python examples/attention_layer.py   (CPU is enough; prints what it checks)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from vllm_attn_compat.backends import Attention, AttentionMetadata, set_forward_context

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 8, 2, 64, 16


def main() -> None:
    torch.manual_seed(0)
    scale = 1 / math.sqrt(HEAD_SIZE)
    layer = Attention(NUM_HEADS, HEAD_SIZE, scale, NUM_KV_HEADS, prefix="model.layers.0.attn")
    layer.allocate_kv_cache(num_blocks=8, block_size=BLOCK_SIZE)
    block_table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)  # 3 blocks per sequence

    # Step 1: prefill two prompts of 20 and 13 tokens, packed into one batch of 33 rows.
    prompt = AttentionMetadata.from_lengths([20, 13], block_table=block_table, block_size=BLOCK_SIZE)
    q, k, v = (torch.randn(33, heads * HEAD_SIZE) for heads in (NUM_HEADS, NUM_KV_HEADS, NUM_KV_HEADS))
    with set_forward_context({layer.layer_name: prompt}):
        out = layer(q, k, v)  # the layer allocates [33, 8, 64] once and returns its 2-D view
    print(f"prefill: output {tuple(out.shape)}")

    # Step 2: one new token per sequence, written into a caller-owned buffer that is larger
    # than the batch (as with CUDA-graph padding); rows past the 2 real tokens stay as they were.
    decode = AttentionMetadata.from_lengths([1, 1], [21, 14], block_table=block_table, block_size=BLOCK_SIZE)
    q, k, v = (torch.randn(4, heads * HEAD_SIZE) for heads in (NUM_HEADS, NUM_KV_HEADS, NUM_KV_HEADS))
    buffer = torch.zeros(4, NUM_HEADS * HEAD_SIZE)
    with set_forward_context({layer.layer_name: decode}):
        result = layer(q, k, v, output=buffer)
    assert result.data_ptr() == buffer.data_ptr(), "the layer wrote into the caller's buffer"
    assert torch.count_nonzero(buffer[2:]) == 0, "padding rows were left alone"
    print(f"decode: wrote rows 0-1 of the caller's {tuple(buffer.shape)} buffer, padding untouched")

    # The same step through the op itself, as a compiled graph or a forwarder calls it.
    op_output = torch.empty(2, NUM_HEADS, HEAD_SIZE)
    with set_forward_context({layer.layer_name: decode}):
        torch.ops.vllm_attn_compat.unified_attention_with_output(
            q[:2].view(2, NUM_HEADS, HEAD_SIZE),
            k[:2].view(2, NUM_KV_HEADS, HEAD_SIZE),
            v[:2].view(2, NUM_KV_HEADS, HEAD_SIZE),
            op_output,
            layer.layer_name,
        )
    torch.testing.assert_close(op_output.flatten(1), buffer[:2])
    print("op: torch.ops.vllm_attn_compat.unified_attention_with_output gives the same rows")


if __name__ == "__main__":
    main()
