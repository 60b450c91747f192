"""`positions` gives exactly what `libcst.metadata.PositionProvider` gives, for every node."""

from __future__ import annotations

import hypothesmith
import libcst as cst
import pytest
from hypothesis import HealthCheck, assume, given, settings
from libcst.metadata import MetadataWrapper, PositionProvider

from vllm_attn_compat.codemods.engine.positions import positions
from vllm_attn_compat.codemods.engine.walk import walk

from libcst_corpus import corpus

CORPUS = corpus()


def _assert_same_positions(source: bytes, alone: int = 0) -> None:
    """All nodes asked for at once, then ``alone`` of them (spread over the file) one at a time,
    where the rendering stops right after the node."""
    module = cst.parse_module(source)
    nodes: list[cst.CSTNode] = []
    walk(module, lambda node: nodes.append(node) or True, lambda node: None)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    ours = positions(module, nodes)
    for node in nodes:
        want, got = expected[node], ours[id(node)]
        assert (got.start_line, got.start_column, got.end_line, got.end_column) == (
            want.start.line,
            want.start.column,
            want.end.line,
            want.end.column,
        ), f"{type(node).__name__} {module.code_for_node(node)!r}"
    for node in nodes[:: max(len(nodes) // alone, 1)] if alone else ():
        assert positions(module, [node]) == {id(node): ours[id(node)]}, f"{type(node).__name__} alone"


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_node_where_the_provider_puts_it(name):
    _assert_same_positions(CORPUS[name], alone=25)


def test_only_the_nodes_asked_for_are_returned():
    module = cst.parse_module(b"a = 1\n\n# note\nb = 2\n")
    span = positions(module, [module.body[1]])
    assert list(span) == [id(module.body[1])]
    assert (span[id(module.body[1])].start_line, span[id(module.body[1])].start_column) == (4, 0)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(hypothesmith.from_grammar())
def test_generated_programs(program):
    try:
        cst.parse_module(program)
    except (cst.ParserSyntaxError, RecursionError):
        assume(False)
    _assert_same_positions(program.encode(), alone=5)
