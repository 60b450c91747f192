"""The index's shortcuts change nothing it finds: `index_module` gives an equal `ModuleIndex` with them and with
the full walk they replaced, kept here as it was: every node stacked and visited (`calls`), every statement's
expressions walked for patch helpers (`runtime_patches`), each function walked with `ast.iter_child_nodes` for the
names it binds once (`bindings`), and `ast.walk` and `ast.iter_child_nodes` wherever the index now walks the
field table (`children`: the flag's reads, patch helpers, class builders, the deleted ops' registrations). Tricky
sources one by one, then every file of two real vLLM trees (and, for the names bound once, of stdlib packages).
The text scans' helpers (`classscan`) are held to the expressions they replaced."""

from __future__ import annotations

import ast
import itertools
import os
import sys
import textwrap
from collections import Counter
from collections.abc import Sequence

import pytest

from vllm_attn_compat.codemods.index import bindings, calls, children, classscan, occurrences, runtime_patches
from vllm_attn_compat.codemods.index.hierarchy import ModuleIndex, index_module

# --- the full walk, as `calls._Collector._scope` was before it skipped anything ------------------------------

_REFERENCE_LEAF_FIELDS = frozenset(
    {
        "ctx",
        "id",
        "attr",
        "name",
        "names",
        "arg",
        "asname",
        "module",
        "level",
        "kind",
        "type_comment",
        "conversion",
        "is_async",
        "simple",
        "tag",
        "n",
        "s",
    }
)
_REFERENCE_NOT_ESCAPING = (ast.Compare, ast.BinOp, ast.UnaryOp)


def _reference_scope(
    self: calls._Collector,
    nodes: Sequence[ast.AST],
    parent: ast.AST | None,
    scope: calls._Scope,
    scopes: list[calls._Scope],
    pending: calls._Pending,
) -> None:
    stack = [(node, parent) for node in nodes]
    called: set[int] = set()
    while stack:
        node, parent = stack.pop()
        if isinstance(node, calls._DEFS):
            self._define(node, parent, scope, scopes, pending)
            continue
        if isinstance(node, ast.Call):
            if type(node.func) is ast.Attribute:
                called.add(id(node.func))
            self._call(node, scope, scopes)
        elif isinstance(node, ast.MatchClass):
            self.named += [
                occurrences.NamedUse(name, node.lineno, node.col_offset + 1, "lookup", occurrences.shorten(node))
                for name in node.kwd_attrs
            ]
        elif type(node).__name__ not in occurrences.KNOWN_NODES:
            self.named += occurrences.unknown_syntax(node)
        if isinstance(node, ast.Attribute) and node.attr == "__dict__" and type(node.ctx) is ast.Load:
            self._reflect(node, "dict", node.value, (), scope, scopes)
        elif isinstance(node, ast.Attribute) and type(node.ctx) is ast.Store:
            self._store(node.value, node.attr, scopes)
        if (
            isinstance(node, ast.Attribute)
            and isinstance(parent, ast.Attribute)
            and type(node.ctx) is ast.Load
            and parent.attr.startswith("__")
            and parent.attr not in {"__name__", "__qualname__", "__module__", "__doc__", "__self__", "__class__"}
        ):
            self._through(node, scope, scopes)  # `x.m.__func__`: a way to call `x.m`
        elif (
            isinstance(node, ast.Attribute)
            and id(node) not in called
            and type(node.ctx) is ast.Load
            and not isinstance(parent, (*_REFERENCE_NOT_ESCAPING, ast.Attribute))
            and not (isinstance(parent, ast.Subscript) and parent.value is node)
            and self._records(node.attr)
        ):
            receiver, target, text = self._receiver(node.value, scope, scopes)
            end = node.end_lineno or node.lineno
            kind = "signature" if self._reads_signature(node, parent) else "reference"  # (not the walk's concern)
            use = calls.Use(node.attr, node.lineno, node.col_offset + 1, end, kind, receiver, scope.owner, target, text)
            self.uses.append(use)
        for name in (field for field in node._fields if field not in _REFERENCE_LEAF_FIELDS):
            value = getattr(node, name, None)
            if type(value) is list:
                stack.extend((item, node) for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST):
                stack.append((value, node))


# --- the names a function binds once, as `constructed` found them before its walk used the field table -----

