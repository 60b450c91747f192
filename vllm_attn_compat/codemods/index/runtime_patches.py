"""Code copied onto vLLM's attention classes at run time, found by the class index (stdlib ``ast``).

Plugins for new hardware often do not subclass vLLM's classes but patch them: a function assigned as a
method (``MLAAttention.forward = _forward``, ``setattr(Attention, "forward_impl", fn)``, a patch helper
or decorator), or a "methods" class whose members are copied into a backend (``for name, value in
MyBackendMethods.__dict__.items(): setattr(FlashAttentionBackend, name, value)``, or a class decorator).
That code runs as the class's own, so the rules treat it as such. A "methods" class of which a
decorator builds a new backend class (``type(cls.__name__, (base,), namespace)``: `BUILDER`, `BUILT`) is
reported, never fixed: its flag and asserts are the fork's design. Where an explicit patch (``setattr``,
a patch helper or decorator) targets a class that cannot be resolved (a parameter, a computed value),
the entry has no target: its code is reported, never fixed. A plain ``obj.attr = fn`` counts only where
``obj`` resolves to a class of the run or an import: on anything else it sets an instance attribute.
"""

from __future__ import annotations

import ast
import re
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from vllm_attn_compat.codemods.index import children

# What is copied: one attribute (a function becomes a method), or a class's members (a mixin).
ATTRIBUTE = "attribute"
MEMBERS = "members"
# A function building a class with ``type(name, bases, namespace)`` (targets: the bases it names), and a
# "methods" class a decorator is applied to (targets: the decorator). A class whose decorator is such a
# builder becomes, at run time, a new class deriving from the builder's bases with its members: its
# flag and asserts are that class's design (`ClassHierarchy.patch_scope` answers "built"; reported only).
BUILDER = "builder"
BUILT = "built"

Resolve = Callable[[ast.expr], "str | None"]


@dataclass(frozen=True)
class PatchEntry:
    source: str  # dotted name of the function or class whose code is copied
    kind: str  # ATTRIBUTE or MEMBERS
    targets: tuple[str, ...]  # dotted names the patched class may have; () when it cannot be resolved
    line: int


def _callee_name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


# Helpers that copy code onto a class name what they do: `patch`, `patch.object`, `monkeypatch.setattr`,
# `_patch_method`, `merge_into`, `inject_methods`, ... (in any case). "dispatch" spells "patch" but names no
# such helper: `self.cudagraph_dispatcher.dispatch(num_tokens, ...)` copies nothing onto a class.
_HELPER_WORDS = (b"patch", b"merge", b"inject", b"mixin", b"setattr")


