"""Per ``ast`` node type, the fields a walk of the index follows: those that can hold child nodes.

Python's grammar types the other fields as identifiers, numbers, constants, contexts or operators; they are
known by name, not by a value seen once (an absent optional child is None too). The contexts and operators
are nodes (``Load()``, ``Add()``) that hold nothing an index looks for, so no walk stacks them. A field
followed may still hold something else (a constant's value, a list of strings): a walk tests what it stacks.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator

_LEAF_FIELDS = frozenset(
    {
        "ctx",
        "op",
        "ops",
        "id",
        "attr",
        "name",
        "names",
        "arg",
        "asname",
        "module",
        "level",
        "kind",
        "type_comment",
        "conversion",
        "is_async",
        "simple",
        "tag",
        "n",
        "s",
    }
)


class _ChildFields(dict[type, tuple[str, ...]]):
    """Per type, the fields to walk: none for what is no node (a string of a list, None) and for nodes without
    children (names, constants)."""

    def __missing__(self, kind: type) -> tuple[str, ...]:
        fields = self[kind] = (
            tuple(name for name in kind._fields if name not in _LEAF_FIELDS) if issubclass(kind, ast.AST) else ()
        )
        return fields


CHILDREN = _ChildFields()

# Where statements nest, by statement type, in the order ``ast.NodeVisitor`` would reach them (a walk of statements
# alone: the class hierarchy's, a function's bindings).
STATEMENT_BODIES: dict[type, tuple[str, ...]] = {
    ast.If: ("body", "orelse"),
    ast.For: ("body", "orelse"),
    ast.AsyncFor: ("body", "orelse"),
    ast.While: ("body", "orelse"),
    ast.With: ("body",),
    ast.AsyncWith: ("body",),
    ast.Try: ("body", "handlers", "orelse", "finalbody"),
    ast.ExceptHandler: ("body",),
}
if hasattr(ast, "TryStar"):  # Python >= 3.11
    STATEMENT_BODIES[ast.TryStar] = ("body", "handlers", "orelse", "finalbody")
if hasattr(ast, "Match"):  # Python >= 3.10
    STATEMENT_BODIES[ast.Match] = ("cases",)
    STATEMENT_BODIES[ast.match_case] = ("body",)


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """`ast.iter_child_nodes`, in its order, without what `CHILDREN` leaves out."""
    found: list[ast.AST] = []
    for field in CHILDREN[type(node)]:
        value = getattr(node, field, None)
        if type(value) is list:
            found += [item for item in value if isinstance(item, ast.AST)]
        elif isinstance(value, ast.AST):
            found.append(value)
    return found


def walk(node: ast.AST) -> Iterator[ast.AST]:
    """`ast.walk` (breadth first, each node's children in field order), without what `CHILDREN` leaves out: a
    search that stops at the first match finds the same node."""
    pending = deque([node])
    while pending:
        node = pending.popleft()
        pending.extend(child_nodes(node))
        yield node


def push_children(node: object, stack: list[object]) -> None:
    """Stack what ``node``'s fields may hold (`CHILDREN`): not `child_nodes`, which tests each item of a list to be a
    node (a pattern's attribute names are strings, a dict's keys hold None for ``**d``); the loops that use this
    test what they pop anyway, and the test cost the walk a sixth of its time."""
    for field in CHILDREN[type(node)]:
        value = getattr(node, field, None)
        if type(value) is list:
            stack.extend(value)
        elif isinstance(value, ast.AST):
            stack.append(value)
