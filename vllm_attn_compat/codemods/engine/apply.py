"""Carry out the accepted edits in one transformer pass, formatting removals as vLLM's
maintainers did by hand.

Removal formatting: the removed statement's leading lines (blank lines and comments) and any
comment inside it move to the next statement; a removal at the start of a block (or right
after the docstring) also takes the blank lines that followed it, so the block does not begin
with a blank line; elsewhere the blank runs on both sides merge into the longer one, never
into their sum. A block left empty gets ``pass``. ``libcst.RemoveFromParent`` would drop the
leading comments, which is why removals are done here at the block level.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import libcst as cst

from vllm_attn_compat.codemods.engine.edits import AddImport, Built, CommentSink, RemoveStatement, Replace
from vllm_attn_compat.codemods.engine.patterns import is_docstring
from vllm_attn_compat.codemods.engine.walk import walk

_Block: TypeAlias = cst.Module | cst.IndentedBlock


def _is_blank(line: cst.EmptyLine) -> bool:
    return line.comment is None


def _leading_blanks(lines: Sequence[cst.EmptyLine]) -> int:
    count = 0
    for line in lines:
        if not _is_blank(line):
            break
        count += 1
    return count


def _trailing_blanks(lines: Sequence[cst.EmptyLine]) -> int:
    return _leading_blanks(list(reversed(lines)))


def join_lines(
    before: Sequence[cst.EmptyLine], after: Sequence[cst.EmptyLine], *, at_start: bool
) -> list[cst.EmptyLine]:
    """Lines left where a removed statement stood: ``before`` were its own leading lines (and
    comments), ``after`` the next statement's."""
    if at_start:
        return [*before, *after[_leading_blanks(after) :]]
    a, b = _trailing_blanks(before), _leading_blanks(after)
    kept = before[len(before) - a :] if a > b else after[:b]
    return [*before[: len(before) - a], *kept, *after[b:]]


def inner_comments(node: cst.CSTNode) -> list[cst.Comment]:
    """Comments inside ``node`` (a statement's own leading lines excluded)."""
    if hasattr(node, "leading_lines"):
        node = node.with_changes(leading_lines=())
    comments: list[cst.Comment] = []

    def visit(child: cst.CSTNode) -> bool:
        if isinstance(child, cst.Comment):
            comments.append(child)
        return True

    walk(node, visit, lambda child: None)
    return comments


def comment_line(comment: cst.Comment) -> cst.EmptyLine:
    return cst.EmptyLine(indent=True, whitespace=cst.SimpleWhitespace(""), comment=comment)


