"""VAC008: uses of this package's own deprecated names, which keep the package needed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.engine.rule import Example, Rule
from vllm_attn_compat.codemods.findings import FixSafety, Status

if TYPE_CHECKING:
    import libcst as cst

    from vllm_attn_compat.codemods.engine.scope import FileContext

_COMPAT = "vllm_attn_compat.compat"
_FORWARDERS = ("unified_attention", "unified_mla_attention")
# Every dotted name under which the deprecated objects can be reached, with the object it names.
DEPRECATED = {
    **{f"{module}.{op}": op for module in (_COMPAT, f"{_COMPAT}.forwarders") for op in _FORWARDERS},
    **{f"torch.ops.vllm_attn_compat.{op}{overload}": op for op in _FORWARDERS for overload in ("", ".default")},
    **{f"{module}.adapt_legacy_impl": "adapt_legacy_impl" for module in (_COMPAT, f"{_COMPAT}.legacy")},
}

_FORWARDER_MESSAGE = (
    "`{name}` is vllm-attn-compat's deprecated forwarder (gone in 0.3.0): allocate the output and call "
    "`torch.ops.vllm.{op}_with_output`"
)
_ADAPTER_MESSAGE = (
    "`{name}` is vllm-attn-compat's deprecated adapter (gone in 0.3.0): make the impl's `forward` write "
    "into `output`, then drop it"
)


class CompatNames(Rule):
    """This package keeps pre-0.20 code running with deprecated names of its own: the forwarders
    ``vllm_attn_compat.compat.unified_attention`` / ``unified_mla_attention`` (also the ops
    ``torch.ops.vllm_attn_compat.*``, and what ``--unsafe-fixes`` of VAC007 writes) and the adapter
    ``adapt_legacy_impl``. Code using them works, but only while the package is installed, and the
    names go away in vllm-attn-compat 0.3.0. So ``migrate --check`` reports each import and each use,
    through any alias, saying what to write instead: allocate the output and call the
    ``_with_output`` op; write the impl's result into ``output``. Only then does a passing check mean
    the package can be dropped. The fix needs the layer's shape or a change to the impl's computation,
    which a codemod cannot decide: reported only. Functions of the same name from elsewhere (vLLM's
    Triton kernel, a plugin's own helper) are not this package's and stay untouched.
    """

    code = "VAC008"
    name = "compat-deprecated-names"
    summary = "Report uses of vllm-attn-compat's deprecated forwarders and adapter: the package is still needed."
    fix_safety = FixSafety.DISPLAY_ONLY
    # Every use names a forwarder (which VAC007's tokens cover too) or the adapter.
    tokens = (b"unified_attention", b"unified_mla_attention", b"adapt_legacy_impl")
    # Every such name is reached through this package's name (an import, ``torch.ops.vllm_attn_compat``): vLLM's own
    # `unified_attention` kernels alone are none of them.
    requires = (b"vllm_attn_compat",)
    scoped = False
    reads = (b"vllm_attn_compat",)  # its imports bind the names, wherever the walk meets them
    examples = (
        Example(
            "a call of the forwarder VAC007's unsafe fix wrote",
            """\
            import vllm_attn_compat.compat


            def attend(query, key, value, layer_name):
                return vllm_attn_compat.compat.unified_attention(query, key, value, layer_name)
            """,
            findings=(Status.MANUAL,),
        ),
        Example(
            "the forwarders' module imported in a helper, a forwarder called in another function",
            """\
            def _forwarders():
                import vllm_attn_compat.compat as compat

                return compat


            def attend(query, key, value, layer_name):
                compat = _forwarders()
                return compat.unified_attention(query, key, value, layer_name)
            """,
            findings=(Status.MANUAL,),
        ),
        Example(
            "an import of the forwarder, an alias, and its calls",
            """\
            from vllm_attn_compat.compat import unified_mla_attention as mla_forward


            def attend(q, kv_c_normed, k_pe, layer_name):
                return mla_forward(q, kv_c_normed, k_pe, layer_name)
            """,
            findings=(Status.MANUAL, Status.MANUAL),
        ),
        Example(
            "the adapter, as a decorator through a module alias",
            """\
            from vllm_attn_compat import compat
            from vllm.v1.attention.backend import AttentionImpl


            @compat.adapt_legacy_impl
            class ReturningImpl(AttentionImpl):
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output):
                    return query.clone()
            """,
            findings=(Status.MANUAL,),
        ),
        Example(
            "the forwarder op",
            """\
            import torch


            def attend(query, key, value, layer_name):
                return torch.ops.vllm_attn_compat.unified_attention.default(query, key, value, layer_name)
            """,
            findings=(Status.MANUAL,),
        ),
        Example(
            "vLLM's Triton kernel and the package's names that are not deprecated stay",
            """\
            from vllm.v1.attention.ops.triton_unified_attention import unified_attention
            from vllm_attn_compat.compat import normalize_splitting_ops


            def adapt_legacy_impl(cls):
                return cls


            splitting_ops = normalize_splitting_ops(["vllm::unified_attention"])
            unified_attention(q, k, v, out, cu_seqlens_q=cu)
            """,
        ),
    )

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        # Bound name -> dotted target, from every import of the file (top level first, then as walked).
        self.bindings = dict(ctx.imports)

    def _resolve(self, node: cst.BaseExpression) -> str | None:
        from vllm_attn_compat.codemods.engine.scope import dotted_name

        dotted = dotted_name(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        target = self.bindings.get(head)
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target

    def _report(self, node: cst.CSTNode, name: str) -> None:
        deprecated = DEPRECATED[name]
        template = _ADAPTER_MESSAGE if deprecated == "adapt_legacy_impl" else _FORWARDER_MESSAGE
        self.ctx.report(self, node, template.format(name=name, op=deprecated))

    def visit_Import(self, node: cst.Import) -> None:
        from vllm_attn_compat.codemods.engine.scope import as_name, dotted_name

        for alias in node.names:
            target = dotted_name(alias.name) or ""
            bound = as_name(alias)
            if bound is not None:
                self.bindings[bound] = target
            else:
                head = target.partition(".")[0]
                self.bindings[head] = head

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        import libcst as cst

        from vllm_attn_compat.codemods.engine.scope import as_name, dotted_name

        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted_name(node.module)
        for alias in node.names:
            name = dotted_name(alias.name) or ""
            self.bindings[as_name(alias) or name] = f"{module}.{name}"
            if f"{module}.{name}" in DEPRECATED:
                self._report(alias, f"{module}.{name}")

    def visit_Attribute(self, node: cst.Attribute) -> None:
        import libcst as cst

        name = self._resolve(node)
        if name is None or name not in DEPRECATED:
            return
        parent = self.ctx.parent()
        if isinstance(parent, cst.Attribute) and parent.value is node and self._resolve(parent) in DEPRECATED:
            return  # `.default` of this reference: reported there
        self._report(node, name)

    def visit_Name(self, node: cst.Name) -> None:
        import libcst as cst

        name = self.bindings.get(node.value)
        if name is None or name not in DEPRECATED:
            return
        parent = self.ctx.parent()
        # `x.name` is another object's attribute, `name.attr` is resolved whole by visit_Attribute; the
        # import itself, a keyword, a parameter or an assignment binds the name rather than using it.
        if isinstance(parent, (cst.Attribute, cst.ImportAlias, cst.AsName, cst.Param, cst.AssignTarget)):
            return
        if isinstance(parent, (cst.Arg, cst.FunctionDef, cst.ClassDef)) and getattr(parent, "value", None) is not node:
            return
        self._report(node, name)
