"""`walk` sees what `CSTVisitor` sees, in the same order, on real and generated sources."""

from __future__ import annotations

import hypothesmith
import libcst as cst
import pytest
from hypothesis import HealthCheck, assume, given, settings

from vllm_attn_compat.codemods.engine import walk as walk_module
from vllm_attn_compat.codemods.engine.walk import walk

from libcst_corpus import corpus

CORPUS = corpus()


class _Recorder(cst.CSTVisitor):
    def __init__(self, skip: tuple[type, ...]) -> None:
        super().__init__()
        self.events: list[tuple[str, int]] = []
        self.skip = skip

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.events.append(("visit", id(node)))
        return not isinstance(node, self.skip)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.events.append(("leave", id(original_node)))


def _events_of_walk(module: cst.Module, skip: tuple[type, ...]) -> list[tuple[str, int]]:
    events: list[tuple[str, int]] = []

    def visit(node: cst.CSTNode) -> bool:
        events.append(("visit", id(node)))
        return not isinstance(node, skip)

    walk(module, visit, lambda node: events.append(("leave", id(node))))
    return events


def _assert_same_traversal(source: bytes, skip: tuple[type, ...] = ()) -> None:
    module = cst.parse_module(source)
    expected = _Recorder(skip)
    module.visit(expected)
    assert _events_of_walk(module, skip) == expected.events


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_same_nodes_in_the_same_order_as_libcst(name):
    _assert_same_traversal(CORPUS[name])


def test_children_are_skipped_where_on_visit_says_so():
    _assert_same_traversal(CORPUS["odd forms (LF)"], skip=(cst.FunctionDef, cst.Call, cst.FormattedString))


def test_a_field_libcst_visits_only_when_set_is_learnt_per_instance(monkeypatch):
    # The first f-string expression has no format spec: a cache learnt from it alone would miss
    # the names inside the second one's spec.
    monkeypatch.setattr(walk_module, "_FIELDS", {})
    source = b'x = f"{a}"\ny = f"{b:>{width}}"\n'
    _assert_same_traversal(source)
    names: list[str] = []

    def visit(node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Name):
            names.append(node.value)
        return True

    walk(cst.parse_module(source), visit, lambda node: None)
    assert names == ["x", "a", "y", "b", "width"]


def _parses(program: str) -> bytes | None:
    try:
        cst.parse_module(program)
    except (cst.ParserSyntaxError, RecursionError):
        return None
    return program.encode()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(hypothesmith.from_grammar())
def test_generated_programs(program):
    source = _parses(program)
    assume(source is not None)
    _assert_same_traversal(source)


def test_each_node_type_is_learnt_once_where_no_field_is_conditional(monkeypatch):
    # Fields such as Newline.value (Optional[str]) are unset and never visited, but hold no node: their
    # types must not be learnt again for every instance (a libcst visit per newline).
    monkeypatch.setattr(walk_module, "_FIELDS", {})
    learnt: list[type] = []
    real_record = walk_module._record
    monkeypatch.setattr(walk_module, "_record", lambda node: learnt.append(type(node)) or real_record(node))
    module = cst.parse_module(CORPUS["examples/legacy_plugin/legacy_attn_plugin/base.py"])
    walk(module, lambda node: True, lambda node: None)
    assert len(learnt) == len(set(learnt)) and cst.Newline in learnt
