"""One `ast` parse per source for the steps of a migration."""

from __future__ import annotations

import ast

import pytest

from vllm_attn_compat.codemods.engine import statements


@pytest.fixture(autouse=True)
def _empty(monkeypatch):
    monkeypatch.setattr(statements, "_recent", type(statements._recent)())


def test_the_same_source_is_parsed_once_while_it_is_among_the_last_few():
    source = b"def f(x):\n    return x\n"
    tree = statements.parse(source)
    assert statements.parse(bytes(bytearray(source))) is tree  # equal bytes, another object
    for number in range(statements._RECENT):
        statements.parse(b"x = %d\n" % number)
    again = statements.parse(source)
    assert again is not tree and ast.dump(again) == ast.dump(tree)


def test_an_unparsable_source_raises_each_time():
    for _ in range(2):
        with pytest.raises(SyntaxError):
            statements.parse(b"def f(:\n")
