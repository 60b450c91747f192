"""VAC006: old op names in strings (``splitting_ops`` lists and the like)."""

from __future__ import annotations

from vllm_attn_compat.codemods.edits import Replace
from vllm_attn_compat.codemods.findings import FixSafety, Status
from vllm_attn_compat.codemods.rule import Example, Rule

_OLD_OPS = ("unified_attention", "unified_mla_attention")
# Both spellings vLLM accepted in `splitting_ops`: the schema name and the dotted form.
OLD_NAMES = {f"vllm{sep}{op}": f"vllm{sep}{op}_with_output" for op in _OLD_OPS for sep in ("::", ".")}


def _equivalents(name: str) -> set[str]:
    return {name, name.replace("::", ".", 1), name.replace(".", "::", 1)}


def _string_value(node) -> str | None:
    import libcst as cst

    if isinstance(node, cst.SimpleString) and "b" not in node.prefix.lower():
        return node.evaluated_value
    return None


def _has_comment(whitespace) -> bool:
    import libcst as cst

    return isinstance(whitespace, cst.ParenthesizedWhitespace) and (
        whitespace.first_line.comment is not None or any(line.comment for line in whitespace.empty_lines)
    )


def _merge_whitespace(before, after):
    """The whitespace left where an element was dropped: the comments of both sides, the layout of ``after``.

    A dropped element's own trailing comment becomes a comment line where the element stood, since it no
    longer trails anything.
    """
    import libcst as cst

    if not isinstance(after, cst.ParenthesizedWhitespace):
        return before
    if not isinstance(before, cst.ParenthesizedWhitespace):
        return after
    carried = []
    if after.first_line.comment is not None:
        carried.append(cst.EmptyLine(indent=before.indent, whitespace=before.last_line, comment=after.first_line.comment))
    return before.with_changes(
        empty_lines=[*before.empty_lines, *carried, *after.empty_lines],
        indent=after.indent,
        last_line=after.last_line,
    )


def _opening(literal):
    """The bracket whose ``whitespace_after`` holds the comments above the first element (None: bare tuple)."""
    import libcst as cst

    if isinstance(literal, cst.List):
        return literal.lbracket
    if isinstance(literal, cst.Set):
        return literal.lbrace
    return literal.lpar[0] if literal.lpar else None


def _with_opening(literal, bracket):
    import libcst as cst

    if isinstance(literal, cst.List):
        return literal.with_changes(lbracket=bracket)
    if isinstance(literal, cst.Set):
        return literal.with_changes(lbrace=bracket)
    return literal.with_changes(lpar=[bracket, *literal.lpar[1:]])


def _closing_whitespace(literal):
    import libcst as cst

    if isinstance(literal, cst.List):
        return literal.rbracket.whitespace_before
    if isinstance(literal, cst.Set):
        return literal.rbrace.whitespace_before
    return literal.rpar[-1].whitespace_before if literal.rpar else None


def _with_closing_whitespace(literal, whitespace):
    import libcst as cst

    if isinstance(literal, cst.List):
        return literal.with_changes(rbracket=literal.rbracket.with_changes(whitespace_before=whitespace))
    if isinstance(literal, cst.Set):
        return literal.with_changes(rbrace=literal.rbrace.with_changes(whitespace_before=whitespace))
    rpar = literal.rpar[-1].with_changes(whitespace_before=whitespace)
    return literal.with_changes(rpar=[*literal.rpar[:-1], rpar])


def _drop_elements(old: str):
    """Drop every element equal to ``old``; every comment around them stays in the literal."""

    def build(literal, sink):
        import libcst as cst

        elements = list(literal.elements)
        if all(_string_value(e.value) == old for e in elements) or not any(
            _string_value(e.value) == old for e in elements
        ):
            return literal
        opening = _opening(literal)
        closing = _closing_whitespace(literal)
        kept: list = []
        last = len(elements) - 1
        for index, element in enumerate(elements):
            if _string_value(element.value) != old:
                kept.append(element)
                continue
            comma = kept[-1].comma if kept else None
            if index == last and isinstance(closing, cst.ParenthesizedWhitespace):
                # The comments after the last element sit before the closing bracket; they now follow kept[-1].
                closing = _merge_whitespace(comma.whitespace_after, closing)
                comma = comma.with_changes(whitespace_after=cst.SimpleWhitespace(""))
                kept[-1] = kept[-1].with_changes(comma=comma if isinstance(element.comma, cst.Comma) else cst.MaybeSentinel.DEFAULT)
            elif index == last:
                kept[-1] = kept[-1].with_changes(comma=element.comma)
            elif kept:
                after = _merge_whitespace(comma.whitespace_after, element.comma.whitespace_after)
                kept[-1] = kept[-1].with_changes(comma=comma.with_changes(whitespace_after=after))
            elif opening is not None:
                opening = opening.with_changes(
                    whitespace_after=_merge_whitespace(opening.whitespace_after, element.comma.whitespace_after)
                )
        if isinstance(literal, cst.Tuple) and len(kept) == 1 and kept[0].comma is cst.MaybeSentinel.DEFAULT:
            kept[0] = kept[0].with_changes(comma=cst.Comma())
        new = literal.with_changes(elements=kept)
        if opening is not None:
            new = _with_opening(new, opening)
        if closing is not None:
            new = _with_closing_whitespace(new, closing)
        return new

    return build


def _rename(new_name: str):
    def build(string, sink):
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
    if renamed. Strings that merely start with an old name are never touched.
    """

    code = "VAC006"
    name = "old-op-name-strings"
    summary = "Rename old op names in op lists (`splitting_ops`) to their `_with_output` names."
    fix_safety = FixSafety.SAFE
    tokens = tuple(name.encode() for name in OLD_NAMES)
    scoped = False
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

    def visit_SimpleString(self, node) -> None:
        import libcst as cst

        value = _string_value(node)
        if value not in OLD_NAMES:
            return
        new_name = OLD_NAMES[value]
        element, literal = self.ctx.parent(), self.ctx.parent(2)
        in_literal = (
            isinstance(element, cst.Element)
            and element.value is node
            and isinstance(literal, (cst.List, cst.Tuple, cst.Set))
        )
        if not in_literal:
            self.ctx.report(
                self,
                node,
                f"`{value}` no longer exists in vLLM >= 0.20 (now `{new_name}`); "
                "review this use: renaming it here could change what the code does",
            )
            return
        present = {_string_value(e.value) for e in literal.elements}
        if present & _equivalents(new_name):
            self.ctx.report(
                self,
                node,
                f"`{value}` no longer exists in vLLM >= 0.20 and `{new_name}` is already listed: drop it",
                Replace(literal, _drop_elements(value)),
            )
        else:
            self.ctx.report(
                self,
                node,
                f"`{value}` no longer exists in vLLM >= 0.20: use `{new_name}`",
                Replace(node, _rename(new_name)),
            )
