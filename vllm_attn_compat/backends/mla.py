"""Reference multi-head latent attention (MLA) behind ``unified_mla_attention_with_output``.

The cache holds each token's latent ``kv_c_normed`` and rotary ``k_pe``; attention first
decompresses the latent through the layer's ``kv_b_proj`` into per-head ``k_nope`` and
``v``, appends the shared ``k_pe`` to every head's key, then runs the sdpa backend's padded
attention, whose final gather writes straight into ``output[:num_actual_tokens]`` (no copy).
Clarity over speed: real MLA kernels absorb ``kv_b_proj`` into the query for decode instead
of decompressing every cached token.
"""

from __future__ import annotations

import torch

from vllm_attn_compat.backends.abstract import (
    AttentionBackend,
    MLAAttentionImpl,
    MLALayer,
    reject_output_quantization,
)
from vllm_attn_compat.backends.metadata import AttentionMetadata
from vllm_attn_compat.backends.paged import gather_kv
from vllm_attn_compat.backends.sdpa import padded_sdpa_into


def decompress(layer: MLALayer, latent: torch.Tensor, k_pe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head keys ``[..., H, nope + rope]`` and values ``[..., H, v_head_dim]`` from the
    latent ``[..., kv_lora_rank]`` and ``k_pe`` ``[..., 1, rope]``."""
    kv: torch.Tensor | tuple[torch.Tensor, ...] = layer.kv_b_proj(latent)
    if isinstance(kv, tuple):  # vLLM's parallel linear layers return (output, bias)
        kv = kv[0]
    kv = kv.view(*latent.shape[:-1], layer.num_heads, layer.qk_nope_head_dim + layer.v_head_dim)
    k_nope, value = torch.split(kv, [layer.qk_nope_head_dim, layer.v_head_dim], dim=-1)
    key = torch.cat([k_nope, k_pe.expand(*k_nope.shape[:-1], k_pe.shape[-1])], dim=-1)
    return key, value


class ReferenceMLAImpl(MLAAttentionImpl):
    def forward(
        self,
        layer: MLALayer,
        q: torch.Tensor,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Write MLA for rows ``[:num_actual_tokens]`` into ``output`` (no copy)."""
        reject_output_quantization("mla_reference", output_scale, output_block_scale)
        attn_metadata.check_fits(q.shape[0], kv_cache)
        n = attn_metadata.num_actual_tokens
        if n == 0:
            return output
        latent, rope = gather_kv(
            attn_metadata,
            kv_c_normed.unsqueeze(1),  # the cache's single "kv head"
            k_pe,
            kv_cache,
            layer.kv_lora_rank,
            attn_metadata.layout.kv_index,
            q.dtype,
        )
        with torch.no_grad():  # the ops define no backward; out= writes refuse autograd inputs
            key, value = decompress(layer, latent.squeeze(-2), rope)
        padded_sdpa_into(output[:n], q, key, value, attn_metadata, layer.scale)
        return output


class ReferenceMLABackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "mla_reference"

    @staticmethod
    def get_impl_cls() -> type[ReferenceMLAImpl]:
        return ReferenceMLAImpl
