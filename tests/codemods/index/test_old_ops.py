"""The functions named as the ops vLLM 0.20 deleted, as a module's index records them (codemods/index/old_ops.py):
which count (module-level, named as an op) and whether the module registers each."""

from __future__ import annotations

import ast
import textwrap

import pytest

from vllm_attn_compat.codemods.index.old_ops import OldOpBody, old_op_bodies


def _bodies(text: str) -> tuple[OldOpBody, ...]:
    return old_op_bodies(ast.parse(textwrap.dedent(text)))


BODY = """
def unified_attention(query, key, value, layer_name):
    self = get_forward_context().no_compile_layers[layer_name]
    return self.impl.forward(self, query, key, value)
"""


@pytest.mark.parametrize(
    "registration",
    [
        'direct_register_custom_op(op_name="unified_attention", op_func=unified_attention)',
        'direct_register_custom_op("unified_attention", unified_attention, op_name="unified_attention")',
        'torch.library.custom_op("vllm::unified_attention", mutates_args=())(unified_attention)',
        'torch.library.define("vllm::unified_attention(Tensor q, str layer_name) -> Tensor")',
        'def register():\n    direct_register_custom_op(op_name="unified_attention", op_func=unified_attention)',
        'if HAS_TORCH:\n    direct_register_custom_op(op_name="unified_attention", op_func=unified_attention)',
    ],
    ids=["op_name", "op_name-among-others", "custom_op", "define-with-schema", "in-a-function", "in-a-branch"],
)
def test_a_registered_body_is_told_by_any_call_naming_its_op(registration):
    (body,) = _bodies(BODY + "\n\n" + registration + "\n")
    assert body == OldOpBody(2, 4, "unified_attention", True)


@pytest.mark.parametrize(
    "registration",
    [
        "",
        'direct_register_custom_op(op_name="unified_mla_attention", op_func=unified_attention)',  # another op
        'torch.library.custom_op("mylib::unified_attention", mutates_args=())(unified_attention)',  # not vLLM's
        'log("unified_attention")',  # the name, not as an op
        'NAME = "vllm::unified_attention"',  # no call
    ],
    ids=["none", "another-op", "another-namespace", "a-plain-string", "no-call"],
)
def test_a_body_nothing_registers_as_its_op_is_told_apart(registration):
    (body,) = _bodies(BODY + "\n\n" + registration + "\n")
    assert body == OldOpBody(2, 4, "unified_attention", False)


def test_both_ops_and_async_functions_count_each_with_its_own_registration():
    text = """
    async def unified_mla_attention(q):
        return q

    def unified_attention(q):
        return q

    direct_register_custom_op(op_name="unified_mla_attention", op_func=unified_mla_attention)
    """
    assert _bodies(text) == (
        OldOpBody(2, 3, "unified_mla_attention", True),
        OldOpBody(5, 6, "unified_attention", False),
    )


@pytest.mark.parametrize(
    "text",
    [
        "class Layer:\n    def unified_attention(self, q):\n        return q\n",  # a method
        "def outer():\n    def unified_attention(q):\n        return q\n",  # nested
        "def unified_attention_with_output(q, output):\n    output.copy_(q)\n",  # the op vLLM kept
        "unified_attention = functools.partial(attend, causal=True)\n",  # no function
    ],
    ids=["method", "nested", "kept-op", "assignment"],
)
def test_only_module_level_functions_named_as_a_deleted_op_count(text):
    assert _bodies(text + '\ndirect_register_custom_op(op_name="unified_attention", op_func=f)\n') == ()


def test_a_decorated_body_spans_its_def_line_to_its_last():
    text = "@maybe_transfer_kv_layer\ndef unified_attention(q):\n    x = q\n    return x\n"
    assert _bodies(text) == (OldOpBody(2, 4, "unified_attention", False),)
