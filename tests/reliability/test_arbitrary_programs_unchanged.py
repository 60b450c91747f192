"""Arbitrary Python programs (hypothesmith) carry no old-API attention code: the tool changes nothing,
byte for byte, whether they are seen alone, inside an attention class's method, or through the CLI."""

from __future__ import annotations

import ast
import textwrap
import warnings
from pathlib import Path

import hypothesmith
from hypothesis import assume, given
from hypothesis import strategies as st

from vllm_attn_compat.codemods.engine.migrate import ParseError

from .cli_run import run_cli, snapshot
from .engine_api import Status, migrate
from .profile import reliability_settings

ATTENTION_CLASS = """from vllm.v1.attention.backend import AttentionImpl
import torch


class GeneratedImpl(AttentionImpl):
    def __init__(self, *args, **kwargs):
        pass

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output: torch.Tensor, output_scale=None,
                output_block_scale=None):
{body}
        return output
"""


def _valid(source: str) -> bytes | None:
    try:
        data = source.encode("utf-8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            ast.parse(data)
    except (SyntaxError, UnicodeEncodeError, ValueError, MemoryError, RecursionError):
        return None
    return data


def _unchanged(source: bytes) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # generated code like `1()`: the engine's ast pass warns
        try:
            result = migrate(source)
        except ParseError as error:
            # Valid Python libcst cannot parse (a line continuation before a lone CRLF): left as it is, and said so.
            assert "Python accepts this file" in error.message
            return
    assert result.source == source, "an arbitrary program was changed"
    assert not [f for f in result.findings if f.status is Status.FIXED]
    assert not result.removed_comments


@reliability_settings(ci=30, long=3000)
@given(program=hypothesmith.from_grammar())
def test_generated_programs_come_out_byte_identical(program: str) -> None:
    source = _valid(program)
    assume(source is not None)
    _unchanged(source)


@reliability_settings(ci=8, long=300)
@given(program=hypothesmith.from_node())
def test_generated_syntax_trees_come_out_byte_identical(program: str) -> None:
    """from_node writes programs from libcst's own node types: more realistic statements, slower to draw."""
    source = _valid(program)
    assume(source is not None)
    _unchanged(source)


@reliability_settings(ci=30, long=1500)
@given(program=hypothesmith.from_grammar(), crlf=st.booleans())
def test_generated_statements_inside_an_attention_method_come_out_byte_identical(program: str, crlf: bool) -> None:
    assume("output" not in program)  # a statement of its own about `output` could be old-API code
    body = textwrap.indent(program if program.strip() else "pass\n", " " * 8)
    source = _valid(ATTENTION_CLASS.format(body=body.rstrip("\n")))
    assume(source is not None)
    if crlf:
        source = source.replace(b"\n", b"\r\n")
        assume(_valid(source.decode()) is not None)
    _unchanged(source)


@reliability_settings(ci=1, long=30)
@given(programs=st.lists(hypothesmith.from_grammar(), min_size=8, max_size=12))
def test_generated_programs_through_the_cli(programs: list[str], tmp_path_factory) -> None:
    tree: Path = tmp_path_factory.mktemp("programs")
    sources = [s for s in map(_valid, programs) if s is not None]
    # Each program also gets a vLLM base import so the prefilter cannot skip it unparsed.
    header = b"from vllm.v1.attention.backend import AttentionImpl  # AttentionImpl accept_output_buffer\n"
    for i, source in enumerate(sources):
        (tree / f"program_{i}.py").write_bytes(header + source)
    before = snapshot(tree)
    result = run_cli("migrate", ".", "--jobs", "2", cwd=tree)
    assert result.returncode == 0, (result.stdout + result.stderr).decode(errors="replace")
    assert snapshot(tree) == before
