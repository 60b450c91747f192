"""The paged KV cache layout and the padded-batch view that gather-based backends use.

Cache layout (one tensor per layer, so that ``head_size_v`` may differ from ``head_size``):
``[num_blocks, block_size, num_kv_heads, head_size + head_size_v]``; keys occupy the first
``head_size`` channels of the last dimension, values the rest.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Protocol

import torch


class Paging(NamedTuple):
    """Where a batch's tokens live in the paged cache (validated together, all or none)."""

    block_table: torch.Tensor  # [B, max_blocks_per_seq] int32
    slot_mapping: torch.Tensor  # [num_actual_tokens] int64, flat slot of each new token
    block_size: int


class PackedBatch(Protocol):
    """What the layout and the gathers read of a batch (`metadata.AttentionMetadata` has it all).

    A protocol rather than the metadata class itself, so that this module does not import the
    module that builds on it."""

    num_actual_tokens: int
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    causal: bool
    query_lens: list[int]
    seq_lens_list: list[int]

    @property
    def paging(self) -> Paging | None: ...


def kv_cache_shape(
    num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, head_size_v: int
) -> tuple[int, int, int, int]:
    return (num_blocks, block_size, num_kv_heads, head_size + head_size_v)


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """Index tensors that scatter a packed batch into a padded ``[B, max_len]`` grid.

    ``kv_index[i, p]`` is where token ``p`` of sequence ``i`` lives: a flat cache slot for a
    paged batch, a packed row of ``key``/``value`` otherwise (0 for padding positions).
    ``mask[i, 0, j, p]`` says whether query row ``j`` of sequence ``i`` may attend to
    position ``p``: causal masks align the query's last row with the sequence's last token.
    Padding query rows may attend to position 0 only, so that softmax stays finite there.
    """

    token_seq: torch.Tensor  # [n] sequence of each real query token
    token_row: torch.Tensor  # [n] row of each real query token inside its sequence
    token_flat: torch.Tensor  # [n] its row in the flattened [B * max_query_len] grid
    kv_index: torch.Tensor  # [B, max_seq_len]
    mask: torch.Tensor  # [B, 1, max_query_len, max_seq_len] bool

    @staticmethod
    def build(md: PackedBatch) -> BatchLayout:
        device = md.query_start_loc.device
        starts = md.query_start_loc.long()
        q_lens = torch.tensor(md.query_lens, dtype=torch.long, device=device)
        s_lens = torch.tensor(md.seq_lens_list, dtype=torch.long, device=device)
        num_seqs = len(md.query_lens)
        token_seq = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens)
        token_row = torch.arange(md.num_actual_tokens, device=device) - starts[token_seq]
        pos = torch.arange(md.max_seq_len, device=device)
        kv_valid = pos[None, :] < s_lens[:, None]
        paging = md.paging
        if paging is not None:
            table = paging.block_table.long()
            column = (pos // paging.block_size).clamp(max=max(table.shape[1] - 1, 0))
            blocks = table[:, column] if table.shape[1] else torch.zeros_like(kv_valid, dtype=torch.long)
            kv_index = blocks * paging.block_size + pos % paging.block_size
        else:
            kv_index = starts[:-1, None] + pos[None, :]
        kv_index = torch.where(kv_valid, kv_index, torch.zeros_like(kv_index))
        rows = torch.arange(md.max_query_len, device=device)
        allowed = kv_valid[:, None, :].expand(num_seqs, md.max_query_len, md.max_seq_len)
        if md.causal:
            last_visible = rows[None, :] + (s_lens - q_lens)[:, None]
            allowed = allowed & (pos[None, None, :] <= last_visible[:, :, None])
        padding_row = rows[None, :] >= q_lens[:, None]
        allowed = allowed | (padding_row[:, :, None] & (pos == 0)[None, None, :])
        token_flat = token_seq * md.max_query_len + token_row
        return BatchLayout(token_seq, token_row, token_flat, kv_index, allowed[:, None])


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store this step's keys and values at their slots (rows beyond the slots are padding)."""
    n, head_size = slot_mapping.shape[0], key.shape[-1]
    flat = kv_cache.flatten(0, 1)
    flat[..., :head_size].index_copy_(0, slot_mapping, key[:n].to(kv_cache.dtype))
    flat[..., head_size:].index_copy_(0, slot_mapping, value[:n].to(kv_cache.dtype))


def gather_kv(
    md: PackedBatch,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    kv_cache: torch.Tensor | None,
    head_size: int,
    index: torch.Tensor,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values at ``index`` (entries of `BatchLayout.kv_index`), shaped
    ``[*index.shape, num_kv_heads, D]``, in ``dtype``.

    A paged batch stores this step's key/value into the cache first, then reads all of each
    sequence's tokens back from it (so decode sees the context that prefill wrote).
    """
    paging = md.paging
    if paging is not None:
        if kv_cache is None or kv_cache.numel() == 0:
            raise ValueError(
                "kv_cache: attn_metadata has a block table, expected an allocated paged cache "
                "(Attention.allocate_kv_cache), got an empty one"
            )
        if key is not None and value is not None:
            write_kv(kv_cache, key, value, paging.slot_mapping)
        gathered = _rows(kv_cache.flatten(0, 1), index).to(dtype)
        return gathered[..., :head_size], gathered[..., head_size:]
    if key is None or value is None:
        raise ValueError("key/value: without a paged cache the batch's keys and values must be passed, got None")
    return _rows(key, index), _rows(value, index)


def _rows(source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    # index_select gathers whole rows; advanced indexing is several times slower on the CPU
    return source.index_select(0, index.flatten()).view(*index.shape, *source.shape[1:])
