"""Imports decided after every edit of a file: added only where the final code uses them, and names
dropped from import lines where it no longer does.

Rules attach import edits to their fixes, but a fix of one rule can delete the code another rule's
import was for (VAC005 deletes the old path that held VAC007's call). So the engine calls
:func:`finish_imports` on the edited module, and only then asks what the code still uses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import libcst as cst

from vllm_attn_compat.codemods.engine.apply import Applier, add_imports, inner_comments
from vllm_attn_compat.codemods.engine.edits import AddImport, DropUnusedImport, RemoveStatement
from vllm_attn_compat.codemods.engine.scope import as_name, dotted_name
from vllm_attn_compat.codemods.engine.walk import walk


@dataclass
class Uses:
    """What the code outside import statements refers to: names, dotted attribute chains and string
    constants (a name listed in ``__all__`` is used)."""

    names: set[str] = field(default_factory=set)
    dotted: set[str] = field(default_factory=set)
    strings: set[str] = field(default_factory=set)

    def uses_module(self, module: str) -> bool:
        prefix = module + "."
        return any(chain.startswith(prefix) for chain in self.dotted)

    def uses_name(self, name: str) -> bool:
        return name in self.names or name in self.strings


def uses(module: cst.Module) -> Uses:
    found = Uses()

    def visit(node: cst.CSTNode) -> bool:
        kind = type(node)  # exact types: isinstance on libcst's ABC-based classes is slow
        if kind in (cst.Import, cst.ImportFrom):
            return False
        if kind is cst.Name:
            found.names.add(cast(cst.Name, node).value)
        elif kind is cst.Attribute:
            chain = dotted_name(cast(cst.Attribute, node))
            if chain is not None:
                found.dotted.add(chain)
        elif kind is cst.SimpleString:
            value = cast(cst.SimpleString, node).evaluated_value
            if isinstance(value, str):
                found.strings.add(value)
        return True

    walk(module, visit, lambda node: None)
    return found


def finish_imports(
    module: cst.Module, edits: Sequence[AddImport | DropUnusedImport], *, is_package: bool
) -> tuple[cst.Module, list[str], set[int]]:
    """Carry out the import edits on the edited ``module``; returns the new module, the comments that
    went with dropped names, and the ids of the edits that changed something.

    In a package's ``__init__.py`` an import is an export: nothing is dropped there.
    """
    used = uses(module)
    done: set[int] = set()
    removed: list[str] = []
    drops = [edit for edit in edits if isinstance(edit, DropUnusedImport)]
    unused = {(edit.module, edit.name) for edit in drops if not is_package and not used.uses_name(edit.name)}
    if unused:
        module, removed, dropped = _drop_names(module, unused)
        done |= {id(edit) for edit in drops if (edit.module, edit.name) in dropped}
    wanted = [edit for edit in edits if isinstance(edit, AddImport) and used.uses_module(edit.module)]
    if wanted:
        before = module
        module = add_imports(module, wanted)
        if module is not before:
            done |= {id(edit) for edit in wanted}
    return module, removed, done


def _drop_names(module: cst.Module, unused: set[tuple[str, str]]) -> tuple[cst.Module, list[str], set[tuple[str, str]]]:
    """Take the ``(module, bound name)`` pairs of ``unused`` out of ``from ... import`` lines; a line
    left without names goes, its comments moving on as for any removed statement."""
    lines: dict[int, cst.SimpleStatementLine] = {}  # id(line) -> line rewritten without the names
    emptied: list[RemoveStatement] = []
    dropped: set[tuple[str, str]] = set()
    removed: list[str] = []

    def visit(node: cst.CSTNode) -> bool:
        if isinstance(node, cst.SimpleStatementLine):
            if len(node.body) == 1 and isinstance(node.body[0], cst.ImportFrom):
                _consider(node, node.body[0])
            return False
        return not isinstance(node, cst.BaseExpression)

    def _consider(line: cst.SimpleStatementLine, statement: cst.ImportFrom) -> None:
        if statement.relative or statement.module is None or isinstance(statement.names, cst.ImportStar):
            return
        source = dotted_name(statement.module)
        if source is None:  # not a dotted name: `unused` holds none of its names
            return
        names = list(statement.names)
        gone = [alias for alias in names if (source, _bound(alias)) in unused]
        if not gone:
            return
        dropped.update((source, _bound(alias)) for alias in gone)
        kept = [alias for alias in names if alias not in gone]
        if not kept:
            emptied.append(RemoveStatement(statement))
            return
        if names[-1] in gone:  # the new last name takes the old last one's comma (none, or a trailing one)
            kept[-1] = kept[-1].with_changes(comma=_without_comment(names[-1].comma))
        new_line = line.with_changes(body=[statement.with_changes(names=kept)])
        lost = Counter(c.value for c in inner_comments(line)) - Counter(c.value for c in inner_comments(new_line))
        removed.extend(lost.elements())
        lines[id(line)] = new_line

    walk(module, visit, lambda node: None)
    rewrite = _Rewrite(lines, emptied)
    module = module.visit(rewrite)
    return module, [*removed, *rewrite.sink.removed], dropped


def _without_comment(comma: cst.Comma | cst.MaybeSentinel) -> cst.Comma | cst.MaybeSentinel:
    """``comma`` without the comment after it: that comment stood by the name that goes."""
    if not isinstance(comma, cst.Comma):
        return comma
    after = comma.whitespace_after
    if isinstance(after, cst.ParenthesizedWhitespace) and after.first_line.comment is not None:
        first = after.first_line.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None)
        return comma.with_changes(whitespace_after=after.with_changes(first_line=first))
    return comma


def _bound(alias: cst.ImportAlias) -> str:
    bound = as_name(alias)
    if bound is not None:
        return bound
    return dotted_name(alias.name) or ""


class _Rewrite(Applier):
    """The lines that lose names, then the removals of those left empty, in one pass."""

    def __init__(self, lines: dict[int, cst.SimpleStatementLine], emptied: list[RemoveStatement]) -> None:
        super().__init__(emptied, [])
        self._lines = lines

    def on_leave(  # type: ignore[override]  # as Applier.on_leave
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        replaced = self._lines.get(id(original_node))
        return super().on_leave(original_node, replaced if replaced is not None else updated_node)
