"""Small libcst predicates shared by the rules (rule modules import this lazily)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import libcst as cst

from vllm_attn_compat.codemods.engine.walk import walk
from vllm_attn_compat.codemods.index.names import ALLOCATORS as ALLOCATORS  # for the rules, which see the engine
from vllm_attn_compat.codemods.index.occurrences import is_op_list_name as is_op_list_name  # (VAC006: likewise)


def is_name(node: cst.CSTNode | None, value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value


def none_test(node: cst.BaseExpression, name: str = "output") -> str | None:
    """``"is"`` for ``<name> is None``, ``"is not"`` for ``<name> is not None``, else None."""
    if not isinstance(node, cst.Comparison) or len(node.comparisons) != 1:
        return None
    target = node.comparisons[0]
    if not (is_name(node.left, name) and is_name(target.comparator, "None")):
        return None
    if isinstance(target.operator, cst.Is):
        return "is"
    if isinstance(target.operator, cst.IsNot):
        return "is not"
    return None


def _nothing(node: cst.CSTNode) -> None:
    pass


def contains_none_test(node: cst.CSTNode, name: str = "output") -> bool:
    found = False

    def visit(child: cst.CSTNode) -> bool:
        nonlocal found
        found = found or (isinstance(child, cst.Comparison) and none_test(child, name) is not None)
        return not found

    walk(node, visit, _nothing)
    return found


def _binds(target: cst.CSTNode, name: str) -> bool:
    if is_name(target, name):
        return True
    if isinstance(target, (cst.Tuple, cst.List)):
        return any(_binds(element.value, name) for element in target.elements)
    if isinstance(target, cst.StarredElement):
        return _binds(target.value, name)
    if isinstance(target, (cst.MatchAs, cst.MatchStar)):
        return is_name(target.name, name)
    return False


def rebinds(function: cst.FunctionDef | cst.Lambda, name: str, *, ignore: tuple[cst.CSTNode, ...] = ()) -> bool:
    """True when the body of ``function`` assigns ``name`` outside the ``ignore`` nodes (nested
    functions and classes are other scopes)."""
    return _assigns(function.body, name, ignore)


def _assigns(root: cst.CSTNode, name: str, ignore: tuple[cst.CSTNode, ...]) -> bool:
    found = False

    def visit(node: cst.CSTNode) -> bool:
        nonlocal found
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) or any(node is n for n in ignore):
            return False
        found = found or any(_binds(target, name) for target in _targets(node))
        return not found

    walk(root, visit, _nothing)
    return found


def rebinds_before(path: Sequence[cst.CSTNode], name: str, *, ignore: tuple[cst.CSTNode, ...] = ()) -> bool:
    """Whether an assignment to ``name`` (outside ``ignore``) may run before ``path[-1]``.

    ``path`` goes from a function down to one of its statements, each node the parent of the next.
    What may run first: the statements before each node of the path in its block, a loop's whole
    body (the next iteration comes back), the test of an ``if`` but not its other branch, the ``try``
    body before a handler but not the other handlers.
    """
    for parent, child in itertools.pairwise(path):
        if isinstance(parent, cst.For) and _binds(parent.target, name):
            return True
        if any(_assigns(earlier, name, ignore) for earlier in _runs_before(parent, child)):
            return True
    return False


def _runs_before(parent: cst.CSTNode, child: cst.CSTNode) -> list[cst.CSTNode]:
    if isinstance(parent, cst.FunctionDef):
        return []  # the parameters are what `name` is at the start
    if isinstance(parent, (cst.For, cst.While)):
        header = [parent.iter] if isinstance(parent, cst.For) else [parent.test]
        return [*header, parent.body]  # in the body: earlier iterations ran all of it
    if isinstance(parent, cst.If):
        return [parent.test]  # the other branch never runs before this one
    if isinstance(parent, (cst.Try, cst.TryStar)):
        if child is parent.body:
            return []
        if child is parent.finalbody:
            return [parent.body, *parent.handlers, *([parent.orelse] if parent.orelse else [])]
        return [parent.body]  # a handler or the else: after the body, never after another handler
    if isinstance(parent, cst.Match):
        return [parent.subject]
    earlier = []
    for node in parent.children:
        if node is child:
            break
        earlier.append(node)
    return earlier


def _targets(node: cst.CSTNode) -> list[cst.CSTNode]:
    if isinstance(node, cst.Assign):
        return [t.target for t in node.targets]
    if isinstance(node, (cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor, cst.NamedExpr, cst.Del)):
        return [node.target]
    if isinstance(node, cst.AsName):
        return [node.name]
    if isinstance(node, (cst.MatchAs, cst.MatchStar)):
        return [node]
    return []


def is_docstring(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def rebinds_outside_none_guards(function: cst.FunctionDef | cst.Lambda, name: str) -> bool:
    """Like `rebinds`, but assignments under ``if <name> is None:`` do not count: they are the
    old fallbacks, not a local variable shadowing the parameter."""
    return rebinds(function, name, ignore=none_guards(function, name))


def none_guards(function: cst.FunctionDef | cst.Lambda, name: str) -> tuple[cst.If, ...]:
    """The ``if <name> is None:`` statements of ``function``'s own body, in the order they stand."""
    return tuple(
        statement
        for statement in compound_statements(function.body)
        if isinstance(statement, cst.If) and none_test(statement.test, name) == "is"
    )


# Where a compound statement, or a clause of one (`else`, `finally`, `except`, `case`), keeps its statements
# and clauses, in the order they stand (an `elif` is the `If` in `orelse`).
_CLAUSES = ("body", "handlers", "orelse", "finalbody", "cases")
_CLAUSE_TYPES = (cst.Else, cst.Finally, cst.ExceptHandler, cst.ExceptStarHandler, cst.MatchCase)


def compound_statements(block: cst.CSTNode) -> Iterator[cst.BaseCompoundStatement]:
    """The compound statements (``if``, ``for``, ``try`` ...) of ``block`` and of the blocks they hold, in the
    order they stand; not those of the functions and classes defined in it (other scopes). Only statements
    are read, never their expressions, which hold none: a fraction of a walk of every node."""
    pending: list[cst.CSTNode] = [block]
    while pending:
        node = pending.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(node, (cst.IndentedBlock, cst.SimpleStatementSuite)):
            pending.extend(reversed(node.body))
        elif isinstance(node, (cst.BaseCompoundStatement, *_CLAUSE_TYPES)):
            if isinstance(node, cst.BaseCompoundStatement):
                yield node
            held: list[cst.CSTNode] = []
            for clause in _CLAUSES:
                value = getattr(node, clause, None)
                if isinstance(value, (list, tuple)):
                    held += value
                elif value is not None:
                    held.append(value)
            pending.extend(reversed(held))
