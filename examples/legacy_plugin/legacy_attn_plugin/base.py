"""The plugin's own base classes; its backends in other modules derive from these only."""

from typing import Optional

import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl


class PluginBackend(AttentionBackend):
    """What every backend of this plugin shares."""

    forward_includes_kv_cache_update = True

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_builder_cls():
        raise NotImplementedError("this example runs without a KV cache")

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return head_size % 8 == 0


class PluginImpl(AttentionImpl):
    """Stores the layer geometry vLLM passes to every impl."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, *args, **kwargs):
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads or num_heads

    def split_heads(self, query, key, value):
        """``[T, heads * D]`` or ``[T, heads, D]`` inputs as ``[heads, T, D]`` views."""
        tokens = query.shape[0]
        q = query.view(tokens, self.num_heads, -1).transpose(0, 1)
        k = key.view(tokens, self.num_kv_heads, -1).transpose(0, 1)
        v = value.view(tokens, self.num_kv_heads, -1).transpose(0, 1)
        return q, k, v

    def causal_sdpa(self, query, key, value) -> torch.Tensor:
        """Causal attention of one sequence, laid out ``[T, heads, Dv]``."""
        q, k, v = self.split_heads(query, key, value)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.scale, enable_gqa=self.num_kv_heads != self.num_heads
        )
        return out.transpose(0, 1)

    def forward(
        self,
        layer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata,
        output: Optional[torch.Tensor] = None,
        output_scale: Optional[torch.Tensor] = None,
        output_block_scale: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        raise NotImplementedError
