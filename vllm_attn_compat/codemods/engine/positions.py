"""Line and column of a few nodes, as ``libcst.metadata.PositionProvider`` gives them, for less.

The provider renders the module and, on every token, splits it on newlines to track the line and
column, then stores a ``CodeRange`` object for every node. Findings need the positions of a handful
of nodes. :func:`positions` renders once recording only where each node starts and ends as token
counts (an integer per node), and turns the few positions asked for into lines and columns from the
rendered text afterwards. Same rules as the provider: the syntactic span (``record_syntactic_position``,
leading lines and indentation left out) where a node declares one, else the whole rendering.

Given the `ast` tree of the source, it renders less: only the statements of the module or of a class
body that hold the nodes (a backend's ``forward``, not the whole file), each from the line where it
starts, which the tree gives (its first line, less its leading blank and comment lines).
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import libcst as cst
from libcst._nodes.internal import CodegenState  # the base the provider's own states derive from

from vllm_attn_compat.codemods.engine.statements import first_line

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


def positions(
    module: cst.Module,
    nodes: Iterable[cst.CSTNode],
    *,
    parents: Mapping[int, cst.CSTNode] | None = None,
    tree: ast.Module | None = None,
    source: bytes | None = None,
) -> dict[int, Span]:
    """``id(node) -> Span`` for each of ``nodes`` (which must belong to ``module``).

    The rendering stops after the last of them: a finding near the top of a long file costs little.
    Given the ``parents`` of the nodes (``id(node) -> parent``, as the walk recorded them), the ``ast``
    ``tree`` of the ``source`` libcst parsed (or of a source with the same statements at module and class
    level: `spans` keeps them), only the statements of the module or of a class holding the nodes are
    rendered, each from its own first line (see `_by_statement`).
    """
    nodes = list(nodes)
    if parents is not None and tree is not None and source is not None and nodes:
        found = _by_statement(module, nodes, parents, tree, source)
        if found is not None:
            return found
    return _placed(module, nodes, module, (), 1)[0]


def _line_starts(text: str) -> list[int]:
    """The offset at which each line of ``text`` starts (the provider's line breaks)."""
    return [0, *(match.end() for match in _NEWLINE.finditer(text))]


def _placed(
    module: cst.Module, nodes: list[cst.CSTNode], rendered: cst.CSTNode, indents: tuple[str, ...], start_line: int
) -> tuple[dict[int, Span], str]:
    """The spans of ``nodes``, all inside ``rendered``, whose rendering starts at line ``start_line`` and
    column 0 under the ``indents`` of the blocks around it; and that rendering, up to the last of them."""
    state = _SpanState(default_indent=module.default_indent, default_newline=module.default_newline)
    state.indent_tokens = list(indents)
    state.missing = {id(node) for node in nodes}
    try:
        if state.missing:
            rendered._codegen(state)
    except _AllPlaced:
        pass
    tokens = state.tokens
    text = "".join(tokens)
    offsets = [0, *accumulate(map(len, tokens))]  # token count -> characters rendered before it
    line_starts = _line_starts(text)

    def place(token_count: int) -> tuple[int, int]:
        offset = offsets[token_count]
        line = bisect.bisect_right(line_starts, offset) - 1
        return line + start_line, offset - line_starts[line]

    found = {}
    for node in nodes:
        # A node its parent does not render has no position, as with the provider: libcst 1.5.0 (which the package
        # allows) renders no whitespace around the `if` of a `case` without a guard, which later releases do.
        span = state.spans.get(id(node))
        if span is not None:
            found[id(node)] = Span(*place(span[0]), *place(span[1]))
    return found, text


@dataclass
class _Anchor:
    """A statement of the module or of a class body, the nodes asked for inside it, where its rendering
    starts and the indentation of the blocks around it."""

    statement: cst.BaseStatement
    start_line: int
    indents: tuple[str, ...]
    nodes: list[cst.CSTNode] = field(default_factory=list)


def _by_statement(
    module: cst.Module,
    nodes: list[cst.CSTNode],
    parents: Mapping[int, cst.CSTNode],
    tree: ast.Module,
    source: bytes,
) -> dict[int, Span] | None:
    """The spans of ``nodes`` from a rendering of the statements holding them alone, or None where one
    of them is outside every statement (the module's header or footer) or a statement's place is not
    certain. A statement's rendering starts on its first line (`ast` gives it, decorators included) less
    its leading blank and comment lines, at column 0. (A guard besides: each rendering must be the
    source's text at that place.)"""
    anchors: dict[int, _Anchor] = {}
    blocks: dict[int, list[ast.stmt] | None] = {}  # id(libcst block body) -> its ast statements, one for one
    for node in nodes:
        anchor = _anchor(node, module, parents, tree, blocks)
        if anchor is None:
            return None
        anchors.setdefault(id(anchor.statement), anchor).nodes.append(node)
    text = source.decode(module.encoding)
    line_starts = _line_starts(text)
    found: dict[int, Span] = {}
    for anchor in anchors.values():
        if not 0 < anchor.start_line <= len(line_starts):
            return None
        spans, rendered = _placed(module, anchor.nodes, anchor.statement, anchor.indents, anchor.start_line)
        if not rendered or not text.startswith(rendered, line_starts[anchor.start_line - 1]):
            return None  # nothing rendered to check (a node of empty text first): not certain
        found.update(spans)
    return found


def _anchor(
    node: cst.CSTNode,
    module: cst.Module,
    parents: Mapping[int, cst.CSTNode],
    tree: ast.Module,
    blocks: dict[int, list[ast.stmt] | None],
) -> _Anchor | None:
    """The innermost statement of the module or of a class body (classes nested in classes) holding
    ``node``."""
    chain = [node]
    while chain[-1] is not module:
        parent = parents.get(id(chain[-1]))
        if parent is None:
            return None
        chain.append(parent)
    chain.reverse()  # the module, ..., node
    body: Sequence[cst.BaseStatement] = module.body
    statements: list[ast.stmt] = tree.body
    indents: tuple[str, ...] = ()
    found = None
    at = 1
    while at < len(chain):
        pair = _matching(body, statements, chain[at], blocks)
        if pair is None:
            break
        statement, matched = pair
        decorators: Sequence[cst.Decorator] = getattr(statement, "decorators", ())
        if decorators and not _on_its_line(decorators[0]):
            return None
        # Every statement has leading lines (blank and comment lines before it), one line each.
        leading: Sequence[cst.EmptyLine] = getattr(statement, "leading_lines", ())
        found = _Anchor(statement, first_line(matched) - len(leading), indents)
        block = getattr(statement, "body", None)
        if not (
            type(statement) is cst.ClassDef
            and isinstance(matched, ast.ClassDef)
            and type(block) is cst.IndentedBlock
            and at + 2 < len(chain)
            and chain[at + 1] is block
        ):
            break
        indents = (*indents, module.default_indent if block.indent is None else block.indent)
        body, statements = block.body, matched.body
        at += 2
    return found


def _matching(
    body: Sequence[cst.BaseStatement],
    statements: list[ast.stmt],
    statement: cst.CSTNode,
    blocks: dict[int, list[ast.stmt] | None],
) -> tuple[cst.BaseStatement, ast.stmt] | None:
    """``statement``, one of the libcst ``body``, and its `ast` statement, one of ``statements`` (the same
    block as `ast` parsed it: a line of small statements, ``a = 1; b = 2``, is one libcst statement and
    several `ast` ones); None where ``statement`` is not in ``body`` or the two blocks do not pair up."""
    if id(body) not in blocks:
        counts = [len(line.body) if type(line) is cst.SimpleStatementLine else 1 for line in body]
        starts = [0, *accumulate(counts)]
        pairs = sum(counts) == len(statements)
        blocks[id(body)] = [statements[starts[index]] for index in range(len(body))] if pairs else None
    paired = blocks[id(body)]
    if paired is None:
        return None
    for index, candidate in enumerate(body):
        if candidate is statement:
            return candidate, paired[index]
    return None


def _on_its_line(decorator: cst.Decorator) -> bool:
    """Whether the decorator's ``@`` is on the line `ast` gives it, its expression's first token's: not
    after ``@ \\`` or ``@(``, where the expression starts on a later line. Certain for a chain of names,
    attributes, calls and subscripts without brackets around its parts (every decorator in practice)."""
    if "\\" in decorator.whitespace_after_at.value:
        return False
    expression: cst.BaseExpression = decorator.decorator
    while True:
        if getattr(expression, "lpar", ()):
            return False
        if isinstance(expression, (cst.Attribute, cst.Subscript)):
            expression = expression.value
        elif isinstance(expression, cst.Call):
            expression = expression.func
        else:
            return isinstance(expression, cst.Name)
