"""VAC009 beyond its examples: what counts as replacing the buffer, and where vLLM passes one."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.findings import Status

from rule_testing import run, source

HEADER = """\
import torch
from vllm.v1.attention.backend import AttentionImpl, MLAAttentionImpl
from vllm.model_executor.layers.attention import Attention, MLAAttention
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase


class Impl({base}):
    def {name}(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
"""


def _method(body: str, name: str = "forward", base: str = "AttentionImpl") -> str:
    lines = source(body).splitlines(keepends=True)
    indented = "".join(("        " + line) if line.strip() else line for line in lines)
    return HEADER.format(name=name, base=base) + indented


def _reported(text: str) -> list[int]:
    findings = run(text, ["VAC009"]).findings
    assert all(f.code == "VAC009" and f.status is Status.MANUAL for f in findings)
    return [f.line for f in findings]


FIRST = 9  # the first line of the method's body in `_method`


@pytest.mark.parametrize(
    ("body", "line"),
    [
        ("output = torch.empty_like(query)\nreturn output\n", FIRST),
        ('"""Docstring."""\noutput: torch.Tensor = self.kernel(query)\nreturn output\n', FIRST + 1),
        ("n = query.shape[0]; output = query[:n].clone()\nreturn output\n", FIRST),
        ("output, lse = self.kernel(query)\nreturn output\n", FIRST),
        ("self.output = query\noutput = self.run(query, out=None)\nreturn output\n", FIRST + 1),
        ("self.run(query, output=None)\noutput = query * 2\nreturn output\n", FIRST + 1),
        # Written into or read first: the buffer is used.
        ("output[:] = query\noutput = output.view(-1)\nreturn output\n", None),
        ("output.copy_(query)\noutput = query\nreturn output\n", None),
        ("output = output.view(-1)\nreturn output\n", None),
        ("output += query\nreturn output\n", None),
        ("output[0], lse = self.kernel(query)\nreturn output\n", None),
        ("self.run(query, output)\noutput = query\nreturn output\n", None),
        # Under a condition, or named first by a nested function: left alone.
        ("if attn_metadata is None:\n    output = query\nreturn output\n", None),
        ("def write():\n    output.copy_(query)\nwrite()\noutput = query\nreturn output\n", None),
        # Statements that cannot write into the buffer are passed over: the replacement after them is reported.
        ("if output is None:\n    output = torch.empty_like(query)\noutput = self.kernel(query)\n", FIRST + 2),
        ("assert output is not None\noutput = self.kernel(query)\nreturn output\n", FIRST + 1),
        ("if kv_cache is None:\n    return output\noutput = self.kernel(query)\nreturn output\n", FIRST + 2),
        ("if attn_metadata is None:\n    output = query\noutput = self.kernel(query)\n", FIRST + 2),
        ("if kv_cache is None:\n    return output.fill_(0)\noutput = self.kernel(query)\n", None),  # writes
        ("if kv_cache is None:\n    self.run(output)\noutput = self.kernel(query)\n", None),  # may write
        ("if kv_cache is None:\n    return output, None\noutput = self.kernel(query)\n", None),
        ("if kv_cache is None:\n    f = lambda: output\noutput = self.kernel(query)\n", None),
        # A method given a buffer stops first: nothing is lost silently.
        ("assert output is None\noutput = torch.empty_like(query)\nreturn output\n", None),
        ("if output is not None:\n    raise ValueError('no buffer')\noutput = self.kernel(query)\n", None),
        ("if output is not None:\n    return self.legacy(query, output)\noutput = self.kernel(query)\n", None),
        ("if output is not None:\n    self.log()\noutput = self.kernel(query)\n", FIRST + 2),
        # Every branch replaces it: the `if` does.
        ("if attn_metadata.prefill:\n    output = self.a(query)\nelse:\n    output = self.b(query)\n", FIRST),
        ("if a:\n    output = self.a(query)\nelif b:\n    output = self.b(query)\nelse:\n    output = query\n", FIRST),
        ("if a:\n    output = self.a(query)\nelif b:\n    output = self.b(query)\nreturn output\n", None),
        ("if a:\n    output = self.a(query)\nelse:\n    output[:] = query\nreturn output\n", None),
        ("if a:\n    output = self.a(query)\nelse:\n    self.b(query, output)\nreturn output\n", None),
        ("if a:\n    output = self.a(query)\nelse:\n    return query\nreturn output\n", None),
    ],
)
def test_the_first_statement_naming_output_replacing_it_is_reported(body, line):
    assert _reported(_method(body)) == ([] if line is None else [line])


@pytest.mark.parametrize(
    ("body", "reported"),
    [
        ("return self.kernel(query)\n", True),
        ("self.impl.forward(layer, query, key, value, kv_cache, attn_metadata)\n", True),
        ("return self.run(query, out=self.output)\n", True),
        ('"""Abstract."""\n...\n', False),
        ("pass\n", False),
        ('raise NotImplementedError("subclasses compute")\n', False),
        ("return self.kernel(query, output)\n", False),
        ("write = lambda: output.copy_(query)\nwrite()\n", False),
    ],
)
def test_a_method_that_never_names_output_is_reported_at_the_parameter_unless_it_computes_nothing(body, reported):
    text = _method(body)
    line = FIRST - 1  # the parameter, on the `def` line
    assert _reported(text) == ([line] if reported else [])


def test_an_abstract_method_is_left_alone():
    text = _method("return query\n").replace("    def forward", "    @abc.abstractmethod\n    def forward")
    assert _reported("import abc\n" + text) == []


@pytest.mark.parametrize(
    ("name", "base", "reported"),
    [
        ("forward", "AttentionImpl", True),
        ("forward_mha", "MLAAttentionImpl", True),
        ("forward_impl", "MLAAttention", True),  # called by vLLM's MLA op with the buffer
        ("forward_impl", "Attention", False),  # vLLM calls no other layer's: the plugin's own code does
        ("forward_impl", "AttentionLayerBase", False),
        ("forward_impl", "AttentionImpl", False),  # an impl's helper of that name: vLLM calls the layer's
        ("forward", "Attention", False),  # a layer's forward: vLLM calls it as layer(q, k, v), without output
        ("_forward_decode", "AttentionImpl", False),  # a helper: its callers may use what it returns
        ("forward", "object", False),  # no attention class
    ],
)
def test_only_the_methods_vllm_gives_the_buffer_are_looked_at(name, base, reported):
    text = _method("output = torch.empty_like(query)\nreturn output\n", name=name, base=base)
    assert _reported(text) == ([FIRST] if reported else [])


def test_the_report_outlives_the_flag_the_unsafe_fix_deletes():
    """A return-value backend: `--unsafe-fixes` deletes its `accept_output_buffer = False` (VAC004) with the adapter
    around its impl; VAC009 still names the statement that loses the result, which the source still does."""
    text = source(
        """
        import torch
        from vllm.attention.backends.abstract import AttentionBackend, AttentionImpl


        class Backend(AttentionBackend):
            accept_output_buffer = False

            @staticmethod
            def get_impl_cls():
                return Impl


        class Impl(AttentionImpl):
            def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                output = torch.empty_like(query)
                return output
        """
    )
    migrated = run(text, ["VAC004", "VAC009"], unsafe=True)
    assert b"accept_output_buffer" not in migrated.source
    again = run(migrated.source, ["VAC004", "VAC009"], unsafe=True)
    line = migrated.source.decode().splitlines().index("        output = torch.empty_like(query)") + 1
    assert [(f.code, f.line) for f in again.findings] == [("VAC009", line)]
