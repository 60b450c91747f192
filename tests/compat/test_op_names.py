"""normalize_splitting_ops: exact old names become the _with_output names; nothing else changes."""

from __future__ import annotations

import pytest

from vllm_attn_compat.compat import RENAMED_OPS, normalize_splitting_ops
from vllm_attn_compat.compat.op_names import renamed_in


@pytest.mark.parametrize(
    "ops, expected",
    [
        (["vllm::unified_attention"], ["vllm::unified_attention_with_output"]),
        (["vllm::unified_mla_attention"], ["vllm::unified_mla_attention_with_output"]),
        (
            ["vllm.unified_attention", "vllm.unified_mla_attention"],
            ["vllm.unified_attention_with_output", "vllm.unified_mla_attention_with_output"],
        ),
        # Old and new name both present: one entry, at the first one's place.
        (
            ["a", "vllm::unified_attention", "b", "vllm::unified_attention_with_output"],
            ["a", "vllm::unified_attention_with_output", "b"],
        ),
        (
            ["vllm::unified_attention_with_output", "x", "vllm::unified_attention"],
            ["vllm::unified_attention_with_output", "x"],
        ),
        # Names that merely start with (or contain) an old name, other namespaces, repeats of others: untouched.
        (
            ["vllm::unified_attention_foo", "myns::unified_attention", "vllm::unified_attention ", "a", "a"],
            ["vllm::unified_attention_foo", "myns::unified_attention", "vllm::unified_attention ", "a", "a"],
        ),
        ([], []),
    ],
)
def test_normalize_splitting_ops(ops, expected):
    original = list(ops)
    assert normalize_splitting_ops(ops) == expected
    assert ops == original  # the argument is not modified
    assert normalize_splitting_ops(expected) == expected  # idempotent


def test_table_maps_each_old_name_to_its_with_output_name():
    assert all(new == old + "_with_output" for old, new in RENAMED_OPS.items())
    assert set(RENAMED_OPS) == {
        "vllm::unified_attention",
        "vllm::unified_mla_attention",
        "vllm.unified_attention",
        "vllm.unified_mla_attention",
    }


def test_renamed_in_lists_each_old_name_once_in_order():
    ops = ["vllm::unified_mla_attention", "x", "vllm::unified_attention", "vllm::unified_mla_attention"]
    assert renamed_in(ops) == ["vllm::unified_mla_attention", "vllm::unified_attention"]


def test_bad_input_is_a_clear_error():
    with pytest.raises(TypeError, match=r"a list of op names, not a single string; found 'vllm::unified_attention'"):
        normalize_splitting_ops("vllm::unified_attention")
    with pytest.raises(TypeError, match=r"op-name strings like 'vllm::foo'; found 3"):
        normalize_splitting_ops(["vllm::x", 3])
