"""Every finding's message is one short line: what, where, and what withheld its fix (#53 item 6); the detail is in
`vllm-attn-compat rules CODE`, the rule's documentation."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.registry import all_rules

from rule_testing import run

# What a message says before the clause naming what withheld its fix, and that clause (a path and the use's text).
_SAID = 200
_WITHHELD = 220


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.code)
def test_every_message_of_a_rule_s_examples_is_one_short_line(rule):
    for example in rule.examples:
        for unsafe in (False, True):
            for finding in run(example.source(), [rule.code], unsafe=unsafe, target=example.release()).findings:
                # (an unsafe fix taken names the same use: "taken with --unsafe-fixes, though ...")
                taken = "; taken with --unsafe-fixes, though "
                clause = taken if taken in finding.message else "; withheld: "
                said, _, withheld = finding.message.partition(clause)
                assert "\n" not in finding.message, finding.message
                assert len(said) <= _SAID and len(withheld) <= _WITHHELD, (len(said), len(withheld), finding.message)
