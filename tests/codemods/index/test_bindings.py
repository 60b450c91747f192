"""What a function binds itself (codemods/index/bindings.py): the names it binds once, to a call, by example; the
names it binds at all, by example and held to CPython's own symbol tables (`symtable`) over the standard library's
sources, code nobody here wrote, and over generated functions: a name taken for the function's variable is never
the builtin."""

from __future__ import annotations

import ast
import os
import random
import symtable
import textwrap

import pytest

from vllm_attn_compat.codemods.index.bindings import Bindings, Function, shadows


def local_names(function: Function) -> tuple[frozenset[str], frozenset[str]]:
    return Bindings(function).local_names


def _function(text: str) -> ast.FunctionDef:
    tree = ast.parse(textwrap.dedent(text))
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    return function


def test_what_a_function_binds_itself():
    bound, declared = local_names(
        _function(
            """
            def f(dir, /, a, *args, vars=None, **kw):
                import os.path, json as getattr
                from inspect import getmembers
                x = y = 1
                (p, [q, *r]) = s
                t: int
                u += 1
                for i, j in pairs:
                    with open(p) as (handle, other):
                        pass
                try:
                    pass
                except ValueError as error:
                    del z
                match x:
                    case [m, *rest] | {"k": m, **rest}:
                        pass
                if (w := 2):
                    pass
                def inner(hidden): nested = 1
                class K: in_class = 1
                [comprehended for comprehended in range(3)]
                [(walrus := c) for c in range(3)]
                lambda lam=default: lam
                global g
                g = 1
                nonlocal_free
            """
        )
    )
    assert bound == {
        "dir", "a", "args", "vars", "kw", "os", "getattr", "getmembers", "x", "y", "p", "q", "r", "t", "u", "i",
        "j", "handle", "other", "error", "z", "m", "rest", "w", "inner", "K",
    }  # fmt: skip
    assert declared == {"g"}


def test_the_innermost_function_binding_a_name_decides():
    outer = local_names(_function("def outer(dir):\n    pass\n"))
    inner = local_names(_function("def inner():\n    global dir\n"))
    assert shadows("dir", [outer])
    assert not shadows("dir", [inner, outer])  # declared global where the code is: the module's, or the builtin
    assert not shadows("vars", [outer]) and not shadows("dir", [])


_CORPUS = (
    "argparse", "inspect", "dataclasses", "enum", "typing", "functools", "pathlib", "shutil", "tarfile", "zipfile",
    "pydoc", "pdb", "doctest", "configparser", "logging/__init__", "json/decoder", "email/message", "unittest/mock",
    "http/server", "asyncio/base_events", "collections/__init__", "importlib/_bootstrap",
)  # fmt: skip


def _stdlib_files() -> list[str]:
    root = os.path.dirname(os.__file__)
    paths = [os.path.join(root, name + ".py") for name in _CORPUS]
    return [path for path in paths if os.path.exists(path)]


