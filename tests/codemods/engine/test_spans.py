"""libcst on the statements that can hold a finding: the reduction, the restore, and the proof that a
migration through them equals the whole file's, byte for byte and finding for finding."""

from __future__ import annotations

import ast
import codecs
import os
import re
import textwrap

import pytest

from tests.codemods.rule_testing import source
from vllm_attn_compat.codemods.engine import spans
from vllm_attn_compat.codemods.engine.migrate import migrate_source
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module
from vllm_attn_compat.codemods.registry import all_rules

TOKEN = spans.Needs((b"output is not None",))


@pytest.fixture
def always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stub whatever can be stubbed, however little it saves (the tests' files are small)."""
    monkeypatch.setattr(spans, "_MIN_SAVED", -(1 << 30))


def both_ways(data: bytes, path: str = "plugin_mod.py", *, unsafe: bool) -> None:
    """Migrating ``data`` through the reduction gives exactly what the whole file gives."""
    hierarchy = ClassHierarchy.build([index_module(data, path)])
    settings = dict(path=path, rules=all_rules(), hierarchy=hierarchy, unsafe_fixes=unsafe)
    reduced = migrate_source(data, **settings, reduce_spans=True)
    whole = migrate_source(data, **settings, reduce_spans=False)
    assert reduced.source == whole.source
    assert reduced.findings == whole.findings
    assert reduced.removed_comments == whole.removed_comments


def with_fillers(text: str) -> str:
    """``text`` with a method no rule can act on at the start of every class (after its header line) and
    a class and a function at the end: what the reduction stubs."""
    lines = text.splitlines(keepends=True)
    out = []
    for line in lines:
        out.append(line)
        header = re.fullmatch(r"( *)class \w+(\(.*\))?:\n", line)
        if header:
            inner = header.group(1) + "    "
            out.append(f"{inner}@staticmethod\n{inner}def filler(a, b):\n{inner}    return a + b  # noqa: E501\n\n")
    return "".join(out) + "\n\nclass Filler:\n    def other(self):\n        return 1\n\n\ndef helper():\n    return 2\n"


EXAMPLES = [(rule.code, example) for rule in all_rules() for example in rule.examples]


@pytest.mark.parametrize(("code", "example"), EXAMPLES, ids=[f"{c}-{e.title[:40]}" for c, e in EXAMPLES])
@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
def test_every_example_migrates_the_same_through_the_reduction(always, code, example, unsafe):
    both_ways(example.source().encode(), unsafe=unsafe)
    filled = with_fillers(example.source())
    ast.parse(filled)  # the fillers keep the example valid Python
    both_ways(filled.encode(), unsafe=unsafe)


def test_fillers_are_stubbed_and_kept_statements_are_not(always):
    text = with_fillers(
        source(
            """
            class Impl:
                def forward(self, q, output=None):
                    assert output is not None
                    return output
            """
        )
    )
    reduction = spans.reduce(text.encode(), [TOKEN])
    assert reduction is not None
    reduced = reduction.source.decode()
    assert "return a + b" not in reduced and "return 2" not in reduced and "return 1" not in reduced
    assert "assert output is not None" in reduced
    assert reduced.count("\n") == text.count("\n")  # every line stays where it was
    assert "def filler():" in reduced and "class Filler:" in reduced and "def helper():" in reduced
    ast.parse(reduced)
    assert reduction.restore(reduction.source) == text.encode()


@pytest.mark.parametrize(
    "statement",
    [
        "def one_line(a): return a\n",
        "def suite(\n    a,\n): return a\n",
        "@decorator(1)\n@other\ndef decorated(a):\n    return a\n",
        "async def coroutine(a):\n    await a\n    return a\n",
        "class Nested:\n    class Inner:\n        x = 1\n\n    def m(self):\n        pass\n",
        "def commented():\n    x = 1\n        # a deeper comment after the body\n",
        "def tabs():\n\tif x:\n\t\treturn 1\n\treturn 2\n",
        "def two_lines():\n    return 1\n",
        "class Header(\n    Base,\n    metaclass=Meta,\n):\n    '''doc'''\n",
        "def strings():\n    return '''\n    not code: def f(): pass\n    '''\n",
    ],
)
@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
def test_a_stub_keeps_the_statement_s_lines_and_shape(always, statement, newline):
    kept = "\n\nclass Impl:\n    def f(self, output):\n        assert output is not None\n"
    text = ("import os\n\n\n" + statement + kept).replace("\n", newline)
    reduction = spans.reduce(text.encode(), [TOKEN])
    assert reduction is not None and len(reduction.stubs) == 1
    reduced_tree, tree = ast.parse(reduction.source), ast.parse(text)
    assert [type(node).__name__ for node in reduced_tree.body] == [type(node).__name__ for node in tree.body]
    assert [node.end_lineno for node in reduced_tree.body[1:]] == [node.end_lineno for node in tree.body[1:]]
    assert reduction.source.splitlines(keepends=True)[-3:] == text.encode().splitlines(keepends=True)[-3:]
    assert reduction.restore(reduction.source) == text.encode()


def test_restore_refuses_stubs_that_did_not_come_back_unchanged(always):
    text = b"import os\n\n\ndef a():\n    return 1\n\n\ndef b():\n    return 2\n\n\n"
    text += b"def c(output):\n    assert output is not None\n"
    reduction = spans.reduce(text, [TOKEN])
    assert reduction is not None and len(reduction.stubs) == 2
    lines = reduction.source.splitlines(keepends=True)
    first, second = (stub.first for stub in reduction.stubs)
    assert reduction.restore(b"".join(lines[:first] + lines[first + 2 :])) is None  # a stub lost a line
    swapped = lines[:first] + lines[second : second + 2] + lines[first + 2 : second] + lines[first : first + 2]
    assert reduction.restore(b"".join(swapped + lines[second + 2 :])) is None  # out of order
    doubled = lines + lines[first : first + 2]
    assert reduction.restore(b"".join(doubled)) is None  # a marker twice
    edited = b"".join(lines).replace(b"assert output is not None\n", b"pass\n")
    assert reduction.restore(edited) == text.replace(b"assert output is not None\n", b"pass\n")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b"# -*- coding: latin-1 -*-\nimport os\n\n\ndef a():\n    return 1\n", "a coding declaration"),
        (b"import os\n\n\ndef a(:\n    return 1\n", "a syntax error"),
        (codecs.BOM_UTF8 + b"def a():\n    return 1\n", "after a byte-order mark"),
        (b"import os\n\n\ndef a(): \\\n    return 1\n", "a body after a line continuation"),
    ],
)
def test_nothing_is_stubbed_where_it_cannot_be_done_exactly(always, text, why):
    reduction = spans.reduce(text, [TOKEN])
    assert reduction is None or not reduction.stubs, why


