"""Which withholding uses a run's own fixes deleted from their file: no call is left to report there.

An unsafe fix may delete a use that withholds another fix: VAC005 keeps only the branch of ``if
self.use_output:`` that runs, and the ``else`` it deletes may be the very ``self.impl.forward(...)`` without
``output`` that withheld VAC002's fix (rebellions-sw/vllm-rbln's layer). A run taking both reports the call
only if it is still in the file it wrote. The use is looked for by its text, whitespace aside (a kept branch
is dedented): a use whose text is still there somewhere stays reported, so nothing the rewrite kept goes
unreported.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable
from typing import Protocol


class Site(Protocol):
    @property
    def line(self) -> int: ...

    @property
    def column(self) -> int: ...  # 1-based

    @property
    def end_line(self) -> int: ...

    @property
    def how(self) -> str: ...


# Blockers that are no call of the method: the attribute itself (`x.m` handed on, or its signature read).
_ATTRIBUTES = frozenset({"reference", "signature"})
_SPACE = re.compile(r"\s+")


def deleted(source: bytes, rewritten: bytes, sites: Iterable[Site]) -> set[tuple[int, int]]:
    """The ``(line, column)`` of each site of ``source`` whose use is nowhere in ``rewritten``."""
    try:
        text, new_text = _text(source), _text(rewritten)
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return set()  # (the run parsed both: never here, and reporting every use is the safe side)
    nodes: dict[tuple[int, int, int, bool], ast.AST] = {}
    for node in ast.walk(tree):  # breadth first: the outermost node of a position comes first
        if isinstance(node, (ast.Call, ast.Attribute)):
            key = (node.lineno, node.col_offset + 1, node.end_lineno or node.lineno, isinstance(node, ast.Attribute))
            nodes.setdefault(key, node)
    kept = _SPACE.sub("", new_text)
    gone = set()
    for site in sites:
        found = nodes.get((site.line, site.column, site.end_line, site.how in _ATTRIBUTES))
        segment = ast.get_source_segment(text, found) if found is not None else None
        if segment is not None and _SPACE.sub("", segment) not in kept:
            gone.add((site.line, site.column))
    return gone


def _text(source: bytes) -> str:
    encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    return source.decode(encoding)
