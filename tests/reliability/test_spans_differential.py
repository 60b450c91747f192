"""Handing libcst only the statements that can hold a finding (`engine/spans.py`) changes nothing: generated
old-API modules, and arbitrary programs placed around an attention class, migrate byte for byte and finding
for finding as their whole files do, with safe and with unsafe fixes. The reduction is forced on every file
here, however little it would save."""

from __future__ import annotations

import ast
import textwrap

import hypothesmith
import pytest
from hypothesis import assume, given, note
from hypothesis import strategies as st

from .engine_api import ALL_RULES, engine, hierarchy
from .legacy_source import GeneratedModule, legacy_modules
from .profile import reliability_settings
from .test_arbitrary_programs_unchanged import _valid

spans = pytest.importorskip("vllm_attn_compat.codemods.engine.spans", reason="libcst on spans is not in the tree")

PATH = "plugin/attention/backend.py"


def _both_ways(source: bytes, unsafe: bool) -> spans.Reduction | None:
    """Asserts both ways agree; returns the reduction made (None: the file went through whole)."""
    classes = hierarchy.ClassHierarchy.build([hierarchy.index_module(source, PATH)])
    settings = dict(path=PATH, rules=ALL_RULES, hierarchy=classes, unsafe_fixes=unsafe)
    saved, reduce, made = spans._MIN_SAVED, spans.reduce, []
    spans._MIN_SAVED = -(1 << 30)  # not a fixture: hypothesis runs many examples per test call
    spans.reduce = lambda *args, **kwargs: made.append(reduce(*args, **kwargs)) or made[-1]
    try:
        reduced = engine.migrate_source(source, **settings, reduce_spans=True)
    finally:
        spans._MIN_SAVED, spans.reduce = saved, reduce
    whole = engine.migrate_source(source, **settings, reduce_spans=False)
    assert reduced.source == whole.source
    assert reduced.findings == whole.findings
    assert reduced.removed_comments == whole.removed_comments
    return made[0] if made else None


@reliability_settings(ci=30, long=3000)
@given(module=legacy_modules(), unsafe=st.booleans())
def test_generated_modules_migrate_the_same_through_the_reduction(module: GeneratedModule, unsafe: bool) -> None:
    note(module.source.decode(module.encoding))
    _both_ways(module.source, unsafe)


AROUND = """import torch
from vllm.v1.attention.backend import AttentionImpl

{before}

class GeneratedImpl(AttentionImpl):
    def helper(self):
{inside}

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        assert output is not None
        return output

{after}
"""


@reliability_settings(ci=20, long=1000)
@given(programs=st.lists(hypothesmith.from_grammar(), min_size=3, max_size=3))
def test_arbitrary_programs_around_an_attention_class_migrate_the_same(programs: list[str]) -> None:
    before, inside, after = programs
    inside = textwrap.indent(inside if inside.strip() else "pass\n", " " * 8).rstrip("\n")
    source = _valid(AROUND.format(before=before, inside=inside, after=after))
    assume(source is not None)
    reduction = _both_ways(source, unsafe=True)
    helper = next(
        node.body[0]
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef)
        and isinstance(node.body[0], ast.FunctionDef)
        and node.body[0].name == "helper"
    )
    first_line = helper.body[0].lineno
    after_continuation = source.splitlines()[first_line - 2].rstrip().endswith(b"\\")  # a stub is refused there
    if not after_continuation and not any(token in inside.encode() for rule in ALL_RULES for token in rule.tokens):
        assert reduction is not None and b"def helper():" in reduction.source  # the comparison is not vacuous
