"""VAC006: old op names in strings (``splitting_ops`` lists and the like)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.engine.edits import CommentSink, Replace
from vllm_attn_compat.codemods.engine.rule import Example, Rule, narrowed_to
from vllm_attn_compat.codemods.engine.scan import NOT_BEFORE_IDENTIFIER
from vllm_attn_compat.codemods.findings import FixSafety, Status

if TYPE_CHECKING:
    from typing import TypeAlias

    import libcst as cst

    _Literal: TypeAlias = cst.List | cst.Tuple | cst.Set

_OLD_OPS = ("unified_attention", "unified_mla_attention")
# Both spellings vLLM accepted in `splitting_ops`: the schema name and the dotted form.
OLD_NAMES = {f"vllm{sep}{op}": f"vllm{sep}{op}_with_output" for op in _OLD_OPS for sep in ("::", ".")}
_WHOLE_OLD_NAME = re.compile(rb"vllm(?:::|\.)unified_(?:mla_)?attention" + NOT_BEFORE_IDENTIFIER)


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
    places. A string that is exactly an old name (``vllm::`` or dotted ``vllm.`` form) becomes the
    ``_with_output`` name, or drops out when that name is already in the list, only where it is provably an op
    name vLLM reads: an element of the list, tuple or set that is a ``splitting_ops`` value (or the value of any
    name ending in ``_ops``, as ``SPLITTING_OPS`` or a compilation config's ``_attention_ops``: an assignment, a
    keyword argument, a dictionary key, ``.extend(...)``), or what ``.append(...)`` adds to such a list. Anywhere
    else (a comparison, an argument, a tuple pairing old and new names, a tuple of removed names used to reject
    them, an op's registration, a torch lookup) the string is only reported: renaming it there could change what
    the code does. Strings that merely start with an old name are never touched.

    The rename is safe only while every other string of the run naming the op is accounted for: one in an op
    list (renamed too), a registration, or prose; any other (``if op == "vllm::unified_attention"``, a prefix that
    composes op names, ``"vllm::" + name``, a doctest, the text of a file that does not parse) may be compared
    with what the list holds, and withholds it (unsafe), the finding naming it. In a fork of vLLM <= 0.19 (the
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
    # Each finding is a string that is an old name whole: not one a longer name starts with
    # (``vllm::unified_attention_with_output``), as most of vLLM's own are.
    narrows = True
    facts, acts_in = narrowed_to(_WHOLE_OLD_NAME)

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
        listed = (
            isinstance(element, cst.Element)
            and element.value is node
            and isinstance(literal, (cst.List, cst.Tuple, cst.Set))
            and _op_list_place(literal, self.ctx.parent(3), self.ctx.parent(4))
        )
        appended = isinstance(element, cst.Arg) and element.value is node and _appended(element, self.ctx.parent(2))
        if not (listed or appended):
            message = f"`{value}` no longer exists in vLLM >= 0.20 (now `{new_name}`): review this use"
            self.ctx.report(self, node, message)
            return
        # A fork of vLLM <= 0.19 (its own AttentionBackend still declares the flag) still registers the old op and
        # runs it for backends without the flag: until that path goes, the list must keep naming it.
        reason = None
        if self.ctx.hierarchy.declares_flag_in_base():
            reason = "this fork still runs the old op for backends without the flag"
        else:
            reason = self.ctx.hierarchy.op_renaming_withheld(value.partition("::")[2] or value[5:], self.ctx.path)
        safety = None if reason is None else FixSafety.UNSAFE
        suffix = "" if reason is None else f"; {reason}"
        assert isinstance(literal, (cst.List, cst.Tuple, cst.Set)) or appended
        if listed and {_string_value(e.value) for e in literal.elements} & _equivalents(new_name):  # type: ignore[union-attr]
            message = f"`{value}` no longer exists in vLLM >= 0.20 and `{new_name}` is listed: drop it"
            edit = Replace(literal, _drop_elements(value))  # type: ignore[arg-type]
        else:
            message = f"`{value}` no longer exists in vLLM >= 0.20: use `{new_name}`"
            edit = Replace(node, _rename(new_name))
        self.ctx.report(self, node, message + suffix, edit, safety=safety)


def _name_of(node: cst.CSTNode | None) -> str:
    """The last name of a target, keyword or key (``config.splitting_ops``, ``splitting_ops=``, ``"splitting_ops"``)."""
    import libcst as cst

    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.SimpleString):
        value = _string_value(node)
        return value or ""
    return ""


def _op_list_place(literal: cst.CSTNode, parent: cst.CSTNode | None, grandparent: cst.CSTNode | None) -> bool:
    """Whether the literal is an op list vLLM reads (`occurrences.is_op_list_name`), by where it stands: the value
    of an assignment to, a keyword argument or a dictionary key named like one, or what ``.extend`` is given."""
    import libcst as cst

    from vllm_attn_compat.codemods.engine.patterns import is_op_list_name

    if isinstance(parent, cst.Assign):
        return parent.value is literal and any(is_op_list_name(_name_of(t.target)) for t in parent.targets)
    if isinstance(parent, (cst.AnnAssign, cst.AugAssign)):
        return parent.value is literal and is_op_list_name(_name_of(parent.target))
    if isinstance(parent, cst.Arg):
        if parent.keyword is not None:
            return is_op_list_name(parent.keyword.value)
        func = grandparent.func if isinstance(grandparent, cst.Call) else None
        return isinstance(func, cst.Attribute) and func.attr.value == "extend" and is_op_list_name(_name_of(func.value))
    if isinstance(parent, cst.DictElement):
        return parent.value is literal and is_op_list_name(_name_of(parent.key))
    return False


def _appended(argument: cst.Arg, call: cst.CSTNode | None) -> bool:
    """``config.splitting_ops.append("vllm::...")``: a name added to an op list."""
    import libcst as cst

    from vllm_attn_compat.codemods.engine.patterns import is_op_list_name

    if not isinstance(call, cst.Call) or argument.keyword is not None or call.args[0] is not argument:
        return False
    func = call.func
    return isinstance(func, cst.Attribute) and func.attr.value == "append" and is_op_list_name(_name_of(func.value))
