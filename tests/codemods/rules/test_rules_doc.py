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


ATTENTION_API = Path(__file__).resolve().parents[3] / "docs" / "attention-api.md"


def test_the_attention_api_page_names_a_rule_for_what_the_rule_looks_for():
    """docs/attention-api.md (generated with the manifest) says which rule handles each change: a hook it names
    VAC010's is one VAC010 looks for, a removed name VAC011's one VAC011 looks for, a signature VAC012's one VAC012
    compares."""
    from vllm_attn_compat.codemods.registry import select_rules

    looked_for = {rule.code: {t.decode().lstrip(".") for t in rule.tokens} for rule in select_rules(["VAC01"])}
    looked_for["VAC010"].add("accept_output_buffer")  # VAC004's, named with it
    looked_for["VAC011"] |= {"accept_output_buffer", "unified_attention", "unified_mla_attention"}  # and VAC007's
    checked = 0
    for line in ATTENTION_API.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`"):
            continue
        change, where, details, rule = cells
        name = where.strip("`").rpartition(".")[2].removeprefix("vllm::")
        if details == "module":  # a whole module: its names are listed with it
            continue
        for code in ("VAC010", "VAC011", "VAC012"):
            if code in rule and change in ("removed", "no longer called", "signature changed"):
                assert name in looked_for[code], (code, line)
                checked += 1
    assert checked > 20
