"""docs/rules.md is generated from the rules' examples and must match them."""

from __future__ import annotations

from pathlib import Path

from vllm_attn_compat.codemods.engine.docs import render_rule, render_rules
from vllm_attn_compat.codemods.registry import all_rules

DOC = Path(__file__).resolve().parents[3] / "docs" / "rules.md"


def test_committed_rules_doc_is_up_to_date():
    assert DOC.read_text(encoding="utf-8") == render_rules(all_rules()), (
        "docs/rules.md is stale: run python scripts/generate_rules_doc.py"
    )


def test_explain_shows_the_rule_and_its_examples():
    for rule in all_rules():
        text = render_rule(rule)
        assert text.startswith(f"## {rule.code} `{rule.name}`")
        assert rule.summary in text
        for example in rule.examples:
            assert example.title in text
            assert example.source().strip() in text
