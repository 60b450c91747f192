"""Which member names vLLM's own code still uses, anywhere in its ``vllm/`` tree.

A name counts as used where an attribute access ``.name`` or a string literal whose whole text is the name (as
``getattr(x, "name")`` and ``hasattr`` take it) appears outside a function of that same name: the definitions
and overrides of a hook, and a ``super().name(...)`` inside one, are not vLLM calling it. The test is by name,
not by type: a use of another class's member of the same name counts too, so "unused" is reliable and "used"
errs on the side of keeping a hook alive.

Speed: one regular expression lists each file's candidate names (after a dot, or quoted alone); only files with
a candidate not yet confirmed are parsed, smallest first, so a release's 3,600 files cost a few hundred ms of
scanning and a few dozen parses.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

_CANDIDATE = re.compile(r"\.[ \t]*([A-Za-z_]\w*)|[\"']([A-Za-z_]\w*)[\"']")


def used_names(files: Iterable[tuple[str, str]], names: set[str]) -> set[str]:
    """The ``names`` that some file of ``files`` ((path, source) pairs) uses outside their own definitions."""
    hits_by_path: dict[str, tuple[set[str], str]] = {}
    candidates: dict[str, list[tuple[int, str]]] = {}
    for path, text in files:
        hits = {attribute or string for attribute, string in _CANDIDATE.findall(text)} & names
        if hits:
            hits_by_path[path] = (hits, text)
            for name in hits:
                candidates.setdefault(name, []).append((len(text), path))
    confirmed: set[str] = set()
    parsed: set[str] = set()
    for name in sorted(candidates):
        for _, path in sorted(candidates[name]):
            if name in confirmed:
                break
            if path not in parsed:
                parsed.add(path)
                confirmed |= _uses(hits_by_path[path][1], hits_by_path[path][0])
    return confirmed


def _uses(text: str, wanted: set[str]) -> set[str]:
    """The ``wanted`` names a module's source uses, each outside the functions of its own name."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    everywhere = _occurrences(ast.walk(tree), wanted)
    definitions = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in everywhere
    ]
    nested = {
        id(inner)
        for node in definitions
        for inner in ast.walk(node)
        if inner is not node and isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef) and inner.name == node.name
    }
    for node in definitions:
        if id(node) not in nested:  # an outermost definition: its occurrences are the nested ones' too
            everywhere[node.name] -= _occurrences(ast.walk(node), {node.name}).get(node.name, 0)
    return {name for name, count in everywhere.items() if count > 0}


def _occurrences(nodes: Iterable[ast.AST], wanted: set[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in nodes:
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value
        else:
            continue
        if name in wanted:
            counts[name] = counts.get(name, 0) + 1
    return counts
