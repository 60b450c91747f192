"""A method's signature as libcst holds it, in the manifest's terms (`manifest.Signature`), and the edit adding
parameters to it: what VAC012 compares with the signature vLLM calls an override with, and how it fixes one.

Stated for bound calls: ``self``/``cls`` left out of both, as vLLM calls a method on an instance or a class.
"""

from __future__ import annotations

import ast
from collections.abc import Container
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from vllm_attn_compat.manifest.types import Drift, Parameter, Signature

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.engine.edits import CommentSink

_BOUND = ("method", "classmethod")
_POSITIONAL = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
_VARIADIC = ("VAR_POSITIONAL", "VAR_KEYWORD")


def kind_of(node: cst.FunctionDef) -> str:
    """``staticmethod``, ``classmethod``, ``property`` or ``method``, from its decorators."""
    for decorator in node.decorators:
        expression = decorator.decorator
        name = expression.attr.value if isinstance(expression, cst.Attribute) else getattr(expression, "value", "")
        if name in ("staticmethod", "classmethod", "property"):
            return str(name)
    return "method"


def bound(signature: Signature, kind: str) -> Signature:
    """``signature`` as a call on an instance or a class sees it: without ``self``/``cls`` for a method or a class
    method that has it."""
    parameters = signature.parameters
    if kind in _BOUND and parameters and parameters[0].kind in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD"):
        parameters = parameters[1:]
    return Signature(parameters, signature.returns)


def signature_of(node: cst.FunctionDef) -> Signature:
    """The parameters of ``node`` as the manifest states them (defaults as source text, no annotations)."""
    params = node.params
    found = [_parameter(p, "POSITIONAL_ONLY") for p in params.posonly_params]
    found += [_parameter(p, "POSITIONAL_OR_KEYWORD") for p in params.params]
    if isinstance(params.star_arg, cst.Param):
        found.append(_parameter(params.star_arg, "VAR_POSITIONAL"))
    found += [_parameter(p, "KEYWORD_ONLY") for p in params.kwonly_params]
    if params.star_kwarg is not None:
        found.append(_parameter(params.star_kwarg, "VAR_KEYWORD"))
    return Signature(tuple(found), None)


def _parameter(param: cst.Param, kind: str) -> Parameter:
    default = None if param.default is None else cst.Module([]).code_for_node(param.default)
    return Parameter(param.name.value, kind, default, None)  # type: ignore[arg-type]  # one of ParameterKind


