"""A rule that narrows its tokens (`Rule.narrows`, `Rule.requires`) loses nothing by it: each of its examples
migrates the same with the narrowing and without, in a run of its own and in a fork's run holding the vLLM
modules it imports; a run over real files reports the same with and without; and what VAC011's narrowing reads
of a file's imports holds every name ``ast`` finds there, over generated import statements."""

from __future__ import annotations

import ast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_attn_compat.codemods.engine.migrate import migrate_source
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module
from vllm_attn_compat.codemods.registry import all_rules
from vllm_attn_compat.codemods.rules import vac011_removed_name
from vllm_attn_compat.codemods.rules.vac011_removed_name import imported_vllm_names
from vllm_attn_compat.codemods.run.options import Options
from vllm_attn_compat.codemods.run.runner import run_paths
from vllm_attn_compat.manifest import data

NARROWING = [rule for rule in all_rules() if rule.narrows or rule.requires]
CASES = [
    pytest.param(rule, example, id=f"{rule.code}-{index}")
    for rule in NARROWING
    for index, example in enumerate(rule.examples)
]


def _imported_modules(tree):
    """The vLLM modules the import statements of ``tree`` name."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {module for module in found if module.startswith("vllm.")}


def test_some_rule_narrows():
    assert NARROWING


def _fork(tmp_path, modules):
    """Files of a fork's tree defining each of ``modules`` (empty), as (path, source) of the run."""
    files = []
    for module in sorted(modules):
        parts = module.split(".")
        for depth in range(1, len(parts)):
            folder = tmp_path.joinpath(*parts[:depth])
            folder.mkdir(exist_ok=True)
            (folder / "__init__.py").touch()
        path = tmp_path.joinpath(*parts[:-1], parts[-1] + ".py")
        path.write_text("")
        files.append((str(path), b""))
    return files


@pytest.mark.parametrize(("rule", "example"), CASES)
@pytest.mark.parametrize("fork", [False, True], ids=["own-run", "fork"])
def test_an_example_migrates_the_same_narrowed_or_not(rule, example, fork, tmp_path):
    text = example.source().encode()
    path = str(tmp_path / "example.py")
    others = _fork(tmp_path, _imported_modules(ast.parse(text))) if fork else []
    hierarchy = ClassHierarchy.build([index_module(text, path), *(index_module(s, p) for p, s in others)])
    results = [
        migrate_source(
            text, path=path, rules=[rule], hierarchy=hierarchy, unsafe_fixes=True, target=example.release(), narrow=n
        )
        for n in (True, False)
    ]
    assert results[0] == results[1]


PLUGIN_USE = """\
from vllm.v1.attention.backend import CommonAttentionMetadata


def decode_lengths(common_attn_metadata: CommonAttentionMetadata):
    return common_attn_metadata.seq_lens_cpu.tolist()
"""


def _findings(paths):
    report = run_paths(paths, Options(mode="check", jobs=1))
    return [(path, f.line, f.code, f.message) for path, f in report.findings]


COMPLETE_IMPL = """\
from vllm.v1.attention.backend import AttentionImpl


class CompleteImpl(AttentionImpl):
    def __init__(self, num_heads, head_size, scale):
        self.scale = scale

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output):
        output.copy_(query)
        return output
"""
INCOMPLETE_IMPL = """\
from vllm.v1.attention.backend import AttentionImpl


class IncompleteImpl(AttentionImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output):
        output.copy_(query)
        return output
"""


LAYER = """\
import torch
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase


class MixerLayer(AttentionLayerBase):
    def forward(self, hidden_states, output=None):
        if output is None:
            output = torch.empty_like(hidden_states)
        output.copy_(hidden_states)
        return output
"""
PATCHED = """\
from vllm.v1.attention.backend import AttentionImpl


class PatchedImpl(AttentionImpl):
    pass


def _forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
    assert output is not None
    output.copy_(query)
    return output


PatchedImpl.forward = _forward
"""
IN_A_BLOCK = """\
import sys

from vllm.v1.attention.backend import AttentionImpl


class BlockImpl(AttentionImpl):
    if sys.version_info >= (3, 10):

        def prefill(self, query, output=None):
            if output is None:
                output = query.clone()
            return output
"""
# An op some release removed beside a read of a removed member: in a fork's tree, where the read's class is the
# fork's own, only the op can be reported (libcst is handed the function calling it: `RemovedName.span_tokens`).
OP_AND_READ = """\
import torch

from vllm.v1.attention.backend import CommonAttentionMetadata


def scales(query, key, value, layer_name):
    torch.ops.vllm.maybe_calc_kv_scales(query, key, value, layer_name)


def decode_lengths(common_attn_metadata: CommonAttentionMetadata):
    '''The decode lengths.
%s    '''
    return common_attn_metadata.seq_lens_cpu.tolist()
""" % ("    (Long enough that handing libcst a stub in its place is worth it: `spans`.)\n" * 30)
OLD_OPS = """\
import torch


def attend(q, k, v, name):
    return torch.ops.vllm.unified_attention(q, k, v, name)


KERNELS = ["vllm::unified_attention_with_output"]
"""


