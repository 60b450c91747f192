"""The reference CPU backend on `torch.nn.functional.scaled_dot_product_attention`.

The packed batch is scattered into a padded ``[B, max_query_len]`` grid, keys and values
are gathered per sequence (from the paged cache when the batch has one), and one SDPA call
with a boolean mask covers mixed lengths, causal and non-causal attention, grouped-query
attention and decode. SDPA has no ``out=`` argument, but the padded result has to be
gathered back into packed rows anyway, and that gather (``index_select(..., out=)``) writes
straight into ``output[:num_actual_tokens]``: no ``copy_`` (counted in the tests). Rows after
``num_actual_tokens`` are never touched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_attn_compat.backends.abstract import (
    AttentionBackend,
    AttentionImpl,
    reject_output_quantization,
)
from vllm_attn_compat.backends.metadata import AttentionMetadata
from vllm_attn_compat.backends.paged import gather_kv


def padded_sdpa_into(
    out: torch.Tensor,
    query: torch.Tensor,
    key_padded: torch.Tensor,
    value_padded: torch.Tensor,
    md: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Attention of the packed ``query`` rows against padded ``[B, S, Hkv, D]`` keys/values,
    written into ``out`` (``[num_actual_tokens, H, Dv]``) by the final gather itself."""
    layout = md.layout
    n = md.num_actual_tokens
    heads, head_size = query.shape[1:]
    grid = md.num_seqs * md.max_query_len
    query_padded = query.new_zeros(grid, heads, head_size).index_copy_(0, layout.token_flat, query[:n])
    result = F.scaled_dot_product_attention(
        query_padded.view(md.num_seqs, md.max_query_len, heads, head_size).transpose(1, 2),
        key_padded.transpose(1, 2),
        value_padded.transpose(1, 2),
        attn_mask=layout.mask,
        scale=scale,
        enable_gqa=key_padded.shape[2] != heads,
    )
    # SDPA lays its result out like its query, i.e. [B, max_query_len, H, Dv] in memory, so
    # this reshape is a view; the gather back to packed rows then writes straight into out.
    rows = result.transpose(1, 2).reshape(grid, heads, value_padded.shape[-1])
    return torch.index_select(rows, 0, layout.token_flat, out=out)


class SDPAImpl(AttentionImpl):
    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Write attention for rows ``[:num_actual_tokens]`` into ``output`` (no copy)."""
        reject_output_quantization("sdpa", output_scale, output_block_scale)
        attn_metadata.check_fits(query.shape[0], kv_cache)
        n = attn_metadata.num_actual_tokens
        if n == 0:
            return output
        key_padded, value_padded = gather_kv(
            attn_metadata, key, value, kv_cache, self.head_size, attn_metadata.layout.kv_index, query.dtype
        )
        padded_sdpa_into(output[:n], query, key_padded, value_padded, attn_metadata, self.scale)
        return output


class SDPABackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "sdpa"

    @staticmethod
    def get_impl_cls() -> type[SDPAImpl]:
        return SDPAImpl
