"""VAC007 beyond its examples: the with-output rewrite, the forwarder route (opt-in), imports."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.findings import Status

from rule_testing import run, source, statuses

FORWARDER = {"old_op_calls": "forwarder"}


def test_mla_default_overload_and_existing_import():
    text = source(
        """
        import torch
        import vllm_attn_compat.compat


        def f(q, kv, pe, name):
            return torch.ops.vllm.unified_mla_attention.default(q, kv, pe, name)
        """
    )
    result = run(text, ["VAC007"], unsafe=True, **FORWARDER)
    assert result.source.decode() == text.replace(
        "torch.ops.vllm.unified_mla_attention.default", "vllm_attn_compat.compat.unified_mla_attention"
    )


def test_references_that_are_not_calls_are_reported_only():
    text = "import torch\nops = [torch.ops.vllm.unified_attention.default]\n"
    for options in ({}, FORWARDER):
        result = run(text, ["VAC007"], unsafe=True, **options)
        assert result.source.decode() == text and statuses(result) == [Status.MANUAL]


def test_an_assignment_patching_the_old_op_is_told_to_patch_the_with_output_op():
    """unified-cache-management's sparse patch wraps both ops: the old one's wrapper never runs on vLLM >= 0.20."""
    text = source(
        """
        import torch


        def patch(layer):
            torch.ops.vllm.unified_attention = wrap(torch.ops.vllm.unified_attention, layer.attend)
            torch.ops.vllm.unified_mla_attention: object = layer.attend_mla
        """
    )
    result = run(text, ["VAC007"], unsafe=True)
    assert result.source.decode() == text
    assigned, read, annotated = sorted(result.findings, key=lambda finding: (finding.line, finding.column))
    assert (
        "this assignment patches an op vLLM >= 0.20 never calls: patch `torch.ops.vllm.unified_attention_with_output`"
        in assigned.message
    )
    assert read.message.endswith("; use `torch.ops.vllm.unified_attention_with_output`")
    assert "patch `torch.ops.vllm.unified_mla_attention_with_output` instead" in annotated.message
    assert {finding.status for finding in result.findings} == {Status.MANUAL}


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
    for options in ({}, FORWARDER):
        result = run(text, ["VAC007"], unsafe=True, **options)
        assert result.findings == [] and result.source.decode() == text


_USED_WITHOUT_SHAPE = "\n\ndef attend(q, k, v, name):\n    return unified_attention(q, k, v, name)\n"


def test_import_of_the_whole_old_function_list():
    text = "from vllm.attention.layer import unified_attention\n" + _USED_WITHOUT_SHAPE
    result = run(text, ["VAC007"], unsafe=True, **FORWARDER)
    assert result.source.decode() == text.replace("vllm.attention.layer", "vllm_attn_compat.compat")
    assert run(text, ["VAC007"], **FORWARDER).source.decode() == text


def test_an_import_still_used_stays_and_is_left_for_a_person():
    # The call has no layer shape in scope: the with-output rewrite cannot apply, so the import is still
    # needed and its finding turns manual once the fixes are done.
    text = "from vllm.attention.layer import unified_attention\n" + _USED_WITHOUT_SHAPE
    assert statuses(run(text, ["VAC007"])) == [Status.UNSAFE_FIX_AVAILABLE]
    result = run(text, ["VAC007"], unsafe=True)
    assert result.source.decode() == text and statuses(result) == [Status.MANUAL]


def test_an_import_nothing_uses_goes_with_its_comments_declared():
    text = source(
        """
        import torch

        # the old ops
        from vllm.attention import (  # 0.19
            Attention,
            unified_attention,  # prefill
        )
        from vllm.attention import unified_mla_attention as mla  # decode
        x = 1
        """
    )
    result = run(text, ["VAC007"], unsafe=True)
    assert result.source.decode() == source(
        """
        import torch

        # the old ops
        from vllm.attention import (  # 0.19
            Attention,
        )
        # decode
        x = 1
        """
    )
    assert statuses(result) == [Status.FIXED, Status.FIXED]
    assert result.removed_comments == ("# prefill",)


def test_a_package_init_keeps_its_imports():
    text = "from vllm.attention.layer import unified_attention\n"
    result = run(text, ["VAC007"], unsafe=True, path="plugin/__init__.py")
    assert result.source.decode() == text and statuses(result) == [Status.MANUAL]


def test_import_after_docstring_and_future_import():
    text = source(
        '''
        """Module."""
        from __future__ import annotations

        import torch

        x = torch.ops.vllm.unified_attention(q, k, v, "l")
        '''
    )
    assert run(text, ["VAC007"], unsafe=True, **FORWARDER).source.decode() == source(
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
    assert statuses(run(text, ["VAC007"], unsafe=True)) == [Status.MANUAL] * 3
    result = run(text, ["VAC007"], unsafe=True, **FORWARDER)
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

        a = unified_attention(q, k, v, "l")
        b = unified_mla_attention(q, kv, pe, "l")
        """
    )
    result = run(text, ["VAC007"], unsafe=True, **FORWARDER)
    assert result.source.decode() == source(
        """
        # the layer and its ops
        from vllm.attention.layer import (  # 0.19 layout
            Attention,
        )
        from vllm_attn_compat.compat import unified_attention, unified_mla_attention

        a = unified_attention(q, k, v, "l")
        b = unified_mla_attention(q, kv, pe, "l")
        """
    )
    assert statuses(result) == [Status.FIXED, Status.FIXED] and result.removed_comments == ()


