"""Imported by test_vllm_dead_overrides.py's child process: reads a removed member with no plugin loaded."""

from __future__ import annotations

import json


def read() -> str:
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    metadata = CommonAttentionMetadata(
        query_start_loc=torch.tensor([0, 2, 3]),
        query_start_loc_cpu=torch.tensor([0, 2, 3]),
        seq_lens=torch.tensor([5, 3]),
        num_reqs=2,
        num_actual_tokens=3,
        max_query_len=2,
        max_seq_len=5,
        block_table_tensor=torch.zeros(2, 4, dtype=torch.int32),
        slot_mapping=torch.arange(3),
    )
    try:
        metadata.seq_lens_cpu  # noqa: B018 - the read under test
    except AttributeError:
        return json.dumps("AttributeError")
    return json.dumps("read")
