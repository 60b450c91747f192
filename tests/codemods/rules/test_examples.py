"""Every example a rule declares is a test: its source, fixed and unfixed, must come out as the
example says, with the findings it lists. The same examples are the rules' documentation."""

from __future__ import annotations

import ast

import pytest

from vllm_attn_compat.codemods.registry import all_rules

from rule_testing import run, statuses

CASES = [
    pytest.param(rule, example, id=f"{rule.code}-{index}")
    for rule in all_rules()
    for index, example in enumerate(rule.examples)
]


@pytest.mark.parametrize(("rule", "example"), CASES)
@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
def test_example(rule, example, unsafe):
    result = run(example.source(), [rule.code], unsafe=unsafe, path="example.py")
    expected = example.expected(unsafe=unsafe)
    assert result.source.decode() == expected
    ast.parse(expected)
    assert [f.code for f in result.findings] == [rule.code] * len(result.findings)
    expected_statuses = [
        s if not (unsafe and s.value == "unsafe-fix-available") else type(s)("fixed") for s in example.findings
    ]
    assert statuses(result) == expected_statuses


def test_every_rule_has_a_changing_and_an_unchanged_example():
    for rule in all_rules():
        assert any(e.expected(unsafe=True) != e.source() or e.findings for e in rule.examples), rule.code
        assert any(e.after is None and e.unsafe_after is None and not e.findings for e in rule.examples), rule.code


def test_unchanged_examples_come_out_byte_identical():
    for rule in all_rules():
        for example in rule.examples:
            if example.after is None and example.unsafe_after is None:
                for unsafe in (False, True):
                    assert run(example.source(), [rule.code], unsafe=unsafe, path="example.py").source == (
                        example.source().encode()
                    )
