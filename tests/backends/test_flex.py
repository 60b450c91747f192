"""The flex backend's two kernels: compiled without an epilogue, eager with ``out_transform``."""

from __future__ import annotations

import warnings

import pytest
import torch

from vllm_attn_compat.backends import AttentionMetadata, set_forward_context
from vllm_attn_compat.backends.flex import FlexAttentionMetadata

from backend_helpers import TOLERANCES, expected_prefill, random_qkv

SENTINEL = -77.0


def _reference_lse(layer, q, k, query_lens, causal):
    """float64 log-sum-exp of the scaled scores per row and head: [H, n]."""
    rows, start = [], 0
    for n in query_lens:
        qs, ks = q[start : start + n].double(), k[start : start + n].double()
        ks = ks.repeat_interleave(q.shape[1] // k.shape[1], 1)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * layer.scale
        if causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        rows.append(scores.logsumexp(-1))
        start += n
    return torch.cat(rows, dim=1)


def test_compiled_kernel_matches_reference(make_layer):
    layer = make_layer(4, 16, 2, 8, backend="flex")  # compile_kernel=True is the default
    query_lens = [5, 11]
    q, k, v = random_qkv(layer, sum(query_lens) + 2)
    output = torch.full((len(q), 4, 8), SENTINEL)
    md = FlexAttentionMetadata.from_lengths(query_lens)
    with set_forward_context({layer.layer_name: md}):
        layer(q, k, v, output=output)
    expected = expected_prefill(layer, q, k, v, query_lens, causal=True)
    torch.testing.assert_close(output[:16].double(), expected, **TOLERANCES[torch.float32])
    assert torch.all(output[16:] == SENTINEL)


def test_compiled_kernel_serves_more_shapes_than_dynamo_recompiles(make_layer):
    """Each step of a server brings a new token count, each a new shape for the static-shape kernel: past
    dynamo's recompile limit (8 by default; 2 here, to keep the test short) the layer still answers."""
    layer = make_layer(2, 8, backend="flex")
    torch._dynamo.reset()  # the limit counts the compiled entries of flex_attention in this process
    # `config.patch`, not monkeypatch: newer pytest deletes on undo an attribute a module serves through
    # `__getattr__`, as torch's config does, and later compiles then fail for want of the key.
    try:
        with torch._dynamo.config.patch(recompile_limit=2):
            for query_lens in ([3], [2, 2], [5], [1, 6]):
                q, k, v = random_qkv(layer, sum(query_lens))
                output = torch.full((len(q), 2, 8), SENTINEL)
                md = FlexAttentionMetadata.from_lengths(query_lens)
                with set_forward_context({layer.layer_name: md}), warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # past the limit: the unfused kernel warns
                    layer(q, k, v, output=output)
                expected = expected_prefill(layer, q, k, v, query_lens, causal=True)
                torch.testing.assert_close(output.double(), expected, **TOLERANCES[torch.float32])
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_out_transform_receives_output_and_lse(make_layer, dtype):
    """A sink-style epilogue out * sigmoid(lse): both inputs must be the true values."""
    seen = {}

    def out_transform(out, lse):
        seen["lse"] = lse
        return out * torch.sigmoid(lse).unsqueeze(-1).to(out.dtype)

    layer = make_layer(4, 16, 2, 16, backend="flex", out_transform=out_transform)
    query_lens = [4, 6]
    q, k, v = random_qkv(layer, sum(query_lens), dtype)
    output = torch.empty(len(q), 4, 16, dtype=dtype)
    md = FlexAttentionMetadata.from_lengths(query_lens)
    with set_forward_context({layer.layer_name: md}), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # eager flex warns that it is unfused
        layer(q, k, v, output=output)
    lse = _reference_lse(layer, q, k, query_lens, causal=True)  # [H, n]
    torch.testing.assert_close(seen["lse"][0].double(), lse, atol=1e-4, rtol=1e-4)
    expected = expected_prefill(layer, q, k, v, query_lens, causal=True) * torch.sigmoid(lse.T)[..., None]
    torch.testing.assert_close(output.double(), expected, **TOLERANCES[dtype])


def test_out_transform_of_wrong_shape_leaves_output_unwritten(make_layer):
    layer = make_layer(2, 8, backend="flex", out_transform=lambda out, lse: out[..., :1])
    q, k, v = random_qkv(layer, 3)
    output = torch.full((3, 2, 8), SENTINEL)
    with set_forward_context({layer.layer_name: FlexAttentionMetadata.from_lengths([3])}):
        message = r"out_transform: expected .*\[1, 2, 3, 8\].*\[1, 2, 3, 1\]"
        with warnings.catch_warnings(), pytest.raises(ValueError, match=message):
            warnings.simplefilter("ignore", UserWarning)
            layer(q, k, v, output=output)
    assert torch.all(output == SENTINEL)


def test_plain_metadata_is_rejected_before_writing(make_layer):
    layer = make_layer(2, 8, backend="flex")
    q, k, v = random_qkv(layer, 3)
    output = torch.full((3, 2, 8), SENTINEL)
    with (
        set_forward_context({layer.layer_name: AttentionMetadata.from_lengths([3])}),
        pytest.raises(TypeError, match="expected FlexAttentionMetadata, got AttentionMetadata"),
    ):
        layer(q, k, v, output=output)
    assert torch.all(output == SENTINEL)