SIGNATURE = spans.Needs((b"output=None",), reads_statements=())


@pytest.mark.parametrize(
    ("body", "hidden", "shown"),
    [
        ("    x = 1\n\n    # a comment\n    return x + 1\n", ["x = 1", "a comment", "return x"], []),
        ("    # a comment before\n    return q\n", ["return q"], ["# a comment before"]),
        (
            '    """doc"""\n    assert q\n    pass\n    y = q\n    return y\n',
            ["y = q", "return y"],
            ["doc", "assert q", "pass"],
        ),
        (
            "    @decorator\n    def inner(a):\n        return a\n\n    x = inner\n",
            ["x = inner"],
            ["@decorator", "return a"],
        ),
        ("    x = 1; y = 2\n    z = 3\n", ["z = 3"], ["x = 1; y = 2"]),
        ("    y = q\n    raise ValueError(y)\n    ...\n", ["y = q"], ["raise ValueError(y)", "    ..."]),
        ("    x = (1 +\n         2)\n    if x:\n        return\n", ["x = (1", "2)", "if x:"], []),
    ],
)
@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["LF", "CRLF"])
def test_statements_no_rule_reads_reach_libcst_as_one_stub_per_run(always, body, hidden, shown, newline):
    header = "class Impl:\n    @property\n    def forward(\n        self, q,\n        output=None,\n    ):\n"
    text = ("import os\n\n\n" + header + textwrap.indent(body, "    ") + "\n\nTAIL = 0\n").replace("\n", newline)
    reduction = spans.reduce(text.encode(), [SIGNATURE])
    assert reduction is not None and len(reduction.stubs) == 1
    reduced = reduction.source.decode()
    assert reduced.startswith(("import os\n\n\n" + header).replace("\n", newline))  # the def lines, as they were
    assert not [text for text in hidden if text in reduced] and all(text in reduced for text in shown)
    assert reduced.count(newline) == text.count(newline)
    method = ast.parse(reduced).body[1].body[0]
    assert isinstance(method, ast.FunctionDef)
    stubs = [node for node in method.body if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)]
    assert len(stubs) == 1
    assert not ast.get_docstring(method) or "doc" in body  # a stub is no docstring
    assert reduction.restore(reduction.source) == text.encode()
    edited = reduction.source.replace(b"output=None", b"output")
    assert reduction.restore(edited) == text.encode().replace(b"output=None", b"output")


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("def f(q, output=None):\n    g = lambda output=None: output\n    return g\n", "g = lambda"),
        ("def f(q, output=None): return q\n", "return q"),
        ("def f(q, output=None): \\\n    return q\n", "return q"),
    ],
)
def test_statements_holding_a_token_or_that_cannot_be_stubbed_exactly_are_kept(always, text, kept):
    whole = "import os\n\n\n" + text + "\n\ndef other():\n    return 1\n"
    reduction = spans.reduce(whole.encode(), [SIGNATURE])
    assert reduction is not None and kept.encode() in reduction.source and b"return 1" not in reduction.source


