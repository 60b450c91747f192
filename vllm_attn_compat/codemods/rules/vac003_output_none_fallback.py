"""VAC003: dead ``if output is None`` fallbacks in attention methods."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.engine.edits import RemoveStatement
from vllm_attn_compat.codemods.engine.rule import Example, Rule, class_source, narrowed_to_methods
from vllm_attn_compat.codemods.findings import FixSafety, Status

if TYPE_CHECKING:
    import libcst as cst

    from vllm_attn_compat.codemods.engine.scope import FunctionFrame

_HEADER = """\
    import torch
    from vllm.v1.attention.backend import AttentionImpl


    class MyImpl(AttentionImpl):
"""


def _is_allocation_fallback(node: cst.If) -> bool:
    """``if output is None: output = <allocation call>`` with no other statement and no else."""
    import libcst as cst

    from vllm_attn_compat.codemods.engine.patterns import ALLOCATORS, is_name, none_test
    from vllm_attn_compat.codemods.engine.scope import dotted_name

    if none_test(node.test) != "is" or node.orelse is not None:
        return False
    if isinstance(node.body, cst.SimpleStatementSuite):
        smalls = node.body.body
    elif len(node.body.body) == 1 and isinstance(node.body.body[0], cst.SimpleStatementLine):
        smalls = node.body.body[0].body
    else:
        return False
    if len(smalls) != 1 or not isinstance(smalls[0], cst.Assign) or len(smalls[0].targets) != 1:
        return False
    assign = smalls[0]
    if not is_name(assign.targets[0].target, "output") or not isinstance(assign.value, cst.Call):
        return False
    func = dotted_name(assign.value.func) or ""
    return func.rpartition(".")[2] in ALLOCATORS


def _at_method_start(method_body: cst.BaseSuite, node: cst.CSTNode) -> bool:
    """Only a docstring, asserts or ``pass`` come before ``node`` in the method body."""
    import libcst as cst

    from vllm_attn_compat.codemods.engine.patterns import is_docstring

    for statement in method_body.body:
        if statement is node:
            return True
        if is_docstring(statement):
            continue
        if isinstance(statement, cst.SimpleStatementLine) and all(
            isinstance(small, (cst.Assert, cst.Pass)) for small in statement.body
        ):
            continue
        return False
    return False


def _raises(node: cst.If) -> bool:
    """Whether the branch of ``node`` opens with a ``raise``."""
    import libcst as cst

    body = node.body
    first = body.body[0] if isinstance(body, cst.IndentedBlock) and body.body else body
    statements = first.body if isinstance(first, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else ()
    return bool(statements) and isinstance(statements[0], cst.Raise)


_IN_A_LAYER = (
    "tests a layer's own `output`: vLLM >= 0.20's layers allocate the buffer they pass on; check who passes this "
    "one (no fix)"
)


class OutputNoneFallback(Rule):
    """Old backends guarded against being called without a buffer with
    ``if output is None: output = torch.empty(...)``. vLLM >= 0.20 always passes ``output``, so
    such a fallback at the start of an attention method is dead code and goes. Anything else that
    tests ``output`` against None there (a fallback further down, one with other statements, an
    ``else``, ``output is not None`` in a condition) is reported for a person to simplify, and so is a
    method that refuses the buffer (``assert output is None``, ``if output is not None: raise ...``, before
    any assignment to ``output``): it fails whenever it is given one. Only the ``output`` parameter counts: a test
    that no assignment to ``output`` may run before tests it, whatever the method assigns to the name afterwards
    (``output = output.view(...)``); a test after one may test the local, and is never touched, nor is a function
    without such a parameter.
    Deleting a fallback is safe only while every use of the method in the run passes a buffer: a value that
    cannot be None (a fresh tensor, a required parameter, a slice or view of one). A call without ``output``, with
    ``output=None`` or with a value that may be None (``self.buffer``, a field defaulting to None), the method
    handed on as a value, and every use that withholds VAC002's fix (see there) withhold it (unsafe); the finding
    names the first.
    """

    code = "VAC003"
    name = "output-none-fallback"
    summary = "Remove dead `if output is None: output = torch.empty(...)` fallbacks; report other None tests."
    fix_safety = FixSafety.SAFE
    since = fix_requires = "0.20.0"  # the release that made the output buffer mandatory
    tokens = (b"output is None", b"output is not None")
    # Of a method's body: the statements naming `output` (its bindings, its None tests), and the asserts,
    # `pass` and docstrings that may come before the code it looks at.
    reads_statements = (b"output",)

    # It acts in the methods taking `output` of attention classes and layers (`buffer_methods`): a file whose
    # index shows none needs no parse.
    narrows = True
    acts_in = narrowed_to_methods("buffer", "layer")

    examples = (
        Example(
            "a fallback allocation at the start of forward",
            class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    if output is None:
                        output = torch.empty_like(query)

                    output.copy_(query)
                    return output
                """,
            ),
            after=class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    output.copy_(query)
                    return output
                """,
            ),
            findings=(Status.FIXED,),
        ),
        Example(
            "a fallback the run relies on stays (unsafe), the finding naming the call",
            class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    if output is None:
                        output = torch.empty_like(query)
                    output.copy_(query)
                    return output

                def warm_up(self, query):
                    return self.forward(None, query, query, query, None, None)
                """,
            ),
            unsafe_after=class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    output.copy_(query)
                    return output

                def warm_up(self, query):
                    return self.forward(None, query, query, query, None, None)
                """,
            ),
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "a fallback opening a method that reshapes the buffer afterwards goes too",
            class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    if output is None:
                        output = torch.empty_like(query)
                    output = output.view(-1, query.shape[-1])
                    output.copy_(query.view(-1, query.shape[-1]))
                    return output
                """,
            ),
            after=class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    output = output.view(-1, query.shape[-1])
                    output.copy_(query.view(-1, query.shape[-1]))
                    return output
                """,
            ),
            findings=(Status.FIXED,),
        ),
        Example(
            "a fallback that returns a new tensor is reported",
            class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    result = self.kernel(query, key, value)
                    if output is None:
                        return result
                    output.copy_(result)
                    return output
                """,
            ),
            findings=(Status.MANUAL,),
        ),
        Example(
            "a method that refuses the buffer is reported: it fails whenever it is given one",
            class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    assert output is None, "this backend returns a new tensor"
                    return self.kernel(query, key, value)

                def prefill(self, query, output=None):
                    if output is not None:
                        raise NotImplementedError("output buffers are not supported")
                    return self.kernel(query, query, query)
                """,
            ),
            findings=(Status.MANUAL, Status.MANUAL),
        ),
        Example(
            "a local variable named output stays",
            class_source(
                _HEADER,
                """
                def prefill(self, query):
                    output = self.cache.get(query)
                    if output is None:
                        output = torch.empty_like(query)
                    return output
                """,
            ),
        ),
        Example(
            "a layer's method testing the layer's own output is reported",
            """\
            from vllm.model_executor.layers.attention import MLAAttention


            class PluginMLA(MLAAttention):
                def forward(self, q, kv_c_normed, k_pe, output=None, **kwargs):
                    if output is None:
                        output = self.allocate(q)
                    return self.compute(q, kv_c_normed, k_pe, output)
            """,
            findings=(Status.MANUAL,),
        ),
    )

    def visit_Comparison(self, node: cst.Comparison) -> None:
        import libcst as cst

        from vllm_attn_compat.codemods.engine.patterns import none_test, rebinds_outside_none_guards

        method = self.ctx.output_method()
        kind = none_test(node)
        if kind is None:
            return
        if method is None:
            layer = self.ctx.layer_output_method()
            in_assert = any(isinstance(ancestor, cst.Assert) for ancestor in self.ctx.stack)
            if layer is not None and not in_assert and self.ctx.output_still_parameter(layer):
                self.ctx.report(self, node, f"`output {kind} None` {_IN_A_LAYER}")
            return
        parent = self.ctx.parent()
        asserted = isinstance(parent, cst.Assert) and parent.test is node
        raising = kind == "is not" and isinstance(parent, cst.If) and parent.test is node and _raises(parent)
        if (asserted and kind == "is") or raising:
            self._refused(node, method, asserted)
            return
        if any(isinstance(ancestor, cst.Assert) for ancestor in self.ctx.stack):
            return  # `assert output is not None` is VAC001's
        fallback = (
            parent if isinstance(parent, cst.If) and parent.test is node and _is_allocation_fallback(parent) else None
        )
        if rebinds_outside_none_guards(method.node, "output") and not self.ctx.output_still_parameter(method):
            return  # `output` is (also) a local variable, assigned before the test may run: it may test that
        body = method.node.body
        if (
            fallback is not None
            and self.ctx.parent(2) is body
            and isinstance(body, cst.BaseSuite)  # always, once it holds the fallback (a lambda's is an expression)
            and _at_method_start(body, fallback)
        ):
            message = "this fallback is dead: vLLM >= 0.20 always passes the output buffer"
            self.ctx.report_unless_withheld(self, node, method, message, RemoveStatement(fallback))
            return
        truth = "never true" if kind == "is" else "always true"
        message = (
            f"`output {kind} None` is {truth}: vLLM >= 0.20 always passes the output buffer; "
            "remove the code that handles a missing buffer"
        )
        uses = self.ctx.uses_passing_no_buffer(method)
        self.ctx.report(self, node, message if uses is None else f"{message} {uses}")

    def _refused(self, node: cst.Comparison, method: FunctionFrame, asserted: bool) -> None:
        """``assert output is None`` or ``if output is not None: raise ...``: where ``output`` is still the
        parameter (no assignment may run before, as for VAC001's assert), the method fails whenever it is given a
        buffer, and vLLM >= 0.20 gives one to every call it makes."""
        if not self.ctx.output_still_parameter(method):
            return
        test = "`assert output is None` fails" if asserted else "the `raise` under `if output is not None` runs"
        message = f"{test} whenever a buffer is passed, as vLLM >= 0.20 always does: write into `output` instead"
        self.ctx.report(self, node, message)
