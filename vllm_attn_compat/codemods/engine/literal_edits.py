"""Dropping elements from a list, tuple or set literal without losing the comments around them.

libcst keeps an element's surrounding comments in the whitespace of the neighbouring commas and
brackets; removing the element naively removes them too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import libcst as cst

_Literal: TypeAlias = cst.List | cst.Tuple | cst.Set
_Opening: TypeAlias = cst.LeftSquareBracket | cst.LeftCurlyBrace | cst.LeftParen


def _merge_whitespace(
    before: cst.BaseParenthesizableWhitespace, after: cst.BaseParenthesizableWhitespace
) -> cst.BaseParenthesizableWhitespace:
    """The whitespace left where an element was dropped: the comments of both sides, the layout of ``after``.

    A dropped element's own trailing comment becomes a comment line where the element stood, since it no
    longer trails anything.
    """
    if not isinstance(after, cst.ParenthesizedWhitespace):
        return before
    if not isinstance(before, cst.ParenthesizedWhitespace):
        return after
    carried: list[cst.EmptyLine] = []
    if after.first_line.comment is not None:
        comment = after.first_line.comment
        carried.append(cst.EmptyLine(indent=before.indent, whitespace=before.last_line, comment=comment))
    return before.with_changes(
        empty_lines=[*before.empty_lines, *carried, *after.empty_lines],
        indent=after.indent,
        last_line=after.last_line,
    )


def _opening(literal: _Literal) -> _Opening | None:
    """The bracket whose ``whitespace_after`` holds the comments above the first element (None: bare tuple)."""
    if isinstance(literal, cst.List):
        return literal.lbracket
    if isinstance(literal, cst.Set):
        return literal.lbrace
    return literal.lpar[0] if literal.lpar else None


def _with_opening(literal: _Literal, bracket: _Opening) -> _Literal:
    if isinstance(literal, cst.List):
        return literal.with_changes(lbracket=bracket)
    if isinstance(literal, cst.Set):
        return literal.with_changes(lbrace=bracket)
    return literal.with_changes(lpar=[bracket, *literal.lpar[1:]])


def _closing_whitespace(literal: _Literal) -> cst.BaseParenthesizableWhitespace | None:
    if isinstance(literal, cst.List):
        return literal.rbracket.whitespace_before
    if isinstance(literal, cst.Set):
        return literal.rbrace.whitespace_before
    return literal.rpar[-1].whitespace_before if literal.rpar else None


def _with_closing_whitespace(literal: _Literal, whitespace: cst.BaseParenthesizableWhitespace) -> _Literal:
    if isinstance(literal, cst.List):
        return literal.with_changes(rbracket=literal.rbracket.with_changes(whitespace_before=whitespace))
    if isinstance(literal, cst.Set):
        return literal.with_changes(rbrace=literal.rbrace.with_changes(whitespace_before=whitespace))
    rpar = literal.rpar[-1].with_changes(whitespace_before=whitespace)
    return literal.with_changes(rpar=[*literal.rpar[:-1], rpar])


def _inner_comma(element: cst.BaseElement) -> cst.Comma:
    """The comma after an element that is not the literal's last: always a real one."""
    if not isinstance(element.comma, cst.Comma):
        raise AssertionError(f"an element before the last has no comma: {element!r}")
    return element.comma


def drop_elements(literal: _Literal, drop: Callable[[cst.BaseElement], bool]) -> _Literal:
    """``literal`` without the elements ``drop`` selects; unchanged if it selects none or all of them."""
    elements = list(literal.elements)
    dropped = [drop(element) for element in elements]
    if all(dropped) or not any(dropped):
        return literal
    opening = _opening(literal)
    closing = _closing_whitespace(literal)
    kept: list[cst.BaseElement] = []
    last = len(elements) - 1
    # Not all are dropped: when the last is, an earlier one is kept, and its comma is a real one.
    for index, element in enumerate(elements):
        if not dropped[index]:
            kept.append(element)
            continue
        if index == last and isinstance(closing, cst.ParenthesizedWhitespace):
            # The comments after the last element sit before the closing bracket; they now follow kept[-1].
            comma = _inner_comma(kept[-1])
            closing = _merge_whitespace(comma.whitespace_after, closing)
            comma = comma.with_changes(whitespace_after=cst.SimpleWhitespace(""))
            trailing = comma if isinstance(element.comma, cst.Comma) else cst.MaybeSentinel.DEFAULT
            kept[-1] = kept[-1].with_changes(comma=trailing)
        elif index == last:
            kept[-1] = kept[-1].with_changes(comma=element.comma)
        elif kept:
            comma = _inner_comma(kept[-1])
            after = _merge_whitespace(comma.whitespace_after, _inner_comma(element).whitespace_after)
            kept[-1] = kept[-1].with_changes(comma=comma.with_changes(whitespace_after=after))
        elif opening is not None:
            opening = opening.with_changes(
                whitespace_after=_merge_whitespace(opening.whitespace_after, _inner_comma(element).whitespace_after)
            )
    if isinstance(literal, cst.Tuple) and len(kept) == 1 and kept[0].comma is cst.MaybeSentinel.DEFAULT:
        kept[0] = kept[0].with_changes(comma=cst.Comma())
    new = literal.with_changes(elements=kept)
    if opening is not None:
        new = _with_opening(new, opening)
    if closing is not None:
        new = _with_closing_whitespace(new, closing)
    return new