def test_a_rule_reading_whole_bodies_keeps_every_statement_of_a_function_it_wants(always):
    text = b"import os\n\n\ndef f(q, output=None):\n    x = 1\n    return x\n\n\ndef g(q):\n    return 2\n"
    reduction = spans.reduce(text, [SIGNATURE, spans.Needs((b"output=None",))])
    assert reduction is not None and b"x = 1" in reduction.source and b"return 2" not in reduction.source


def test_a_rule_reading_statements_that_name_output_keeps_those(always):
    text = b"import os\n\n\ndef f(q, output=None):\n    x = 1\n    output = x\n    return x\n\n\nx = 1\n"
    needs = [SIGNATURE, spans.Needs((b"output=None",), reads_statements=(b"output",))]
    reduction = spans.reduce(text, needs)
    assert reduction is not None and b"output = x" in reduction.source
    assert b"x = 1\n    output" not in reduction.source and b"return x" not in reduction.source


NESTED = '''\
import torch
from vllm.v1.attention.backend import AttentionImpl


class Impl(AttentionImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        """Docs."""
        if output is None:
            output = torch.empty_like(query)
        if attn_metadata is None:
            x = 1  # a comment
            assert output is not None
            y = 2
        elif query.dim() == 3:
            z = 3
        else:
            w = 4
            return output.fill_(0)
        for i in range(3):
            v = i
        else:
            u = 5
            output[0] = u
        try:
            t = 6
        except ValueError:
            s = 7
        finally:
            r = output
        with torch.no_grad():
            if query: p = 8
            q = output
        match query:
            case None:
                o = 9
            case _:
                n = output
        return output
'''


def test_runs_are_found_in_the_blocks_of_compound_statements_kept_for_what_they_hold(always):
    needs = [spans.Needs((b"output is not None",), reads_statements=(b"output",))]
    reduction = spans.reduce(NESTED.encode(), needs)
    assert reduction is not None
    reduced = reduction.source.decode()
    hidden = ["x = 1", "a comment", "y = 2", "z = 3", "w = 4", "v = i", "u = 5", "t = 6", "s = 7", "p = 8", "o = 9"]
    assert [text for text in hidden if text in reduced] == []
    shown = ["elif query.dim()", "else:", "return output.fill_(0)", "output[0] = u", "r = output", "q = output"]
    assert [text for text in shown if text not in reduced] == []
    assert reduced.count("\n") == NESTED.count("\n")
    ast.parse(reduced)
    assert reduction.restore(reduction.source) == NESTED.encode()


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
def test_a_method_with_nested_blocks_migrates_the_same_through_the_reduction(always, unsafe):
    both_ways(NESTED.encode(), unsafe=unsafe)


def test_scoped_tokens_count_only_in_attention_code(always):
    text = source(
        """
        import torch


        class Mixer(torch.nn.Module):
            def forward(self, x, output: torch.Tensor | None = None):
                assert output is not None


        class Impl(AttentionImpl):
            def helper(self):
                return 1

            def forward(self, q, output: torch.Tensor | None = None):
                assert output is not None
        """
    ).encode()
    needs = [spans.Needs((b"output is not None",), scoped=True)]
    reduction = spans.reduce(text, needs, lambda qualname, is_class: qualname.startswith("Impl"))
    assert reduction is not None
    reduced = reduction.source.decode()
    assert [line for line in reduced.splitlines() if "assert" in line] == ["        assert output is not None"]
    assert reduced.index("assert") > reduced.index("class Impl") and "class Mixer:" in reduced
    assert "return 1" not in reduced


def test_what_a_rule_reads_in_a_class_is_kept_only_where_the_rule_s_token_is(always):
    text = source(
        """
        import torch


        class Layer:
            def __init__(self):
                self.num_heads = 8

            def forward(self, q):
                return torch.ops.vllm.unified_attention(q)


        class Other:
            def __init__(self):
                self.num_heads = 8
        """
    ).encode()
    reduction = spans.reduce(text, [spans.Needs((b"unified_attention",), reads_in_class=(b"num_heads",))])
    assert reduction is not None
    assert reduction.source.count(b"self.num_heads = 8") == 1  # Layer's, not Other's


