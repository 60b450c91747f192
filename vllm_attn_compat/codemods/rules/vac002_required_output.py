"""VAC002: make the ``output`` parameter of attention methods required."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.engine.edits import CommentSink, Replace
from vllm_attn_compat.codemods.engine.rule import Example, Rule, class_source, narrowed_to_methods
from vllm_attn_compat.codemods.findings import FixSafety, Status

if TYPE_CHECKING:
    import libcst as cst

_HEADER = """\
    from typing import Optional

    import torch
    from vllm.v1.attention.backend import AttentionImpl


    class MyImpl(AttentionImpl):
"""


def _optional_inner(annotation: cst.BaseExpression) -> cst.BaseExpression | None:
    """The ``X`` of ``Optional[X]``, ``Union[X, None]``, ``X | None`` or ``None | X``; else None."""
    import libcst as cst

    from vllm_attn_compat.codemods.engine.patterns import is_name
    from vllm_attn_compat.codemods.engine.scope import dotted_name

    if isinstance(annotation, cst.BinaryOperation) and isinstance(annotation.operator, cst.BitOr):
        if is_name(annotation.right, "None"):
            return annotation.left
        if is_name(annotation.left, "None"):
            return annotation.right
        return None
    if isinstance(annotation, cst.Subscript):
        kind = (dotted_name(annotation.value) or "").rpartition(".")[2]
        items = [element.slice.value for element in annotation.slice if isinstance(element.slice, cst.Index)]
        if kind == "Optional" and len(items) == 1:
            return items[0]
        if kind == "Union" and len(items) == 2:
            others = [item for item in items if not is_name(item, "None")]
            return others[0] if len(others) == 1 else None
    return None


def _required_annotation(annotation: cst.Annotation | None, fallback: str | None) -> cst.Annotation | None:
    """The annotation without its ``None`` alternative (string annotations stay strings)."""
    import libcst as cst

    if annotation is None:
        return cst.Annotation(annotation=cst.parse_expression(fallback)) if fallback else None
    inner_expression = annotation.annotation
    if isinstance(inner_expression, cst.SimpleString) and "b" not in inner_expression.prefix.lower():
        text = inner_expression.evaluated_value
        assert isinstance(text, str), "not a bytes literal: its prefix has no b"
        try:
            parsed = cst.parse_expression(text)
        except cst.ParserSyntaxError:
            return annotation
        inner = _optional_inner(parsed)
        if inner is None:
            return annotation
        quote = inner_expression.quote
        new_text = cst.Module([]).code_for_node(inner)
        if quote in new_text:
            return annotation
        return annotation.with_changes(
            annotation=inner_expression.with_changes(value=f"{inner_expression.prefix}{quote}{new_text}{quote}")
        )
    inner = _optional_inner(inner_expression)
    return annotation if inner is None else annotation.with_changes(annotation=inner)


class RequiredOutputParameter(Rule):
    """vLLM >= 0.20 declares ``AttentionImpl.forward(..., attn_metadata, output: torch.Tensor,
    ...)``: the buffer is always passed, so an ``output`` parameter defaulting to ``None``
    misdocuments the contract and invites dead fallback code. The parameter becomes required
    and its annotation loses the ``None`` alternative (``Optional[...]``, ``Union[..., None]``,
    ``... | None``, also inside string annotations), keeping the tensor type the code used; an
    unannotated ``output=None`` becomes ``output: torch.Tensor`` (or ``Tensor`` when that is how
    the module imports it; unannotated when it imports neither). When a positional parameter
    before ``output`` has a default, dropping ``= None`` would be a syntax error: the site is
    reported instead, asking for ``output`` keyword-only and required (vLLM passes it by keyword;
    moving it before that parameter would silently rebind the arguments of a call passing both by
    position), and naming the run's uses that change would break: calls that omit ``output`` or pass
    it by position, and the method handed on.

    A safe fix accounts for every use of the method's name in the files the run reads, or is withheld. A
    plugin's own warm-up path, test or subclass may call the method without ``output``
    (``self.prefill(q, q, q)``, ``super().decode(query=q)``, ``impl.forward(layer, q, k, v, kv_cache, md)`` in a
    smoke test), and would raise ``TypeError`` once it is required. So the fix is safe only while every use is
    proven unaffected: a call passing ``output`` (by keyword, or positionally at its place), a use on a receiver
    that cannot be an instance of the class (``self`` of an unrelated class, a module, a literal), the definition
    itself. Anything else withholds it (unsafe): a call omitting ``output`` or passing ``*args``, the method handed
    on as a value (a callback, ``functools.partial(self.prefill)``, ``getattr``, an alias ``run = forward`` in the
    class body, an entry in a dispatch table, a decorator that may register it), reflection that may reach the
    class (``vars()``, ``__dict__``, ``dir()``, ``inspect.getmembers``, ``getattr``/``hasattr``/``setattr`` with
    a computed name), a name a string looks up (``operator.attrgetter``, ``mock.patch``), a doctest, the text of a
    file that does not parse. The finding at the parameter names the first such use (file and line) and how many
    more there are; the uses themselves get no finding of their own.
    """

    code = "VAC002"
    name = "required-output-parameter"
    summary = "Make the `output` parameter of attention methods required: vLLM >= 0.20 always passes it."
    fix_safety = FixSafety.SAFE
    since = fix_requires = "0.20.0"  # the release that made the output buffer mandatory
    tokens = (b"output=None", b"output = None", b"output:", b"output :", b"output =None", b"output= None")
    reads_statements = ()  # the parameter, its annotation and default; callers come from the run's index

    # It acts in the methods vLLM passes the buffer (`buffer_methods`): a file whose index shows none needs no
    # parse.
    narrows = True
    acts_in = narrowed_to_methods("buffer")

    examples = (
        Example(
            "Optional annotation",
            class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata,
                            output: Optional[torch.Tensor] = None,
                            output_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
                    return output
                """,
            ),
            after=class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata,
                            output: torch.Tensor,
                            output_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
                    return output
                """,
            ),
            findings=(Status.FIXED,),
        ),
        Example(
            "unannotated default",
            class_source(
                _HEADER,
                """
                def forward_decode(self, query, output=None):
                    return output
                """,
            ),
            after=class_source(
                _HEADER,
                """
                def forward_decode(self, query, output: torch.Tensor):
                    return output
                """,
            ),
            findings=(Status.FIXED,),
        ),
        Example(
            "a defaulted parameter before output is reported",
            class_source(
                _HEADER,
                """
                def forward(self, query, scale=1.0, output: torch.Tensor | None = None):
                    return output
                """,
            ),
            findings=(Status.MANUAL,),
        ),
        Example(
            "a module-level function patched onto vLLM's MLAAttention is one of its methods "
            "(unsafe: its callers cannot be traced)",
            """\
            import torch
            from vllm.model_executor.layers.attention.mla_attention import MLAAttention


            def _forward_impl(self, q, kv_c_normed, k_pe, kv_cache, attn_metadata, output: torch.Tensor | None = None):
                return self.impl.forward_mqa(q, kv_cache, attn_metadata, self, output)


            MLAAttention.forward_impl = _forward_impl
            """,
            unsafe_after="""\
            import torch
            from vllm.model_executor.layers.attention.mla_attention import MLAAttention


            def _forward_impl(self, q, kv_c_normed, k_pe, kv_cache, attn_metadata, output: torch.Tensor):
                return self.impl.forward_mqa(q, kv_cache, attn_metadata, self, output)


            MLAAttention.forward_impl = _forward_impl
            """,
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "a function patched through a helper onto a class that cannot be resolved is reported",
            """\
            import torch
            from vllm.platforms import current_platform


            def _forward(self, query, key, value, output: torch.Tensor | None = None):
                return self.impl.forward(self, query, key, value, None, None, output)


            def apply_patches(layer_cls):
                patch_method(layer_cls, "forward", _forward)
            """,
            findings=(Status.MANUAL,),
        ),
        Example(
            "a function assigned onto another project's class stays",
            """\
            import torch
            from vllm.platforms import current_platform
            from mylib.layers import Attention


            def _forward(self, query, output: torch.Tensor | None = None):
                return query if output is None else output.copy_(query)


            Attention.forward = _forward
            """,
        ),
        Example(
            "a helper the run calls without output keeps its default (unsafe), the finding naming the call",
            class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    return self.prefill(query, key, value, output)

                def prefill(self, query, key, value, output=None):
                    return output

                def warm_up(self, query):
                    return self.prefill(query, query, query)
                """,
            ),
            after=class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output: torch.Tensor):
                    return self.prefill(query, key, value, output)

                def prefill(self, query, key, value, output=None):
                    return output

                def warm_up(self, query):
                    return self.prefill(query, query, query)
                """,
            ),
            unsafe_after=class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output: torch.Tensor):
                    return self.prefill(query, key, value, output)

                def prefill(self, query, key, value, output: torch.Tensor):
                    return output

                def warm_up(self, query):
                    return self.prefill(query, query, query)
                """,
            ),
            findings=(Status.FIXED, Status.UNSAFE_FIX_AVAILABLE),
        ),
        Example(
            "a subclass calling super() without output",
            """
            from vllm.v1.attention.backend import AttentionImpl


            class BaseImpl(AttentionImpl):
                def decode(self, query, output=None):
                    return query


            class MyImpl(BaseImpl):
                def decode(self, query, output=None):
                    return super().decode(query=query)
            """,
            after="""
            from vllm.v1.attention.backend import AttentionImpl


            class BaseImpl(AttentionImpl):
                def decode(self, query, output=None):
                    return query


            class MyImpl(BaseImpl):
                def decode(self, query, output):
                    return super().decode(query=query)
            """,
            unsafe_after="""
            from vllm.v1.attention.backend import AttentionImpl


            class BaseImpl(AttentionImpl):
                def decode(self, query, output):
                    return query


            class MyImpl(BaseImpl):
                def decode(self, query, output):
                    return super().decode(query=query)
            """,
            findings=(Status.UNSAFE_FIX_AVAILABLE, Status.FIXED),
        ),
        Example(
            "a method handed on as a callback: its callers cannot be checked",
            class_source(
                "    import functools\n" + _HEADER,
                """
                def prefill(self, query, output=None):
                    return output

                def schedule(self, queue):
                    queue.append(functools.partial(self.prefill))
                """,
            ),
            unsafe_after=class_source(
                "    import functools\n" + _HEADER,
                """
                def prefill(self, query, output: torch.Tensor):
                    return output

                def schedule(self, queue):
                    queue.append(functools.partial(self.prefill))
                """,
            ),
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "every call passes output: the fix stays safe",
            class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output: torch.Tensor):
                    self.prefill(query, output)
                    return self.prefill(query, output=output)

                def prefill(self, query, output=None):
                    return output
                """,
            ),
            after=class_source(
                _HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output: torch.Tensor):
                    self.prefill(query, output)
                    return self.prefill(query, output=output)

                def prefill(self, query, output: torch.Tensor):
                    return output
                """,
            ),
            findings=(Status.FIXED,),
        ),
        Example(
            "a required output stays",
            class_source(
                _HEADER,
                """
                def forward(self, query, output: torch.Tensor):
                    return output
                """,
            ),
        ),
    )

    def visit_Param(self, node: cst.Param) -> None:
        from vllm_attn_compat.codemods.engine.patterns import is_name

        method = self.ctx.output_method()
        if method is None or node is not method.param("output") or not is_name(node.default, "None"):
            return
        params = method.node.params
        positional = (*params.posonly_params, *params.params)
        if any(node is param for param in positional):
            before = positional[: [id(p) for p in positional].index(id(node))]
            defaulted = [p.name.value for p in before if p.default is not None]
            if defaulted:
                # Keyword-only, not moved before the defaulted parameter: a move would rebind the arguments of a call
                # passing both by position, silently; vLLM passes `output` by keyword.
                message = (
                    f"`output` follows `{defaulted[-1]}`, which has a default, so `= None` cannot simply go: make it "
                    "keyword-only and required (`*, output: torch.Tensor`)"
                )
                uses = self.ctx.keyword_only_breaks(method)
                self.ctx.report(self, node, message if uses is None else f"{message}; {uses}")
                return
        fallback = self.ctx.tensor_annotation()

        def build(updated: cst.Param, sink: CommentSink) -> cst.Param:
            import libcst as cst

            return updated.with_changes(
                annotation=_required_annotation(updated.annotation, fallback),
                default=None,
                equal=cst.MaybeSentinel.DEFAULT,
            )

        message = "`output` defaults to None, but vLLM >= 0.20 always passes the output buffer: make it required"
        self.ctx.report_unless_withheld(self, node, method, message, Replace(node, build))
