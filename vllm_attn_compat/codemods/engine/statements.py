"""One `ast` parse of a source for the steps of a file's migration that read its statements.

`spans.reduce` reads the statements of the file it is given; the write-time checks (`safety`) read those
of the original and of the rewritten file, and then migrate the rewritten file again (its `spans.reduce`
reads them once more). The same bytes come back, so the last few trees are kept. The helpers below read a
statement's lines and the blocks it nests, for both.
"""

from __future__ import annotations

import ast
import collections
import warnings
from collections.abc import Iterator

_RECENT = 4  # trees kept of the last sources parsed

_recent: collections.OrderedDict[bytes, ast.Module] = collections.OrderedDict()


def parse(source: bytes) -> ast.Module:
    """``ast.parse(source)``, warnings silenced (e.g. SyntaxWarning for an invalid escape: not ours to
    report). Raises SyntaxError, or ValueError (null bytes), as ``ast.parse`` does. Callers must not change
    the tree: it is shared."""
    tree = _recent.get(source)
    if tree is not None:
        _recent.move_to_end(source)
        return tree
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = ast.parse(source)
    _recent[source] = tree
    if len(_recent) > _RECENT:
        _recent.popitem(last=False)
    return tree


def cached(source: bytes) -> ast.Module | None:
    """The tree of ``source`` if one of the last few parses was of it (nothing is parsed here)."""
    return _recent.get(source)


# Where a compound statement keeps the statements it runs (handlers and match cases hold theirs in `body`).
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def first_line(statement: ast.stmt) -> int:
    """The statement's first line, 1-based: its first decorator's, if it has any."""
    decorators: list[ast.expr] = getattr(statement, "decorator_list", [])
    return decorators[0].lineno if decorators else statement.lineno


def last_line(statement: ast.stmt) -> int:
    return statement.end_lineno or statement.lineno


def sub_blocks(statement: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The blocks of statements ``statement`` nests (a function's or class's body, an ``if``'s branches, a
    ``try``'s handlers ...), each non-empty."""
    for name in _BLOCKS:
        children = getattr(statement, name, None) or []
        if name in ("handlers", "cases"):
            yield from (child.body for child in children)
        elif children:
            yield children
