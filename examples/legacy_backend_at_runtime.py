"""A backend written for vLLM <= 0.19 (accept_output_buffer = False, returns a new tensor), kept working.

Runs on CPU without vLLM, on this package's reference layer: ``python examples/legacy_backend_at_runtime.py``.
With vLLM >= 0.20 installed next to this package, its plugin does the same inside vLLM.
Run it with ``VLLM_ATTN_COMPAT_WARNINGS=error`` to see what a fork's CI would stop on.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import vllm_attn_compat.compat as compat
from vllm_attn_compat.backends import Attention, AttentionBackend, AttentionImpl, AttentionMetadata, set_forward_context


class MyLegacyImpl(AttentionImpl):
    """Pre-0.20 style: 2-D inputs ``[T, heads * head_size]``, the result returned as a new tensor."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata):
        T = query.shape[0]
        q, k, v = (x.view(T, -1, self.head_size).transpose(0, 1) for x in (query, key, value))
        result = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return result.transpose(0, 1).reshape(T, -1)


class MyLegacyBackend(AttentionBackend):
    accept_output_buffer = False  # the old opt-out of the output buffer: the plugin adapts MyLegacyImpl

    @staticmethod
    def get_name():
        return "my-legacy"

    @staticmethod
    def get_impl_cls():
        return MyLegacyImpl


def main():
    compat.install_into_backends()  # the old flags and the legacy adapter; the plugin does this inside vLLM
    layer = Attention(4, 16, 1 / math.sqrt(16), prefix="model.layers.0.attn", attn_backend=MyLegacyBackend)
    reference = Attention(4, 16, 1 / math.sqrt(16), prefix="model.layers.1.attn", attn_backend="sdpa")
    query, key, value = (torch.randn(6, 4 * 16) for _ in range(3))
    with set_forward_context(AttentionMetadata.from_lengths([6])):
        by_layer = layer(query, key, value)  # vLLM >= 0.20 style: the layer allocates, the adapter fills
        by_old_op = compat.unified_attention(query, key, value, "model.layers.0.attn")  # a pre-0.20 call
        expected = reference(query, key, value)
    print("legacy backend through the layer matches sdpa:", torch.allclose(by_layer, expected, atol=1e-5))
    print("deprecated unified_attention matches sdpa:   ", torch.allclose(by_old_op, expected, atol=1e-5))
    print("MyLegacyBackend.accept_output_buffer reads its own stale value:", MyLegacyBackend.accept_output_buffer)
    print("AttentionBackend.accept_output_buffer reads (with a warning):", AttentionBackend.accept_output_buffer)


if __name__ == "__main__":
    main()
