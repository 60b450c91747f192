"""The forwarders give what the with-output path gives, for 2-D and 3-D inputs and head_size_v != head_size."""

from __future__ import annotations

import warnings

import pytest
import torch

from vllm_attn_compat import compat
from vllm_attn_compat.backends import UnknownLayerError
from vllm_attn_compat.compat import VllmAttnCompatDeprecationWarning

from compat_helpers import causal_attention, random_inputs

pytestmark = pytest.mark.filterwarnings("ignore::vllm_attn_compat.compat.VllmAttnCompatDeprecationWarning")

FORWARDERS = {
    "function": lambda *args: compat.unified_attention(*args),
    "op": lambda *args: torch.ops.vllm_attn_compat.unified_attention(*args),
}


@pytest.mark.parametrize("forwarder", list(FORWARDERS))
@pytest.mark.parametrize("three_d", [False, True], ids=["2d", "3d"])
@pytest.mark.parametrize(
    "shape", [dict(head_size=16), dict(head_size=16, head_size_v=8), dict(num_kv_heads=4, head_size=8)]
)
def test_unified_attention_matches_the_with_output_path(layers, forwarder, three_d, shape):
    layer = layers.attention(**shape)
    q, k, v = random_inputs(layer, 5)
    if three_d:
        q = q.view(5, layer.num_heads, layer.head_size)
        k = k.view(5, layer.num_kv_heads, layer.head_size)
        v = v.view(5, layer.num_kv_heads, layer.head_size_v)
    with layers.context([3, 2]):
        expected = torch.zeros(5, layer.num_heads, layer.head_size_v)
        torch.ops.vllm_attn_compat.unified_attention_with_output(
            q.reshape(expected.shape[0], layer.num_heads, -1),
            k.reshape(5, layer.num_kv_heads, -1),
            v.reshape(5, layer.num_kv_heads, -1),
            expected,
            layer.layer_name,
        )
        result = FORWARDERS[forwarder](q, k, v, layer.layer_name)
    assert result.shape == (5, layer.num_heads * layer.head_size_v)  # the old 2-D result
    torch.testing.assert_close(result, expected.view(5, -1), rtol=0, atol=0)
    # ...and that path is attention: sequence 0 is rows 0-2, sequence 1 rows 3-4.
    heads = (layer.num_heads, layer.num_kv_heads, layer.num_kv_heads)
    q3, k3, v3 = (x.reshape(5, h, -1) for x, h in zip((q, k, v), heads, strict=True))
    reference = torch.cat([causal_attention(q3[s], k3[s], v3[s], layer.scale) for s in (slice(0, 3), slice(3, 5))])
    torch.testing.assert_close(result.view(5, layer.num_heads, -1), reference, atol=2e-5, rtol=2e-5)


def test_each_call_returns_a_fresh_buffer(layers):
    layer = layers.attention()
    q, k, v = random_inputs(layer, 2)
    with layers.context([2]):
        first = compat.unified_attention(q, k, v, layer.layer_name)
        second = compat.unified_attention(q, k, v, layer.layer_name)
    assert first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, second, rtol=0, atol=0)


@pytest.mark.parametrize("forwarder", ["function", "op"])
@pytest.mark.parametrize("three_d", [False, True], ids=["2d", "3d"])
def test_unified_mla_attention_matches_the_with_output_path(layers, forwarder, three_d):
    layer = layers.mla()
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(4, layer.num_heads, layer.qk_head_dim, generator=gen)
    kv_c = torch.randn(4, layer.kv_lora_rank, generator=gen)
    k_pe = torch.randn(4, 1, layer.qk_rope_head_dim, generator=gen)
    with layers.context([4]):
        expected = layer(q, kv_c, k_pe)  # the layer allocates and calls unified_mla_attention_with_output
        args = (q, kv_c, k_pe) if three_d else (q.view(4, -1), kv_c, k_pe.view(4, -1))
        if forwarder == "function":
            result = compat.unified_mla_attention(*args, layer.layer_name)
        else:
            result = torch.ops.vllm_attn_compat.unified_mla_attention(*args, layer.layer_name, kv_cache_dummy_dep=None)
    assert result.shape == (4, layer.num_heads * layer.v_head_dim)
    torch.testing.assert_close(result, expected, rtol=0, atol=0)


def test_wrong_input_shape_names_the_argument_and_both_shapes(layers):
    layer = layers.attention(head_size=16, num_kv_heads=2)
    q, k, v = random_inputs(layer, 3)
    expected = r"key: expected shape \[T, 32\] or \[T, 2, 16\], got \[3, 31\]"
    with layers.context([3]), pytest.raises(ValueError, match=expected):
        compat.unified_attention(q, k[:, :31], v, layer.layer_name)


def test_unknown_layer_is_a_clear_error(layers):
    layer = layers.attention()
    q, k, v = random_inputs(layer, 3)
    with layers.context([3]), pytest.raises(UnknownLayerError, match=r"got 'no.such.layer'"):
        compat.unified_attention(q, k, v, "no.such.layer")


def test_opcheck_of_the_forwarder_op(layers):
    layer = layers.attention(head_size_v=8)
    q, k, v = random_inputs(layer, 3)
    with layers.context([3]), warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        torch.library.opcheck(
            torch.ops.vllm_attn_compat.unified_attention.default,
            (q, k, v, layer.layer_name),
            test_utils=("test_schema", "test_faketensor"),
        )
