"""One `ast` parse per source for the steps of a migration, and the trees a worker keeps from its index."""

from __future__ import annotations

import ast

import pytest

from vllm_attn_compat.codemods.engine import statements


@pytest.fixture(autouse=True)
def _empty(monkeypatch):
    monkeypatch.setattr(statements, "_recent", type(statements._recent)())
    monkeypatch.setattr(statements, "_kept", {})


def test_the_same_source_is_parsed_once_while_it_is_among_the_last_few():
    source = b"def f(x):\n    return x\n"
    tree = statements.parse(source)
    assert statements.parse(bytes(bytearray(source))) is tree  # equal bytes, another object
    for number in range(statements._RECENT):
        statements.parse(b"x = %d\n" % number)
    again = statements.parse(source)
    assert again is not tree and ast.dump(again) == ast.dump(tree)


def test_a_kept_tree_is_the_next_parse_of_its_source_and_is_given_once():
    source = b"class A:\n    pass\n"
    kept = ast.parse(source)
    statements.keep(source, kept)
    assert statements.parse(source) is kept
    assert statements._kept == {}  # handed over: the recent trees hold it now
    for number in range(statements._RECENT):
        statements.parse(b"x = %d\n" % number)
    assert statements.parse(source) is not kept


def test_trees_are_kept_up_to_a_bound_of_source_bytes(monkeypatch):
    monkeypatch.setattr(statements, "KEPT_BYTES", 30)
    first, second = b"a = 1\n" * 4, b"b = 2\n" * 2  # 24 and 12 bytes
    statements.keep(first, ast.parse(first))
    statements.keep(second, ast.parse(second))  # over the bound: not kept
    assert list(statements._kept) == [first]
    tree = ast.parse(first)
    statements.keep(first, tree)  # the first tree stays
    assert statements.parse(first) is not tree


def test_an_unparsable_source_raises_each_time():
    for _ in range(2):
        with pytest.raises(SyntaxError):
            statements.parse(b"def f(:\n")
