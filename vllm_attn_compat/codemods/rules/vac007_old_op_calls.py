"""VAC007: calls of the deleted ops and imports of their Python functions."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.engine.edits import AddImport, DropUnusedImport, Replace
from vllm_attn_compat.codemods.engine.rule import Example, Rule, narrowed_to
from vllm_attn_compat.codemods.engine.scan import NOT_AFTER_IDENTIFIER, NOT_BEFORE_IDENTIFIER
from vllm_attn_compat.codemods.findings import FixSafety, Status

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import libcst as cst

    from vllm_attn_compat.codemods.engine.edits import CommentSink, Edit
    from vllm_attn_compat.codemods.engine.scope import FunctionFrame

    # What _move_import's builder is given and builds: the import line, or it with the compat import.
    _Lines = cst.SimpleStatementLine | cst.FlattenSentinel[cst.BaseStatement]

_OLD_OPS = ("unified_attention", "unified_mla_attention")
_WHOLE_OP_NAME = re.compile(NOT_AFTER_IDENTIFIER + rb"unified_(?:mla_)?attention" + NOT_BEFORE_IDENTIFIER)
_OP_REFERENCES = {f"torch.ops.vllm.{op}{suffix}": op for op in _OLD_OPS for suffix in ("", ".default")}
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

FORWARDER = "forwarder"  # `old-op-calls`: calls whose shape is unknown go to the deprecated forwarder

_WITH_OUTPUT_MESSAGE = "`{ref}` was removed in vLLM 0.20: allocate the output and call `{op}_with_output` (unsafe fix)"
_MANUAL_MESSAGE = (
    "`{ref}` was removed in vLLM 0.20: allocate the output and call `{op}_with_output` (no fix: the layer's shape is "
    "unknown here)"
)
_CALL_MESSAGE = (
    "`{ref}` was removed in vLLM 0.20: allocate the output and call `{op}_with_output` (unsafe fix: the forwarder)"
)
_IMPORT_MESSAGE = (
    "`{module}.{op}` was removed in vLLM 0.20: call `{op}_with_output` (unsafe fix: import the forwarder instead)"
)
_IMPORT_DROP_MESSAGE = "`{module}.{op}` was removed in vLLM 0.20: call `{op}_with_output` (unsafe fix: drop the import)"


class OldOpCalls(Rule):
    """vLLM 0.20 deleted ``torch.ops.vllm.unified_attention`` and ``unified_mla_attention`` and
    their Python functions; what replaces a call is what vLLM 0.20's own layers do: allocate the
    output, call ``*_with_output`` with it, and use the buffer. Calls of these ops, calls through
    vLLM's attention modules (``layer_module.unified_attention(...)``) and calls of the functions
    imported from there are reported. The unsafe fix writes that form where the layer's output
    shape is known in scope: from a local ``output_shape`` (as upstream's MLA layer), or from the
    layer's ``self.num_heads`` with ``self.head_size_v`` (MLA: ``self.v_head_dim``), named in the
    class or given by deriving from vLLM's ``Attention`` / ``MLAAttention``; the attention layer's
    query, key, value and output are viewed as ``[T, heads, size]`` as upstream does, and the old
    call's value becomes the 2-D buffer, the shape the old op returned. The call must be a whole
    statement (``return``, an assignment to a name, or an expression) and its query a plain name.
    An import of the old functions goes once the fixes leave nothing using it.

    Elsewhere the call is reported for a person to allocate the buffer, unless the run opts in to
    this package's deprecated forwarders (``old-op-calls = "forwarder"`` in
    ``[tool.vllm-attn-compat]``, or ``--old-op-calls=forwarder``): the unsafe fix then calls
    ``vllm_attn_compat.compat.unified_attention`` (``unified_mla_attention``) and imports it
    from there, code that must be migrated again before the package can be dropped. Other
    functions named ``unified_attention`` (vLLM's Triton or AITER kernels, a plugin's own helper)
    are never touched.
    """

    code = "VAC007"
    name = "old-op-calls"
    summary = (
        "Report calls/imports of the deleted `unified_attention` ops; unsafe fix: allocate and call `*_with_output`."
    )
    fix_safety = FixSafety.UNSAFE
    since = fix_requires = "0.20.0"  # the release that made the output buffer mandatory
    tokens = (b"unified_attention", b"unified_mla_attention")
    # Each finding is at the op's name, whole: not at one that merely holds it (`unified_attention_with_output`,
    # `triton_unified_attention`), as most of vLLM's own mentions do.
    narrows = True
    facts, acts_in = narrowed_to(_WHOLE_OP_NAME)

    scoped = False
    # The buffer's shape comes from the `self.` attributes any method of the class uses (`with_output`).
    reads_in_class = (b"num_heads", b"num_kv_heads", b"head_size", b"v_head_dim")
    examples = (
        Example(
            "an attention layer calling the op: allocate, call the with-output op, return the buffer",
            """\
            import torch
            from vllm.model_executor.layers.attention import Attention


            class MyAttention(Attention):
                def forward(self, query, key, value):
                    # the backend returns its result
                    return torch.ops.vllm.unified_attention(query, key, value, self.layer_name)
            """,
            unsafe_after="""\
            import torch
            from vllm.model_executor.layers.attention import Attention


            class MyAttention(Attention):
                def forward(self, query, key, value):
                    # the backend returns its result
                    output = torch.empty(
                        (query.shape[0], self.num_heads * self.head_size_v),
                        dtype=query.dtype,
                        device=query.device,
                    )
                    torch.ops.vllm.unified_attention_with_output(
                        query.view(-1, self.num_heads, self.head_size),
                        key.view(-1, self.num_kv_heads, self.head_size),
                        value.view(-1, self.num_kv_heads, self.head_size_v),
                        output.view(-1, self.num_heads, self.head_size_v),
                        self.layer_name,
                    )
                    return output
            """,
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "a plugin's own layer: its shape from the attributes another of its methods sets",
            """\
            import torch


            class PluginAttention(torch.nn.Module):
                def __init__(self, num_heads, head_size, num_kv_heads, layer_name):
                    super().__init__()
                    self.num_heads = num_heads
                    self.num_kv_heads = num_kv_heads
                    self.head_size = head_size
                    self.head_size_v = head_size
                    self.layer_name = layer_name

                def forward(self, query, key, value):
                    return torch.ops.vllm.unified_attention(query, key, value, self.layer_name)
            """,
            unsafe_after="""\
            import torch


            class PluginAttention(torch.nn.Module):
                def __init__(self, num_heads, head_size, num_kv_heads, layer_name):
                    super().__init__()
                    self.num_heads = num_heads
                    self.num_kv_heads = num_kv_heads
                    self.head_size = head_size
                    self.head_size_v = head_size
                    self.layer_name = layer_name

                def forward(self, query, key, value):
                    output = torch.empty(
                        (query.shape[0], self.num_heads * self.head_size_v),
                        dtype=query.dtype,
                        device=query.device,
                    )
                    torch.ops.vllm.unified_attention_with_output(
                        query.view(-1, self.num_heads, self.head_size),
                        key.view(-1, self.num_kv_heads, self.head_size),
                        value.view(-1, self.num_kv_heads, self.head_size_v),
                        output.view(-1, self.num_heads, self.head_size_v),
                        self.layer_name,
                    )
                    return output
            """,
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "an MLA layer with its output_shape, written as upstream did",
            """\
            import torch
            from vllm.model_executor.layers.attention import MLAAttention


            class MyMLA(MLAAttention):
                def forward(self, q, kv_c_normed, k_pe, output_shape=None):
                    dep = torch.ops.vllm.unified_mla_kv_cache_update(kv_c_normed, k_pe, self.layer_name)
                    out = torch.ops.vllm.unified_mla_attention(
                        q, kv_c_normed, k_pe, self.layer_name, kv_cache_dummy_dep=dep
                    )
                    return out
            """,
            unsafe_after="""\
            import torch
            from vllm.model_executor.layers.attention import MLAAttention


            class MyMLA(MLAAttention):
                def forward(self, q, kv_c_normed, k_pe, output_shape=None):
                    dep = torch.ops.vllm.unified_mla_kv_cache_update(kv_c_normed, k_pe, self.layer_name)
                    out = torch.empty(output_shape, dtype=q.dtype, device=q.device)
                    torch.ops.vllm.unified_mla_attention_with_output(
                        q, kv_c_normed, k_pe, out, self.layer_name, kv_cache_dummy_dep=dep
                    )
                    return out
            """,
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "the imported function, called where the shape is known: the call is rewritten, the import goes",
            """\
            from vllm.attention.layer import Attention, unified_attention


            class Layer(Attention):
                def forward(self, query, key, value):
                    return unified_attention(query, key, value, self.layer_name)
            """,
            unsafe_after="""\
            from vllm.attention.layer import Attention
            import torch


            class Layer(Attention):
                def forward(self, query, key, value):
                    output = torch.empty(
                        (query.shape[0], self.num_heads * self.head_size_v),
                        dtype=query.dtype,
                        device=query.device,
                    )
                    torch.ops.vllm.unified_attention_with_output(
                        query.view(-1, self.num_heads, self.head_size),
                        key.view(-1, self.num_kv_heads, self.head_size),
                        value.view(-1, self.num_kv_heads, self.head_size_v),
                        output.view(-1, self.num_heads, self.head_size_v),
                        self.layer_name,
                    )
                    return output
            """,
            findings=(Status.UNSAFE_FIX_AVAILABLE, Status.UNSAFE_FIX_AVAILABLE),
        ),
        Example(
            'no layer shape in scope: reported (old-op-calls = "forwarder" opts in to the forwarder)',
            """\
            import torch


            def attend(query, key, value, layer_name):
                return torch.ops.vllm.unified_attention(query, key, value, layer_name)
            """,
            findings=(Status.MANUAL,),
        ),
        Example(
            "vLLM's Triton kernel of the same name stays",
            """\
            from vllm.attention.ops.triton_unified_attention import unified_attention

            unified_attention(q, k, v, out, cu_seqlens_q=cu)
            """,
        ),
    )

    def visit_Attribute(self, node: cst.Attribute) -> None:
        import libcst as cst

        from vllm_attn_compat.codemods.engine.scope import dotted_name

        reference = dotted_name(node) or ""
        op = _OP_REFERENCES.get(reference) or self._module_function(reference)
        if op is None:
            return
        parent = self.ctx.parent()
        if isinstance(parent, cst.Attribute) and parent.value is node and dotted_name(parent) in _OP_REFERENCES:
            return  # `.default` of this reference: reported there
        if isinstance(parent, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign)) and parent.target is node:
            # A patch of the op (sparse-attention plugins wrap it): vLLM >= 0.20 calls the with-output op only.
            self.ctx.report(
                self,
                node,
                f"`{reference}` was removed in vLLM 0.20, so this assignment patches an op vLLM >= 0.20 never "
                f"calls: patch `torch.ops.vllm.{op}_with_output` instead (it runs every backend there)",
            )
            return
        if not (isinstance(parent, cst.Call) and parent.func is node):
            self.ctx.report(
                self,
                node,
                f"`{reference}` was removed in vLLM 0.20; use `torch.ops.vllm.{op}_with_output`",
            )
            return
        with_output = f"torch.ops.vllm.{op}_with_output" + (".default" if reference.endswith(".default") else "")
        if self._report_with_output(parent, op, reference, with_output, levels=1):
            return
        if self.ctx.old_op_calls == FORWARDER:

            def build(updated: cst.Attribute, sink: CommentSink) -> cst.BaseExpression:
                return cst.parse_expression(f"{COMPAT_MODULE}.{op}")

            message = _CALL_MESSAGE.format(ref=reference, op=op)
            self.ctx.report(self, parent, message, Replace(node, build), AddImport(COMPAT_MODULE))
            return
        self.ctx.report(self, parent, _MANUAL_MESSAGE.format(ref=reference, op=op))

    def visit_Name(self, node: cst.Name) -> None:
        """``unified_attention(...)`` through a name imported from vLLM's modules: rewritten where the
        shape is known; elsewhere its import is the finding."""
        import libcst as cst

        parent = self.ctx.parent()
        if not (isinstance(parent, cst.Call) and parent.func is node):
            return
        module, _, op = self.ctx.imports.get(node.value, "").rpartition(".")
        if module in OLD_OP_MODULES and op in _OLD_OPS:
            self._report_with_output(parent, op, node.value, f"torch.ops.vllm.{op}_with_output", levels=1)

    def _report_with_output(self, call: cst.Call, op: str, reference: str, with_output: str, levels: int) -> bool:
        """Report ``call`` with the rewrite into the with-output form, if the shape is known here."""
        import libcst as cst

        from vllm_attn_compat.codemods.engine import with_output as form

        small, line, block = (self.ctx.parent(levels + n) for n in (1, 2, 3))
        if not (
            isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
            and isinstance(block, (cst.IndentedBlock, cst.Module))
            and isinstance(small, (cst.Return, cst.Expr, cst.Assign))
            and small.value is call
        ):
            return False
        assign_to = None
        if isinstance(small, cst.Assign):
            if len(small.targets) != 1 or not isinstance(small.targets[0].target, cst.Name):
                return False
            assign_to = small.targets[0].target.value
        arguments = form.call_arguments(call, op, self.ctx.module)
        frame = self.ctx.current_function()
        if arguments is None or frame is None or not isinstance(frame.node, cst.FunctionDef):
            return False
        query = arguments.get("query", arguments.get("q"))  # one of them: call_arguments found every required one
        if query is None or not form.is_plain(query):
            return False  # the rewrite reads the query twice: only a plain name or attribute
        klass = self._method_class(frame)
        attributes = form.self_attributes(klass, self.ctx.imports) if klass is not None else frozenset()
        shape = form.shape_of(op, query, attributes, form.binds(frame.node, "output_shape"))
        used = form.names_in(frame.node)
        buffer: str | None
        if assign_to is not None and assign_to not in form.names_in(call):
            buffer, assign_to = assign_to, None
        else:
            buffer = form.buffer_name(used)
        if shape is None or buffer is None:
            return False
        depth = sum(isinstance(node, cst.IndentedBlock) for node in self.ctx.stack)
        plan = form.Plan(
            op=with_output,
            arguments=arguments,
            shape=shape[0],
            views=shape[1],
            buffer=buffer,
            assign_to=assign_to,
            returns=isinstance(small, cst.Return),
            indent=4 * depth,
        )
        edits: list[Edit] = [Replace(line, form.build(plan, self.ctx.module.config_for_parsing)), AddImport("torch")]
        self.ctx.report(self, call, _WITH_OUTPUT_MESSAGE.format(ref=reference, op=op), *edits)
        return True

    def _method_class(self, frame: FunctionFrame) -> cst.ClassDef | None:
        """The class ``frame`` is a method of, when its first parameter is ``self``."""
        import libcst as cst

        index = next(i for i, f in enumerate(self.ctx.frames) if f is frame)
        owner = self.ctx.frames[index - 1] if index > 0 else None
        params = frame.node.params.params
        if owner is None or not isinstance(owner.node, cst.ClassDef) or not params or params[0].name.value != "self":
            return None
        return owner.node

    def _module_function(self, reference: str) -> str | None:
        """``op`` for ``layer_module.unified_attention`` where ``layer_module`` is vLLM's module."""
        head, _, rest = reference.partition(".")
        target = self.ctx.imports.get(head)
        if target is None or not rest:
            return None
        module, _, name = f"{target}.{rest}".rpartition(".")
        return name if module in OLD_OP_MODULES and name in _OLD_OPS else None

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        import libcst as cst

        from vllm_attn_compat.codemods.engine.scope import as_name, dotted_name

        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted_name(node.module)
        if module is None or module not in OLD_OP_MODULES:
            return
        old = [
            (alias, alias.name.value)
            for alias in node.names
            if isinstance(alias.name, cst.Name) and alias.name.value in _OLD_OPS
        ]
        line = self.ctx.parent()
        for alias, op in old:
            bound = as_name(alias) or op
            if self.ctx.old_op_calls != FORWARDER:
                message = _IMPORT_DROP_MESSAGE.format(module=module, op=op)
                self.ctx.report(self, alias, message, DropUnusedImport(module, bound))
            elif isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
                message = _IMPORT_MESSAGE.format(module=module, op=op)
                edits = (Replace(line, _move_import(op)), DropUnusedImport(COMPAT_MODULE, bound))
                self.ctx.report(self, alias, message, *edits)
            else:
                self.ctx.report(self, alias, _IMPORT_MESSAGE.format(module=module, op=op))


