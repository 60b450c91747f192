"""The torch.library ops: schemas as vLLM's, opcheck, fakes, and the plain Python bodies."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vllm_attn_compat.backends import (
    AttentionMetadata,
    MLAAttention,
    set_forward_context,
    unified_attention_with_output,
)

from backend_helpers import random_qkv

OPS = torch.ops.vllm_attn_compat
OPCHECK_TESTS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


def test_schemas_mark_output_as_mutated_and_return_nothing():
    for op, first in [
        (OPS.unified_attention_with_output, ["query", "key", "value"]),
        (OPS.unified_mla_attention_with_output, ["q", "kv_c_normed", "k_pe"]),
    ]:
        schema = op.default._schema
        names = [a.name for a in schema.arguments]
        tail = ["output", "layer_name", "output_scale", "output_block_scale", "kv_cache_dummy_dep"]
        assert names == [*first, *tail]
        written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        assert written == ["output", "output_block_scale"]
        assert schema.returns == []


@pytest.mark.vllm
def test_argument_names_match_vllm():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs the real vLLM package (scripts/install-vllm-tier.sh)")
    import vllm.model_executor.layers.attention.attention  # registers torch.ops.vllm
    import vllm.model_executor.layers.attention.mla_attention  # noqa: F401

    for name in ("unified_attention_with_output", "unified_mla_attention_with_output"):
        ours = [a.name for a in getattr(OPS, name).default._schema.arguments]
        theirs = [a.name for a in getattr(torch.ops.vllm, name).default._schema.arguments]
        assert theirs[: len(ours)] == ours  # vLLM's MLA op appends quantization options after these


@pytest.mark.parametrize("sliced", [False, True], ids=["buffer", "slice-of-buffer"])
def test_opcheck_attention(make_layer, sliced):
    layer = make_layer(4, 16, 2, 8)
    q, k, v = random_qkv(layer, 6)
    output = torch.empty(12, 4, 8)[:6] if sliced else torch.empty(6, 4, 8)
    with set_forward_context({layer.layer_name: AttentionMetadata.from_lengths([2, 4])}):
        args = (q, k, v, output, layer.layer_name)
        torch.library.opcheck(OPS.unified_attention_with_output.default, args, test_utils=OPCHECK_TESTS)


def test_opcheck_mla_on_paged_cache(layer_name):
    layer = MLAAttention(2, 0.3, 8, 4, 6, 10, prefix=layer_name("test.mla")).requires_grad_(False)
    layer.allocate_kv_cache(num_blocks=3, block_size=4)
    md = AttentionMetadata.from_lengths([5], block_table=torch.tensor([[2, 0]]), block_size=4)
    q, kv_c, k_pe = torch.randn(5, 2, 12), torch.randn(5, 10), torch.randn(5, 1, 4)
    args = (q, kv_c, k_pe, torch.empty(5, 2, 6), layer.layer_name)
    with set_forward_context({layer.layer_name: md}):
        torch.library.opcheck(OPS.unified_mla_attention_with_output.default, args, test_utils=OPCHECK_TESTS)


def test_fake_impls_run_without_a_forward_context():
    """torch.compile traces with fake tensors; the fakes must not look the layer up."""
    with FakeTensorMode():
        q, k, v, out = torch.empty(3, 2, 8), torch.empty(3, 2, 8), torch.empty(3, 2, 8), torch.empty(3, 2, 8)
        assert OPS.unified_attention_with_output(q, k, v, out, "not-registered") is None
        latent, k_pe = torch.empty(3, 10), torch.empty(3, 1, 4)
        assert OPS.unified_mla_attention_with_output(q, latent, k_pe, out, "not-registered") is None


def test_python_body_and_op_write_the_same_result(make_layer):
    layer = make_layer(4, 16)
    q, k, v = random_qkv(layer, 5)
    via_op, via_function = torch.full((5, 4, 16), 3.0), torch.full((5, 4, 16), 4.0)
    with set_forward_context({layer.layer_name: AttentionMetadata.from_lengths([5])}):
        assert OPS.unified_attention_with_output(q, k, v, via_op, layer.layer_name) is None
        assert unified_attention_with_output(q, k, v, via_function, layer.layer_name) is None
    torch.testing.assert_close(via_op, via_function, rtol=0, atol=0)