def test_a_line_left_without_names_gives_its_place_and_comments_to_the_compat_import():
    text = (
        "import torch\n\n# the ops\nfrom vllm.attention import (  # old\n    unified_attention,  # prefill\n"
        "    unified_mla_attention,\n)\n\nx = unified_attention, unified_mla_attention\n"
    )
    result = run(text, ["VAC007"], unsafe=True, **FORWARDER)
    assert result.source.decode() == (
        "import torch\n\n# the ops\nfrom vllm_attn_compat.compat import unified_attention, unified_mla_attention\n"
        "\nx = unified_attention, unified_mla_attention\n"
    )
    # The comments inside the parentheses went with the names they stood by, and are declared.
    assert sorted(result.removed_comments) == ["# old", "# prefill"]


_LAYER = """\
import torch
from plugin.base import Base


class Layer(Base):
    def __init__(self, num_heads, head_size):
        self.num_heads, self.num_kv_heads = num_heads, num_heads
        self.head_size = self.head_size_v = head_size

    def forward(self, query, key, value, output=None):
"""


def _layer(body: str) -> str:
    return _LAYER + "".join(f"        {line}\n" if line else "\n" for line in source(body).splitlines())


_CALL = """\
torch.ops.vllm.unified_attention_with_output(
    query.view(-1, self.num_heads, self.head_size),
    key.view(-1, self.num_kv_heads, self.head_size),
    value.view(-1, self.num_kv_heads, self.head_size_v),
    {buffer}.view(-1, self.num_heads, self.head_size_v),
    self.layer_name,
){comment}
"""
_EMPTY = """\
{buffer} = torch.empty(
    (query.shape[0], self.num_heads * self.head_size_v),
    dtype=query.dtype,
    device=query.device,
)
"""


