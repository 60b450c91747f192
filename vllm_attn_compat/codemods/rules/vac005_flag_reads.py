"""VAC005: reads of ``accept_output_buffer`` and of the layer's ``use_output``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeGuard

from vllm_attn_compat.codemods.engine.edits import CommentSink, Edit, RemoveStatement, Replace
from vllm_attn_compat.codemods.engine.rule import Example, Rule, class_source
from vllm_attn_compat.codemods.findings import FixSafety, Status

if TYPE_CHECKING:
    import libcst as cst

FLAGS = ("accept_output_buffer", "use_output")

_HEADER = """\
    from vllm.model_executor.layers.attention import Attention


    class MyAttention(Attention):
"""


def _comments(nodes: Iterable[cst.CSTNode]) -> Counter[str]:
    """The text of every comment in ``nodes`` (``libcst`` nodes or ``EmptyLine``s), their own leading lines included."""
    import libcst as cst

    from vllm_attn_compat.codemods.engine.walk import walk

    found: Counter[str] = Counter()

    def visit(child: cst.CSTNode) -> bool:
        if isinstance(child, cst.Comment):
            found[child.value] += 1
        return True

    for node in nodes:
        walk(node, visit, lambda child: None)
    return found


def _true_branch(node: cst.If, sink: CommentSink) -> cst.FlattenSentinel[cst.BaseStatement]:
    """Statements that replace ``if <flag>: A else: B``: A, its comments kept, B's declared removed."""
    import libcst as cst

    from vllm_attn_compat.codemods.engine.apply import comment_line, leading_lines

    body = node.body
    footer: list[cst.EmptyLine] = []
    statements: list[cst.BaseStatement]
    if isinstance(body, cst.SimpleStatementSuite):
        statements = [cst.SimpleStatementLine(body=body.body, trailing_whitespace=body.trailing_whitespace)]
        header = []
    else:
        assert isinstance(body, cst.IndentedBlock), type(body)  # the other kind of suite
        statements = list(body.body)
        header = [comment_line(body.header.comment)] if body.header.comment else []
        footer = list(body.footer)  # comments closing A: they follow its last statement
    first = statements[0]
    statements[0] = first.with_changes(leading_lines=[*node.leading_lines, *header, *leading_lines(first)])
    if any(line.comment for line in footer):
        sink.place_after(statements[-1], footer)
    sink.removed.extend((_comments([node]) - _comments([*statements, *footer])).elements())
    return cst.FlattenSentinel(statements)


def _else_branch(node: cst.If, sink: CommentSink) -> cst.If | cst.FlattenSentinel[cst.BaseStatement]:
    """``if not <flag>: A else: B`` -> B; ``elif`` chains become an ``if``."""
    import libcst as cst

    orelse = node.orelse
    assert orelse is not None, "the rule replaces only an `if not <flag>` that has an else branch"
    if isinstance(orelse, cst.If):
        new_if = orelse.with_changes(leading_lines=node.leading_lines)
        sink.removed.extend((_comments([node]) - _comments([new_if])).elements())
        return new_if
    return _true_branch(cst.If(test=node.test, body=orelse.body, leading_lines=node.leading_lines), sink)


_EXITS = ("Return", "Raise", "Continue", "Break")


def always_exits(body: cst.BaseSuite) -> bool:
    """Whether a block (``IndentedBlock`` or one-line suite) never falls through to what follows it:
    it ends in ``return``/``raise``/``continue``/``break``, or in an ``if`` all of whose branches do."""
    import libcst as cst

    statements = body.body
    if not statements:
        return False
    last = statements[-1]
    if isinstance(body, cst.SimpleStatementSuite):
        return type(last).__name__ in _EXITS
    if isinstance(last, cst.SimpleStatementLine):
        return type(last.body[-1]).__name__ in _EXITS
    if isinstance(last, cst.If):
        return _if_always_exits(last)
    return False


