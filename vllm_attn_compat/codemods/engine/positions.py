"""Line and column of a few nodes, as ``libcst.metadata.PositionProvider`` gives them, for less.

The provider renders the module and, on every token, splits it on newlines to track the line and
column, then stores a ``CodeRange`` object for every node. Findings need the positions of a handful
of nodes. :func:`positions` renders once recording only where each node starts and ends as token
counts (an integer per node), and turns the few positions asked for into lines and columns from the
rendered text afterwards. Same rules as the provider: the syntactic span (``record_syntactic_position``,
leading lines and indentation left out) where a node declares one, else the whole rendering.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate

import libcst as cst
from libcst._nodes.internal import CodegenState  # the base the provider's own states derive from

_NEWLINE = re.compile(r"\r\n?|\n")  # the provider's definition of a line break


@dataclass(frozen=True)
class Span:
    """1-based lines, 0-based columns (the provider's convention); ``end`` is exclusive."""

    start_line: int
    start_column: int
    end_line: int
    end_column: int


class _AllPlaced(Exception):
    """Every node asked for has its span: the rest of the module need not be rendered."""


@dataclass(frozen=False)
class _SpanState(CodegenState):
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # id(node) -> token counts
    missing: set[int] = field(default_factory=set)  # id() of the nodes asked for and not rendered yet
    _starts: list[int] = field(default_factory=list)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append(len(self.tokens))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._starts.pop()
        key = id(node)
        self.spans.setdefault(key, (start, len(self.tokens)))  # a syntactic span, set inside, wins
        if key in self.missing:
            self.missing.remove(key)
            if not self.missing:
                raise _AllPlaced

    def pop_trailing_newline(self) -> None:
        # The rendering drops a file's missing final newline here; the provider's positions count it.
        pass

    # A plain context manager in place of libcst's generator-based one (see _SyntacticSpan); its callers
    # only enter and leave it.
    def record_syntactic_position(  # type: ignore[override]  # the narrower return type, as said above
        self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None, end_node: cst.CSTNode | None = None
    ) -> _SyntacticSpan:
        return _SyntacticSpan(self, node, start_node, end_node)


class _SyntacticSpan:
    """The provider's ``record_syntactic_position``, as a plain context manager (a generator-based one
    costs more than the rest of the rendering's bookkeeping)."""

    __slots__ = ("end_node", "node", "start", "start_node", "state")

    def __init__(
        self, state: _SpanState, node: cst.CSTNode, start_node: cst.CSTNode | None, end_node: cst.CSTNode | None
    ) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = len(self.state.tokens)

    def __exit__(self, error_type: object, *exc_info: object) -> None:
        if error_type is not None:  # the rendering stops (_AllPlaced): the end node may never come
            return
        spans = self.state.spans
        start = spans[id(self.start_node)][0] if self.start_node is not None else self.start
        end = spans[id(self.end_node)][1] if self.end_node is not None else len(self.state.tokens)
        spans[id(self.node)] = (start, end)


def positions(module: cst.Module, nodes: Iterable[cst.CSTNode]) -> dict[int, Span]:
    """``id(node) -> Span`` for each of ``nodes`` (which must belong to ``module``).

    The rendering stops after the last of them: a finding near the top of a long file costs little.
    """
    nodes = list(nodes)
    state = _SpanState(default_indent=module.default_indent, default_newline=module.default_newline)
    state.missing = {id(node) for node in nodes}
    try:
        if state.missing:
            module._codegen(state)
    except _AllPlaced:
        pass
    tokens = state.tokens
    text = "".join(tokens)
    offsets = [0, *accumulate(map(len, tokens))]  # token count -> characters rendered before it
    line_starts = [0, *(match.end() for match in _NEWLINE.finditer(text))]

    def place(token_count: int) -> tuple[int, int]:
        offset = offsets[token_count]
        line = bisect.bisect_right(line_starts, offset) - 1
        return line + 1, offset - line_starts[line]

    found = {}
    for node in nodes:
        start, end = state.spans[id(node)]
        found[id(node)] = Span(*place(start), *place(end))
    return found
