"""The occurrences of names in a module that the index's other records do not account for, kept for the run's
accounting (`accounting`): before a safe fix, every use of what it changes must be proven unaffected, or the fix is
withheld.

Where a name can occur in a module that parses, and what each place means for a fix that changes a method of a
class (VAC001-VAC003: what its callers may pass) or deletes its ``accept_output_buffer`` (VAC004):

* an attribute read (``x.forward``, ``x.forward(...)``, ``getattr(x, "forward")``): the call-site analysis decides
  each from its receiver and arguments (`calls.Use`), the flag's owners each read of the flag (`flags.FlagRead`);
* a name read in a class body (``run = forward``, ``supports = accept_output_buffer``, a decorator or a default
  value of a method): the class's own attribute, where its body binds the name (:class:`ClassBodyName`);
* reflection (``vars()``, ``__dict__``, ``dir()``, ``inspect.getmembers``, ``getattr``/``hasattr``/``setattr``/
  ``delattr`` with a name that is no literal, ``operator.attrgetter``, ...): a use of every member of every class
  it may reach, decided from its receiver (:class:`Reflection`);
* a name a call looks up from a string (``operator.attrgetter("forward")``, ``methodcaller``, ``mock.patch``) and a
  doctest, which is code (:class:`NamedUse`);
* a definition, a parameter, a keyword argument's name, an import, an assignment, a name read outside a class
  body (a local or global, never a class's attribute), an attribute written, a comment: unaffected;
* any other string: unaffected, since only reflection turns a string into an attribute, and reflection is
  accounted where it happens (its literal name here, a computed one as reach).

Syntax this module does not know (a newer Python's) names what it holds as a :class:`NamedUse` of kind
``syntax``: an occurrence the accounting does not recognise withholds. Old op names in strings (VAC006) are
:class:`OpString` records, each with its place: an op list vLLM reads, a registration, prose, or anything else.

A file that does not parse has an index of its text alone (:func:`unparsed_index`): every identifier in it, and
every reflection word, is a use. Plain picklable data, stored by `records`.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from vllm_attn_compat.codemods.index import children
from vllm_attn_compat.codemods.index.names import IDENTIFIER_PATTERN

_TEXT_LIMIT = 60

# The builtins and library functions that read or write a member whose name they are given (a string) or every
# member: what the call-site analysis cannot follow by name. By the last part of the callee's dotted name.
BY_NAME = frozenset({"getattr", "hasattr", "setattr", "delattr", "getattr_static"})
ALL_MEMBERS = frozenset({"vars", "dir", "getmembers", "getmembers_static"})
# Calls that look a member up by a name given as a string, and the argument that holds it (-1: every argument).
NAME_LOOKUPS = {"attrgetter": -1, "methodcaller": 0, "__getattribute__": 0, "patch": 0, "object": 1, "multiple": -1}
REFLECTION_WORDS = BY_NAME | ALL_MEMBERS | {"__dict__", "attrgetter", "methodcaller", "__getattribute__", "locals"}


class ClassBodyName(NamedTuple):
    """A name read in a class body, where that body binds it: the class's own attribute of that name."""

    owner: str  # the class's qualname
    name: str
    line: int
    column: int  # 1-based


class Reflection(NamedTuple):
    """A read or write of members by a computed name, or of every member."""

    line: int
    column: int  # 1-based
    # "dict": ``vars(x)``/``x.__dict__`` (an instance's holds no method nor class attribute); "other": the rest
    kind: str
    # "self" (an instance of the class ``target`` or a subclass), "cls" (that class or a subclass), "class" (what the
    # dotted name ``target`` names), "instance" (an instance of the class ``target`` names, made in the function),
    # "namespace" (``vars()``/``locals()`` in the body of class ``target``), "none" (a literal, a module imported
    # with ``import``, ``vars()`` in a function: no class's member), "any"
    receiver: str
    target: str | None
    names: tuple[str, ...]  # the names it may use, where they are known literals; () for any name
    text: str


class NamedUse(NamedTuple):
    """A name used where the run cannot tell by what: a string looked up as a member (``attrgetter("forward")``),
    a doctest, syntax this module does not know, a file that does not parse."""

    name: str
    line: int
    column: int  # 1-based
    kind: str  # "lookup", "doctest", "syntax", "unparsed"
    text: str


