"""The libcst predicates the rules share: here, the ``if <name> is None:`` guards of a function, read from its
statements alone, against a walk of every node."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from vllm_attn_compat.codemods.engine.patterns import compound_statements, none_guards, none_test
from vllm_attn_compat.codemods.engine.walk import walk

from libcst_corpus import corpus

CORPUS = corpus()


def _guards_by_walk(function: cst.FunctionDef, name: str) -> tuple[cst.If, ...]:
    """The reference: every node of the body walked, functions and classes defined there left out."""
    guards: list[cst.If] = []

    def visit(node: cst.CSTNode) -> bool:
        if isinstance(node, cst.If) and none_test(node.test, name) == "is":
            guards.append(node)
        return not isinstance(node, (cst.FunctionDef, cst.ClassDef))

    walk(function.body, visit, lambda node: None)
    return tuple(guards)


def _functions_and_names(module: cst.Module) -> tuple[list[cst.FunctionDef], set[str]]:
    functions: list[cst.FunctionDef] = []
    names = {"output"}

    def visit(node: cst.CSTNode) -> bool:
        if isinstance(node, cst.FunctionDef):
            functions.append(node)
        elif isinstance(node, cst.Comparison) and isinstance(node.left, cst.Name):
            names.add(node.left.value)
        return True

    walk(module, visit, lambda node: None)
    return functions, names


GUARDED = textwrap.dedent(
    """
    def forward(self, q, output=None):
        if output is None:
            output = q.new_empty(q.shape)
        elif q is None:
            pass
        else:
            if output is None:
                pass
        for x in q:
            if output is None:
                break
        else:
            while output is None:
                if output is None:
                    pass
        try:
            if output is None:
                pass
        except ValueError:
            if output is None:
                pass
        else:
            if output is None:
                pass
        finally:
            if output is None:
                pass
        with open(q) as f:
            if output is None:
                pass
        match q:
            case 1:
                if output is None:
                    pass

        def inner(output=None):
            if output is None:
                pass

        class Inner:
            if output is None:
                pass

        if output is None: pass
        check = lambda output: output is None
        return output if output is None else q
    """
)


def test_every_guard_of_the_function_s_own_blocks_in_order_and_none_of_other_scopes():
    module = cst.parse_module(GUARDED)
    forward = module.body[0]
    guards = none_guards(forward, "output")
    lines = [module.code_for_node(guard).strip().splitlines()[0] for guard in guards]
    assert len(guards) == 11 and set(lines) == {"if output is None:", "if output is None: pass"}
    assert guards == _guards_by_walk(forward, "output")
    assert none_guards(cst.parse_expression("lambda output: output is None"), "output") == ()
    assert [type(s).__name__ for s in compound_statements(forward.body)][:4] == ["If", "If", "If", "For"]


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_guards_are_those_a_walk_of_every_node_finds(name):
    module = cst.parse_module(CORPUS[name])
    functions, names = _functions_and_names(module)
    for function in functions:
        for tested in names:
            assert none_guards(function, tested) == _guards_by_walk(function, tested), (function.name.value, tested)
