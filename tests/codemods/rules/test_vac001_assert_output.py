"""VAC001 beyond its examples: formatting, comments, scope, the calls that withhold it."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.findings import Status

import rule_testing
from rule_testing import run, source, statuses


def fixed(text: str, select=("VAC001",)) -> str:
    return rule_testing.fixed(text, select)


HEADER = """\
from vllm.v1.attention.backend import AttentionImpl


class Impl(AttentionImpl):
"""


def _method(body: str) -> str:
    lines = source(body).splitlines(keepends=True)
    return HEADER + "".join(("    " + line) if line.strip() else line for line in lines)


def test_multi_line_assert_with_message_goes_with_its_comments_kept():
    result = fixed(
        _method(
            """
            def forward(self, layer, q, k, v, cache, meta, output=None):
                x = q + 1

                # the caller always passes it
                assert (
                    output is not None  # checked upstream
                ), (
                    "Output tensor must be provided."
                )

                return x
            """
        ),
        ["VAC001"],
    )
    assert result == _method(
        """
        def forward(self, layer, q, k, v, cache, meta, output=None):
            x = q + 1

            # the caller always passes it
            # checked upstream

            return x
        """
    )


def test_first_statement_takes_the_blank_lines_after_it():
    result = fixed(
        _method(
            """
            def forward(self, q, output=None):
                assert output is not None

                return q
            """
        )
    )
    assert result == _method(
        """
        def forward(self, q, output=None):
            return q
        """
    )


def test_after_docstring_keeps_the_docstring_separation():
    result = fixed(
        _method(
            '''
            def forward(self, q, output=None):
                """Doc."""

                assert output is not None

                return q
            '''
        )
    )
    assert result == _method(
        '''
        def forward(self, q, output=None):
            """Doc."""

            return q
        '''
    )


def test_middle_removal_never_doubles_a_blank_line():
    result = fixed(
        _method(
            """
            def forward(self, q, output=None):
                q = q * 2

                assert output is not None

                return q
            """
        )
    )
    assert result == _method(
        """
        def forward(self, q, output=None):
            q = q * 2

            return q
        """
    )


def test_only_statement_becomes_pass_and_keeps_the_comment_above():
    result = fixed(
        _method(
            """
            def forward(self, q, output=None):
                # must be given
                assert output is not None  # always
            """
        )
    )
    assert result == _method(
        """
        def forward(self, q, output=None):
            # must be given
            # always
            pass
        """
    )


def test_last_statement_comments_go_to_the_block_footer():
    result = fixed(
        _method(
            """
            def forward(self, q, output=None):
                output.copy_(q)
                # why
                assert output is not None

            def other(self):
                pass
            """
        )
    )
    assert result == _method(
        """
        def forward(self, q, output=None):
            output.copy_(q)
            # why

        def other(self):
            pass
        """
    )


def test_semicolon_line_and_inline_suite():
    result = fixed(
        _method(
            """
            def forward(self, q, output=None):
                assert output is not None; output.copy_(q)
                if q is None: assert output is not None
                output.copy_(q); assert output is not None
            """
        )
    )
    assert result == _method(
        """
        def forward(self, q, output=None):
            output.copy_(q)
            if q is None: pass
            output.copy_(q)
        """
    )


def test_crlf_source_keeps_crlf():
    text = _method(
        """
        def forward(self, q, output=None):
            assert output is not None

            return q
        """
    ).replace("\n", "\r\n")
    result = run(text.encode(), ["VAC001"])
    assert (
        result.source
        == _method(
            """
        def forward(self, q, output=None):
            return q
        """
        )
        .replace("\n", "\r\n")
        .encode()
    )


def test_noqa_suppresses_the_finding_and_the_fix():
    text = _method(
        """
        def forward(self, q, output=None):
            assert output is not None  # noqa: VAC001
            assert output is not None  # noqa
            assert output is not None  # noqa: VAC004
            return q
        """
    )
    result = run(text, ["VAC001"])
    assert statuses(result) == [Status.SUPPRESSED, Status.SUPPRESSED, Status.FIXED]
    assert result.source.decode().count("assert output is not None") == 2


def test_local_variable_reassigned_parameter_and_nested_function_stay():
    text = _method(
        """
        def forward(self, q, output=None):
            output = self.compute(q)
            assert output is not None
            return output

        def decode(self, q):
            output = q
            assert output is not None

        def prefill(self, q, output=None):
            def inner(output):
                assert output is not None
            return inner
        """
    )
    result = run(text, ["VAC001"])
    assert result.findings == []
    assert result.source.decode() == text


def test_outside_attention_classes_nothing_happens():
    text = source(
        """
        from mylib.attention import AttentionImpl


        class Impl(AttentionImpl):
            def forward(self, q, output=None):
                assert output is not None


        def forward(q, output=None):
            assert output is not None
        """
    )
    result = run(text, ["VAC001"])
    assert result.findings == [] and result.source.decode() == text


def test_nested_class_in_a_factory_function():
    text = source(
        """
        from vllm.v1.attention.backend import AttentionImpl


        def make_impl():
            class Base(AttentionImpl):
                pass

            class Impl(Base):
                def forward(self, q, output=None):
                    assert output is not None
                    return q

            return Impl
        """
    )
    assert "assert" not in fixed(text, ["VAC001"])


def test_hierarchy_over_three_files():
    base = """
        from vllm.model_executor.layers.attention import Attention
        from vllm.v1.attention.backend import AttentionImpl as _Impl


        class PluginImplBase(_Impl):
            pass
    """
    middle = """
        from plugin.base import PluginImplBase


        class TiledImpl(PluginImplBase):
            pass
    """
    leaf = """
        from .tiled import TiledImpl


        class FastImpl(TiledImpl):
            def forward(self, q, output=None):
                assert output is not None
                return q
    """
    result = run(
        leaf, ["VAC001"], path="plugin/fast.py", others=[("plugin/base.py", base), ("plugin/tiled.py", middle)]
    )
    assert statuses(result) == [Status.FIXED]
    unrelated = run(leaf, ["VAC001"], path="plugin/fast.py", others=[("plugin/tiled.py", middle)])
    assert unrelated.findings == []


def test_noqa_on_any_line_of_a_multi_line_assert():
    text = _method(
        """
        def forward(self, q, output=None):
            assert (
                output is not None
            ), "needed"  # noqa: VAC001
            return q
        """
    )
    result = run(text, ["VAC001"])
    assert statuses(result) == [Status.SUPPRESSED] and result.source.decode() == text


# Where `output` may be reassigned before the assert (the assert then tests a local value): kept.
_REASSIGNED_FIRST = {
    "in an earlier iteration of the loop": """
        def forward(self, q, output=None):
            for chunk in q:
                assert output is not None
                output = output[1:]
        """,
    "by the loop's own target": """
        def forward(self, q, output=None):
            for output in q:
                assert output is not None
        """,
    "in the try body, before a handler": """
        def forward(self, q, output=None):
            try:
                output = self.kernel(q)
            except RuntimeError:
                assert output is not None
        """,
    "by a with statement": """
        def forward(self, q, output=None):
            with self.buffer() as output:
                assert output is not None
        """,
    "in a branch that may have run": """
        def forward(self, q, output=None):
            if q.numel():
                output = q
            assert output is not None
        """,
    "by a walrus in the test of the enclosing if": """
        def forward(self, q, output=None):
            if (output := self.kernel(q)) is q:
                assert output is not None
        """,
}

# Where every reassignment comes after the assert, or on a path that cannot precede it: removed.
_PARAMETER_AT_THE_ASSERT = {
    "reassigned after it": """
        def forward(self, q, output=None):
            assert output is not None
            output = output[: q.shape[0]]
        """,
    "reassigned in the other branch": """
        def forward(self, q, output=None):
            if q.numel():
                output = q
            else:
                assert output is not None
        """,
    "reassigned in another handler": """
        def forward(self, q, output=None):
            try:
                q = q + 1
            except ValueError:
                output = q
            except RuntimeError:
                assert output is not None
        """,
    "inside a loop that reassigns only after it ends": """
        def forward(self, q, output=None):
            for chunk in q:
                assert output is not None
                chunk.add_(1)
            output = output[1:]
        """,
    "after a fallback under `if output is None`": """
        def forward(self, q, output=None):
            if output is None:
                output = q.new_empty(q.shape)
            assert output is not None
        """,
}


def test_reassigned_before_the_assert_on_some_path_keeps_it():
    for case, body in _REASSIGNED_FIRST.items():
        text = _method(body)
        result = run(text, ["VAC001"])
        assert (result.findings, result.source.decode()) == ([], text), case


def test_parameter_still_unchanged_at_the_assert_loses_it():
    for case, body in _PARAMETER_AT_THE_ASSERT.items():
        text = _method(body)
        result = run(text, ["VAC001"])
        assert statuses(result) == [Status.FIXED], case
        assert "assert output is not None" not in result.source.decode(), case


def test_a_forks_mla_layer_loses_the_assert_upstream_deleted(tmp_path):
    """vLLM's own `MLAAttention.forward_impl` (0.19.1, and 0.20.0 still carried it): the assert opens the
    method, the parameter is sliced later, as in the real source."""
    text = source(
        """
        import torch.nn as nn

        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase


        class MLAAttention(nn.Module, AttentionLayerBase):
            def forward_impl(self, q, k_c_normed, k_pe, kv_cache, attn_metadata, output=None):
                assert output is not None, "Output tensor must be provided."

                num_actual_toks = attn_metadata.num_actual_tokens

                # Inputs and outputs may be padded for CUDA graphs
                output_padded = output
                output = output[:num_actual_toks, ...]
                return output_padded
        """
    )
    path = tmp_path / "vllm" / "model_executor" / "layers" / "attention" / "mla_attention.py"
    path.parent.mkdir(parents=True)
    for folder in (path.parent, *path.parent.parents[:3]):
        (folder / "__init__.py").touch()
    result = run(text, ["VAC001"], path=str(path))
    assert statuses(result) == [Status.FIXED]
    assert result.source.decode() == text.replace(
        '        assert output is not None, "Output tensor must be provided."\n\n', ""
    )


ASSERTING = """\
from vllm.v1.attention.backend import AttentionImpl