class OpString(NamedTuple):
    """A string naming an op vLLM 0.20 deleted (``"vllm::unified_attention"``), or composing one (``"vllm::"``)."""

    line: int
    column: int  # 1-based
    op: str  # "unified_attention", "unified_mla_attention"; "" for a prefix that composes op names
    # "list": an element of an op list vLLM reads (VAC006 renames it); "registration": an op's registration or a
    # torch lookup (they read no list); "prose": text that cannot be an op's name; "prefix"; "other"; "unparsed"
    place: str
    text: str


@dataclass(frozen=True)
class Occurrences:
    class_names: tuple[ClassBodyName, ...] = ()
    reflection: tuple[Reflection, ...] = ()
    named: tuple[NamedUse, ...] = ()
    op_strings: tuple[OpString, ...] = ()
    # The dotted names (resolved through the module's imports and definitions) of the attributes it assigns
    # (``registry.IMPL = MyImpl()``, ``setattr(registry, "IMPL", ...)``): an object outside the run that code of the
    # run may have set, which reflection on it may then reach (`accounting.reaches`).
    stores: tuple[str, ...] = ()


EMPTY = Occurrences()


def shorten(node: ast.AST) -> str:
    text = ast.unparse(node)
    text = " ".join(text.split())
    return text if len(text) <= _TEXT_LIMIT else text[: _TEXT_LIMIT - 3] + "..."


# --- names read in class bodies ----------------------------------------------------------------------------------


def _bound_in_body(body: list[ast.stmt]) -> set[str]:
    """The names a class body binds (definitions, assignments, imports, loop and ``with`` targets, a walrus): what a
    read there may mean. Definitions are not entered: their bodies bind their own names."""
    bound: set[str] = set()
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):  # (the field table does not enter their aliases)
            bound.update((alias.asname or alias.name).partition(".")[0] for alias in node.names)
        pending += children.child_nodes(node)
    return bound