@pytest.mark.parametrize("path", _stdlib_files(), ids=os.path.basename)
def test_a_name_taken_for_a_variable_is_one_by_cpython(path):
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    tree = ast.parse(source)
    functions = {
        (node.name, node.lineno): node
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    checked = 0

    def visit(table: symtable.SymbolTable, chain: list[tuple[frozenset[str], frozenset[str]]]) -> None:
        nonlocal checked
        if table.get_type() == "function":
            node = functions.get((table.get_name(), table.get_lineno()))
            if node is None:  # a lambda or a comprehension: its own scope, not looked at here
                return
            chain = [local_names(node), *chain]
            for symbol in table.get_symbols():
                if not symbol.is_referenced():
                    continue
                if shadows(symbol.get_name(), chain):
                    checked += 1
                    assert not symbol.is_global(), (path, table.get_name(), symbol.get_name())
                if symbol.is_local() and _plainly_bound(symbol):
                    assert shadows(symbol.get_name(), chain), (table, symbol)
        elif table.get_type() == "class":
            pass  # a method does not see its class's names
        for child in table.get_children():
            visit(child, chain)

    visit(symtable.symtable(source, path, "exec"), [])
    assert checked > 50  # the corpus holds functions reading their own names


def _plainly_bound(symbol: symtable.Symbol) -> bool:
    """A local CPython knows the function binds by a parameter or an import (what `local_names` must see). Not any
    assignment: from Python 3.12 (PEP 709) a comprehension's targets are listed among its function's locals, though
    they stay its own, and `local_names` leaves them out."""
    return symbol.is_parameter() or symbol.is_imported()


# Statements that may bind the probed name `dir` in the function holding them, or in a scope of their own.
_STATEMENTS = (
    "dir = 1", "for dir in x: pass", "with a as dir: pass", "import dir", "from m import dir", "def dir(): pass",
    "class dir: pass", "[dir for dir in x]", "f = lambda dir: dir", "(dir := 1)", "[(dir := c) for c in x]",
    "global dir", "del dir", "try:\n    pass\nexcept E as dir:\n    pass", "def g(dir): pass", "class C:\n    dir = 1",
    "x = 1", "print(dir)", "match x:\n    case [dir]: pass", "y = [c for c in dir]",
)  # fmt: skip


def _program(chosen: random.Random) -> str:
    outer = chosen.sample(_STATEMENTS, chosen.randint(0, 3))
    inner = chosen.sample(_STATEMENTS, chosen.randint(0, 2))
    parameter = chosen.choice(["", "dir"])
    body = "\n".join([*outer, "def inner():", *("    " + line for s in inner for line in s.split("\n")), "    dir"])
    return f"def outer({parameter}):\n" + textwrap.indent(body, "    ") + "\n    dir\n"


def test_generated_functions_agree_with_cpython_where_a_name_is_taken_for_a_variable():
    chosen = random.Random(20261207)
    compared = taken = 0
    while compared < 400:
        source = _program(chosen)
        try:
            table = symtable.symtable(source, "generated.py", "exec")
        except SyntaxError:
            continue  # e.g. `global dir` after a use of it
        compared += 1
        outer_node = ast.parse(source).body[0]
        assert isinstance(outer_node, ast.FunctionDef)
        inner_node = next(n for n in outer_node.body if isinstance(n, ast.FunctionDef) and n.name == "inner")
        outer_table = table.get_children()[0]
        inner_table = next(t for t in outer_table.get_children() if t.get_name() == "inner")
        for code_table, chain in (
            (outer_table, [local_names(outer_node)]),
            (inner_table, [local_names(inner_node), local_names(outer_node)]),
        ):
            symbol = code_table.lookup("dir")
            if shadows("dir", chain):
                taken += 1
                assert not symbol.is_global(), source
    assert taken > 100


# --- the names bound once, to a call -------------------------------------------------------------------------


def _constructed(body: str, parameters: str = "") -> dict[str, str]:
    text = f"def f({parameters}):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    function = ast.parse(text).body[0]
    assert isinstance(function, ast.FunctionDef)
    return {name: ast.unparse(callee) for name, callee in Bindings(function).constructed.items()}


def test_a_name_bound_once_to_a_call_holds_what_the_call_made():
    found = _constructed(
        """
        impl = MyImpl(1, 2)
        typed: Impl = plugin.Impl()
        made = factory()(3)
        value = 3
        impl.forward(None)
        """
    )
    assert found == {"impl": "MyImpl", "typed": "plugin.Impl", "made": "factory()"}


@pytest.mark.parametrize(
    "body",
    [
        "impl = MyImpl()\nimpl = OtherImpl()\n",
        "impl = MyImpl()\nfor impl in impls:\n    pass\n",
        "impl = MyImpl()\nwith open(p) as impl:\n    pass\n",
        "impl = MyImpl()\ndel impl\n",
        "impl = MyImpl()\nimpl += 1\n",
        "impl = MyImpl()\nif (impl := other()):\n    pass\n",
        "impl = MyImpl()\n[impl for impl in impls]\n",  # (its own scope in Python 3: counted all the same)
        "global impl\nimpl = MyImpl()\n",
        "impl = MyImpl()\nimport impl\n",
        "impl = MyImpl()\ntry:\n    pass\nexcept E as impl:\n    pass\n",
        "impl = MyImpl()\nmatch x:\n    case [*impl]:\n        pass\n",
        "impl = MyImpl()\nmatch x:\n    case {**impl}:\n        pass\n",
        "impl = MyImpl()\nmatch x:\n    case Point() as impl:\n        pass\n",
        "impl = MyImpl()\ndef g():\n    nonlocal impl\n    impl = other\n",
        "impl = MyImpl()\ndef impl():\n    pass\n",
        "impl = MyImpl()\nclass impl:\n    pass\n",
        "impl, other = MyImpl(), Other()\n",
        "impl = other = MyImpl()\n",
        "impl[0] = MyImpl()\n",
    ],
)
def test_any_other_binding_of_the_name_makes_it_unknown(body):
    assert "impl" not in _constructed(body)


def test_a_parameter_is_unknown_and_nested_scopes_bind_nothing_of_their_own():
    assert _constructed("impl = MyImpl()\n", "impl") == {}
    nested = _constructed("impl = MyImpl()\ndef g():\n    impl = Other()\n    inner = Inner()\nlambda impl: impl\n")
    assert nested == {"impl": "MyImpl"}
    assert _constructed("impl = MyImpl()\ndef g(x=(impl := 2)):\n    pass\n") == {}  # a default runs here