_REFERENCE_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _reference_constructed(function: bindings.Function) -> dict[str, ast.expr]:
    arguments = function.args
    bindings = Counter(
        a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg,
                        arguments.kwarg] if a is not None
    )  # fmt: skip
    made: dict[str, ast.expr] = {}
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, _REFERENCE_NESTED):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bindings[node.name] += 2
                stack.extend(node.decorator_list)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                stack.extend(d for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None)
            if isinstance(node, ast.ClassDef):
                stack.extend([*node.bases, *node.keywords])
            for inner in ast.walk(node):
                if isinstance(inner, ast.Nonlocal):
                    bindings.update({name: 2 for name in inner.names})
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bindings[node.id] += 1
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bindings.update({name: 2 for name in node.names})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bindings.update({(a.asname or a.name).partition(".")[0]: 2 for a in node.names})
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            bindings[node.name] += 2
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bindings[node.rest] += 2
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                made[targets[0].id] = node.value.func
        stack.extend(ast.iter_child_nodes(node))
    return {name: callee for name, callee in made.items() if bindings[name] == 1}


def _functions(tree: ast.AST) -> list[bindings.Function]:
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _constructed_differ(tree: ast.AST) -> list[str]:
    """The functions of ``tree`` whose names bound once (and the callee node of each) the two walks disagree on."""
    differing = []
    for function in _functions(tree):
        fast, reference = bindings.Bindings(function).constructed, _reference_constructed(function)
        if fast.keys() != reference.keys() or any(fast[name] is not reference[name] for name in fast):
            differing.append(f"{function.name} (line {function.lineno})")
    return differing


def _reference_scope_constructed(scope: calls._Scope) -> dict[str, ast.expr]:
    return {} if scope.function is None else _reference_constructed(scope.function)


def _reference_index(source: bytes, path: str) -> ModuleIndex:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calls._Collector, "_scope", _reference_scope)
        patch.setattr(
            calls._Scope, "constructed", lambda scope: _reference_constructed(scope.function) if scope.function else {}
        )
        patch.setattr(children, "walk", ast.walk)
        patch.setattr(children, "child_nodes", ast.iter_child_nodes)
        patch.setattr(runtime_patches, "may_patch", lambda node, lines: True)
        return index_module(source, path)


def _assert_same(source: bytes, path: str = "/plugin/plug.py") -> ModuleIndex:
    fast = index_module(source, path)
    reference = _reference_index(source, path)
    assert fast.classes == reference.classes
    assert fast.patches == reference.patches
    assert fast.calls.methods == reference.calls.methods
    assert fast.calls.uses == reference.calls.uses
    assert fast == reference
    return fast


def _source(text: str) -> bytes:
    return textwrap.dedent(text).encode()


# --- the call walk: nothing it no longer stacks could record a use -------------------------------------------

CALL_SOURCES = {
    "chains": """
        import torch
        class Impl:
            def forward(self, q, output=None):
                a = self.impl.inner.forward(q, output=None)
                b = q.view(1).contiguous().float().sum
                c = self.a.b(q).c.d
                self.layer.cache.data = torch.empty(3).cuda()
                del self.x.y
                self.n.count += q.shape.numel()
                return (self.impl).forward(q)(self.other)
    """,
    "arguments and keywords": """
        def f(layer, d):
            layer.run(layer.q, *layer.args, key=layer.k, **layer.kw, other=lambda: layer.lazy)
            layer.merge({**d.extra, "a": d.first}, [x.y for x in d.items if x.ok])
            getattr(layer.impl, "forward")(layer.q, output=None)
            getattr(layer, name)
            setattr(layer.impl, "forward", d.fn)
            (layer.a or layer.b).c(layer.d if layer.e else layer.f)
            return layer.a[layer.b].c, -layer.n, layer.x + layer.y, layer.p < layer.q.r, not layer.s
    """,
    "scopes": """
        from vllm.v1.attention.backend import AttentionImpl
        def factory(base):
            class Local(AttentionImpl):
                class Inner:
                    def forward(self, q, output=None):
                        return Local.helper(self.q)
                @staticmethod
                def helper(q, *, output=None):
                    return q.clone()
            return Local.Inner().forward(base.q, output=None)
        x = lambda s: s.impl.forward(s.q)
        @decorators.wrap(factory.attr)
        async def coroutine(self) -> types.Result:
            async with self.lock.hold() as held:
                await held.impl.forward(self.q)
            return [item.value async for item in self.stream.items()]
    """,
    "strings, comments, f-strings, match": """
        def f(point, layer):
            text = f"{layer.name!r:>{layer.width}} {point.x.y}"  # a.b.c() in a comment
            doc = "layer.forward(q) in a string"
            match point.shape:
                case Point(x=0, y=layer.zero):
                    layer.reset()
                case {"k": v, **rest} if v.ok:
                    rest.pop()
                case [first, *others]:
                    first.go()
            if (n := layer.count()) > layer.limit:
                raise layer.error.kind(n) from layer.cause
            try:
                layer.run()
            except layer.errors.Timeout as error:
                error.report()
            else:
                layer.done()
            finally:
                layer.close()
            assert layer.ok, layer.message
            global something
            return {k: v.value for k, v in layer.items()}, {s.x for s in layer.set}, (g.y for g in layer.gen)
    """,
    "line continuations and deep nesting": """
        result = layer \\
            .first() \\
            .second(
                # a comment between
                arg.value,
            ).third
        value = ((((((a.b))))))
        total = a.x + b.y + c.z + d.w + e.v + f.u
    """,
}