def class_body_names(node: ast.ClassDef, qualname: str) -> list[ClassBodyName]:
    """The reads in ``node``'s class scope (its statements, its methods' decorators, defaults and annotations, but
    not their bodies) of names its body binds. A comprehension's inner parts count too: erring towards a use."""
    bound = _bound_in_body(node.body)
    if not bound:
        return []
    found: list[ClassBodyName] = []
    pending: list[ast.AST | None] = []
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = statement.args
            pending += [*statement.decorator_list, *arguments.defaults, *arguments.kw_defaults]
            pending += [a.annotation for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
            pending += [statement.returns]
        elif isinstance(statement, ast.ClassDef):
            pending += [*statement.decorator_list, *statement.bases, *statement.keywords]
        else:
            pending.append(statement)
    while pending:
        item = pending.pop()
        if item is None or isinstance(item, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue  # their bodies are function scopes (a nested class's body reads none of these)
        if isinstance(item, ast.Name) and isinstance(item.ctx, ast.Load) and item.id in bound:
            found.append(ClassBodyName(qualname, item.id, item.lineno, item.col_offset + 1))
        pending += children.child_nodes(item)
    found.sort(key=lambda use: (use.line, use.column))
    return found


# --- strings: doctests and op names ------------------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOCTEST_LINE = re.compile(r"^[ \t]*(?:>>>|\.\.\.)(?: |$)(.*)$", re.MULTILINE)


def doctest_uses(tree: ast.Module) -> list[NamedUse]:
    """Every name in the code of a doctest (``>>>`` and ``...`` lines) of any string of ``tree``."""
    found: list[NamedUse] = []
    for node in children.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and ">>>" in node.value:
            for match in _DOCTEST_LINE.finditer(node.value):
                line = node.lineno + node.value.count("\n", 0, match.start())
                code = match.group(1)
                for word in dict.fromkeys(_WORD.findall(code)):
                    found.append(NamedUse(word, line, node.col_offset + 1, "doctest", code.strip()[:_TEXT_LIMIT]))
    return found


OP_NAMES = ("unified_attention", "unified_mla_attention")
_OP = re.compile(r"vllm(?:::|\.)(unified_(?:mla_)?attention)(?![A-Za-z0-9_])")
# A literal part that composes an op's name with what follows it: ``"vllm::" + name``, ``f"vllm::{name}"``.
_PREFIX = re.compile(r"vllm(?:::|\.)\Z")
# An op list vLLM reads: `splitting_ops` (`CompilationConfig`'s field), or a name ending in `_ops`
# (`SPLITTING_OPS`, `_attention_ops`); what holds a list of op names.
_OP_LIST_NAME = re.compile(r"(?:^|_)ops\Z", re.IGNORECASE)
# Calls that register an op or look one up in torch (they read no op list).
_REGISTRATIONS = frozenset(
    {"direct_register_custom_op", "custom_op", "define", "impl", "register_fake", "register_kernel", "Library"}
)


def is_op_list_name(name: str) -> bool:
    return bool(_OP_LIST_NAME.search(name))


def _last_name(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _op_list_place(literal: ast.AST, parent: ast.AST | None) -> bool:
    """Whether the list, tuple or set ``literal`` is an op list vLLM reads, by where it stands (``parent``)."""
    if isinstance(parent, ast.Assign):
        return parent.value is literal and any(is_op_list_name(_last_name(t) or "") for t in parent.targets)
    if isinstance(parent, (ast.AnnAssign, ast.AugAssign)):
        return parent.value is literal and is_op_list_name(_last_name(parent.target) or "")
    if isinstance(parent, ast.keyword):
        return is_op_list_name(parent.arg or "")
    if isinstance(parent, ast.Dict):
        return any(
            value is literal and is_op_list_name(_last_name(key) or "")
            for key, value in zip(parent.keys, parent.values, strict=True)
        )
    if isinstance(parent, ast.Call):  # `config.splitting_ops.extend([...])`
        func = parent.func
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "extend"
            and is_op_list_name(_last_name(func.value) or "")
            and literal in parent.args
        )
    return False


def _string_place(node: ast.Constant, value: str, parents: dict[int, ast.AST]) -> str:
    """Where a string holding an old op's name stands (`OpString.place`)."""
    parent = parents.get(id(node))
    listed = isinstance(parent, (ast.List, ast.Tuple, ast.Set)) and _OP.fullmatch(value)
    if listed and _op_list_place(parent, parents.get(id(parent))):  # type: ignore[arg-type]
        return "list"
    if isinstance(parent, ast.Call) and node in parent.args and _OP.fullmatch(value):
        func = parent.func  # `config.splitting_ops.append("vllm::...")`
        if isinstance(func, ast.Attribute) and func.attr == "append" and is_op_list_name(_last_name(func.value) or ""):
            return "list"
    if isinstance(parent, ast.keyword) and parent.arg == "op_name":
        return "registration"
    if isinstance(parent, ast.Call):
        callee = _last_name(parent.func) or ""
        dotted = ast.unparse(parent.func)
        if callee in _REGISTRATIONS or dotted.startswith("torch."):
            return "registration"
    if isinstance(parent, ast.Expr):  # a docstring, or a string standing alone: read by nothing, unless a doctest
        return "other" if ">>>" in value else "prose"
    if not _OP.fullmatch(value.strip()) and any(blank in value for blank in " \t\n"):
        return "prose"  # no op's name: `logger.info("uses vllm::unified_attention")`
    return "other"


def op_strings(tree: ast.Module) -> list[OpString]:
    """The strings of ``tree`` naming an op vLLM 0.20 deleted, or composing op names, with their places."""
    parents: dict[int, ast.AST] = {}  # of each string naming one, its parent and its parent's parent
    found: list[OpString] = []
    stack: list[tuple[ast.AST, ast.AST | None]] = [(tree, None)]
    while stack:
        node, parent = stack.pop()
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            stack += [(child, node) for child in children.child_nodes(node)]
            if parent is not None:
                parents[id(node)] = parent  # (a node's parent is asked of literals only: cheap to keep)
            continue
        value = node.value
        if "vllm" not in value:
            continue
        if parent is not None:
            parents[id(node)] = parent
        ops = dict.fromkeys(match.group(1) for match in _OP.finditer(value))
        place = _string_place(node, value, parents) if ops else ""
        for op in ops:
            found.append(OpString(node.lineno, node.col_offset + 1, op, place, shorten(node)))
        if _PREFIX.search(value):
            found.append(OpString(node.lineno, node.col_offset + 1, "", "prefix", shorten(node)))
    found.sort(key=lambda occurrence: (occurrence.line, occurrence.column))
    return found


# A source that may hold such a string (a file without it is not walked for them).
OP_SOURCE = re.compile(rb"vllm(?:::|\.(?:unified_|[\"'{]))")
# The texts a string naming an old op (`_OP`), or composing one (`_PREFIX`), holds: what the accounting looks for in
# the files it has not read while an op's renaming is still safe.
OP_TEXTS = frozenset({"vllm::unified_", "vllm.unified_", 'vllm::"', "vllm::'", "vllm::{", 'vllm."', "vllm.'", "vllm.{"})


# --- syntax this module does not know ---------------------------------------------------------------------------

# Python 3.11's node types (what the index's walks know): a node of another type holds syntax whose meaning the
# accounting cannot tell, and every name in it counts as a use.
_KNOWN_NODES_TEXT = """
    Module Interactive Expression FunctionType FunctionDef AsyncFunctionDef ClassDef Return Delete Assign AugAssign
    AnnAssign For AsyncFor While If With AsyncWith Match Raise Try TryStar Assert Import ImportFrom Global Nonlocal
    Expr Pass Break Continue BoolOp NamedExpr BinOp UnaryOp Lambda IfExp Dict Set ListComp SetComp DictComp
    GeneratorExp Await Yield YieldFrom Compare Call FormattedValue JoinedStr Constant Attribute Subscript Starred Name
    List Tuple Slice Load Store Del And Or Add Sub Mult MatMult Div Mod Pow LShift RShift BitOr BitXor BitAnd FloorDiv
    Invert Not UAdd USub Eq NotEq Lt LtE Gt GtE Is IsNot In NotIn comprehension ExceptHandler arguments arg keyword
    alias withitem match_case MatchValue MatchSingleton MatchSequence MatchMapping MatchClass MatchStar MatchAs MatchOr
    TypeIgnore
"""
KNOWN_NODES = frozenset(_KNOWN_NODES_TEXT.split())


def unknown_syntax(node: ast.AST) -> list[NamedUse]:
    """The names a node of a type this module does not know holds (its string fields, and its children's)."""
    found: list[NamedUse] = []
    for inner in ast.walk(node):
        for field in inner._fields:
            value = getattr(inner, field, None)
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str) and _WORD.fullmatch(item):
                    line = getattr(inner, "lineno", getattr(node, "lineno", 1))
                    column = getattr(inner, "col_offset", 0) + 1
                    found.append(NamedUse(item, line, column, "syntax", type(node).__name__))
    return found


# --- a file that does not parse ---------------------------------------------------------------------------------

_WORD_BYTES = re.compile(IDENTIFIER_PATTERN)
_OP_BYTES = re.compile(rb"vllm(?:::|\.)(unified_(?:mla_)?attention)(?![A-Za-z0-9_])|vllm(?:::|\.)[\"'{]")


def unparsed_occurrences(source: bytes) -> Occurrences:
    """Every name in the text of a file that does not parse, each at its first place, as a use (`NamedUse`
    ``unparsed``); every reflection word as reflection that may reach any class; every old op's name and
    op-composing prefix as an op string of no known place."""
    starts = [0] + [match.end() for match in re.finditer(rb"\r\n|\r|\n", source)]

    def place(offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(starts, offset)
        return line, offset - starts[line - 1] + 1

    named: dict[str, NamedUse] = {}
    reflection: list[Reflection] = []
    for match in _WORD_BYTES.finditer(source):
        word = match.group().decode("utf-8", "replace")
        if word not in named or word in REFLECTION_WORDS:
            line, column = place(match.start())
            named.setdefault(word, NamedUse(word, line, column, "unparsed", word))
            if word in REFLECTION_WORDS:
                reflection.append(Reflection(line, column, "other", "any", None, (), word))
    ops: list[OpString] = []
    for match in _OP_BYTES.finditer(source):
        line, column = place(match.start())
        op = (match.group(1) or b"").decode()
        ops.append(OpString(line, column, op, "unparsed" if op else "prefix", match.group().decode("utf-8", "replace")))
    return Occurrences((), tuple(reflection), tuple(named.values()), tuple(ops))


def names_in(uses: Iterable[NamedUse]) -> frozenset[str]:
    return frozenset(use.name for use in uses)
