"""The class index walks statement bodies only: every place a class or import can stand is still reached."""

from __future__ import annotations

import sys
import textwrap

from vllm_attn_compat.codemods.index.hierarchy import index_module

EVERY_BODY = """
try:
    from vllm.v1.attention.backend import AttentionImpl as Impl
except ImportError:
    from vllm.attention.backends.abstract import AttentionImpl as Impl
else:
    class InElse(Impl): ...
finally:
    class InFinally(Impl): ...

if True:
    class InIf(Impl): ...
elif False:
    class InElif(Impl): ...
else:
    class InIfElse(Impl): ...

for _ in ():
    class InFor(Impl): ...
else:
    class InForElse(Impl): ...

while False:
    class InWhile(Impl): ...
else:
    class InWhileElse(Impl): ...

with open(__file__):
    class InWith(Impl): ...

match 1:
    case 1:
        class InCase(Impl): ...

async def coroutine():
    async with lock:
        class InAsyncWith(Impl): ...
    async for _ in stream:
        class InAsyncFor(Impl): ...


def factory():
    import vllm.v1.attention.backend as late

    class Outer(late.AttentionBackend):
        if True:
            class Inner(Impl): ...

        def method(self):
            class Local(Outer): ...
    return Outer

# A class in an expression cannot exist; a lambda or comprehension holds none.
VALUE = [lambda: None for _ in ()]
"""


# `except*` parses from Python 3.11 (the index parses with the running interpreter's `ast`).
EXCEPT_STAR = """
try:
    pass
except* ValueError:
    class InExceptStar(Impl): ...
"""


def test_every_statement_body_is_walked_in_source_order():
    star = sys.version_info >= (3, 11)
    source = EVERY_BODY.replace("\n\nasync def", EXCEPT_STAR + "\n\nasync def", 1) if star else EVERY_BODY
    index = index_module(textwrap.dedent(source).encode(), "pkg.py")
    found = [(entry.qualname, entry.bases) for entry in index.classes]
    impl = ("vllm.attention.backends.abstract.AttentionImpl",)  # the later import binds the name
    assert found == [
        ("InElse", impl),
        ("InFinally", impl),
        ("InIf", impl),
        ("InElif", impl),
        ("InIfElse", impl),
        ("InFor", impl),
        ("InForElse", impl),
        ("InWhile", impl),
        ("InWhileElse", impl),
        ("InWith", impl),
        ("InCase", impl),
        *([("InExceptStar", impl)] if star else []),
        ("coroutine.<locals>.InAsyncWith", impl),
        ("coroutine.<locals>.InAsyncFor", impl),
        ("factory.<locals>.Outer", ("vllm.v1.attention.backend.AttentionBackend",)),
        ("factory.<locals>.Outer.Inner", impl),
        ("factory.<locals>.Outer.method.<locals>.Local", ("pkg.factory.<locals>.Outer",)),
    ]
    assert [entry.line for entry in index.classes] == sorted(entry.line for entry in index.classes)


def test_deep_expressions_are_not_walked():
    # 800 nested unary minuses: ast parses it; a visitor of every expression node would overflow
    # Python's recursion limit, the statement walk never enters the expression.
    source = b"from vllm.attention import AttentionImpl\nDEPTH = " + b"-" * 800 + b"1\nclass A(AttentionImpl): ...\n"
    index = index_module(source, "deep.py")
    assert [(entry.qualname, entry.bases) for entry in index.classes] == [("A", ("vllm.attention.AttentionImpl",))]
