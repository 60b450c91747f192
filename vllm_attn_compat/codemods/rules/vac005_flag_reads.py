"""VAC005: reads of ``accept_output_buffer`` and of the layer's ``use_output``."""

from __future__ import annotations

from vllm_attn_compat.codemods.edits import RemoveStatement, Replace
from vllm_attn_compat.codemods.findings import FixSafety, Status
from vllm_attn_compat.codemods.rule import Example, Rule, class_source

FLAGS = ("accept_output_buffer", "use_output")

_HEADER = """\
    from vllm.model_executor.layers.attention import Attention


    class MyAttention(Attention):
"""


def _true_branch(node, sink):
    """Statements that replace ``if <flag>: A else: B``: A (its comments kept, B's declared)."""
    from collections import Counter

    import libcst as cst

    from vllm_attn_compat.codemods.apply import comment_line, inner_comments

    body = node.body
    footer: list = []
    if isinstance(body, cst.SimpleStatementSuite):
        statements = [cst.SimpleStatementLine(body=body.body, trailing_whitespace=body.trailing_whitespace)]
        header = []
    else:
        statements = list(body.body)
        header = [comment_line(body.header.comment)] if body.header.comment else []
        footer = list(body.footer)  # comments closing A: they follow its last statement
    first = statements[0]
    statements[0] = first.with_changes(leading_lines=[*node.leading_lines, *header, *first.leading_lines])
    if any(line.comment for line in footer):
        sink.place_after(statements[-1], footer)
    lost = Counter(c.value for c in inner_comments(node)) - Counter(
        c.value for s in statements for c in inner_comments(s.with_changes(leading_lines=()))
    ) - Counter(line.comment.value for line in [*statements[0].leading_lines, *footer] if line.comment)
    sink.removed.extend(lost.elements())
    return cst.FlattenSentinel(statements)


def _else_branch(node, sink):
    """``if not <flag>: A else: B`` -> B; ``elif`` chains become an ``if``."""
    import libcst as cst

    orelse = node.orelse
    if isinstance(orelse, cst.If):
        new_if = orelse.with_changes(leading_lines=node.leading_lines)
        return _declare_lost(node, new_if, sink)
    return _true_branch(cst.If(test=node.test, body=orelse.body, leading_lines=node.leading_lines), sink)


def _declare_lost(old, new, sink):
    from collections import Counter

    from vllm_attn_compat.codemods.apply import inner_comments

    lost = Counter(c.value for c in inner_comments(old)) - Counter(c.value for c in inner_comments(new))
    sink.removed.extend(lost.elements())
    return new


class FlagReads(Rule):
    """vLLM 0.20 removed ``AttentionBackend.accept_output_buffer`` and ``Attention.use_output``:
    reading them raises ``AttributeError`` on a backend or layer that no longer defines them,
    and every backend now writes into the buffer, so a read means "true". Reads are reported
    inside attention classes and in modules that import vLLM (``x.accept_output_buffer``,
    ``self.use_output``, ``getattr(x, "accept_output_buffer", False)``, ``hasattr(...)``); other
    projects' attributes of the same name are left alone. As an unsafe fix, an ``if`` whose
    whole condition is such a read is replaced by its true branch (``if not <read>`` by its else
    branch, or removed). A read combined with other conditions is reported only.
    """

    code = "VAC005"
    name = "output-flag-reads"
    summary = "Report reads of `accept_output_buffer` / `use_output`; unsafe fix: keep only the true branch."
    fix_safety = FixSafety.UNSAFE
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

    def visit_Attribute(self, node) -> None:
        import libcst as cst

        if node.attr.value not in FLAGS or not self._in_scope():
            return
        parent = self.ctx.parent()
        written = (
            isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)) and parent.target is node
        ) or isinstance(parent, cst.Del)
        if not written:
            self._report_read(node, node.attr.value)

    def visit_Call(self, node) -> None:
        import libcst as cst

        from vllm_attn_compat.codemods.patterns import is_name

        if not (isinstance(node.func, cst.Name) and node.func.value in ("getattr", "hasattr")):
            return
        if len(node.args) < 2 or not isinstance(node.args[1].value, cst.SimpleString):
            return
        flag = node.args[1].value.evaluated_value
        if flag in FLAGS and self._in_scope() and not is_name(node.func, "setattr"):
            self._report_read(node, flag)

    def _report_read(self, read, flag: str) -> None:
        import libcst as cst

        what = "`AttentionBackend.accept_output_buffer`" if flag == "accept_output_buffer" else "`Attention.use_output`"
        message = (
            f"{what} was removed in vLLM 0.20 (reading it raises AttributeError); every backend now "
            "writes into the output buffer, so this read is always true"
        )
        parent = self.ctx.parent()
        negated = isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not)
        condition = parent if negated else read
        statement = self.ctx.parent(2 if negated else 1)
        block = self.ctx.parent(3 if negated else 2)
        if not (
            isinstance(statement, cst.If)
            and statement.test is condition
            and isinstance(block, (cst.IndentedBlock, cst.Module))  # not an `elif`
        ):
            self.ctx.report(self, read, message + ": simplify the code that uses it")
            return
        if not negated:
            edit = Replace(statement, _true_branch)
        elif statement.orelse is None:
            edit = RemoveStatement(statement)
        else:
            edit = Replace(statement, _else_branch)
        self.ctx.report(self, read, message + "; the unsafe fix keeps only the branch that runs", edit)