@pytest.mark.parametrize("name", sorted(CALL_SOURCES))
def test_call_index_equals_the_full_walk(name):
    index = _assert_same(_source(CALL_SOURCES[name]))
    assert index.calls.uses  # the walk found something to compare


def test_uses_sharing_a_line_and_column_keep_the_full_walks_order():
    # `x.view(1).contiguous()`: both calls start at `x`, column 5; the sort by position keeps the walk's order.
    index = _assert_same(_source("y = x.view(1).contiguous().float()\n"))
    assert [(use.name, use.column) for use in index.calls.uses] == [("float", 5), ("contiguous", 5), ("view", 5)]


def test_a_deep_expression_is_walked_without_recursion():
    index = _assert_same(("x = " + "a.b() + " * 400 + "c.d()\n").encode())
    assert len(index.calls.uses) == 401


# --- the patch walk: a statement skipped names no patch helper -----------------------------------------------

PATCH_HEADER = """
from vllm.model_executor.layers.attention import Attention, MLAAttention
def fn(self, q, output=None): ...
class Methods: ...
"""
PATCH_SOURCES = {
    "any case": "Patch_Method(Attention, fn)\nx = INJECT(MLAAttention, fn)\n",
    "in an expression": "register(lambda: mixin_into(Attention, fn))\nitems = [merge(Attention, fn) for _ in ()]\n",
    "word on a later line": "x = (\n    mock.\n    patch.object(Attention, 'forward', fn)\n).start()\n",
    "continued line": "handle = \\\n    setattr(Attention, 'forward', fn)\n",
    "two statements on a line": "a = 1; patch_method(Attention, fn)\n",
    "annotated": "patcher: object = patch('vllm.x.Attention.forward', fn)\n",
    "setattr in a loop": "for name, value in vars(Methods).items():\n    setattr(Attention, name, value)\n",
    "dict in a loop": "for name in Methods.__dict__:\n    setattr(Attention, name, getattr(Methods, name))\n",
    "plain assignment": "Attention.forward = fn\nMLAAttention.impl.forward = fn\nself.callback = fn\n",
    "decorators": "@patch_method(Attention, 'forward')\ndef g(self): ...\n@merge_into(MLAAttention)\nclass M: ...\n",
    # Where the walk stops at its first match, or keeps what it finds in order: breadth first, as `ast.walk`.
    "the first builder by breadth": textwrap.dedent(
        """\
        def build(cls):
            if cls.plain:
                return type(cls.__name__, (Attention,), {})
            return wrap(type(cls.__name__, (MLAAttention,), {}))
        """
    ),
    "the first members by breadth": textwrap.dedent(
        """\
        for name in merged(MLAAttention.__dict__, outer(vars(Methods))):
            setattr(Attention, name, fn)
        """
    ),
    "helpers in order": "patcher = chain(inject(MLAAttention, fn), inner(patch_method(Attention, fn)))\n",
    "nested statements": textwrap.dedent(
        """\
        if True:
            while x:
                with y:
                    try:
                        inject(Attention, fn)
                    except E:
                        pass
        """
    ),
}


@pytest.mark.parametrize("name", sorted(PATCH_SOURCES))
def test_patches_equal_the_full_walk(name):
    index = _assert_same((PATCH_HEADER + PATCH_SOURCES[name]).encode())
    assert index.patches  # each source patches something: the comparison has something to lose


