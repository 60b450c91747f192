"""VAC003 beyond its examples."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.findings import Status

from rule_testing import assert_names_use, run, source, statuses

HEADER = """\
import torch
from vllm.v1.attention.backend import AttentionImpl


class Impl(AttentionImpl):
"""


def method(body: str) -> str:
    return HEADER + "".join("    " + line if line.strip() else line for line in source(body).splitlines(True))


def test_fallback_after_an_assert_goes_with_its_comments_moved_and_the_blank_line_kept():
    text = method(
        '''
        def forward(self, q, output=None):
            """Doc."""
            assert q is not None
            # allocate when the caller did not
            if output is None:  # old path
                output = torch.zeros(q.shape, dtype=q.dtype)

            output.copy_(q)
        '''
    )
    result = run(text, ["VAC003"])
    assert result.source.decode() == method(
        '''
        def forward(self, q, output=None):
            """Doc."""
            assert q is not None
            # allocate when the caller did not
            # old path

            output.copy_(q)
        '''
    )
    assert statuses(result) == [Status.FIXED]


def test_inline_fallback_and_new_empty():
    text = method(
        """
        def forward(self, q, output=None):
            if output is None: output = q.new_empty(q.shape)
            return output
        """
    )
    assert run(text, ["VAC003"]).source.decode() == method(
        """
        def forward(self, q, output=None):
            return output
        """
    )


def test_fallbacks_that_are_not_plain_allocations_are_reported():
    text = method(
        """
        def forward(self, q, output=None):
            x = q * 2
            if output is None:
                output = torch.empty_like(q)
            if output is None:
                output = self.make(q)
            if output is not None and q.numel():
                output.copy_(x)
            return output
        """
    )
    result = run(text, ["VAC003"])
    assert result.source.decode() == text
    assert statuses(result) == [Status.MANUAL] * 3


def test_local_variable_output_is_never_touched():
    text = method(
        """
        def decode(self, q):
            output = None
            if output is None:
                output = torch.empty_like(q)
            return output

        def forward(self, q, output=None):
            output = self.cache.get(q)
            if output is None:
                output = torch.empty_like(q)
            return output
        """
    )
    result = run(text, ["VAC003"])
    assert result.findings == [] and result.source.decode() == text


def test_only_statement_becomes_pass():
    text = method(
        """
        def forward(self, q, output=None):
            if output is None:
                output = torch.empty_like(q)
        """
    )
    assert run(text, ["VAC003"]).source.decode() == method(
        """
        def forward(self, q, output=None):
            pass
        """
    )


def test_a_method_refusing_the_buffer_is_told_it_fails_when_given_one_and_other_tests_what_to_remove():
    text = method(
        """
        def forward(self, q, output=None):
            assert output is None, "returns a new tensor"
            assert output is None or q.numel() == 0
            return q

        def decode(self, q, output=None):
            if output is not None:
                raise NotImplementedError("no output buffer")
            return q

        def prefill(self, q, output=None):
            if output is not None:
                output.copy_(q)
                return output
            return q
        """
    )
    result = run(text, ["VAC003"])
    assert [(f.line, f.status) for f in result.findings] == [
        (7, Status.MANUAL),
        (12, Status.MANUAL),
        (17, Status.MANUAL),
    ]
    refused, raising, simplified = (f.message for f in result.findings)
    assert refused.startswith("`assert output is None` fails whenever a buffer is passed, as vLLM >= 0.20 always")
    assert raising.startswith("the `raise` under `if output is not None` runs whenever a buffer is passed")
    assert "write into `output` instead" in raising
    assert simplified.endswith("remove the code that handles a missing buffer")


def test_a_refusal_counts_where_output_is_still_the_parameter():
    """An assignment after the refusal (the method's own result: ROCm's fork's dual-chunk backend) does not
    hide it; one that may run before it does (the test is then of a local)."""
    text = method(
        """
        def forward(self, q, output=None):
            assert output is None, "not supported"
            output = q * 2
            return output

        def decode(self, q, output=None):
            output = self.buffers.get(q)
            if output is not None:
                raise ValueError("busy")
            output = q
            return output
        """
    )
    result = run(text, ["VAC003"])
    assert [(f.line, f.status) for f in result.findings] == [(7, Status.MANUAL)]
    assert result.findings[0].message.startswith("`assert output is None` fails whenever a buffer is passed")


@pytest.mark.parametrize(
    ("signature", "caller", "named"),
    [
        ("output=None", "impl.forward(q)", "does not pass `output`"),
        ("output=None", "given.forward(q)", None),  # maybe another class's `forward`: the run cannot tell
        ("output=None", "impl.forward(q, output=None)", "passes `output=None`"),
        ("output: torch.Tensor", "impl.forward(q, output=None)", "passes `output=None`"),
        ("output=None", "getattr(impl, 'forward')", "hands it on"),
        ("output=None", "impl.forward(q, out)", None),
        ("output: torch.Tensor", "impl.forward(q)", None),  # raises TypeError today: no None reaches the test
    ],
)
def test_a_reported_none_test_names_the_run_s_uses_that_pass_no_buffer(signature, caller, named):
    """`output is not None` is always true for vLLM's calls, not for the run's own that pass no buffer: removing
    the code it guards breaks them (found over vllm-project/tpu-inference, whose tests call the impl without it)."""
    text = method(
        f"""
        def forward(self, q, {signature}):
            result = q * 2
            if output is not None:
                output.copy_(result)
            return result
        """
    )
    callers = f"from plugin_mod import Impl\n\n\ndef test(q, out, given):\n    impl = Impl()\n    return {caller}\n"
    [finding] = [f for f in run(text, ["VAC003"], others=[("test_impl.py", callers)]).findings if f.code == "VAC003"]
    assert finding.status is Status.MANUAL and "`output is not None` is always true" in finding.message
    assert_names_use(finding.message, "once the run's uses of the method pass one", "test_impl.py:6", named)


def test_a_fallback_opening_a_method_that_reassigns_output_later_follows_the_methods_callers():
    """The fallback tests the parameter (nothing before it assigns `output`), whatever the method assigns to the
    name afterwards: it goes while every call the run sees passes a buffer, and stays (unsafe) while one does not,
    that call named. A test further down, after such an assignment, may test the local: never touched."""
    text = method(
        """
        def forward(self, q, output=None):
            if output is None:
                output = torch.empty_like(q)
            output = output.view(-1)
            if output is None:
                raise ValueError("no buffer")
            return output
        """
    )
    result = run(text, ["VAC003"])
    assert statuses(result) == [Status.FIXED]
    assert "if output is None:\n            output = torch.empty_like(q)" not in result.source.decode()
    assert "output = output.view(-1)\n        if output is None:" in result.source.decode()
    caller = "from plugin_mod import Impl\n\n\ndef warm(q):\n    impl = Impl()\n    return impl.forward(q)\n"
    withheld = run(text, ["VAC003"], path="plugin_mod.py", others=[("caller.py", caller)])
    assert statuses(withheld) == [Status.UNSAFE_FIX_AVAILABLE] and withheld.source.decode() == text
    assert "withheld: `impl.forward(...)` at caller.py:6 does not pass `output`" in withheld.findings[0].message
    assert run(caller, ["VAC003"], path="caller.py", others=[("plugin_mod.py", text)]).findings == []


def test_a_fallback_further_down_before_any_assignment_to_output_is_reported_where_the_method_reassigns_it():
    """omni-infer's `AscendAttentionBackendImpl.forward`: `num_tokens = query.shape[0]`, then the fallback, then
    `output = output.view(...)` further on. The fallback tests the parameter: reported for a person (no fix: it is
    not the method's opening statement); it was passed over in silence."""
    text = method(
        """
        def forward(self, q, output=None):
            num_tokens = q.shape[0]
            if output is None:
                output = torch.empty(num_tokens, 4)
            if num_tokens == 0:
                return output
            output = output.view(num_tokens, -1)
            return output
        """
    )
    result = run(text, ["VAC003"])
    assert statuses(result) == [Status.MANUAL] and result.source.decode() == text
    assert result.findings[0].line == 8 and "`output is None` is never true" in result.findings[0].message
