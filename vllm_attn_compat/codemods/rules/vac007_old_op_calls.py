"""VAC007: calls of the deleted ops and imports of their Python functions."""

from __future__ import annotations

from vllm_attn_compat.codemods.edits import AddImport, Replace
from vllm_attn_compat.codemods.findings import FixSafety, Status
from vllm_attn_compat.codemods.rule import Example, Rule

_OLD_OPS = ("unified_attention", "unified_mla_attention")
_OP_REFERENCES = {
    f"torch.ops.vllm.{op}{suffix}": op for op in _OLD_OPS for suffix in ("", ".default")
}
# Where vLLM (<= 0.19) defined the ops' Python functions. vLLM's Triton kernel
# `vllm.attention.ops.triton_unified_attention.unified_attention` is another function.
OLD_OP_MODULES = frozenset(
    {
        "vllm.attention",
        "vllm.attention.layer",
        "vllm.model_executor.layers.attention",
        "vllm.model_executor.layers.attention.attention",
        "vllm.model_executor.layers.attention.mla_attention",
    }
)
COMPAT_MODULE = "vllm_attn_compat.compat"

_CALL_MESSAGE = (
    "`{ref}` was removed in vLLM 0.20: allocate the output and call `{op}_with_output` "
    "(the unsafe fix calls the deprecated forwarder `vllm_attn_compat.compat.{op}` instead)"
)
_IMPORT_MESSAGE = (
    "`{module}.{op}` was removed in vLLM 0.20: allocate the output and call `{op}_with_output` "
    "(the unsafe fix imports the deprecated forwarder from `vllm_attn_compat.compat` instead)"
)


class OldOpCalls(Rule):
    """vLLM 0.20 deleted ``torch.ops.vllm.unified_attention`` and ``unified_mla_attention`` and
    their Python functions: the replacement, ``*_with_output``, needs an output buffer the
    caller allocates, which a codemod cannot decide for you. So calls of these ops, imports of
    their functions from vLLM's attention modules and calls through those modules
    (``layer_module.unified_attention(...)``) are reported; the unsafe fix routes them to
    this package's deprecated forwarders (``vllm_attn_compat.compat.unified_attention``,
    ``unified_mla_attention``), which allocate the buffer through the layer and call the
    ``_with_output`` op, and warn once per call site. Other functions named
    ``unified_attention`` (vLLM's Triton or AITER kernels, a plugin's own helper) are never
    touched.
    """

    code = "VAC007"
    name = "old-op-calls"
    summary = "Report calls/imports of the deleted `unified_attention` ops; unsafe fix: use the compat forwarder."
    fix_safety = FixSafety.UNSAFE
    tokens = (b"unified_attention", b"unified_mla_attention")
    scoped = False
    examples = (
        Example(
            "a direct call of the op",
            """\
            import torch


            def attend(query, key, value, layer_name):
                return torch.ops.vllm.unified_attention(query, key, value, layer_name)
            """,
            unsafe_after="""\
            import torch
            import vllm_attn_compat.compat


            def attend(query, key, value, layer_name):
                return vllm_attn_compat.compat.unified_attention(query, key, value, layer_name)
            """,
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "an import of the op's function",
            """\
            from vllm.attention.layer import Attention, unified_attention
            """,
            unsafe_after="""\
            from vllm.attention.layer import Attention
            from vllm_attn_compat.compat import unified_attention
            """,
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "both functions from one line: one compat import, in the line's order",
            """\
            from vllm.attention import unified_mla_attention, unified_attention  # the old ops
            """,
            unsafe_after="""\
            from vllm_attn_compat.compat import unified_mla_attention, unified_attention  # the old ops
            """,
            findings=(Status.UNSAFE_FIX_AVAILABLE, Status.UNSAFE_FIX_AVAILABLE),
        ),
        Example(
            "vLLM's Triton kernel of the same name stays",
            """\
            from vllm.attention.ops.triton_unified_attention import unified_attention

            unified_attention(q, k, v, out, cu_seqlens_q=cu)
            """,
        ),
    )

    def visit_Attribute(self, node) -> None:
        import libcst as cst

        from vllm_attn_compat.codemods.scope import dotted_name

        reference = dotted_name(node) or ""
        op = _OP_REFERENCES.get(reference) or self._module_function(reference)
        if op is None:
            return
        parent = self.ctx.parent()
        if isinstance(parent, cst.Attribute) and parent.value is node and dotted_name(parent) in _OP_REFERENCES:
            return  # `.default` of this reference: reported there
        if not (isinstance(parent, cst.Call) and parent.func is node):
            self.ctx.report(
                self,
                node,
                f"`{reference}` was removed in vLLM 0.20; use `torch.ops.vllm.{op}_with_output`",
            )
            return

        def build(updated, sink):
            return cst.parse_expression(f"{COMPAT_MODULE}.{op}")

        self.ctx.report(
            self,
            parent,
            _CALL_MESSAGE.format(ref=reference, op=op),
            Replace(node, build),
            AddImport(COMPAT_MODULE),
        )

    def _module_function(self, reference: str) -> str | None:
        """``op`` for ``layer_module.unified_attention`` where ``layer_module`` is vLLM's module."""
        head, _, rest = reference.partition(".")
        target = self.ctx.imports.get(head)
        if target is None or not rest:
            return None
        module, _, name = f"{target}.{rest}".rpartition(".")
        return name if module in OLD_OP_MODULES and name in _OLD_OPS else None

    def visit_ImportFrom(self, node) -> None:
        import libcst as cst

        from vllm_attn_compat.codemods.scope import dotted_name

        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted_name(node.module)
        if module not in OLD_OP_MODULES:
            return
        old = [alias for alias in node.names if alias.name.value in _OLD_OPS]
        line = self.ctx.parent()
        fixable = isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
        for alias in old:
            message = _IMPORT_MESSAGE.format(module=module, op=alias.name.value)
            if fixable:
                self.ctx.report(self, alias, message, Replace(line, _move_import(alias.name.value)))
            else:
                self.ctx.report(self, alias, message)


