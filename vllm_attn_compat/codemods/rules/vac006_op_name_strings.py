"""VAC006: old op names in strings (``splitting_ops`` lists and the like)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.engine.edits import CommentSink, Replace
from vllm_attn_compat.codemods.engine.rule import Example, Rule
from vllm_attn_compat.codemods.findings import FixSafety, Status

if TYPE_CHECKING:
    from typing import TypeAlias

    import libcst as cst

    _Literal: TypeAlias = cst.List | cst.Tuple | cst.Set

_OLD_OPS = ("unified_attention", "unified_mla_attention")
# Both spellings vLLM accepted in `splitting_ops`: the schema name and the dotted form.
OLD_NAMES = {f"vllm{sep}{op}": f"vllm{sep}{op}_with_output" for op in _OLD_OPS for sep in ("::", ".")}


def _equivalents(name: str) -> set[str]:
    return {name, name.replace("::", ".", 1), name.replace(".", "::", 1)}


def _string_value(node: cst.CSTNode) -> str | None:
    import libcst as cst

    if isinstance(node, cst.SimpleString) and "b" not in node.prefix.lower():
        value = node.evaluated_value
        return value if isinstance(value, str) else None  # always a str without the b prefix
    return None


def _drop_elements(old: str) -> Callable[[_Literal, CommentSink], _Literal]:
    """Drop every element equal to ``old``; every comment around them stays in the literal."""

    def build(literal: _Literal, sink: CommentSink) -> _Literal:
        from vllm_attn_compat.codemods.engine.literal_edits import drop_elements

        return drop_elements(literal, lambda element: _string_value(element.value) == old)

    return build


def _rename(new_name: str) -> Callable[[cst.SimpleString, CommentSink], cst.SimpleString]:
    def build(string: cst.SimpleString, sink: CommentSink) -> cst.SimpleString:
        start = len(string.prefix) + len(string.quote)
        return string.with_changes(value=string.value[:start] + new_name + string.value[-len(string.quote) :])

    return build


class OldOpNameStrings(Rule):
    """vLLM 0.20 deleted the ops ``vllm::unified_attention`` and ``vllm::unified_mla_attention``;
    only the ``_with_output`` ops remain. ``splitting_ops`` and similar op lists match names as
    strings, so a stale name is silently ignored and piecewise CUDA graphs split at the wrong
    places. A string that is exactly an old name (``vllm::`` or dotted ``vllm.`` form) inside a
    list, tuple or set literal becomes the ``_with_output`` name, or drops out when that name is
    already in the literal. Anywhere else (a comparison, an argument, a dictionary key) the
    string is only reported: ``if name == "vllm::unified_attention": ...`` would change meaning
    if renamed. Strings that merely start with an old name are never touched. In a fork of vLLM <= 0.19 (the
    run holds vLLM's own ``AttentionBackend``, still declaring ``accept_output_buffer``) the old op still runs
    for backends without the flag, so there the rename is an unsafe fix, made together with that path's removal.
    """

    code = "VAC006"
    name = "old-op-name-strings"
    summary = "Rename old op names in op lists (`splitting_ops`) to their `_with_output` names."
    fix_safety = FixSafety.SAFE
    since = fix_requires = "0.20.0"  # the release that made the output buffer mandatory
    tokens = tuple(name.encode() for name in OLD_NAMES)
    scoped = False
    reads_hierarchy = True  # a fork's own base class makes the rename unsafe
    examples = (
        Example(
            "splitting_ops in a compilation config",
            """\
            splitting_ops = [
                "vllm::unified_attention",
                "vllm::unified_attention_with_output",
                "vllm::unified_mla_attention",
            ]
            """,
            after="""\
            splitting_ops = [
                "vllm::unified_attention_with_output",
                "vllm::unified_mla_attention_with_output",
            ]
            """,
            findings=(Status.FIXED, Status.FIXED),
        ),
        Example(
            "a comparison is reported, not renamed",
            """\
            def is_attention(op_name: str) -> bool:
                return op_name == "vllm::unified_attention"
            """,
            findings=(Status.MANUAL,),
        ),
        Example(
            "a longer name that starts with an old one stays",
            """\
            ops = ("vllm::unified_attention_fp8", "vllm::unified_attention_with_output")
            """,
        ),
    )

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        import libcst as cst

        value = _string_value(node)
        if value not in OLD_NAMES:
            return
        new_name = OLD_NAMES[value]
        element, literal = self.ctx.parent(), self.ctx.parent(2)
        if not (
            isinstance(element, cst.Element)
            and element.value is node
            and isinstance(literal, (cst.List, cst.Tuple, cst.Set))
        ):
            self.ctx.report(
                self,
                node,
                f"`{value}` no longer exists in vLLM >= 0.20 (now `{new_name}`); "
                "review this use: renaming it here could change what the code does",
            )
            return
        present = {_string_value(e.value) for e in literal.elements}
        # A fork of vLLM <= 0.19 (its own AttentionBackend still declares the flag) still registers the old op and
        # runs it for backends without the flag: until that path goes, the list must keep naming it.
        fork = self.ctx.hierarchy.declares_flag_in_base()
        safety = FixSafety.UNSAFE if fork else None
        still = " (this fork still runs the old op for backends without the flag: unsafe until that path goes)"
        if present & _equivalents(new_name):
            self.ctx.report(
                self,
                node,
                f"`{value}` no longer exists in vLLM >= 0.20 and `{new_name}` is already listed: drop it"
                + (still if fork else ""),
                Replace(literal, _drop_elements(value)),
                safety=safety,
            )
        else:
            self.ctx.report(
                self,
                node,
                f"`{value}` no longer exists in vLLM >= 0.20: use `{new_name}`" + (still if fork else ""),
                Replace(node, _rename(new_name)),
                safety=safety,
            )
