"""Where one module reads ``accept_output_buffer``: what the hierarchy asks before a safe fix deletes a
class's declaration of the flag (`hierarchy.ClassHierarchy.flag_readers`).

Deleting ``accept_output_buffer = True`` is safe only if no read in the run can see the difference: on
vLLM >= 0.20 the base class no longer declares the flag, so a read of the class (or of a subclass, or of
an instance) returns True before and raises ``AttributeError`` after. A read is any access to the name:
``X.accept_output_buffer``, ``getattr(X, "accept_output_buffer", ...)``, ``hasattr``. (A string naming it anywhere
else reads nothing by itself: only reflection makes a member of a string, and the run accounts for reflection where
it happens, `occurrences`: ``vars(X)["accept_output_buffer"]`` reads through ``vars(X)``.) Each records what its
receiver can be: a class (``X``, ``X()``, ``mod.X``), any subclass of the class whose method holds it
(``self``, ``cls``, ``type(self)``, ``super()``), or anything (every other receiver: a parameter, an
attribute of an object, a call's result). The hierarchy decides what a resolved name is: a name that is
no class of the run but belongs to one of its modules (a variable holding a class) may be any class.
Stdlib ``ast``, plain picklable data.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import NamedTuple

from vllm_attn_compat.codemods.index import children
from vllm_attn_compat.codemods.index.names import FLAG as FLAG
from vllm_attn_compat.codemods.index.names import FLAG_BYTES as FLAG_BYTES


class FlagRead(NamedTuple):
    line: int
    target: str | None  # dotted name the receiver resolves to; None: it may be any class
    kind: str  # "class" (`X`), "instance" (`X()`), "subclass" (`self`: the class or any subclass), "any"
    text: str  # how the read looks, for messages


# Resolves a name or dotted attribute to the dotted name it is bound to by an import or a definition of
# the module; None for anything else (`hierarchy._Indexer.resolve_bound` with the module's scope).
Resolve = Callable[[ast.expr], "str | None"]

_TEXT_LIMIT = 60


def _text(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= _TEXT_LIMIT else text[: _TEXT_LIMIT - 3] + "..."


class _Reads:
    def __init__(self, module: str, resolve: Resolve) -> None:
        self.module = module
        self.resolve = resolve
        self.found: list[FlagRead] = []

    def visit(self, node: ast.AST, classes: list[str], receivers: dict[str, str]) -> None:
        """``classes``: qualnames of the enclosing class bodies; ``receivers``: self/cls parameter -> class."""
        if isinstance(node, ast.ClassDef):
            for child in (*node.decorator_list, *node.bases, *node.keywords):
                self.visit(child, classes, receivers)
            qualname = ".".join([*classes, node.name]) if classes else node.name
            for statement in node.body:
                self._statement_in_class(statement, [*classes, node.name], qualname, receivers)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = dict(receivers)
            arguments = node.args
            for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
                inner.pop(argument.arg, None)  # a parameter shadows an enclosing method's self
            self._children(node, classes, inner)
            return
        self._read(node, receivers)
        self._children(node, classes, receivers)

    def _statement_in_class(
        self, statement: ast.stmt, classes: list[str], qualname: str, receivers: dict[str, str]
    ) -> None:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in statement.decorator_list)
            positional = [*statement.args.posonlyargs, *statement.args.args]
            inner = dict(receivers)
            for argument in (*positional, *statement.args.kwonlyargs):
                inner.pop(argument.arg, None)
            if positional and not static:
                inner[positional[0].arg] = f"{self.module}.{qualname}"
            for default in (*statement.decorator_list, *statement.args.defaults, *statement.args.kw_defaults):
                if default is not None:
                    self.visit(default, classes, receivers)
            for child in statement.body:
                self.visit(child, classes, inner)
            return
        self.visit(statement, classes, receivers)

    def _children(self, node: ast.AST, classes: list[str], receivers: dict[str, str]) -> None:
        for child in children.child_nodes(node):
            self.visit(child, classes, receivers)

    def _read(self, node: ast.AST, receivers: dict[str, str]) -> None:
        if isinstance(node, ast.Attribute) and node.attr == FLAG and isinstance(node.ctx, ast.Load):
            self._add(node, node.value, receivers)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == FLAG
        ):
            self._add(node, node.args[0], receivers)

    def _add(self, read: ast.expr, receiver: ast.expr, receivers: dict[str, str]) -> None:
        target, kind = self._receiver(receiver, receivers)
        self.found.append(FlagRead(read.lineno, target, kind, _text(read)))

    def _receiver(self, receiver: ast.expr, receivers: dict[str, str]) -> tuple[str | None, str]:
        """What the receiver resolves to, and its kind (`FlagRead`)."""
        if isinstance(receiver, ast.Name) and receiver.id in receivers:
            return receivers[receiver.id], "subclass"
        if isinstance(receiver, ast.Attribute) and receiver.attr == "__class__":
            return self._receiver(receiver.value, receivers)
        if isinstance(receiver, ast.Call) and not receiver.keywords:
            func = receiver.func
            if isinstance(func, ast.Name) and func.id == "type" and len(receiver.args) == 1:
                return self._receiver(receiver.args[0], receivers)
            if isinstance(func, ast.Name) and func.id == "super" and not receiver.args:
                enclosing = list(receivers.values())  # the innermost method's class is the last one added
                return (enclosing[-1], "subclass") if enclosing else (None, "any")
            if isinstance(func, (ast.Name, ast.Attribute)):  # an instance of a class: read through the class
                target = self.resolve(func)
                return (target, "instance") if target else (None, "any")
            return None, "any"
        if isinstance(receiver, (ast.Name, ast.Attribute)):
            target = self.resolve(receiver)
            return (target, "class") if target else (None, "any")
        return None, "any"


def index_flag_reads(tree: ast.Module, module: str, resolve: Resolve) -> tuple[FlagRead, ...]:
    """Every read of ``accept_output_buffer`` in ``tree`` (call it only where the source holds the name)."""
    reads = _Reads(module, resolve)
    for statement in tree.body:
        reads.visit(statement, [], {})
    return tuple(reads.found)
