"""The edits a rule attaches to a finding. Plain data, free of libcst at import time, so rule
modules can import it at the top; `apply` carries them out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import libcst as cst


@dataclass(frozen=True)
class RemoveStatement:
    """Delete a statement (or one small statement of a ``a; b`` line), keeping the comments
    around it unless ``drop_comment_block``: then the comment block directly above it and its
    own trailing comment go too (they documented what is removed)."""

    node: cst.CSTNode
    drop_comment_block: bool = False


@dataclass
class CommentSink:
    """Collects the text of comments an edit deliberately removes, and lines an edit wants placed after
    a statement it returns (a replaced block's closing comments, which no returned node can carry)."""

    removed: list[str] = field(default_factory=list)
    # id(statement) -> (statement, lines); holding the statement keeps its id unique
    after: dict[int, tuple[object, list[cst.EmptyLine]]] = field(default_factory=dict)

    def place_after(self, statement: object, lines: list[cst.EmptyLine]) -> None:
        """Put ``lines`` (``libcst.EmptyLine``) after ``statement``, before whatever follows it."""
        self.after[id(statement)] = (statement, lines)


# What a Replace builds: a node, or statements in place of one (a FlattenSentinel).
Built: TypeAlias = "cst.CSTNode | cst.FlattenSentinel[cst.CSTNode]"


@dataclass(frozen=True)
class Replace:
    """Replace ``node`` by ``build(updated_node, sink)`` (the updated node already carries the
    edits made inside it, so nested fixes compose)."""

    node: cst.CSTNode
    # Given the updated node, or what an earlier Replace of the same node built. Each builder takes the
    # node class of its own rule, which no parameter type common to all builders can name: hence Any.
    build: Callable[[Any, CommentSink], Built]


@dataclass(frozen=True)
class AddImport:
    """Add ``import <module>`` after the module's top imports, unless already imported, or unless
    nothing refers to ``<module>.`` once every edit of the file is made (another fix may delete the
    code this import was for)."""

    module: str


@dataclass(frozen=True)
class DropUnusedImport:
    """Once every edit of the file is made, take ``name`` (as the file binds it) out of
    ``from <module> import ...`` lines if nothing in the file uses it any more (the fixes replaced or
    deleted its uses)."""

    module: str
    name: str


Edit: TypeAlias = RemoveStatement | Replace | AddImport | DropUnusedImport
