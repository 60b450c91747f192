"""A read-only traversal of a libcst tree, in libcst's own visiting order, several times faster.

``module.visit(visitor)`` rebuilds every node it passes, even for a visitor that changes nothing
(libcst's ``_visit_and_replace_children`` constructs a new node per node): on a backend file that is
more than a parse costs. Analysis only needs to see the nodes, so :func:`walk` reads the children
straight from their fields. The field order is learnt from libcst itself, once per node type, by
recording the ``on_visit_attribute`` calls of a one-level visit (public visitor API), so the order is
libcst's by construction rather than by a table that could drift from it.

Two node types visit a field only when it is set (``format_spec`` of f- and t-string expressions): a
type whose first instance left unset, and unvisited, a field that can hold nodes is learnt again per
instance (an unset ``Optional[str]`` such as ``Newline.value`` does not count).
"""

from __future__ import annotations

import typing
from collections.abc import Callable

import libcst as cst

Visit = Callable[[cst.CSTNode], bool]
Leave = Callable[[cst.CSTNode], None]


class _FieldRecorder(cst.CSTVisitor):
    """Records which fields of ``node`` libcst visits, in order, without descending further."""

    def __init__(self, node: cst.CSTNode) -> None:
        super().__init__()
        self.node = node
        self.fields: dict[str, None] = {}

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node is self.node

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if node is self.node:
            self.fields[attribute] = None


# Node type -> its child fields in visiting order; None for types learnt per instance.
_FIELDS: dict[type, tuple[str, ...] | None] = {}
# Types of field values that are no node (str, None, MaybeSentinel, ...): ``isinstance`` against
# libcst's abstract node classes goes through ``ABCMeta`` and costs more than the rest of the walk.
_LEAVES: set[type] = {str, bool, int, type(None), tuple, list}


def _record(node: cst.CSTNode) -> tuple[str, ...]:
    recorder = _FieldRecorder(node)
    node.visit(recorder)
    return tuple(recorder.fields)


def _may_hold_nodes(annotation: object) -> bool:
    """Whether a field annotated so can hold nodes (``Optional[str]`` cannot; unknown forms may)."""
    if isinstance(annotation, type):
        return issubclass(annotation, cst.CSTNode)
    arguments = typing.get_args(annotation)
    if not arguments:
        return True  # a forward reference, a bare generic: cannot tell, so assume it can
    if typing.get_origin(annotation) is typing.Literal:
        return False
    return any(_may_hold_nodes(argument) for argument in arguments)


def _learn(node: cst.CSTNode) -> tuple[str, ...]:
    fields = _record(node)
    # A field that could hold nodes, left out while unset on this instance, may be visited on another:
    # such a type is learnt per instance.
    unset_unvisited = any(
        name not in fields and getattr(node, name) is None and _may_hold_nodes(field.type)
        for name, field in node.__dataclass_fields__.items()
    )
    _FIELDS[type(node)] = None if unset_unvisited else fields
    return fields


def child_fields(node: cst.CSTNode) -> tuple[str, ...]:
    """The names of ``node``'s fields that libcst visits, in the order it visits them."""
    try:
        fields = _FIELDS[type(node)]
    except KeyError:
        return _learn(node)
    return _record(node) if fields is None else fields


def _is_node(value: object) -> bool:
    kind = type(value)
    if kind in _FIELDS:
        return True
    if kind in _LEAVES:
        return False
    if isinstance(value, cst.CSTNode):
        return True
    _LEAVES.add(kind)
    return False


# Leaves that hold no code, no comment and nothing a rule or a scope looks at: half the nodes of a file.
TRIVIA: frozenset[type] = frozenset({cst.SimpleWhitespace, cst.Newline})


def walk(node: cst.CSTNode, on_visit: Visit, on_leave: Leave, skip: frozenset[type] = frozenset()) -> None:
    """Call ``on_visit`` on each node of the tree in libcst's order (children are skipped when it returns
    false) and ``on_leave`` after a node's children, as ``CSTVisitor.on_visit``/``on_leave`` would be;
    nodes of the types in ``skip`` (leaves such as `TRIVIA`) are passed over."""
    if on_visit(node):
        for name in child_fields(node):
            value = getattr(node, name)
            if type(value) is tuple or type(value) is list:
                for item in value:
                    if type(item) not in skip and _is_node(item):
                        walk(item, on_visit, on_leave, skip)
            elif type(value) not in skip and _is_node(value):
                walk(value, on_visit, on_leave, skip)
    on_leave(node)
