"""Per ``ast`` node type, the fields a walk of the index follows: those that can hold child nodes.

Python's grammar types the other fields as identifiers, numbers, constants, contexts or operators; they are
known by name, not by a value seen once (an absent optional child is None too). The contexts and operators
are nodes (``Load()``, ``Add()``) that hold nothing an index looks for, so no walk stacks them. A field
followed may still hold something else (a constant's value, a list of strings): a walk tests what it stacks.
"""

from __future__ import annotations

import ast

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
