"""The codemod engine as the reliability tests drive it, plus independent oracles for its output.

The oracles (comments, blank-line runs, line endings) are written here from the standard library
rather than imported from the runner's own safety checks, so a bug in those checks cannot hide
the same bug in the rules.
"""

from __future__ import annotations

import ast
import codecs
import io
import tokenize
from collections import Counter

import pytest

engine = pytest.importorskip(
    "vllm_attn_compat.codemods.engine.migrate", reason="the codemod engine (issue 3) is not in the tree yet"
)
registry = pytest.importorskip(
    "vllm_attn_compat.codemods.registry", reason="the rule registry (issue 3) is not in the tree yet"
)
hierarchy = pytest.importorskip(
    "vllm_attn_compat.codemods.index.hierarchy", reason="the class hierarchy (issue 3) is not in the tree yet"
)

ALL_RULES = registry.all_rules()
# The rules of vLLM 0.20's output buffer, whose changes the generated legacy modules' oracles know
# (`legacy_source.GeneratedModule.expected`): the later releases' rules have oracles of their own.
RULES_0_20 = [rule for rule in ALL_RULES if rule.code < "VAC010"]


def migrate(source: bytes, *, path: str = "plugin/attention/backend.py", unsafe_fixes: bool = False, rules=ALL_RULES):
    """One file through every rule (or ``rules``), as the runner does for a run of a single file."""
    classes = hierarchy.ClassHierarchy.build([hierarchy.index_module(source, path)])
    return engine.migrate_source(source, path=path, rules=rules, hierarchy=classes, unsafe_fixes=unsafe_fixes)


def comments(source: bytes) -> Counter[str]:
    return Counter(
        token.string.rstrip()
        for token in tokenize.tokenize(io.BytesIO(source).readline)
        if token.type == tokenize.COMMENT
    )


def program(source: bytes) -> str:
    """The syntax tree without positions: equal for programs that differ only in layout and comments."""
    return ast.dump(ast.parse(source))


def longest_blank_run(source: bytes) -> int:
    longest = run = 0
    for line in source.splitlines():
        run = run + 1 if not line.strip() else 0
        longest = max(longest, run)
    return longest


def line_endings(source: bytes) -> set[bytes]:
    found = set()
    for line in source.splitlines(keepends=True):
        if line.endswith(b"\r\n"):
            found.add(b"\r\n")
        elif line.endswith((b"\n", b"\r")):
            found.add(line[-1:])
    return found


def has_bom(source: bytes) -> bool:
    return source.startswith(codecs.BOM_UTF8)


from vllm_attn_compat.codemods.findings import Status  # noqa: E402  (after the skips above)

__all__ = ["Status", "comments", "has_bom", "line_endings", "longest_blank_run", "migrate", "program"]
