"""torch.compile(fullgraph=True) over the layers: no graph breaks, no copy of the output."""

from __future__ import annotations

import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from vllm_attn_compat.backends import AttentionMetadata, MLAAttention, set_forward_context

from backend_helpers import random_qkv

OP = "torch.ops.vllm_attn_compat.unified_attention_with_output.default"
MLA_OP = "torch.ops.vllm_attn_compat.unified_mla_attention_with_output.default"


def _call_body(code: str) -> str:
    """The generated ``call`` function only: the module header defines unrelated helpers."""
    return code[code.find("def call(self, args)") : code.find("runner = Runner")]


def _compile_and_inspect(fn, *args):
    torch._dynamo.reset()
    breaks = torch._dynamo.explain(fn)(*args).graph_break_count
    torch._dynamo.reset()
    result, (code,) = run_and_get_code(torch.compile(fn, fullgraph=True), *args)
    return breaks, result, _call_body(code)


@pytest.mark.parametrize("caller_buffer", [True, False], ids=["caller-buffer", "layer-allocates"])
def test_attention_layer_compiles_without_breaks_or_output_copies(make_layer, caller_buffer):
    layer = make_layer(4, 16, 2, 8)
    q, k, v = (x.flatten(1) for x in random_qkv(layer, 7))
    md = AttentionMetadata.from_lengths([3, 4])
    with set_forward_context({layer.layer_name: md}):
        eager = layer(q, k, v)
        if caller_buffer:
            buffer = torch.zeros(16, 32)[:7]  # a slice of a persistent buffer
            into_buffer = lambda q, k, v, b: layer(q, k, v, output=b)  # noqa: E731
            breaks, result, body = _compile_and_inspect(into_buffer, q, k, v, buffer)
            assert result.data_ptr() == buffer.data_ptr()
        else:
            breaks, result, body = _compile_and_inspect(layer, q, k, v)
    assert breaks == 0
    torch.testing.assert_close(result, eager)
    assert body.count(OP) == 1
    assert not re.search(r"copy_|clone|cpp_fused", body), body
    # the only allocation is the layer's own output buffer, and only when it allocates
    assert body.count("empty_strided") == (0 if caller_buffer else 1), body


def test_mla_layer_compiles_without_breaks_or_output_copies(layer_name):
    torch.manual_seed(0)
    layer = MLAAttention(2, 0.3, 8, 4, 6, 10, prefix=layer_name("test.mla"))
    q, kv_c, k_pe = torch.randn(5, 2, 12), torch.randn(5, 10), torch.randn(5, 1, 4)
    buffer = torch.zeros(5, 12)
    # vLLM runs models without autograd; with grad enabled, the kv_b_proj weight would make
    # AOTAutograd trace a training graph, which copies mutated inputs back after the call.
    md = AttentionMetadata.from_lengths([5])
    with set_forward_context({layer.layer_name: md}), torch.no_grad():
        eager = layer(q, kv_c, k_pe)
        breaks, result, body = _compile_and_inspect(lambda q, c, p, b: layer(q, c, p, output=b), q, kv_c, k_pe, buffer)
    assert breaks == 0
    torch.testing.assert_close(result, eager)
    assert body.count(MLA_OP) == 1 and not re.search(r"copy_|clone|empty_strided|cpp_fused", body), body