def test_what_a_rule_reads_is_kept_anywhere_in_a_file_holding_the_rule_s_token(always):
    text = source(
        """
        def setup():
            import vllm_attn_compat.compat as shim


        def attend(q):
            return shim.unified_attention(q)


        def unrelated():
            import vllm_attn_compat
        """
    ).encode()
    needs = [spans.Needs((b"unified_attention",), reads=(b"vllm_attn_compat",))]
    reduction = spans.reduce(text, needs)
    assert reduction is None or not reduction.stubs  # every function holds a token or a name the rule reads
    without = spans.reduce(text.replace(b"unified_attention", b"other_name"), needs)
    assert without is not None and len(without.stubs) == 3  # without the rule's token, what it reads counts for nothing


FACTORY = """\
import torch
from vllm.v1.attention.backend import AttentionImpl


def make_impl(kernel):
    class LegacyImpl(AttentionImpl):
        def forward(self, layer, query, key, value, kv_cache, attn_metadata, output):
            return kernel(query, key, value)

        def _decode(self, query, output):
            output = torch.empty_like(query)
            return self._run(query, output)

    return LegacyImpl
"""


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
def test_a_backend_made_in_a_factory_migrates_the_same_through_the_reduction(always, unsafe):
    both_ways(FACTORY.encode(), unsafe=unsafe)
    hierarchy = ClassHierarchy.build([index_module(FACTORY.encode(), "plugin_mod.py")])
    result = migrate_source(
        FACTORY.encode(), path="plugin_mod.py", rules=all_rules(), hierarchy=hierarchy, unsafe_fixes=unsafe
    )
    assert [finding.code for finding in result.findings].count("VAC009") == 1  # the factory's forward, kept


VLLM_TREES = [
    tree for tree in (f"/tmp/vllm-src/{v}/vllm" for v in ("0.19.1", "0.20.0", "0.33.0")) if os.path.isdir(tree)
]


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_TREES, reason="vLLM's sources are not unzipped under /tmp/vllm-src (see bench_fork.py)")
@pytest.mark.parametrize("tree", VLLM_TREES)
def test_vllm_s_own_files_migrate_the_same_through_the_reduction(tree, monkeypatch):
    """Every file of vLLM's sources that reaches libcst in a run over the whole tree, both ways, safe and
    unsafe fixes, with the run's own class hierarchy."""
    from vllm_attn_compat.codemods.engine import migrate as engine
    from vllm_attn_compat.codemods.run.runner import Options, run_paths

    seen: dict[str, tuple[bytes, dict]] = {}
    original = engine.migrate_source

    def record(data, **settings):
        seen[settings["path"]] = (data, settings)
        return original(data, **settings)

    monkeypatch.setattr(engine, "migrate_source", record)
    run_paths([tree], Options(mode="check", jobs=1))
    monkeypatch.setattr(engine, "migrate_source", original)
    assert len(seen) > 10
    reduced_somewhere = 0
    for path, (data, settings) in sorted(seen.items()):
        settings = {key: value for key, value in settings.items() if key not in ("reduce_spans", "unsafe_fixes")}
        for unsafe in (False, True):
            reduced = original(data, **settings, unsafe_fixes=unsafe, reduce_spans=True)
            whole = original(data, **settings, unsafe_fixes=unsafe, reduce_spans=False)
            assert (reduced.source, reduced.findings, reduced.removed_comments) == (
                whole.source,
                whole.findings,
                whole.removed_comments,
            ), path
        reduced_somewhere += spans.reduce(data, [spans.Needs(rule.tokens) for rule in settings["rules"]]) is not None
    assert reduced_somewhere > len(seen) // 2  # the comparison is not vacuous


def test_an_identifier_token_counts_only_as_a_whole_word(always):
    text = source(
        """
        import triton


        @triton.jit
        def kernel_unified_attention_2d(q):
            use_unified_attention = True


        def unified_attention(q):
            return kernel_unified_attention_2d(q)


        OPS = ["vllm::unified_attention"]
        """
    ).encode()
    reduction = spans.reduce(text, [spans.Needs((b"unified_attention",))])
    assert reduction is not None and len(reduction.stubs) == 1
    assert b"def kernel_unified_attention_2d():" in reduction.source
    assert b"def unified_attention(q):" in reduction.source
