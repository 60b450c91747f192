"""Attention metadata for packed variable-length batches over a paged KV cache.

One `AttentionMetadata` describes one forward step of a batch and is shared by every layer.
It is validated once, when it is built, so that the per-layer hot path only checks shapes:
a bad batch raises there with the argument, the expected and the actual value, before any
layer writes anything.

Terms (vLLM's): the batch packs B sequences along the token axis. Sequence ``i`` owns query
rows ``query_start_loc[i]:query_start_loc[i + 1]``; its keys and values are its
``seq_lens[i]`` most recent tokens (earlier context plus this step's tokens), so the query's
last row sits at absolute position ``seq_lens[i] - 1``. Prefill has query length == sequence
length, decode has query length 1. With a paged cache, token ``p`` of sequence ``i`` lives in
block ``block_table[i, p // block_size]`` at offset ``p % block_size``; ``slot_mapping``
holds the flat slot (``block * block_size + offset``) of each of this step's tokens.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import torch

from vllm_attn_compat.backends.paged import BatchLayout, Paging


def _host_values(name: str, tensor: torch.Tensor, ndim: int) -> list[Any]:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != ndim or tensor.is_floating_point() or tensor.is_complex():
        raise ValueError(f"{name}: expected a {ndim}-D integer tensor, got a {tensor.dim()}-D {tensor.dtype} tensor")
    values: list[Any] = tensor.tolist()
    return values


def _as_list(name: str, tensor: torch.Tensor) -> list[int]:
    return _host_values(name, tensor, 1)


def _as_rows(name: str, tensor: torch.Tensor) -> list[list[int]]:
    return _host_values(name, tensor, 2)


@dataclasses.dataclass(eq=False)
class AttentionMetadata:
    """One batch step: packed query layout, sequence lengths and the paged-cache mapping.

    Validation reads the small index tensors once on the host (one device sync per step on
    CUDA, as vLLM's metadata builders also do on the host). Prefer `from_lengths` to build it.
    """

    num_actual_tokens: int
    query_start_loc: torch.Tensor  # [B + 1] int32, cumulative query lengths starting at 0
    seq_lens: torch.Tensor  # [B] int32, key/value length of each sequence
    max_query_len: int
    max_seq_len: int
    causal: bool = True
    block_table: torch.Tensor | None = None  # [B, max_blocks_per_seq] int32
    slot_mapping: torch.Tensor | None = None  # [num_actual_tokens] int64
    block_size: int | None = None

    def __post_init__(self) -> None:
        starts = _as_list("query_start_loc", self.query_start_loc)
        if not starts or starts[0] != 0:
            raise ValueError(f"query_start_loc: expected cumulative query lengths starting at 0, got {starts}")
        for i in range(1, len(starts)):
            if starts[i] < starts[i - 1]:
                raise ValueError(
                    f"query_start_loc: expected non-decreasing cumulative lengths, got {starts} "
                    f"(entry {i} = {starts[i]} < entry {i - 1} = {starts[i - 1]})"
                )
        if starts[-1] != self.num_actual_tokens:
            raise ValueError(
                f"query_start_loc: the query lengths must sum to num_actual_tokens="
                f"{self.num_actual_tokens}, but they sum to {starts[-1]}"
            )
        query_lens = [b - a for a, b in pairwise(starts)]
        seq_lens = _as_list("seq_lens", self.seq_lens)
        if len(seq_lens) != len(query_lens):
            raise ValueError(
                f"seq_lens: expected one length per sequence ({len(query_lens)}, from "
                f"query_start_loc), got {len(seq_lens)}"
            )
        for i, (q_len, s_len) in enumerate(zip(query_lens, seq_lens, strict=True)):
            if s_len < q_len:
                raise ValueError(
                    f"seq_lens: sequence {i} has {q_len} query tokens, so expected seq_lens[{i}] "
                    f">= {q_len}, got {s_len}"
                )
        for name, declared, actual in (
            ("max_query_len", self.max_query_len, max(query_lens, default=0)),
            ("max_seq_len", self.max_seq_len, max(seq_lens, default=0)),
        ):
            if declared < actual:
                raise ValueError(f"{name}: expected at least {actual}, got {declared}")
        self._max_block_id, self._max_slot = self._check_paging(query_lens, seq_lens)
        self.query_lens = query_lens
        self.seq_lens_list = seq_lens

    def _check_paging(self, query_lens: list[int], seq_lens: list[int]) -> tuple[int, int]:
        block_table, slot_mapping, block_size = self.block_table, self.slot_mapping, self.block_size
        given = [x is not None for x in (block_table, slot_mapping, block_size)]
        if not any(given):
            if any(s != q for s, q in zip(seq_lens, query_lens, strict=True)):
                raise ValueError(
                    "block_table: sequences with earlier context (seq_lens > query lengths) "
                    "need a paged KV cache, expected block_table, slot_mapping and block_size, got none"
                )
            return -1, -1
        if block_table is None or slot_mapping is None or block_size is None:
            missing = [n for n, g in zip(("block_table", "slot_mapping", "block_size"), given, strict=True) if not g]
            raise ValueError(f"block_table, slot_mapping and block_size: expected all three or none, missing {missing}")
        if block_size <= 0:
            raise ValueError(f"block_size: expected a positive int, got {block_size}")
        table = _as_rows("block_table", block_table)
        if len(table) != len(seq_lens):
            raise ValueError(f"block_table: expected one row per sequence ({len(seq_lens)}), got {len(table)}")
        columns = block_table.shape[1]
        for i, s_len in enumerate(seq_lens):
            needed = -(-s_len // block_size)
            if needed > columns:
                raise ValueError(
                    f"block_table: sequence {i} has {s_len} tokens, which need {needed} blocks of "
                    f"{block_size}, but the block table has {columns} columns"
                )
            if any(b < 0 for b in table[i][:needed]):
                raise ValueError(
                    f"block_table: expected block ids >= 0 for the {needed} blocks sequence {i} "
                    f"uses, got {table[i][:needed]}"
                )
        slots = _as_list("slot_mapping", slot_mapping)
        if len(slots) != self.num_actual_tokens:
            raise ValueError(f"slot_mapping: expected one slot per token ({self.num_actual_tokens}), got {len(slots)}")
        self._check_slots(table, query_lens, seq_lens, slots, block_size)
        used_blocks = [b for i, s in enumerate(seq_lens) for b in table[i][: -(-s // block_size)]]
        return max(used_blocks, default=-1), max(slots, default=-1)

    @staticmethod
    def _check_slots(
        table: list[list[int]], query_lens: list[int], seq_lens: list[int], slots: list[int], block_size: int
    ) -> None:
        """Each new token's slot must be where the block table puts it, or the cache write and
        the reads after it would silently disagree."""
        if not slots:
            return
        q_lens, s_lens = torch.tensor(query_lens), torch.tensor(seq_lens)
        seq = torch.repeat_interleave(torch.arange(len(query_lens)), q_lens)
        starts = torch.cumsum(q_lens, 0) - q_lens
        pos = torch.arange(len(slots)) - starts[seq] + (s_lens - q_lens)[seq]
        expected = torch.tensor(table, dtype=torch.long)[seq, pos // block_size] * block_size
        expected += pos % block_size
        wrong = (expected != torch.tensor(slots)).nonzero()
        if wrong.numel():
            i = int(wrong[0])
            raise ValueError(
                f"slot_mapping: token {i} (sequence {int(seq[i])}, position {int(pos[i])}) expected "
                f"slot {int(expected[i])} from the block table, got {slots[i]}"
            )

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def is_paged(self) -> bool:
        return self.block_table is not None

    @property
    def paging(self) -> Paging | None:
        """The paged-cache mapping, or None for a batch without a cache (validated: all or none)."""
        if self.block_table is None or self.slot_mapping is None or self.block_size is None:
            return None
        return Paging(self.block_table, self.slot_mapping, self.block_size)

    def check_fits(self, num_tokens: int, kv_cache: torch.Tensor | None) -> None:
        """Shape-only checks against this layer's inputs; called before anything is written."""
        if self.num_actual_tokens > num_tokens:
            raise ValueError(
                f"query: attn_metadata.num_actual_tokens={self.num_actual_tokens}, expected at most "
                f"the number of query rows, got {num_tokens} rows"
            )
        if not self.is_paged or kv_cache is None or kv_cache.numel() == 0:
            return
        if kv_cache.shape[1] != self.block_size:
            raise ValueError(
                f"kv_cache: expected block size {self.block_size} (dimension 1), got shape {list(kv_cache.shape)}"
            )
        if self._max_block_id >= kv_cache.shape[0] or self._max_slot >= kv_cache.shape[0] * self.block_size:
            raise ValueError(
                f"kv_cache: the block table uses block {self._max_block_id} and slot_mapping slot "
                f"{self._max_slot}, but the cache has {kv_cache.shape[0]} blocks of {self.block_size}"
            )

    @functools.cached_property
    def layout(self) -> BatchLayout:
        """Padded-batch index tensors for gather-based backends, built once per step."""
        return BatchLayout.build(self)

    @classmethod
    def from_lengths(
        cls,
        query_lens: Sequence[int],
        seq_lens: Sequence[int] | None = None,
        *,
        causal: bool = True,
        block_table: torch.Tensor | None = None,
        block_size: int | None = None,
        device: torch.device | str | None = None,
    ) -> AttentionMetadata:
        """Build metadata from per-sequence lengths; ``seq_lens`` defaults to the query lengths
        (pure prefill). With a block table, the slot of each new token is derived from it."""
        query_lens = list(query_lens)
        seq_lens = list(query_lens if seq_lens is None else seq_lens)
        starts = [0]
        for q_len in query_lens:
            starts.append(starts[-1] + q_len)
        slot_mapping = None
        if block_table is not None and block_size is not None:
            table = block_table.tolist()
            slots = []
            # Lengths may differ here: the constructor reports that with the names and counts.
            for i, (q_len, s_len) in enumerate(zip(query_lens, seq_lens, strict=False)):
                for pos in range(s_len - q_len, s_len):
                    if pos // block_size >= len(table[i]):
                        break  # the constructor reports the too-short block table
                    slots.append(table[i][pos // block_size] * block_size + pos % block_size)
            slot_mapping = torch.tensor(slots, dtype=torch.int64, device=device)
            block_table = block_table.to(device=device, dtype=torch.int32)
        return cls(
            num_actual_tokens=starts[-1],
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            max_query_len=max(query_lens, default=0),
            max_seq_len=max(seq_lens, default=0),
            causal=causal,
            block_table=block_table,
            slot_mapping=slot_mapping,
            block_size=block_size,
        )
