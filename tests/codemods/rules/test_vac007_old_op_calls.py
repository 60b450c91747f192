"""VAC007 beyond its examples."""

from __future__ import annotations

from rule_testing import run, source, statuses
from vllm_attn_compat.codemods.findings import Status


def test_mla_default_overload_and_existing_import():
    text = source(
        """
        import torch
        import vllm_attn_compat.compat


        def f(q, kv, pe, name):
            return torch.ops.vllm.unified_mla_attention.default(q, kv, pe, name)
        """
    )
    result = run(text, ["VAC007"], unsafe=True)
    assert result.source.decode() == text.replace(
        "torch.ops.vllm.unified_mla_attention.default", "vllm_attn_compat.compat.unified_mla_attention"
    )


def test_references_that_are_not_calls_are_reported_only():
    text = "import torch\nops = [torch.ops.vllm.unified_attention.default]\n"
    result = run(text, ["VAC007"], unsafe=True)
    assert result.source.decode() == text and statuses(result) == [Status.MANUAL]


def test_kernels_and_helpers_named_unified_attention_stay():
    text = source(
        """
        from vllm.attention.ops.triton_unified_attention import unified_attention
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention as kernel
        from .ops import unified_attention as mine
        import torch


        def unified_attention(q, k, v):
            return q


        unified_attention(1, 2, 3)
        torch.ops.vllm.unified_attention_with_output(q, k, v, out, "x")
        torch.ops.my_plugin.unified_attention(q, k, v)
        """
    )
    result = run(text, ["VAC007"], unsafe=True)
    assert result.findings == [] and result.source.decode() == text


def test_import_of_the_whole_old_function_list():
    text = "from vllm.attention.layer import unified_attention\n"
    result = run(text, ["VAC007"], unsafe=True)
    assert result.source.decode() == "from vllm_attn_compat.compat import unified_attention\n"
    assert run(text, ["VAC007"]).source.decode() == text


def test_import_after_docstring_and_future_import():
    text = source(
        '''
        """Module."""
        from __future__ import annotations

        import torch

        x = torch.ops.vllm.unified_attention(q, k, v, "l")
        '''
    )
    assert run(text, ["VAC007"], unsafe=True).source.decode() == source(
        '''
        """Module."""
        from __future__ import annotations

        import torch
        import vllm_attn_compat.compat

        x = vllm_attn_compat.compat.unified_attention(q, k, v, "l")
        '''
    )


def test_calls_through_vllm_module_objects():
    text = source(
        """
        import vllm
        import vllm.attention.layer as layer_module
        from vllm.model_executor.layers.attention import attention


        a = layer_module.unified_attention(q, k, v, "l")
        b = attention.unified_mla_attention(q, kv, pe, "l")
        c = vllm.attention.layer.unified_attention(q, k, v, "l")
        d = layer_module.Attention
        """
    )
    result = run(text, ["VAC007"], unsafe=True)
    assert statuses(result) == [Status.FIXED] * 3
    out = result.source.decode()
    assert out.count("vllm_attn_compat.compat.unified_attention(q, k, v") == 2
    assert "vllm_attn_compat.compat.unified_mla_attention(q, kv, pe" in out
    assert "d = layer_module.Attention" in out


def test_names_moved_from_a_parenthesized_line_join_one_compat_import_after_what_stays():
    text = source(
        """
        # the layer and its ops
        from vllm.attention.layer import (  # 0.19 layout
            unified_attention,
            Attention,
            unified_mla_attention,
        )
        """
    )
    result = run(text, ["VAC007"], unsafe=True)
    assert result.source.decode() == source(
        """
        # the layer and its ops
        from vllm.attention.layer import (  # 0.19 layout
            Attention,
        )
        from vllm_attn_compat.compat import unified_attention, unified_mla_attention
        """
    )
    assert statuses(result) == [Status.FIXED, Status.FIXED] and result.removed_comments == ()


def test_a_line_left_without_names_gives_its_place_and_comments_to_the_compat_import():
    text = "import torch\n\n# the ops\nfrom vllm.attention import (  # old\n    unified_attention,  # prefill\n    unified_mla_attention,\n)\n"
    result = run(text, ["VAC007"], unsafe=True)
    assert result.source.decode() == (
        "import torch\n\n# the ops\nfrom vllm_attn_compat.compat import unified_attention, unified_mla_attention\n"
    )
    # The comments inside the parentheses went with the names they stood by, and are declared.
    assert sorted(result.removed_comments) == ["# old", "# prefill"]