def _from_import(line: cst.CSTNode) -> tuple[cst.SimpleStatementLine, Sequence[cst.ImportAlias]]:
    """A line that _names or _is_compat_line picked out (``from ... import a, b``) and its names."""
    import libcst as cst

    statement = line.body[0] if isinstance(line, cst.SimpleStatementLine) else None
    assert isinstance(line, cst.SimpleStatementLine) and isinstance(statement, cst.ImportFrom), line
    assert not isinstance(statement.names, cst.ImportStar), "_names skips `import *`; the compat line is ours"
    return line, statement.names


def _move_import(op: str) -> Callable[[_Lines, CommentSink], cst.FlattenSentinel[cst.BaseStatement]]:
    """Take ``op`` out of a ``from vllm... import`` line and import it from the compat module.

    The names of one line move one edit at a time (in the line's order), all into one compat import
    placed after what is left of the line; when nothing is left, the compat import takes the line's
    place, its leading comments and its trailing comment."""

    def build(line: _Lines, sink: CommentSink) -> cst.FlattenSentinel[cst.BaseStatement]:
        from collections import Counter

        import libcst as cst

        from vllm_attn_compat.codemods.engine.apply import inner_comments, module_name

        nodes: list[cst.BaseStatement] = list(line.nodes) if isinstance(line, cst.FlattenSentinel) else [line]
        old = next(index for index, node in enumerate(nodes) if _names(node, op))
        compat = next((index for index, node in enumerate(nodes) if _is_compat_line(node)), None)
        old_line, old_names = _from_import(nodes[old])
        statement = old_line.body[0]
        names = list(old_names)
        moved = [alias.with_changes(comma=cst.MaybeSentinel.DEFAULT) for alias in names if alias.name.value == op]
        kept = [alias for alias in names if alias.name.value != op]
        imported: list[cst.ImportAlias]
        if compat is None:
            imported = []
            compat_line = cst.SimpleStatementLine(body=[])
        else:
            compat_line, compat_names = _from_import(nodes[compat])
            imported = list(compat_names)
        compat_line = compat_line.with_changes(
            body=[cst.ImportFrom(module=module_name(COMPAT_MODULE), names=[*imported, moved[0]])]
        )
        if not kept:  # the compat import takes the line's place
            in_place = old_line.with_changes(body=compat_line.body)
            lost = Counter(c.value for c in inner_comments(nodes[old]))
            sink.removed.extend((lost - Counter(c.value for c in inner_comments(in_place))).elements())
            rest = [node for index, node in enumerate(nodes) if index not in (old, compat)]
            return cst.FlattenSentinel([*rest[:old], in_place, *rest[old:]])
        if names[-1].name.value == op:
            kept[-1] = kept[-1].with_changes(comma=names[-1].comma)
        new_line = old_line.with_changes(body=[statement.with_changes(names=kept)])
        lost = Counter(c.value for c in inner_comments(nodes[old])) - Counter(c.value for c in inner_comments(new_line))
        sink.removed.extend(lost.elements())
        nodes[old] = new_line
        if compat is None:
            nodes.insert(old + 1, compat_line)
        else:
            nodes[compat] = compat_line
        return cst.FlattenSentinel(nodes)

    return build


def _names(line: cst.CSTNode, op: str) -> bool:
    """Whether ``line`` is a ``from ... import`` line (not the compat one) importing ``op``."""
    import libcst as cst

    if not (isinstance(line, cst.SimpleStatementLine) and isinstance(line.body[0], cst.ImportFrom)):
        return False
    names = line.body[0].names
    if _is_compat_line(line) or isinstance(names, cst.ImportStar):
        return False
    return any(alias.name.value == op for alias in names)


def _is_compat_line(line: cst.CSTNode) -> bool:
    import libcst as cst

    from vllm_attn_compat.codemods.engine.scope import dotted_name

    statement = line.body[0] if isinstance(line, cst.SimpleStatementLine) and line.body else None
    return (
        isinstance(statement, cst.ImportFrom)
        and statement.module is not None
        and (dotted_name(statement.module) == COMPAT_MODULE)
    )