def patch_words(lowered: bytes) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each helper word in ``lowered`` (a lower-cased name or text), word by word (a
    regular expression, an alternation, costs ten times as much on a long file)."""
    for word in _HELPER_WORDS:
        start = lowered.find(word)
        while start >= 0:
            if word != b"patch" or lowered[max(start - 3, 0) : start] != b"dis":
                yield start, start + len(word)
            start = lowered.find(word, start + 1)


def is_patch_object(lowered: bytes) -> bool:
    """Whether a lower-cased name is that of an object whose methods are patch helpers: ``patch.object(...)``,
    ``mock_patch.dict(...)``."""
    return lowered.endswith(b"patch") and not lowered.endswith(b"dispatch")


def _is_patch_helper(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute) and is_patch_object(_callee_name(func.value).lower().encode()):
        return True
    return next(patch_words(_callee_name(func).lower().encode()), None) is not None


def _targets(expr: ast.expr, resolve: Resolve) -> tuple[str, ...]:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str) and "." in expr.value:
        # `patch("vllm.....MLAAttention.forward", fn)` names the attribute; `"....MLAAttention"` the class.
        return (expr.value, expr.value.rpartition(".")[0])
    resolved = resolve(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None
    return (resolved,) if resolved else ()


def _source(expr: ast.expr, resolve: Resolve) -> str | None:
    return resolve(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None


def _from_call(call: ast.Call, resolve: Resolve, line: int) -> list[PatchEntry]:
    if not call.args or not _is_patch_helper(call.func):
        return []
    targets = _targets(call.args[0], resolve)
    values = [*call.args[1:], *(keyword.value for keyword in call.keywords)]
    sources = (_source(value, resolve) for value in values)
    return [PatchEntry(source, ATTRIBUTE, targets, line) for source in sources if source]


def _members_of(iterable: ast.expr, resolve: Resolve) -> str | None:
    """``X`` when ``iterable`` walks the members of class ``X``: ``X.__dict__``, ``vars(X)``, ``getmembers(X)``."""
    for node in children.walk(iterable):
        if isinstance(node, ast.Attribute) and node.attr == "__dict__":
            return _source(node.value, resolve)
        if isinstance(node, ast.Call) and node.args and _callee_name(node.func) in ("vars", "getmembers"):
            return _source(node.args[0], resolve)
    return None


def from_statement(node: ast.stmt, resolve: Resolve) -> list[PatchEntry]:
    """The patches one statement makes (its nested statements are visited on their own)."""
    line = node.lineno
    if isinstance(node, ast.For):
        source = _members_of(node.iter, resolve)
        if source is None:
            return []
        calls = (n for n in children.walk(ast.Module(body=node.body, type_ignores=[])) if isinstance(n, ast.Call))
        setattrs = [call for call in calls if _callee_name(call.func) == "setattr" and call.args]
        return [PatchEntry(source, MEMBERS, _targets(call.args[0], resolve), line) for call in setattrs]
    entries: list[PatchEntry] = []
    if isinstance(node, ast.Assign):
        # `X.forward = fn` patches a class only where `X` resolves: `self.callback = fn` patches nothing.
        source = _source(node.value, resolve)
        for target in node.targets:
            targets = _targets(target.value, resolve) if isinstance(target, ast.Attribute) else ()
            if source and targets:
                entries.append(PatchEntry(source, ATTRIBUTE, targets, line))
    value = getattr(node, "value", None)
    if isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign)) and value is not None:
        # `mock.patch.object(...).start()`, `patcher = patch(...)`: the helper may sit inside the expression.
        for call in children.walk(value):
            if isinstance(call, ast.Call):
                entries += _from_call(call, resolve, line)
    return entries


# `_is_patch_helper` reads a call's names, which the source spells out (in any case: it lowers them); but a
# non-ASCII identifier can fold (NFKC) onto one of the words, so a non-ASCII byte counts as a match too.
_NON_ASCII = re.compile(rb"[\x80-\xff]+")
_ENCODING_DECLARATION = re.compile(rb"coding[:=][ \t]*([-\w.]+)")


class HelperLines:
    """The lines of a module's text that may name a patch helper (`may_patch` reads them): most statements
    name none, and their expressions need no walk."""

    def __init__(self, source: bytes) -> None:
        self.lines: list[int] | None = _helper_lines(source)  # sorted; None where the text cannot tell
        # Lines that may build a class (`builder_entry`); read from the text like the helpers' lines.
        self.builds: list[int] | None = builder_lines(source) if self.lines is not None else None

    def may_build(self, node: ast.stmt) -> bool:
        return self.builds is None or may_build(self.builds, node)

    def any_between(self, first: int, last: int) -> bool:
        if self.lines is None:
            return True
        i = bisect_left(self.lines, first)
        return i < len(self.lines) and self.lines[i] <= last


def _helper_lines(source: bytes) -> list[int] | None:
    # The parser ends lines at a lone CR too, which counting LFs would miss; and it reads the bytes in a
    # declared encoding, where ASCII bytes may spell other characters (UTF-7): no line is known then.
    if b"\r" in source and source.count(b"\r") != source.count(b"\r\n"):
        return None
    first = source.find(b"\n")
    second = source.find(b"\n", first + 1) if first >= 0 else -1
    for name in _ENCODING_DECLARATION.findall(source if second < 0 else source[:second]):
        name = name.lower().replace(b"_", b"-")
        if name not in (b"utf-8", b"utf8") and not name.startswith(b"utf-8-"):
            return None
    lowered = source.lower()  # ASCII letters only, as the parser spells keywords and ASCII names
    starts = [] if source.isascii() else [match.start() for match in _NON_ASCII.finditer(source)]
    starts += [start for start, _ in patch_words(lowered)]
    lines: list[int] = []
    line, counted = 1, 0
    for start in sorted(starts):
        line += source.count(b"\n", counted, start)
        counted = start
        lines.append(line)
    return lines


def may_patch(node: ast.stmt, helper_lines: HelperLines) -> bool:
    """False only where `from_statement` finds no patch in ``node`` (it walks every expression; this reads
    the node's own fields and the text of its lines)."""
    if isinstance(node, ast.For):
        return True
    if (
        isinstance(node, ast.Assign)
        and isinstance(node.value, (ast.Name, ast.Attribute))
        and any(isinstance(target, ast.Attribute) for target in node.targets)
    ):
        return True  # `X.forward = fn`
    return helper_lines.any_between(node.lineno, node.end_lineno or node.lineno)


_NAME_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") | frozenset(range(128, 256))
# What may follow a name that is not called: anything but `(`, a blank, a line end, `\` or `#`.
_NOT_A_CALL = frozenset(range(256)) - frozenset(b"(\r\n\\#")


def builder_lines(source: bytes) -> list[int]:
    """The lines of ``source`` that may call ``type(...)`` or ``types.new_class(...)`` (`may_build`): each
    ``type`` and ``new_class`` (word by word: a regular expression with an alternation or a look-behind
    has no literal to search for, and costs ten times as much)."""
    starts = []
    for word in (b"type", b"new_class"):
        start = source.find(word)
        while start >= 0:
            before = source[start - 1 : start]
            after = source[start + len(word) : start + len(word) + 64].lstrip(b" \t")
            # `dtype`, `obj.type` and `type[int]` call no `type`; what cannot be read at once (a line
            # continuation, a comment, a long run of blanks) counts.
            attribute = before == b"." and word == b"type"  # `types.new_class` is called as an attribute
            if not (before and (before[0] in _NAME_BYTES or attribute)) and not (after and after[0] in _NOT_A_CALL):
                starts.append(start)
            start = source.find(word, start + 1)
    lines, line, counted = [], 1, 0
    for start in sorted(starts):
        line += source.count(b"\n", counted, start)
        counted = start
        lines.append(line)
    return lines


def may_build(lines: list[int], node: ast.stmt) -> bool:
    """Whether ``node`` spans one of ``lines`` (`builder_lines`): only then can it build a class."""
    i = bisect_left(lines, node.lineno)
    return i < len(lines) and lines[i] <= (node.end_lineno or node.lineno)


def builder_entry(node: ast.FunctionDef | ast.AsyncFunctionDef, source: str, resolve: Resolve) -> PatchEntry | None:
    """A `BUILDER` entry when the function (or a function nested in it: a decorator factory) returns a
    class built by ``type(name, bases, namespace)`` or ``types.new_class(name, bases, ...)``; its targets
    are the bases that resolve (none where they are parameters: ``type(cls.__name__, (base,), ns)``)."""
    for call in children.walk(node):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        three = isinstance(func, ast.Name) and func.id == "type" and len(call.args) == 3 and not call.keywords
        if not (three or (_callee_name(func) == "new_class" and len(call.args) >= 2)):
            continue
        bases = call.args[1]
        elements = bases.elts if isinstance(bases, (ast.Tuple, ast.List)) else []
        targets = tuple(name for name in (_source(base, resolve) for base in elements) if name)
        return PatchEntry(source, BUILDER, targets, call.lineno)
    return None


def _may_matter(node: ast.ClassDef) -> bool:
    """Whether a "methods" class holds what a rule reads: the flag, or a method taking ``output``."""
    for statement in node.body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if any(isinstance(t, ast.Name) and t.id == "accept_output_buffer" for t in targets):
                return True
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = statement.args
            if any(a.arg == "output" for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)):
                return True
    return False


def from_decorators(
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, source: str, resolve: Resolve
) -> list[PatchEntry]:
    """Patches by decorator: ``@patch_method(MLAAttention, "forward")`` on a function, ``@merge_into(Backend)``
    on a class. A decorator that is no patch helper counts only when its first argument resolves."""
    kind = MEMBERS if isinstance(node, ast.ClassDef) else ATTRIBUTE
    entries: list[PatchEntry] = []
    if isinstance(node, ast.ClassDef) and _may_matter(node):
        # Whether the decorator builds a class of the members is known once the run's builders are
        # (`ClassHierarchy.patch_scope`): a bare ``@tt_backend`` or a factory ``@backend_from(Base)``.
        for decorator in node.decorator_list:
            callee = decorator.func if isinstance(decorator, ast.Call) else decorator
            named = _source(callee, resolve)
            if named:
                entries.append(PatchEntry(source, BUILT, (named,), decorator.lineno))
    for decorator in node.decorator_list:
        if not (isinstance(decorator, ast.Call) and decorator.args):
            continue
        targets = _targets(decorator.args[0], resolve)
        if targets or _is_patch_helper(decorator.func):
            entries.append(PatchEntry(source, kind, targets, decorator.lineno))
    return entries
