"""Writing a module line by line, twice at once: the old text and the text its migration must give.

Each row holds an old line and its migrated form (the same, another text, or None when the migration
removes it). Comments are unique (``# c<N> ...``) and blank lines, some holding only spaces, can be drawn
before any statement, so a test can tell exactly which comment went where.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st

SAME = object()  # a row whose migrated text equals its old text

# Comment text: printable, one line, never a directive the tools or Python act on.
_FORBIDDEN_IN_COMMENTS = ("noqa", "coding", "type:", "fmt:")


@dataclass
class Row:
    old: str | None
    new: str | None


class SourceWriter:
    """Collects rows of (old, new) text and draws comments and blank lines between them."""

    def __init__(self, draw: Callable, unit: str, comment_alphabet: st.SearchStrategy[str]):
        self.draw = draw
        self.unit = unit
        self.rows: list[Row] = []
        self.comments: list[str] = []
        self.removable: set[str] = set()
        self.unsafe_removable: set[str] = set()
        self.suppressed = 0  # lines of in-scope old-API code with a noqa comment: each must yield a SUPPRESSED finding
        self._alphabet = comment_alphabet

    def comment(self) -> str:
        text = self.draw(
            st.text(self._alphabet, max_size=12).filter(
                lambda t: not any(word in t.lower() for word in _FORBIDDEN_IN_COMMENTS)
            )
        )
        comment = f"# c{len(self.comments)}" + (f" {text.strip()}" if text.strip() else "")
        self.comments.append(comment)
        return comment

    def indent(self, depth: int) -> str:
        return self.unit * depth

    def gap(self, depth: int, *, allow_blank: bool = True) -> list[str]:
        """Blank lines (some with trailing whitespace), then own-line comments; returns the comments."""
        if allow_blank:
            for _ in range(self.draw(st.integers(0, 2))):
                self.rows.append(Row(self.draw(st.sampled_from(["", " ", self.indent(depth)])), SAME))
        placed = []
        for _ in range(self.draw(st.integers(0, 2))):
            column = self.indent(self.draw(st.integers(0, depth))) if depth else ""
            comment = self.comment()
            placed.append(comment)
            self.rows.append(Row(column + comment, SAME))
        return placed

    def trailing(self) -> str:
        return f"  {self.comment()}" if self.draw(st.booleans()) else ""

    def line(self, depth: int, old: str, new: object = SAME, *, trailing: bool = True) -> str:
        """One physical line; ``new`` is SAME, None (removed) or the migrated text."""
        suffix = self.trailing() if trailing else ""
        text = self.indent(depth) + old + suffix
        if new is SAME:
            migrated: object = SAME
        elif new is None:
            migrated = None
        else:
            migrated = self.indent(depth) + str(new) + suffix
        self.rows.append(Row(text, migrated))  # type: ignore[arg-type]
        return suffix

    def statement(self, depth: int, old: str, new: object = SAME) -> None:
        self.gap(depth)
        self.line(depth, old, new)