def _move_import(op: str):
    """Take ``op`` out of a ``from vllm... import`` line and import it from the compat module.

    The names of one line move one edit at a time (in the line's order), all into one compat import
    placed after what is left of the line; when nothing is left, the compat import takes the line's
    place, its leading comments and its trailing comment."""

    def build(line, sink):
        from collections import Counter

        import libcst as cst

        from vllm_attn_compat.codemods.apply import inner_comments

        nodes = list(line.nodes) if isinstance(line, cst.FlattenSentinel) else [line]
        old = next(index for index, node in enumerate(nodes) if _names(node, op))
        compat = next((index for index, node in enumerate(nodes) if _is_compat_line(node)), None)
        statement = nodes[old].body[0]
        names = list(statement.names)
        moved = [alias.with_changes(comma=cst.MaybeSentinel.DEFAULT) for alias in names if alias.name.value == op]
        kept = [alias for alias in names if alias.name.value != op]
        if compat is None:
            imported: list = []
            compat_line = cst.SimpleStatementLine(body=[])
        else:
            imported = list(nodes[compat].body[0].names)
            compat_line = nodes[compat]
        compat_line = compat_line.with_changes(
            body=[cst.ImportFrom(module=cst.parse_expression(COMPAT_MODULE), names=[*imported, moved[0]])]
        )
        if not kept:  # the compat import takes the line's place
            in_place = nodes[old].with_changes(body=compat_line.body)
            lost = Counter(c.value for c in inner_comments(nodes[old]))
            sink.removed.extend((lost - Counter(c.value for c in inner_comments(in_place))).elements())
            rest = [node for index, node in enumerate(nodes) if index not in (old, compat)]
            return cst.FlattenSentinel([*rest[:old], in_place, *rest[old:]])
        if names[-1].name.value == op:
            kept[-1] = kept[-1].with_changes(comma=names[-1].comma)
        new_line = nodes[old].with_changes(body=[statement.with_changes(names=kept)])
        lost = Counter(c.value for c in inner_comments(nodes[old])) - Counter(c.value for c in inner_comments(new_line))
        sink.removed.extend(lost.elements())
        nodes[old] = new_line
        if compat is None:
            nodes.insert(old + 1, compat_line)
        else:
            nodes[compat] = compat_line
        return cst.FlattenSentinel(nodes)

    return build


def _names(line, op: str) -> bool:
    """Whether ``line`` is a ``from ... import`` line (not the compat one) importing ``op``."""
    import libcst as cst

    if not (isinstance(line, cst.SimpleStatementLine) and isinstance(line.body[0], cst.ImportFrom)):
        return False
    names = line.body[0].names
    if _is_compat_line(line) or isinstance(names, cst.ImportStar):
        return False
    return any(alias.name.value == op for alias in names)


def _is_compat_line(line) -> bool:
    import libcst as cst

    from vllm_attn_compat.codemods.scope import dotted_name

    statement = line.body[0] if isinstance(line, cst.SimpleStatementLine) and line.body else None
    return isinstance(statement, cst.ImportFrom) and statement.module is not None and (
        dotted_name(statement.module) == COMPAT_MODULE
    )