def test_a_non_ascii_name_that_folds_onto_a_helper_is_walked():
    # NFKC folds the fullwidth letters onto `patch`: the parser sees `patch(...)`, the bytes hold no "patch".
    source = (PATCH_HEADER + "\uff50\uff41\uff54\uff43\uff48(Attention, fn)\n").encode()
    assert b"patch" not in source.lower()
    assert _assert_same(source).patches


def test_a_declared_encoding_spelling_a_helper_in_ascii_bytes_is_walked():
    # In UTF-7, `+AHA-` is "p": the parser reads `patch(...)` where the bytes hold no "patch".
    source = b"# coding: utf-7\n" + PATCH_HEADER.encode() + b"+AHA-atch(Attention, fn)\n"
    assert b"patch" not in source.lower()
    assert runtime_patches.HelperLines(source).lines is None
    assert _assert_same(source).patches


def test_lone_carriage_returns_end_lines_for_the_parser_so_no_line_is_trusted():
    source = (PATCH_HEADER + "x = 1\rpatch_method(Attention, fn)\r").encode()
    assert runtime_patches.HelperLines(source).lines is None
    assert _assert_same(source).patches


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_helper_lines_are_the_parsers_line_numbers(newline):
    text = newline.join(["import x", "patch(a, b)  # é", "y = 2", "z = MERGE", "", "w = 'ñ'", ""])
    helper_lines = runtime_patches.HelperLines(text.encode())
    assert helper_lines.lines == [2, 2, 4, 6]  # the line of `patch`, of the non-ASCII byte, of MERGE, of ñ
    assert helper_lines.any_between(2, 2) and helper_lines.any_between(3, 4)
    assert not helper_lines.any_between(3, 3) and not helper_lines.any_between(5, 5)
    assert not helper_lines.any_between(7, 9)


def test_a_utf8_declaration_keeps_the_lines():
    source = b"# -*- coding: utf-8 -*-\nx = 1\npatch(a, b)\n"
    assert runtime_patches.HelperLines(source).lines == [3]


def test_a_statement_may_patch_says_no_to_finds_nothing():
    source = _source(
        """
        import mock
        from vllm.model_executor.layers.attention import Attention
        x = compute(1)
        y: int = other.value(2)
        run(thing)
        self.callback = fn
        Attention.forward = fn
        z = mock.patch.object(Attention, "forward", fn)
        """
    )
    tree = ast.parse(source)
    helper_lines = runtime_patches.HelperLines(source)
    skipped = [node for node in tree.body if not runtime_patches.may_patch(node, helper_lines)]
    # `self.callback = fn` stays: the types alone cannot tell it from `Attention.forward = fn`.
    assert [node.lineno for node in skipped] == [2, 3, 4, 5, 6]
    # Even where every name resolves, a statement skipped patches nothing.
    found = {node.lineno: runtime_patches.from_statement(node, lambda expr: "vllm.Attention") for node in tree.body}
    assert all(not found[node.lineno] for node in skipped)
    assert [line for line, entries in found.items() if entries] == [7, 8, 9]


# --- the names bound once: what the field table skips binds nothing -----------------------------------------

# Each binding form binds a name that is also assigned once from a call: only a binding counted keeps it out.
CONSTRUCTED_SOURCES = {
    "bindings of every kind": (
        """
        def f(a, /, b, *c, d, **e):
            a = A()
            b = A()
            c = A()
            d = A()
            e = A()
            impl = Impl()
            typed: Impl = mod.Impl(1)
            x = y = Other()
            (p, q), r[0], s.t = pair()
            for i, j in items(): k = K()
            with open(a) as h, lock: w = W()
            import os.path, json as j2
            from m import n as n2
            global g
            try: pass
            except E as err: u = U()
            del gone
            impl3 = Impl3(); impl3 += 1
            if (walrus := make()): pass
            [c2 for c2 in range(3) if (c3 := c2)]
            lambda z=(z2 := Z()): z
            match value:
                case Point(x=px, y=[*rest]) | {"k": kv, **others} as whole: m1 = M1()
                case [1, *_, last] if last: m2 = M2()
            i = B()
            os = B()
            j2 = B()
            n2 = B()
            g = B()
            err = B()
            gone = B()
            walrus = B()
            c2 = B()
            c3 = B()
            z2 = B()
            px = B()
            rest = B()
            kv = B()
            others = B()
            whole = B()
            last = B()
            p = B()
            q = B()
            made = factory()(3)
            chained = a.b.c.Impl(*c, **e)
            return impl, typed, made, chained
        """,
        {"impl", "typed", "k", "w", "u", "m1", "m2", "made", "chained"},
    ),
    "nested definitions": (
        """
        def outer(self):
            impl = Impl()
            kept = Kept()
            def inner(x=kept):
                nonlocal impl
                impl = Other()
                local = Local()
            class Nested(bases := Base(), metaclass=(meta := Meta)):
                def method(self):
                    def deeper():
                        nonlocal kept
                        kept = 2
                    return deeper
            @decorate(made := Made())
            async def later(y=(dflt := Default())):
                async for item in stream(): a = A()
                async with ctx() as c: b = B()
            made = Again()
            bases = Again()
            meta = Again()
            dflt = Again()
            inner = Again()
            Nested = Again()
            later = Again()
            lonely = Lonely()
            return lambda q, *r, s=Default(), **t: q
        """,
        {"lonely"},
    ),
    "constants and strings in walked fields": (
        """
        def f(x):
            impl = Impl("impl", b"impl", 1, None, ..., f"{impl!r:>10}")
            match x:
                case Point(x=1, y="s", z=None) | True: pass
                case {"k": "v"}: pass
            return impl
        """,
        {"impl"},
    ),
}


