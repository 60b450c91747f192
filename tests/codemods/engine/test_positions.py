"""`positions` gives exactly what `libcst.metadata.PositionProvider` gives, for every node."""

from __future__ import annotations

import ast

import hypothesmith
import libcst as cst
import pytest
from hypothesis import HealthCheck, assume, given, settings
from libcst.metadata import MetadataWrapper, PositionProvider

from vllm_attn_compat.codemods.engine.positions import positions
from vllm_attn_compat.codemods.engine.walk import walk

from libcst_corpus import corpus

CORPUS = corpus()


def _walked(module: cst.Module) -> tuple[list[cst.CSTNode], dict[int, cst.CSTNode]]:
    """Every node of ``module`` in the walk's order, and each one's parent (``id(node) -> parent``), as
    `scope.Analyzer` records them."""
    nodes: list[cst.CSTNode] = []
    parents: dict[int, cst.CSTNode] = {}
    stack: list[cst.CSTNode] = []

    def visit(node: cst.CSTNode) -> bool:
        if stack:
            parents[id(node)] = stack[-1]
        stack.append(node)
        nodes.append(node)
        return True

    walk(module, visit, lambda node: stack.pop())
    return nodes, parents


def _assert_same_positions(source: bytes, alone: int = 0) -> None:
    """All nodes asked for at once, then ``alone`` of them (spread over the file) one at a time,
    where the rendering stops right after the node; rendering the whole module, and rendering only the
    statements (of the module, or of a class) that hold them."""
    module = cst.parse_module(source)
    nodes, parents = _walked(module)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    ours = positions(module, nodes)
    try:
        tree = ast.parse(source)
    except SyntaxError:  # libcst accepts some sources CPython does not (the caller then renders the module)
        tree = None
    by_statement = positions(module, nodes, parents=parents, tree=tree, source=source)
    assert by_statement == ours
    # A node no rendering holds has no position in either (libcst 1.5.0's whitespace of a `case` without a guard).
    assert set(ours) == {id(node) for node in expected}
    for node in nodes:
        if node not in expected:
            continue
        want, got = expected[node], ours[id(node)]
        assert (got.start_line, got.start_column, got.end_line, got.end_column) == (
            want.start.line,
            want.start.column,
            want.end.line,
            want.end.column,
        ), f"{type(node).__name__} {module.code_for_node(node)!r}"
    for node in nodes[:: max(len(nodes) // alone, 1)] if alone else ():
        alone_expected = {id(node): ours[id(node)]} if id(node) in ours else {}
        assert positions(module, [node]) == alone_expected, f"{type(node).__name__} alone"
        given = positions(module, [node], parents=parents, tree=tree, source=source)
        assert given == alone_expected, f"{type(node).__name__} alone, by statement"


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


def test_only_the_statements_holding_the_nodes_are_rendered(monkeypatch):
    source = (
        b"import torch\n\n\n# the backend\nclass Impl:\n    x = 1; y = 2\n\n    @staticmethod\n    # why\n"
        b"    def forward(q, output=None):\n        assert output is not None\n        return output\n\n\n"
        b"def helper():\n    return 1\n"
    )
    module = cst.parse_module(source)
    nodes, parents = _walked(module)
    rendered: list[str] = []
    real = cst.CSTNode._codegen

    def codegen(self, state, **arguments):
        if type(self) in (cst.ClassDef, cst.FunctionDef, cst.SimpleStatementLine, cst.Module):
            rendered.append(type(self).__name__ + (f" {self.name.value}" if hasattr(self, "name") else ""))
        return real(self, state, **arguments)

    monkeypatch.setattr(cst.CSTNode, "_codegen", codegen)
    assertion = next(node for node in nodes if isinstance(node, cst.Assert))
    found = positions(module, [assertion], parents=parents, tree=ast.parse(source), source=source)
    assert (found[id(assertion)].start_line, found[id(assertion)].start_column) == (11, 8)
    assert rendered[0] == "FunctionDef forward" and "Module" not in rendered and "FunctionDef helper" not in rendered


def test_a_tree_of_another_source_costs_the_full_rendering_never_a_wrong_position():
    source = b"class A:\n    def f(self):\n        return 1\n\n    def g(self):\n        return 2\n"
    module = cst.parse_module(source)
    nodes, parents = _walked(module)
    expected = positions(module, nodes)
    # Same statements, one line further down; or other statements altogether.
    for other in (b"\n" + source, b"class A:\n    pass\n", b"x = 1\n"):
        assert positions(module, nodes, parents=parents, tree=ast.parse(other), source=source) == expected
    # The nodes of the module's header and footer are in no statement.
    commented = b"# header\n" + source + b"# footer\n"
    module = cst.parse_module(commented)
    nodes, parents = _walked(module)
    assert positions(module, nodes, parents=parents, tree=ast.parse(commented), source=commented) == positions(
        module, nodes
    )


@pytest.mark.parametrize(
    ("decorator", "on_its_line"),
    [
        ("@staticmethod", True),
        ("@functools.lru_cache(maxsize=4)", True),
        ("@registry['name'].register", True),
        ("@ \\\n    staticmethod", False),  # `ast` puts the decorator on the expression's line, after the `@`
        ("@(\n    staticmethod)", False),
        ("@(lambda f: f)", False),
    ],
)
def test_a_decorator_starting_its_statement_on_another_line_than_its_expression(decorator, on_its_line):
    from vllm_attn_compat.codemods.engine.positions import _on_its_line

    source = f"import functools\n\n\nclass A:\n    x = 1\n\n    {decorator}\n    def f(q):\n        return q\n"
    module = cst.parse_module(source.encode())
    method = module.body[1].body.body[1]
    assert _on_its_line(method.decorators[0]) is on_its_line
    _assert_same_positions(source.encode(), alone=10)