class MyImpl(AttentionImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        assert output is not None
        output.copy_(query)
        return output
"""


@pytest.mark.parametrize(
    "call",
    [
        "impl.forward(a, a, a, a, a, a, output=None)",
        "impl.forward(a, a, a, a, a, a, None)",
        "impl.forward(a, a, a, a, a, a)",  # `output` defaults to None
        "impl.forward(*a)",  # may lack `output`, as for VAC002
    ],
)
def test_a_call_seen_passing_none_withholds_the_deletion_and_is_named_there(call):
    """Such a call fails at the assert today; without it, it would run on (a test may expect the AssertionError). The
    withheld fix's finding names the call; the call is no finding of its own (#50)."""
    caller = f"def f(impl, a):\n    return {call}\n"
    result = run(ASSERTING, ["VAC001"], others=[("caller.py", caller)])
    assert [(f.code, f.status) for f in result.findings] == [("VAC001", Status.UNSAFE_FIX_AVAILABLE)]
    assert "caller.py:2" in result.findings[0].message
    assert run(caller, ["VAC001"], path="caller.py", others=[("plugin_mod.py", ASSERTING)]).findings == []


@pytest.mark.parametrize(
    "caller",
    [
        "def f(impl, a, out):\n    return impl.forward(a, a, a, a, a, a, output=out)\n",
        "def f(impl, args, out):\n    return impl.forward(*args, output=out)\n",
    ],
)
def test_calls_passing_the_buffer_leave_the_deletion_safe(caller):
    result = run(ASSERTING, ["VAC001"], others=[("caller.py", caller)])
    assert statuses(result) == [Status.FIXED]


@pytest.mark.parametrize(
    "caller",
    [
        "import inspect\nfrom plugin_mod import MyImpl\n\nSIGNATURE = inspect.signature(MyImpl.forward)\n",
        "from inspect import getfullargspec\n\ndef f(impl):\n    return getfullargspec(impl.forward).args\n",
    ],
)
def test_reading_the_signature_never_calls_the_method_so_the_deletion_stays_safe(caller):
    result = run(ASSERTING, ["VAC001"], others=[("caller.py", caller)])
    assert statuses(result) == [Status.FIXED]


def test_omitting_a_required_output_withholds_nothing():
    required = ASSERTING.replace("output=None", "output")
    result = run(
        required, ["VAC001"], others=[("caller.py", "def f(impl, a):\n    return impl.forward(a, a, a, a, a, a)\n")]
    )
    assert statuses(result) == [Status.FIXED]  # the call raises TypeError before reaching the assert


def test_a_use_withholding_both_fixes_is_named_by_both_and_a_noqa_there_releases_neither():
    caller = "def f(impl, a):\n    return impl.forward(a, a, a, a, a, a)  # noqa: VAC002\n"
    assert run(caller, ["VAC001", "VAC002"], path="caller.py", others=[("plugin_mod.py", ASSERTING)]).findings == []
    result = run(ASSERTING, ["VAC001", "VAC002"], others=[("caller.py", caller)])
    assert statuses(result) == [Status.UNSAFE_FIX_AVAILABLE, Status.UNSAFE_FIX_AVAILABLE]
    assert all("caller.py:2" in finding.message for finding in result.findings)