@pytest.mark.parametrize("tree", ["plugin", "fork", "impls", "layers"])
def test_a_run_reports_the_same_narrowed_or_not(tmp_path, monkeypatch, tree):
    if tree == "fork":  # the fork's own CommonAttentionMetadata: no removal to report
        _fork(tmp_path, {"vllm.v1.attention.backend"})
        (tmp_path / "vllm/v1/attention/backend.py").write_text("class CommonAttentionMetadata:\n    pass\n")
        (tmp_path / "vllm/v1/worker.py").write_text(PLUGIN_USE)
        (tmp_path / "vllm/v1/scales.py").write_text(OP_AND_READ)
    else:
        (tmp_path / "plugin").mkdir()
        (tmp_path / "plugin/__init__.py").touch()
        (tmp_path / "plugin/metadata.py").write_text(PLUGIN_USE)
        (tmp_path / "plugin/scales.py").write_text(OP_AND_READ)
        if tree == "impls":
            (tmp_path / "plugin/complete.py").write_text(COMPLETE_IMPL)
            (tmp_path / "plugin/incomplete.py").write_text(INCOMPLETE_IMPL)
        if tree == "layers":  # methods taking `output` of a layer, of a function copied onto an impl; an old op
            (tmp_path / "plugin/layer.py").write_text(LAYER)
            (tmp_path / "plugin/patched.py").write_text(PATCHED)
            (tmp_path / "plugin/ops.py").write_text(OLD_OPS)
            (tmp_path / "plugin/blocks.py").write_text(IN_A_BLOCK)  # a method defined in a block of its class
    narrowed = _findings([str(tmp_path)])
    narrowing = {rule.code for rule in NARROWING}
    for rule in NARROWING:
        monkeypatch.setattr(rule, "narrows", False)
        monkeypatch.setattr(rule, "requires", ())
    whole = _findings([str(tmp_path)])
    assert narrowed == whole
    expected = {
        "plugin": ["VAC011"] * 3,
        "fork": ["VAC011"],
        "impls": ["VAC011"] * 3 + ["VAC012", "VAC012", "VAC013"],
        "layers": ["VAC001", "VAC002", "VAC002", "VAC003", "VAC003", "VAC007", *["VAC011"] * 3, "VAC013", "VAC013"],
    }[tree]
    assert sorted(code for _, _, code, _ in narrowed if code in narrowing) == expected


def test_the_op_tokens_are_the_ops_the_manifest_removed():
    removed = {
        op.removeprefix("vllm::").encode()
        for op, history in data.load()["ops"].items()
        if any(state is None for _, state in history)
    }
    handled_elsewhere = {name.encode() for name in vac011_removed_name._HANDLED_ELSEWHERE}
    assert set(vac011_removed_name._OP_TOKENS) == removed - handled_elsewhere


_NAMES = st.sampled_from(["vllm", "v1", "attention", "backend", "x_2", "ops", "vllm_ext", "ä"])
_MODULES = st.lists(_NAMES, min_size=1, max_size=4).map(".".join)
_GAPS = st.sampled_from(["", " ", "  ", "\t", " \\\n ", "\\\n", "\\\r\n"])


@st.composite
def _import_statements(draw):
    """An import statement, with gaps (blanks, line continuations) wherever Python allows them."""

    def gap(required: bool = False) -> str:
        found = draw(_GAPS)
        return found if found.strip(" \t") or not required else found or " "

    def dotted() -> str:
        parts = draw(_MODULES).split(".")
        return "".join(part if i == 0 else f"{gap()}.{gap()}{part}" for i, part in enumerate(parts))

    if draw(st.booleans()):
        names = draw(st.lists(st.sampled_from(["a", "b as c", "d", "ä"]), min_size=1, max_size=3))
        if draw(st.booleans()):  # in brackets: across lines, with comments (which may hold a bracket)
            separator = draw(st.sampled_from([", ", ",\n    ", ",  # see f(x)\n  ", " ,\\\n"]))
            return f"from{gap(True)}{dotted()}{gap(True)}import{gap()}({separator.join(names)},\n # a comment)\n)"
        names = f",{gap()}".join(names)
        return f"from{gap(True)}{dotted()}{gap(True)}import {names}"
    aliases = [dotted() + (" as n" if draw(st.booleans()) else "") for _ in range(draw(st.integers(1, 3)))]
    return f"import{gap(True)}{f',{gap()}'.join(aliases)}"


@given(st.lists(_import_statements(), min_size=1, max_size=4), st.sampled_from(["", "    ", "try:\n    "]))
@settings(max_examples=300, deadline=None)
def test_the_imported_names_hold_every_name_ast_finds(statements, indent):
    text = "\n".join(
        (f"def f():\n    {s}" if indent == "    " else f"try:\n    {s}\nexcept ImportError:\n    pass")
        if indent
        else s + "  # import vllm.not_this"
        for s in statements
    )
    tree = ast.parse(text)
    expected = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            expected.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            expected.update(alias.name for alias in node.names)
    expected = {name for name in expected if name.startswith("vllm.")}
    assert expected <= imported_vllm_names(text.encode())