def drift(expected: Signature, found: Signature, named: Container[str] = frozenset()) -> Drift:
    """The parameters of ``expected`` (the bound signature vLLM calls) that ``found`` (an override's) cannot take,
    and ``found``'s required parameters vLLM never passes, as vLLM calls its hooks: the required parameters by
    position (an override may name them as it likes: ``q`` for ``query``), except those of ``named`` (``output=``;
    `manifest.types.EVERY`: ``validate_configuration(device_capability=..., **config._asdict())``), and those with a
    default by name (``output_scale=...``). `manifest.incompatibilities` holds an override to every call the base's
    signature allows; this holds it to the calls vLLM makes."""
    by_position = _by_position(expected, named)
    by_name = [p for p in expected.parameters if p.kind not in _VARIADIC and p not in by_position]
    positional = [p for p in found.parameters if p.kind in _POSITIONAL]
    takes_args = any(p.kind == "VAR_POSITIONAL" for p in found.parameters)
    takes_kwargs = any(p.kind == "VAR_KEYWORD" for p in found.parameters)
    # The override's parameters vLLM's positional arguments fill: a name among them, passed again, is a TypeError
    # (``got multiple values``) even where ``**kwargs`` would take it.
    filled = {p.name for p in positional[: len(by_position)]}
    nameable = {p.name for p in found.parameters if p.kind in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")}
    missing = [p for index, p in enumerate(by_position) if not (takes_args or index < len(positional))]
    missing += [p for p in by_name if p.name in filled or not (takes_kwargs or p.name in nameable)]
    passed = {p.name for p in by_name}
    extra = tuple(
        p
        for p in found.parameters
        if p.default is None
        and p.kind not in _VARIADIC
        and p.name not in filled
        and not (p.name in passed and p.name in nameable)
    )
    return Drift(tuple(missing), extra)


def _by_position(expected: Signature, named: Container[str]) -> list[Parameter]:
    """The parameters vLLM passes by position, in order: the required ones it does not name (`drift`)."""
    return [p for p in expected.parameters if p.kind in _POSITIONAL and p.default is None and p.name not in named]


class Misfit(NamedTuple):
    """Where vLLM's positional arguments do not fit an override: how many vLLM passes and the override takes, the
    override's parameters they fill that vLLM then passes by name too, and vLLM's parameters the override lacks
    (where it names the others as vLLM does: its own, shifted, take the wrong values)."""

    passed: int
    takes: int
    clashes: tuple[str, ...]
    lacked: tuple[Parameter, ...]


def misfit(expected: Signature, found: Signature, named: Container[str] = frozenset()) -> Misfit | None:
    """How vLLM's positional arguments (`drift`) miss ``found``, or None where they fit it."""
    by_position = _by_position(expected, named)
    if any(p.kind == "VAR_POSITIONAL" for p in found.parameters):
        return None
    positional = [p.name for p in found.parameters if p.kind in _POSITIONAL]
    by_name = {p.name for p in expected.parameters if p.kind not in _VARIADIC} - {p.name for p in by_position}
    clashes = tuple(name for name in positional[: len(by_position)] if name in by_name)
    if len(positional) >= len(by_position) and not clashes:
        return None
    names = {p.name for p in expected.parameters}
    lacked = tuple(p for p in by_position if p.name not in positional) if names.issuperset(positional) else ()
    return Misfit(len(by_position), len(positional), clashes, lacked)


def literal(default: str | None) -> bool:
    """Whether a default's source text is a literal (``False``, ``None``, ``1``, ``"auto"``): the same value in any
    module, evaluated when the ``def`` runs without naming anything."""
    if default is None:
        return False
    try:
        ast.literal_eval(default)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return True


def holds_comments(params: cst.Parameters) -> bool:
    """Whether a comment stands among the parameters (a ``# noqa`` on a parameter's line is one): appending others
    could move it to another line."""
    found: list[cst.Comment] = []

    class _Comments(cst.CSTVisitor):
        def visit_Comment(self, node: cst.Comment) -> None:
            found.append(node)

    params.visit(_Comments())
    return bool(found)


def appended(missing: tuple[Parameter, ...], override: Signature) -> str | None:
    """Why ``missing`` (base parameters ``override`` cannot accept) cannot simply be added to the override with
    their defaults; None when they can: each has a literal default and a name the override lacks, the positional
    ones come after all of the override's (bound) positional parameters, in the base's order, and the override
    takes no ``*args`` or ``**kwargs``, so that every call binding today binds the same afterwards."""
    names = {p.name for p in override.parameters}
    if any(p.kind in ("VAR_POSITIONAL", "VAR_KEYWORD") for p in override.parameters):
        return "the method takes `*args` or `**kwargs`"
    for parameter in missing:
        if parameter.kind in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            return f"vLLM passes `{'*' if parameter.kind == 'VAR_POSITIONAL' else '**'}{parameter.name}`"
        if not literal(parameter.default):
            return f"vLLM gives `{parameter.name}` no default" if parameter.default is None else (
                f"the default of `{parameter.name}` is no literal"
            )  # fmt: skip
        if parameter.name in names:
            return f"`{parameter.name}` is elsewhere in the method's parameters"
    return None


def add_parameters(params: cst.Parameters, missing: tuple[Parameter, ...], sink: CommentSink) -> cst.Parameters:
    """``params`` with ``missing`` appended (positional ones after the positional parameters, keyword-only ones
    after a ``*``), each with its default, in the layout of the parameters before it (one a line stays so)."""
    positional = list(params.params)
    keyword = list(params.kwonly_params)
    for parameter in missing:
        new = cst.Param(
            cst.Name(parameter.name),
            default=cst.parse_expression(parameter.default or "None"),
            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
        )
        if parameter.kind == "KEYWORD_ONLY":
            keyword = _append(keyword, new, list(params.params) + keyword)
        else:
            positional = _append(positional, new, list(params.posonly_params) + positional)
    star = params.star_arg
    if keyword and isinstance(star, cst.MaybeSentinel):
        star = cst.ParamStar()
    return params.with_changes(params=positional, kwonly_params=keyword, star_arg=star)


def _append(section: list[cst.Param], new: cst.Param, before: list[cst.Param]) -> list[cst.Param]:
    """``section`` with ``new`` after it, in the layout of the parameters before it: ``new`` takes the last
    parameter's comma (a trailing comma stays last, and the lines before the closing bracket with it), the last one
    a separator like the one between the two before it (one a line stays one a line), keeping its own comment."""
    if not before or not section:
        return [*section, new]
    last = section[-1]
    own = last.comma
    between = before[-2].comma if len(before) > 1 else cst.MaybeSentinel.DEFAULT
    # What followed the last parameter (the line break before the closing bracket) follows the new one.
    tail = last.whitespace_after_param
    last = last.with_changes(comma=_separator(own, between), whitespace_after_param=cst.SimpleWhitespace(""))
    return [*section[:-1], last, new.with_changes(comma=_bare(own), whitespace_after_param=tail)]


def _separator(own: cst.Comma | cst.MaybeSentinel, between: cst.Comma | cst.MaybeSentinel) -> cst.Comma:
    """The comma after a parameter that another now follows: the line break and indentation of ``between``, the
    comment of ``own`` (where the parameter's line had one), no comment line of either (they stay where they are)."""
    comment = None
    if isinstance(own, cst.Comma) and isinstance(own.whitespace_after, cst.ParenthesizedWhitespace):
        comment = own.whitespace_after.first_line  # (a simple space has no line of its own)
    if isinstance(between, cst.Comma) and isinstance(between.whitespace_after, cst.ParenthesizedWhitespace):
        layout = between.whitespace_after
        first = comment if comment is not None else cst.TrailingWhitespace(newline=layout.first_line.newline)
        return between.with_changes(whitespace_after=layout.with_changes(first_line=first, empty_lines=()))
    if comment is not None and comment.comment is not None:  # the parameter's comment ends its line
        assert isinstance(own, cst.Comma) and isinstance(own.whitespace_after, cst.ParenthesizedWhitespace)
        return own.with_changes(whitespace_after=own.whitespace_after.with_changes(empty_lines=()))
    if isinstance(between, cst.Comma):
        return between
    return cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def _bare(own: cst.Comma | cst.MaybeSentinel) -> cst.Comma | cst.MaybeSentinel:
    """``own`` without the comment that ends the last parameter's line (that comment stays with it)."""
    if isinstance(own, cst.Comma) and isinstance(own.whitespace_after, cst.ParenthesizedWhitespace):
        layout = own.whitespace_after
        return own.with_changes(
            whitespace_after=layout.with_changes(first_line=cst.TrailingWhitespace(newline=layout.first_line.newline))
        )
    return own