class Applier(cst.CSTTransformer):
    """Carries out the edits in one pass. ``within`` (ids of the edited nodes and of every node above
    them) keeps the pass on the paths to the edits: libcst rebuilds every node it passes through."""

    def __init__(
        self, removals: Sequence[RemoveStatement], replacements: Sequence[Replace], within: set[int] | None = None
    ) -> None:
        super().__init__()
        self.within = within
        self.sink = CommentSink()
        self._removals = {id(edit.node): edit for edit in removals}
        self._replacements: dict[int, list[Replace]] = {}
        for edit in replacements:
            self._replacements.setdefault(id(edit.node), []).append(edit)
        # id(updated statement) -> (edit, statement); holding the statement keeps its id unique
        self._removed_lines: dict[int, tuple[RemoveStatement, cst.CSTNode]] = {}

    def on_visit(self, node: cst.CSTNode) -> bool:
        # A statement that goes entirely (dead code after a kept branch) is not edited inside first.
        if id(node) in self._removals or self._removes_line(node):
            return False
        return self.within is None or id(node) in self.within

    def _removes_line(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.SimpleStatementLine) and all(id(small) in self._removals for small in node.body)

    # libcst types on_leave as returning the class it was given; a Replace may build another one.
    def on_leave(  # type: ignore[override]  # any node is valid here, as said above
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        result: Built = updated_node
        removed = id(original_node) in self._removals or self._removes_line(original_node)
        for edit in () if removed else self._replacements.get(id(original_node), ()):
            result = edit.build(result, self.sink)
        if isinstance(result, cst.SimpleStatementLine):
            result = self._drop_small_statements(original_node, result)
        elif isinstance(result, cst.SimpleStatementSuite):
            result = self._drop_suite_statements(original_node, result)
        elif id(original_node) in self._removals and isinstance(result, cst.BaseCompoundStatement):
            self._removed_lines[id(result)] = (self._removals[id(original_node)], result)
        if isinstance(result, (cst.IndentedBlock, cst.Module)):
            result = self._remove_statements(result)
        return result

    def _removed_small(self, original: cst.CSTNode, count: int) -> list[RemoveStatement | None]:
        body = getattr(original, "body", ())
        if len(body) != count:  # a replacement changed the line; its small statements are new
            return [None] * count
        return [self._removals.get(id(small)) for small in body]

    def _drop_small_statements(self, original: cst.CSTNode, line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        marks = self._removed_small(original, len(line.body))
        if not any(marks):
            return line
        if all(marks):
            self._removed_lines[id(line)] = (next(m for m in marks if m), line)
            return line
        return line.with_changes(body=self._kept_small(line.body, marks))

    def _drop_suite_statements(
        self, original: cst.CSTNode, suite: cst.SimpleStatementSuite
    ) -> cst.SimpleStatementSuite:
        marks = self._removed_small(original, len(suite.body))
        if not any(marks):
            return suite
        kept = self._kept_small(suite.body, marks) or [cst.Pass()]
        return suite.with_changes(body=kept)

    def _kept_small(
        self, body: Sequence[cst.BaseSmallStatement], marks: Sequence[object]
    ) -> list[cst.BaseSmallStatement]:
        for small, mark in zip(body, marks, strict=True):
            if mark and getattr(mark, "drop_comment_block", False):
                self.sink.removed.extend(c.value for c in inner_comments(small))
        kept = [small for small, mark in zip(body, marks, strict=True) if not mark]
        if kept and marks[-1]:  # the old last statement went: the new last needs no ';'
            kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return kept

    def _lines_of_removed(self, statement: cst.BaseStatement, edit: RemoveStatement) -> list[cst.EmptyLine]:
        leading = list(leading_lines(statement))
        inner = inner_comments(statement)
        if edit.drop_comment_block:
            block = len(leading) - _trailing_comments(leading)
            self.sink.removed.extend(line.comment.value for line in leading[block:] if line.comment)
            self.sink.removed.extend(c.value for c in inner)
            return leading[:block]
        return [*leading, *(comment_line(c) for c in inner)]

    def _remove_statements(self, block: _Block) -> _Block:
        body = list(block.body)
        if not any(id(statement) in self._removed_lines or id(statement) in self.sink.after for statement in body):
            return block
        kept: list[cst.BaseStatement] = []
        carry: list[cst.EmptyLine] | None = None
        for index, statement in enumerate(body):
            at_start = not kept or (len(kept) == 1 and index > 0 and is_docstring(kept[0]) and kept[0] is body[0])
            entry = self._removed_lines.get(id(statement))
            edit = entry[0] if entry is not None and entry[1] is statement else None
            if edit is not None:
                lines = self._lines_of_removed(statement, edit)
                carry = lines if carry is None else join_lines(carry, lines, at_start=at_start)
                continue
            if carry is not None:
                statement = statement.with_changes(
                    leading_lines=join_lines(carry, leading_lines(statement), at_start=at_start)
                )
                carry = None
            kept.append(statement)
            placed = self.sink.after.get(id(body[index]))
            if placed is not None and placed[0] is body[index]:
                carry = list(placed[1])
        footer = list(block.footer)
        if carry is not None:
            comments = carry[_leading_blanks(carry) :]
            while comments and _is_blank(comments[-1]):
                comments.pop()
            if not kept and isinstance(block, cst.IndentedBlock):
                kept.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=comments))
            else:
                footer = [*comments, *footer]
        return block.with_changes(body=kept, footer=footer)


def leading_lines(statement: cst.BaseStatement) -> Sequence[cst.EmptyLine]:
    # Every statement class of libcst has them; BaseStatement does not declare them.
    assert isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)), type(statement)
    return statement.leading_lines


def _trailing_comments(lines: Sequence[cst.EmptyLine]) -> int:
    count = 0
    for line in reversed(lines):
        if line.comment is None:
            break
        count += 1
    return count


def add_imports(module: cst.Module, imports: Sequence[AddImport]) -> cst.Module:
    """``import x`` for each module not imported yet, after the leading docstring and imports."""
    present: set[str] = set()
    for statement in module.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Import):
                    present.update(module.code_for_node(alias.name) for alias in small.names if not alias.asname)
    wanted = [edit.module for edit in imports if edit.module not in present]
    wanted = list(dict.fromkeys(wanted))
    if not wanted:
        return module
    body = list(module.body)
    position = 0
    for index, statement in enumerate(body):
        if index == 0 and is_docstring(statement):
            position = 1
        elif isinstance(statement, cst.SimpleStatementLine) and all(
            isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
        ):
            position = index + 1
        else:
            break
    new = [
        cst.SimpleStatementLine(body=[cst.Import(names=[cst.ImportAlias(name=module_name(name))])]) for name in wanted
    ]
    return module.with_changes(body=[*body[:position], *new, *body[position:]])


def module_name(name: str) -> cst.Attribute | cst.Name:
    """The node of a dotted module name, as an import statement holds it."""
    expression = cst.parse_expression(name)
    if not isinstance(expression, (cst.Attribute, cst.Name)):
        raise ValueError(f"AddImport: expected a dotted module name, found {name!r}")
    return expression
