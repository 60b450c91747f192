"""VAC001: remove ``assert output is not None`` from attention methods."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.engine.edits import RemoveStatement
from vllm_attn_compat.codemods.engine.rule import Example, Rule, class_source, narrowed_to_methods
from vllm_attn_compat.codemods.findings import FixSafety, Status

if TYPE_CHECKING:
    import libcst as cst

_IMPL_HEADER = """\
    import torch
    from vllm.v1.attention.backend import AttentionImpl


    class MyImpl(AttentionImpl):
"""


_IN_A_LAYER = (
    "a layer's own `output` is asserted: vLLM >= 0.20's layers allocate the buffer they pass on; check who passes "
    "this one (no fix)"
)


class AssertOutputNotNone(Rule):
    """Before vLLM 0.20 a backend could be called without an output buffer, so every in-tree
    ``forward`` began with ``assert output is not None, "Output tensor must be provided."``.
    Since 0.20 (PR #39125) the layer always passes ``output``; upstream deleted these asserts
    and so does this rule. Only an assert on the ``output`` *parameter* of a method of an
    attention class goes: an assert on a local variable named ``output``, on a parameter
    reassigned before the assert (on some path through the method, or in an earlier iteration of
    a loop around it), or outside attention classes stays. A reassignment *after* the assert, such
    as ``output = output[:num_actual_tokens]``, does not keep it: at the assert ``output`` is still
    the parameter, and upstream deleted exactly these asserts. An assert that tests more than
    ``output is not None`` is reported for a person to simplify. Where ``output`` defaults to None, a
    call the run sees passing ``output=None``, or no ``output``, fails at the assert today and would run
    on without it: the deletion is then unsafe, and the finding names the call; so it is where the value passed
    may be None (an attribute such as ``self.buffer``, what a call returns), and wherever VAC002's fix is withheld
    (``*args``, the method handed on, reflection: see VAC002). A parameter already required, or a fresh tensor,
    counts as a buffer.
    """

    code = "VAC001"
    name = "assert-output-not-none"
    summary = "Remove `assert output is not None`: vLLM >= 0.20 always passes the output buffer."
    fix_safety = FixSafety.SAFE
    since = fix_requires = "0.20.0"  # the release that made the output buffer mandatory
    tokens = (b"output is not None",)
    # Of a method's body: the statements naming `output` (its bindings, its None tests), and the asserts,
    # `pass` and docstrings that may come before the code it looks at.
    reads_statements = (b"output",)

    # It acts in the methods taking `output` of attention classes and layers (`buffer_methods`): a file whose
    # index shows none needs no parse.
    narrows = True
    acts_in = narrowed_to_methods("buffer", "layer")

    examples = (
        Example(
            "the assert at the start of forward, with its message",
            class_source(
                _IMPL_HEADER,
                """
            def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                assert output is not None, "Output tensor must be provided."

                output.copy_(query)
                return output
            """,
            ),
            after=class_source(
                _IMPL_HEADER,
                """
            def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                output.copy_(query)
                return output
            """,
            ),
            findings=(Status.FIXED,),
        ),
        Example(
            "a local variable named output stays",
            class_source(
                _IMPL_HEADER,
                """
            def prefill(self, query):
                output = self.kernel(query)
                assert output is not None
                return output
            """,
            ),
        ),
        Example(
            "the parameter sliced after the assert: at the assert it is still the parameter",
            class_source(
                _IMPL_HEADER,
                """
            def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                assert output is not None, "Output tensor must be provided."

                num_actual_tokens = attn_metadata.num_actual_tokens
                output = output[:num_actual_tokens]
                output.copy_(query[:num_actual_tokens])
                return output
            """,
            ),
            after=class_source(
                _IMPL_HEADER,
                """
            def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                num_actual_tokens = attn_metadata.num_actual_tokens
                output = output[:num_actual_tokens]
                output.copy_(query[:num_actual_tokens])
                return output
            """,
            ),
            findings=(Status.FIXED,),
        ),
        Example(
            "the parameter replaced before the assert stays",
            class_source(
                _IMPL_HEADER,
                """
            def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                if attn_metadata is None:
                    output = self.fallback(query)
                assert output is not None
                return output
            """,
            ),
        ),
        Example(
            "a function set onto vLLM's Attention with setattr is one of its methods",
            """\
            from vllm.model_executor.layers.attention import Attention


            def forward_impl(self, query, key, value, output=None):
                assert output is not None
                return self.impl.forward(self, query, key, value, None, None, output)


            setattr(Attention, "forward_impl", forward_impl)
            """,
            after="""\
            from vllm.model_executor.layers.attention import Attention


            def forward_impl(self, query, key, value, output=None):
                return self.impl.forward(self, query, key, value, None, None, output)


            setattr(Attention, "forward_impl", forward_impl)
            """,
            findings=(Status.FIXED,),
        ),
        Example(
            "a combined condition is reported",
            class_source(
                _IMPL_HEADER,
                """
            def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                assert output is not None and output.is_contiguous()
                output.copy_(query)
            """,
            ),
            findings=(Status.MANUAL,),
        ),
        Example(
            "in a methods class a decorator builds a vLLM impl of, with type(), the assert is reported",
            """\
            from vllm.v1.attention.backend import AttentionImpl


            def tt_impl(cls):
                return type(cls.__name__, (AttentionImpl,), dict(vars(cls)))


            @tt_impl
            class TTImpl:
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    assert output is not None
                    output.copy_(query)
            """,
            findings=(Status.MANUAL,),
        ),
        Example(
            "a plugin's own layer asserting the output its own op passes is reported",
            """\
            from torch import nn
            from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase


            class PluginMLALayer(nn.Module, AttentionLayerBase):
                def forward_impl(self, q, kv_c_normed, k_pe, kv_cache, attn_metadata=None, output=None):
                    assert output is not None, "Output tensor must be provided."
                    return self.impl.forward(q, kv_c_normed, k_pe, kv_cache, attn_metadata, output)
            """,
            findings=(Status.MANUAL,),
        ),
    )

    def visit_Assert(self, node: cst.Assert) -> None:
        from vllm_attn_compat.codemods.engine import patterns

        method = self.ctx.output_method()
        if not patterns.contains_none_test(node.test):
            return
        if method is None:
            layer = self.ctx.layer_output_method()
            if layer is not None and self.ctx.output_still_parameter(layer):
                self.ctx.report(self, node, _IN_A_LAYER)
            return
        exact = patterns.none_test(node.test) == "is not"
        if exact and self.ctx.output_still_parameter(method):
            message = "`assert output is not None` is always true: vLLM >= 0.20 always passes the output buffer"
            self.ctx.report_unless_withheld(self, node, method, message, RemoveStatement(node))
        elif patterns.none_test(node.test) is None:
            self.ctx.report(
                self,
                node,
                "this assert tests `output` against None, which vLLM >= 0.20 never passes; "
                "drop that part of the condition",
            )
