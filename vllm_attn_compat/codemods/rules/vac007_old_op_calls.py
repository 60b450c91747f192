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
    """Take ``op`` out of a ``from vllm... import`` line and import it from the compat module."""

    def build(line, sink):
        from collections import Counter

        import libcst as cst

        from vllm_attn_compat.codemods.apply import inner_comments

        if isinstance(line, cst.FlattenSentinel):  # another old name of this line moved first
            nodes = list(line.nodes)
            for index, node in enumerate(nodes):
                if any(alias.name.value == op for alias in node.body[0].names):
                    nodes[index : index + 1] = build(node, sink).nodes
            return cst.FlattenSentinel(nodes)
        statement = line.body[0]
        names = list(statement.names)
        moved = [alias for alias in names if alias.name.value == op]
        kept = [alias for alias in names if alias.name.value != op]
        new_import = cst.ImportFrom(
            module=cst.parse_expression(COMPAT_MODULE),
            names=[moved[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)],
        )
        if not kept:
            return cst.FlattenSentinel([line.with_changes(body=[new_import])])
        if names[-1] is moved[-1]:
            kept[-1] = kept[-1].with_changes(comma=names[-1].comma)
        new_line = line.with_changes(body=[statement.with_changes(names=kept)])
        lost = Counter(c.value for c in inner_comments(line)) - Counter(c.value for c in inner_comments(new_line))
        sink.removed.extend(lost.elements())
        return cst.FlattenSentinel([new_line, cst.SimpleStatementLine(body=[new_import])])

    return build
