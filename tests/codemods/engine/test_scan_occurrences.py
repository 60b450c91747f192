"""The scan confirms a token at each occurrence of its anchor, and falls back to whole-file search past a few."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.engine.scan import _OCCURRENCES_CHECKED, TokenScan

from whole_words import contains_word

TOKENS = (b"vllm.v1.attention", b"unified_attention", b"class Attention(")
PADDING = b"x = scaled_dot_product_attention(q, k, v)\n"


@pytest.mark.parametrize(
    "occurrences", [0, 1, _OCCURRENCES_CHECKED - 1, _OCCURRENCES_CHECKED, 5 * _OCCURRENCES_CHECKED]
)
@pytest.mark.parametrize("token", TOKENS)
def test_a_token_after_many_occurrences_of_its_anchor_is_found(occurrences, token):
    scan = TokenScan(TOKENS).choose_anchors()
    assert len(scan.anchors) < len(TOKENS)  # the tokens share an anchor, which PADDING holds too
    assert any(anchor in PADDING for anchor in scan.anchors)
    assert not scan(PADDING * occurrences)
    assert scan(PADDING * occurrences + token + b"\n")
    assert scan(token + PADDING * occurrences)


@pytest.mark.parametrize("occurrences", [1, _OCCURRENCES_CHECKED + 1])
def test_whole_words_after_many_occurrences_of_the_anchor(occurrences):
    names = (b"PluginImpl", b"PluginBackend")
    scan = TokenScan(names, whole_words=True).choose_anchors()
    longer = b"class MyPluginImplX: ...\n" * occurrences
    assert not scan(longer)
    assert scan(longer + b"class A(PluginBackend): ...\n")
    assert scan(longer + b"PluginImpl") == contains_word(longer + b"PluginImpl", b"PluginImpl") is True


def test_a_token_holding_its_anchor_twice():
    scan = TokenScan([b"abcdefghabcdefgh"]).choose_anchors()
    assert scan(b"abcdefgh abcdefghabcdefgh")
    assert not scan(b"abcdefgh abcdefgh")