def _if_always_exits(node: cst.If) -> bool:
    import libcst as cst

    if node.orelse is None or not always_exits(node.body):
        return False
    orelse = node.orelse
    return _if_always_exits(orelse) if isinstance(orelse, cst.If) else always_exits(orelse.body)


def unreachable_after(statement: cst.CSTNode, block: cst.IndentedBlock | cst.Module) -> list[RemoveStatement]:
    """Edits removing the statements of ``block`` that follow ``statement``, with the comment block
    directly above each and the comments inside (they described the old path); comments further up stay."""
    import libcst as cst

    index = next(i for i, s in enumerate(block.body) if s is statement)
    edits: list[RemoveStatement] = []
    for following in block.body[index + 1 :]:
        if isinstance(following, cst.SimpleStatementLine):
            edits += [RemoveStatement(small, drop_comment_block=True) for small in following.body]
        else:
            edits.append(RemoveStatement(following, drop_comment_block=True))
    return edits


class FlagReads(Rule):
    """vLLM 0.20 removed ``AttentionBackend.accept_output_buffer`` and ``Attention.use_output``:
    reading them raises ``AttributeError`` on a backend or layer that no longer defines them,
    and every backend now writes into the buffer, so a read means "true". Reads are reported
    inside attention classes and in modules that import vLLM (``x.accept_output_buffer``,
    ``self.use_output``, ``getattr(x, "accept_output_buffer", False)``, ``hasattr(...)``); other
    projects' attributes of the same name are left alone. As an unsafe fix, an ``if`` whose
    whole condition is such a read is replaced by its true branch (``if not <read>`` by its else
    branch, or removed), and the comments of the branch that goes go with it. When the kept
    branch always exits (``return``, ``raise``, ``continue``, ``break``), what followed the ``if``
    ran only on the old path: it is deleted too, with the comment block above it. A conditional
    expression on the read becomes its part that runs, and the layer's copy of the flag
    (``self.use_output = self.attn_backend.accept_output_buffer``) is deleted, as upstream did.
    A read combined with other conditions is reported only.
    """

    code = "VAC005"
    name = "output-flag-reads"
    summary = "Report reads of `accept_output_buffer` / `use_output`; unsafe fix: keep only the true branch."
    fix_safety = FixSafety.UNSAFE
    since = fix_requires = "0.20.0"  # the release that made the output buffer mandatory
    # The quoted name matters only as getattr's second argument: a bare "use_output" string appears in
    # unrelated code (torch's own export serializer), and every file it matches costs a libcst parse.
    tokens = (
        b"accept_output_buffer",
        b".use_output",
        b', "use_output"',
        b", 'use_output'",
        b',"use_output"',
        b",'use_output'",
    )
    scoped = False
    examples = (
        Example(
            "a layer branching on use_output",
            class_source(
                _HEADER,
                """
                def forward(self, query, key, value):
                    if self.use_output:
                        output = self.allocate(query)
                        self.impl.forward(self, query, key, value, output=output)
                    else:
                        output = self.impl.forward(self, query, key, value)
                    return output
                """,
            ),
            unsafe_after=class_source(
                _HEADER,
                """
                def forward(self, query, key, value):
                    output = self.allocate(query)
                    self.impl.forward(self, query, key, value, output=output)
                    return output
                """,
            ),
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "hasattr tests for the old API: on vLLM >= 0.20 it is false, so the else branch stays",
            class_source(
                _HEADER,
                """
                def forward(self, query, key, value, output):
                    if hasattr(self.attn_backend, "accept_output_buffer"):
                        # vLLM <= 0.19: the backend may return its result.
                        return self.legacy_forward(query, key, value)
                    else:
                        self.impl.forward(self, query, key, value, output=output)
                        return output
                """,
            ),
            unsafe_after=class_source(
                _HEADER,
                """
                def forward(self, query, key, value, output):
                    self.impl.forward(self, query, key, value, output=output)
                    return output
                """,
            ),
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "a guard without else that returns, followed by the old path: the old path goes",
            class_source(
                _HEADER,
                """
                def forward(self, q, kv_c_normed, k_pe, output_shape=None):
                    if self.attn_backend.accept_output_buffer:
                        output = torch.empty(output_shape, dtype=q.dtype, device=q.device)
                        torch.ops.vllm.unified_mla_attention_with_output(q, kv_c_normed, k_pe, output, self.layer_name)
                        return output

                    # Legacy backends return a new tensor.
                    return torch.ops.vllm.unified_mla_attention(q, kv_c_normed, k_pe, self.layer_name)
                """,
            ),
            unsafe_after=class_source(
                _HEADER,
                """
                def forward(self, q, kv_c_normed, k_pe, output_shape=None):
                    output = torch.empty(output_shape, dtype=q.dtype, device=q.device)
                    torch.ops.vllm.unified_mla_attention_with_output(q, kv_c_normed, k_pe, output, self.layer_name)
                    return output
                """,
            ),
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "an else branch opening with comments, as forks write it: they go with the branch",
            class_source(
                _HEADER,
                """
                def forward(self, query, key, value):
                    # The layer allocates the output when the backend accepts it.
                    if self.use_output:
                        output = self.allocate(query)
                        self.impl.forward(self, query, key, value, output=output)
                        return output
                    # Backends without an output buffer
                    else:
                        # NOTE(fork): our legacy kernels return their result;
                        # keep this path until they are ported.
                        return self.impl.forward(self, query, key, value)
                """,
            ),
            unsafe_after=class_source(
                _HEADER,
                """
                def forward(self, query, key, value):
                    # The layer allocates the output when the backend accepts it.
                    output = self.allocate(query)
                    self.impl.forward(self, query, key, value, output=output)
                    return output
                """,
            ),
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "the layer's copy of the flag, and a conditional expression",
            class_source(
                _HEADER,
                """
                def __init__(self, backend):
                    self.attn_backend = backend
                    self.use_output = self.attn_backend.accept_output_buffer

                def views(self, query):
                    return query.view(-1, self.num_heads, self.head_size) if self.use_output else query
                """,
            ),
            unsafe_after=class_source(
                _HEADER,
                """
                def __init__(self, backend):
                    self.attn_backend = backend

                def views(self, query):
                    return query.view(-1, self.num_heads, self.head_size)
                """,
            ),
            findings=(Status.UNSAFE_FIX_AVAILABLE, Status.UNSAFE_FIX_AVAILABLE),
        ),
        Example(
            "getattr on a backend class, combined with another condition",
            """\
            import vllm.envs


            def can_capture(backend_cls, piecewise):
                return piecewise and getattr(backend_cls, "accept_output_buffer", False)
            """,
            findings=(Status.MANUAL,),
        ),
        Example(
            "an unrelated project's flag stays",
            """\
            class Pipeline:
                def run(self, stage):
                    if stage.use_output:
                        return stage.output
            """,
        ),
    )

    def _in_scope(self) -> bool:
        return self.ctx.attention_class() is not None or self.ctx.imports_vllm

    def visit_Attribute(self, node: cst.Attribute) -> None:
        import libcst as cst

        if node.attr.value not in FLAGS or not self._in_scope():
            return
        parent = self.ctx.parent()
        written = (
            isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)) and parent.target is node
        ) or isinstance(parent, cst.Del)
        if not written:
            self._report_read(node, node.attr.value)

    def visit_Call(self, node: cst.Call) -> None:
        import libcst as cst

        from vllm_attn_compat.codemods.engine.patterns import is_name

        if not (isinstance(node.func, cst.Name) and node.func.value in ("getattr", "hasattr")):
            return
        if len(node.args) < 2 or not isinstance(node.args[1].value, cst.SimpleString):
            return
        flag = node.args[1].value.evaluated_value
        if flag in FLAGS and self._in_scope() and not is_name(node.func, "setattr"):
            self._report_read(node, flag, tests_presence=node.func.value == "hasattr")

    def _report_read(self, read: cst.CSTNode, flag: str, *, tests_presence: bool = False) -> None:
        """``tests_presence``: ``hasattr(x, flag)`` asks whether this is vLLM <= 0.19, which had the flag; on
        vLLM >= 0.20 (once VAC004 removed the stale declarations) it is false, so the other branch runs."""
        import libcst as cst

        what = "`AttentionBackend.accept_output_buffer`" if flag == "accept_output_buffer" else "`Attention.use_output`"
        if tests_presence:
            message = f"{what} was removed in vLLM 0.20: `hasattr` on it is false where no class declares it"
        else:
            message = (
                f"{what} was removed in vLLM 0.20: where no class declares it, this read raises AttributeError "
                "(`getattr`: its default)"
            )
        parent = self.ctx.parent()
        negated = isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not)
        # Which branch runs on vLLM >= 0.20: the false one for `not <read>` and for a bare presence test.
        runs_false = negated != tests_presence
        condition = parent if negated else read
        statement = self.ctx.parent(2 if negated else 1)
        block = self.ctx.parent(3 if negated else 2)
        fixed = message + " (unsafe fix: keep the branch vLLM >= 0.20 takes)"
        if isinstance(statement, cst.IfExp) and statement.test is condition:
            self.ctx.report(self, read, fixed, Replace(statement, _kept_expression(runs_false)))
            return
        if not tests_presence and _stores_flag(statement, condition):
            line = self.ctx.parent(3 if negated else 2)
            if isinstance(line, cst.SimpleStatementLine):
                edit = RemoveStatement(statement, drop_comment_block=True)
                self.ctx.report(self, read, message + " (unsafe fix: delete this copy of the flag)", edit)
                return
        if not (
            isinstance(statement, cst.If)
            and statement.test is condition
            and isinstance(block, (cst.IndentedBlock, cst.Module))  # not an `elif`
        ):
            self.ctx.report(self, read, message + ": simplify the code using it")
            return
        orelse = statement.orelse
        edits: list[Edit]
        if not runs_false:
            edits = [Replace(statement, _true_branch)]
            exits = always_exits(statement.body)
        elif orelse is None:
            edits, exits = [RemoveStatement(statement)], False
        else:
            edits = [Replace(statement, _else_branch)]
            exits = _if_always_exits(orelse) if isinstance(orelse, cst.If) else always_exits(orelse.body)
        if exits:  # what followed the `if` ran only when the flag was false: it is dead now
            edits += unreachable_after(statement, block)
        self.ctx.report(self, read, fixed, *edits)


def _stores_flag(statement: cst.CSTNode | None, value: cst.CSTNode | None) -> TypeGuard[cst.Assign]:
    """``x.use_output = <read>``: a copy of the flag under one of its own names (vLLM's layer kept one)."""
    import libcst as cst

    return (
        isinstance(statement, cst.Assign)
        and statement.value is value
        and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, cst.Attribute)
        and statement.targets[0].target.attr.value in FLAGS
    )


def _kept_expression(negated: bool) -> Callable[[cst.IfExp, CommentSink], cst.BaseExpression]:
    """``a if <flag> else b`` -> ``a`` (``b`` when negated); parentheses kept only around several lines."""

    def build(node: cst.IfExp, sink: CommentSink) -> cst.BaseExpression:
        import libcst as cst

        kept = node.orelse if negated else node.body
        if node.lpar and "\n" in cst.Module([]).code_for_node(kept):
            kept = kept.with_changes(lpar=[*node.lpar, *kept.lpar], rpar=[*kept.rpar, *node.rpar])
        sink.removed.extend((_comments([node]) - _comments([kept])).elements())
        return kept

    return build