def _with_output(buffer: str, after: str = "", comment: str = "") -> str:
    return _EMPTY.format(buffer=buffer) + _CALL.format(buffer=buffer, comment=comment) + after


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            "out = torch.ops.vllm.unified_attention(query, key, value, self.layer_name)  # old op\nreturn out\n",
            _with_output("out", "return out\n", comment="  # old op"),
            id="assigned-to-a-name",
        ),
        pytest.param(
            "return torch.ops.vllm.unified_attention(query, key, value, self.layer_name)\n",
            _with_output("attn_output", "return attn_output\n"),
            id="returned-output-taken",
        ),
        pytest.param(
            "torch.ops.vllm.unified_attention(query, key, value, self.layer_name)\n",
            _with_output("attn_output"),
            id="value-unused",
        ),
        pytest.param(
            "query = torch.ops.vllm.unified_attention(\n    query, key, value, self.layer_name\n)\nreturn query\n",
            _with_output("attn_output", "query = attn_output\nreturn query\n"),
            id="assigned-to-an-argument",
        ),
        pytest.param(
            "return torch.ops.vllm.unified_attention(\n    query,  # [T, H * D]\n    key=key,\n    value=value,\n"
            "    layer_name=self.layer_name,\n)\n",
            _with_output("attn_output", "return attn_output\n"),
            id="keywords-and-a-comment-inside",
        ),
    ],
)
def test_the_with_output_form_by_statement(body, expected):
    result = run(_layer(body), ["VAC007"], unsafe=True, others=[("plugin/base.py", _BASE)], path="plugin/layer.py")
    assert result.source.decode() == _layer(expected)
    assert statuses(result) == [Status.FIXED]
    assert list(result.removed_comments) == (["# [T, H * D]"] if "[T, H * D]" in body else [])


_BASE = """
    from vllm.model_executor.layers.attention import Attention


    class Base(Attention):
        pass
"""


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(
            "return torch.ops.vllm.unified_attention(query.contiguous(), key, value, 'l')\n", id="query-not-plain"
        ),
        pytest.param(
            "if key is None: return torch.ops.vllm.unified_attention(query, key, value, 'l')\n", id="one-line-if"
        ),
        pytest.param("return torch.ops.vllm.unified_attention(*qkv, 'l')\n", id="star-args"),
        pytest.param("x, y = torch.ops.vllm.unified_attention(query, key, value, 'l'), 1\n", id="inside-an-expression"),
    ],
)
def test_calls_the_rewrite_cannot_take_are_reported(body):
    text = _layer(body)
    result = run(text, ["VAC007"], unsafe=True)
    assert result.source.decode() == text and statuses(result) == [Status.MANUAL]
    forwarded = run(text, ["VAC007"], unsafe=True, **FORWARDER)
    assert "vllm_attn_compat.compat.unified_attention(" in forwarded.source.decode()
    assert statuses(forwarded) == [Status.FIXED]


def test_mla_shape_from_the_layer_attributes():
    text = source(
        """
        import torch
        from vllm.model_executor.layers.attention import MLAAttention


        class Mine(MLAAttention):
            def forward(self, q, kv_c_normed, k_pe):
                return torch.ops.vllm.unified_mla_attention(q, kv_c_normed, k_pe, self.layer_name)
        """
    )
    assert run(text, ["VAC007"], unsafe=True).source.decode() == source(
        """
        import torch
        from vllm.model_executor.layers.attention import MLAAttention


        class Mine(MLAAttention):
            def forward(self, q, kv_c_normed, k_pe):
                output = torch.empty(
                    (q.shape[0], self.num_heads * self.v_head_dim),
                    dtype=q.dtype,
                    device=q.device,
                )
                torch.ops.vllm.unified_mla_attention_with_output(
                    q, kv_c_normed, k_pe, output, self.layer_name
                )
                return output
        """
    )


def test_an_import_is_added_only_when_the_final_code_uses_it():
    # VAC005 deletes the old path that held the call: neither torch nor the forwarder is needed after it.
    text = source(
        """
        from vllm.model_executor.layers.attention import Attention, unified_attention


        class Layer(Attention):
            def forward(self, query, key, value):
                if self.use_output:
                    return self.impl.forward(self, query, key, value, output=self.allocate(query))
                else:
                    return unified_attention(query, key, value, self.layer_name)
        """
    )
    for options in ({}, FORWARDER):
        result = run(text, ["VAC005", "VAC007"], unsafe=True, **options)
        out = result.source.decode()
        assert "import torch" not in out and "vllm_attn_compat.compat" not in out
        assert out.startswith("from vllm.model_executor.layers.attention import Attention\n")
        assert "unified_attention" not in out
