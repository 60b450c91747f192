"""The engine: one parse for all rules, byte-faithful output, noqa, statuses, parse errors."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import tokenize
from collections import Counter

import hypothesmith
import libcst
import pytest
from hypothesis import HealthCheck, given, settings

from vllm_attn_compat.codemods.engine.migrate import ParseError, migrate_source, needs_parsing, prefilter_tokens
from vllm_attn_compat.codemods.engine.rule import Rule
from vllm_attn_compat.codemods.findings import Status
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module
from vllm_attn_compat.codemods.registry import all_rules, select_rules

LEGACY = textwrap.dedent(
    '''\
    """A legacy backend."""
    from typing import Optional

    import torch
    from vllm.v1.attention.backend import AttentionBackend, AttentionImpl


    class Backend(AttentionBackend):
        # We take the preallocated output.
        accept_output_buffer: bool = True

        @staticmethod
        def get_name():
            return "LEGACY"

        @staticmethod
        def get_impl_cls():
            return Impl

        @staticmethod
        def get_builder_cls():
            return None


    class Impl(AttentionImpl):
        def __init__(self, *args, **kwargs):
            pass

        def forward(self, layer, q, k, v, kv_cache, meta, output: Optional[torch.Tensor] = None, output_scale=None,
                    output_block_scale=None):
            # The layer allocates it.
            assert output is not None, "Output tensor must be provided."
            if output is None:
                output = torch.empty_like(q)

            output.copy_(q)  # keep
            return output


    SPLITTING_OPS = ["vllm::unified_attention", "vllm::unified_attention_with_output"]
    '''
)
MIGRATED = textwrap.dedent(
    '''\
    """A legacy backend."""
    from typing import Optional

    import torch
    from vllm.v1.attention.backend import AttentionBackend, AttentionImpl


    class Backend(AttentionBackend):
        @staticmethod
        def get_name():
            return "LEGACY"

        @staticmethod
        def get_impl_cls():
            return Impl

        @staticmethod
        def get_builder_cls():
            return None


    class Impl(AttentionImpl):
        def __init__(self, *args, **kwargs):
            pass

        def forward(self, layer, q, k, v, kv_cache, meta, output: torch.Tensor, output_scale=None,
                    output_block_scale=None):
            # The layer allocates it.
            output.copy_(q)  # keep
            return output


    SPLITTING_OPS = ["vllm::unified_attention_with_output"]
    '''
)


def migrate(source: bytes, path: str = "legacy.py", *, unsafe: bool = False, rules=None, with_findings=True):
    hierarchy = ClassHierarchy.build([index_module(source, path)])
    return migrate_source(
        source,
        path=path,
        rules=rules or all_rules(),
        hierarchy=hierarchy,
        unsafe_fixes=unsafe,
        with_findings=with_findings,
    )


def comments(source: bytes) -> Counter:
    tokens = tokenize.tokenize(io.BytesIO(source).readline)
    return Counter(t.string for t in tokens if t.type == tokenize.COMMENT)


def test_all_rules_in_one_file_with_one_parse(monkeypatch):
    calls = []
    real = libcst.parse_module
    monkeypatch.setattr(libcst, "parse_module", lambda *a, **k: calls.append(1) or real(*a, **k))
    result = migrate(LEGACY.encode())
    assert len(calls) == 1
    assert result.source.decode() == MIGRATED
    assert [f.code for f in result.findings] == ["VAC004", "VAC002", "VAC001", "VAC003", "VAC006"]
    assert {f.status for f in result.findings} == {Status.FIXED}
    assert result.removed_comments == ("# We take the preallocated output.",)
    lost = comments(LEGACY.encode()) - comments(result.source)
    assert list(lost.elements()) == list(result.removed_comments)


def test_files_without_old_api_code_come_back_as_the_same_bytes():
    for source in [
        b"\xef\xbb\xbfimport os\r\nx = 1\r\n",
        "# -*- coding: latin-1 -*-\nname = 'caf\xe9'\n".encode("latin-1"),
        b"from vllm.v1.attention.backend import AttentionImpl\nclass I(AttentionImpl):\n    __init__ = forward = None",
    ]:
        result = migrate(source)
        assert result.source is source and result.findings == []


def test_latin1_crlf_and_bom_survive_a_fix():
    body = LEGACY.replace('"""A legacy backend."""', "# -*- coding: latin-1 -*-\n# caf\xe9").replace("\n", "\r\n")
    result = migrate(body.encode("latin-1"))
    expected = MIGRATED.replace('"""A legacy backend."""', "# -*- coding: latin-1 -*-\n# caf\xe9")
    assert result.source == expected.replace("\n", "\r\n").encode("latin-1")
    bom = b"\xef\xbb\xbf" + LEGACY.encode()
    assert migrate(bom).source == b"\xef\xbb\xbf" + MIGRATED.encode()


def test_statuses_follow_fix_safety_and_the_unsafe_flag():
    source = b"import vllm\n\n\ndef f(layer):\n    return 1 if layer.use_output else 2  # noqa: VAC001\n"
    assert [f.status for f in migrate(source).findings] == [Status.UNSAFE_FIX_AVAILABLE]
    assert migrate(source).source is source
    unsafe = migrate(source, unsafe=True)
    assert [f.status for f in unsafe.findings] == [Status.FIXED]
    assert b"    return 1  # noqa: VAC001\n" in unsafe.source
    suppressed = migrate(source.replace(b"VAC001", b"VAC005"), unsafe=True)
    assert [f.status for f in suppressed.findings] == [Status.SUPPRESSED]


def test_finding_positions_are_one_based():
    result = migrate(LEGACY.encode())
    assert (result.findings[0].line, result.findings[0].column) == (10, 5)


def test_parse_error_names_the_position():
    with pytest.raises(ParseError) as caught:
        migrate_source(
            b"x = 1\ndef f(:\n    pass\n",
            path="bad.py",
            rules=all_rules(),
            hierarchy=ClassHierarchy.build([]),
            unsafe_fixes=False,
        )
    assert caught.value.line == 2 and caught.value.column >= 1 and caught.value.message
    assert "Python accepts" not in caught.value.message


def test_a_file_python_accepts_and_libcst_does_not_is_said_to_be_valid():
    """Found by generated programs: a line continuation before a lone CRLF in an LF file. The file is not at
    fault, and the error says so rather than reading as a syntax error in it."""
    source = LEGACY.encode().replace(
        b"    def forward(", b"    def helper(self):\n\n        \\\r\n        pass\n\n    def forward(", 1
    )
    compile(source, "valid.py", "exec")
    with pytest.raises(ParseError) as caught:
        migrate_source(
            source, path="valid.py", rules=all_rules(), hierarchy=ClassHierarchy.build([]), unsafe_fixes=False
        )
    assert "Python accepts this file; libcst, which the codemods rewrite with, does not" in caught.value.message


def test_hierarchy_without_this_file_still_covers_its_classes():
    source = LEGACY.encode()
    result = migrate_source(
        source, path="elsewhere.py", rules=all_rules(), hierarchy=ClassHierarchy.build([]), unsafe_fixes=False
    )
    assert result.source.decode() == MIGRATED


def test_prefilter_tokens_are_selective():
    tokens = prefilter_tokens(all_rules())
    assert all(len(token) >= 10 for token in tokens)
    assert b"output" not in tokens
    plain = b"def forward(self, q, output=None):\n    assert output is not None\n"
    assert not any(token in plain for token in tokens)
    assert not needs_parsing(plain, all_rules())
    assert needs_parsing(plain, all_rules(), frozenset({"PluginBase"})) is False
    assert needs_parsing(b"class X(PluginBase):\n" + plain, all_rules(), frozenset({"PluginBase"}))
    assert needs_parsing(b"ops = ['vllm::unified_attention']", select_rules(["VAC006"]))
    assert not needs_parsing(b"ops = ['vllm::unified_attention']", select_rules(["VAC001"]))


def test_registry_select_ignore_and_unknown_codes():
    assert [r.code for r in all_rules()] == sorted(r.code for r in all_rules())
    assert [r.code for r in select_rules(["VAC00"], ["VAC004", "VAC007"])] == [
        "VAC001",
        "VAC002",
        "VAC003",
        "VAC005",
        "VAC006",
        "VAC008",
        "VAC009",
    ]
    assert [r.code for r in select_rules(["vac006"])] == ["VAC006"]
    with pytest.raises(ValueError, match=r"unknown rule code 'VAC9'.*VAC001"):
        select_rules(["VAC9"])


def test_rules_declare_everything_and_codes_are_unique():
    with pytest.raises(TypeError, match="lacks class attribute"):
        type("Broken", (Rule,), {"__doc__": "x", "code": "VAC990"})
    with pytest.raises(TypeError, match="selective"):
        type(
            "Greedy",
            (Rule,),
            {
                "__doc__": "x",
                "code": "VAC991",
                "name": "greedy",
                "summary": "s",
                "fix_safety": all_rules()[0].fix_safety,
                "tokens": (b"out",),
            },
        )
    with pytest.raises(TypeError, match="used by both"):
        type(
            "Clash",
            (Rule,),
            {
                "__doc__": "x",
                "code": "VAC001",
                "name": "clash",
                "summary": "s",
                "fix_safety": all_rules()[0].fix_safety,
                "tokens": (b"output is not None",),
            },
        )
    assert [r.code for r in all_rules()][-1] == "VAC013"


def test_listing_rules_and_prefiltering_import_neither_libcst_nor_torch():
    code = (
        "import sys\n"
        "from vllm_attn_compat.codemods.registry import all_rules\n"
        "from vllm_attn_compat.codemods.engine import migrate as engine; "
        "from vllm_attn_compat.codemods.index import hierarchy\n"
        "engine.prefilter_tokens(all_rules())\n"
        "print('libcst' in sys.modules, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_files_where_no_rule_can_apply_skip_libcst_but_still_report_syntax_errors(monkeypatch):
    calls = []
    real = libcst.parse_module
    monkeypatch.setattr(libcst, "parse_module", lambda *a, **k: calls.append(1) or real(*a, **k))
    # Contains scoped tokens, but defines no attention class.
    source = b"def forward(q, output=None):\n    assert output is not None\n"
    assert migrate(source).source is source and calls == []
    with pytest.raises(ParseError) as caught:
        migrate_source(
            b"def forward(q, output=None):\n    assert output is not\n",
            path="bad.py",
            rules=all_rules(),
            hierarchy=ClassHierarchy.build([]),
            unsafe_fixes=False,
        )
    assert caught.value.line == 2


@given(body=hypothesmith.from_grammar())
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_python_without_old_api_comes_back_unchanged(body):
    source = (
        "from vllm.v1.attention.backend import AttentionImpl\n"
        "class Impl(AttentionImpl):\n"
        "    def forward(self, q, output=None):\n"
        "        pass\n" + body
    ).encode()
    try:
        compile(source, "generated.py", "exec")
    except (SyntaxError, ValueError):
        return
    result = migrate(source, rules=select_rules(ignore=["VAC002"]), unsafe=True)
    if not result.findings:
        assert result.source is source
    else:
        compile(result.source, "generated.py", "exec")


def test_the_fix_pass_goes_only_down_the_paths_to_the_edits_and_changes_nothing_by_it(monkeypatch):
    from vllm_attn_compat.codemods.engine import apply
    from vllm_attn_compat.codemods.engine.walk import walk

    descended = []
    real_on_visit = apply.Applier.on_visit

    def on_visit(self, node):
        entered = real_on_visit(self, node)
        descended.append(entered)
        return entered

    monkeypatch.setattr(apply.Applier, "on_visit", on_visit)
    result = migrate(LEGACY.encode())
    nodes = []
    walk(libcst.parse_module(LEGACY), lambda node: nodes.append(node) or True, lambda node: None)
    assert 0 < sum(descended) < len(nodes) / 4

    # The same edits made by a pass over the whole tree give the same file.
    real_init = apply.Applier.__init__
    monkeypatch.setattr(apply.Applier, "__init__", lambda self, *edits, within=None: real_init(self, *edits))
    assert migrate(LEGACY.encode()) == result


def test_without_findings_the_same_source_comes_back_and_positions_are_computed_only_for_a_noqa(monkeypatch):
    from vllm_attn_compat.codemods.engine import positions

    rendered = []
    real = positions.positions
    monkeypatch.setattr(
        positions, "positions", lambda module, nodes, **given: rendered.append(1) or real(module, nodes, **given)
    )
    full = migrate(LEGACY.encode())
    assert rendered == [1]
    source_only = migrate(LEGACY.encode(), with_findings=False)
    assert (source_only.source, source_only.findings) == (full.source, [])
    assert rendered == [1]  # no noqa in the file: nothing needed a position

    held_back = LEGACY.replace("accept_output_buffer: bool = True", "accept_output_buffer: bool = True  # noqa: VAC004")
    source_only = migrate(held_back.encode(), with_findings=False)
    assert "accept_output_buffer: bool = True  # noqa: VAC004" in source_only.source.decode()
    assert source_only.source == migrate(held_back.encode()).source


def test_positions_render_the_statements_holding_findings_not_the_module(monkeypatch):
    # Findings in `Backend`, `Impl.forward` and `SPLITTING_OPS`: the statements of the module and of the
    # classes holding them are rendered, each alone; the rest of the file is not.
    from vllm_attn_compat.codemods.engine import positions

    rendered: list[str] = []
    real = positions._placed

    def placed(module, nodes, statement, indents, start_line):
        rendered.append(type(statement).__name__ + (f" {statement.name.value}" if hasattr(statement, "name") else ""))
        return real(module, nodes, statement, indents, start_line)

    monkeypatch.setattr(positions, "_placed", placed)
    unmigrated = migrate(LEGACY.encode())
    assert "Module" not in rendered and "FunctionDef get_name" not in rendered, rendered
    assert {"FunctionDef forward", "SimpleStatementLine"} <= set(rendered), rendered
    monkeypatch.setattr(positions, "_by_statement", lambda *args: None)  # the whole module rendered instead
    assert unmigrated.findings == migrate(LEGACY.encode()).findings and len(unmigrated.findings) >= 4
    assert rendered.count("Module") == 1