@pytest.mark.parametrize("name", sorted(CONSTRUCTED_SOURCES))
def test_names_bound_once_equal_the_full_walk(name):
    text, expected = CONSTRUCTED_SOURCES[name]
    tree = ast.parse(_source(text))
    assert _constructed_differ(tree) == []
    assert set(bindings.Bindings(_functions(tree)[0]).constructed) == expected


STDLIB_PACKAGES = ["asyncio", "email", "importlib", "json", "logging", "unittest", "concurrent", "xml"]


@pytest.mark.parametrize("package", STDLIB_PACKAGES)
def test_names_bound_once_equal_the_full_walk_over_stdlib_packages(package):
    """Real code nobody here wrote, present wherever the tests run: each function of the package's modules."""
    folder = os.path.join(os.path.dirname(os.__file__), package)
    paths = sorted(os.path.join(d, name) for d, _, names in os.walk(folder) for name in names if name.endswith(".py"))
    differing, found = [], 0
    for path in paths:
        with open(path, "rb") as file:
            tree = ast.parse(file.read(), path, feature_version=sys.version_info[:2])
        differing += [f"{path}: {function}" for function in _constructed_differ(tree)]
        found += sum(len(bindings.Bindings(function).constructed) for function in _functions(tree))
    assert differing == []
    assert found > 0


# --- classscan's helpers, held to the expressions they replaced --------------------------------------------


def _texts() -> list[bytes]:
    return [bytes(chars) for size in range(6) for chars in itertools.product(b"a\r\n) \\", repeat=size)]


def test_line_start_is_after_the_last_line_end():
    for text in _texts():
        for at in range(len(text) + 1):
            expected = max(text.rfind(b"\n", 0, at), text.rfind(b"\r", 0, at)) + 1
            assert classscan._line_start(text, at) == expected, (text, at)


def test_strip_end_is_rstrip():
    for text in _texts():
        for end in range(len(text) + 1):
            for chars in (b"", b" \t\f\r\n\\)", b"a"):
                assert classscan._strip_end(text, end, chars) == len(text[:end].rstrip(chars)), (text, end)


# --- every file of real vLLM trees -------------------------------------------------------------------------

TREES = ["/tmp/vllm-src/0.19.1/vllm", "/tmp/vllm-src/0.20.0/vllm"]


@pytest.mark.slow
@pytest.mark.parametrize("tree", TREES)
def test_every_file_of_a_vllm_tree_indexes_as_with_the_full_walk(tree):
    if not os.path.isdir(tree):
        pytest.skip(f"vLLM sources not unpacked at {tree} (pip download --no-deps vllm==<version>, then unzip)")
    paths = sorted(
        os.path.join(folder, name) for folder, _, names in os.walk(tree) for name in names if name.endswith(".py")
    )
    assert len(paths) > 1000
    differing, patches, uses = [], 0, 0
    for path in paths:
        with open(path, "rb") as file:
            source = file.read()
        fast = index_module(source, path)
        if fast != _reference_index(source, path) or _constructed_differ(ast.parse(source, path)):
            differing.append(path)
        patches += len(fast.patches)
        uses += len(fast.calls.uses)
    assert differing == []
    assert patches > 50 and uses > 100_000  # the trees hold what the shortcuts skip around
