"""The anchored literal scan answers exactly what `any(token in source)` answers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_attn_compat.codemods.engine.migrate import prefilter_groups, prefilter_tokens
from vllm_attn_compat.codemods.engine.scan import PLAIN_BYTES, GuardedScan, TokenScan, choose_anchors
from vllm_attn_compat.codemods.registry import all_rules

from whole_words import contains_word

RULE_TOKENS = prefilter_tokens(all_rules())


def test_every_token_contains_an_anchor_and_related_tokens_share_one():
    anchors = choose_anchors(RULE_TOKENS)
    assert all(any(anchor in token for anchor in anchors) for token in RULE_TOKENS)
    assert len(anchors) < len(RULE_TOKENS)


def test_short_tokens_are_their_own_anchor():
    assert choose_anchors([b"abc", b"xabcx", b"zz"]) in ((b"abc", b"zz"), (b"zz", b"abc"))


# Sources built from pieces of the real tokens, so near-misses (a token cut short) are common.
pieces = st.sampled_from(
    [t[: len(t) // 2] for t in RULE_TOKENS] + [t[len(t) // 2 :] for t in RULE_TOKENS] + list(RULE_TOKENS)
)
sources = st.lists(st.one_of(pieces, st.binary(max_size=6)), max_size=8).map(b"".join)


@settings(max_examples=150, deadline=None)
@given(sources)
def test_the_scan_agrees_with_the_naive_test(source):
    expected = any(token in source for token in RULE_TOKENS)
    assert TokenScan(RULE_TOKENS).choose_anchors()(source) == TokenScan(RULE_TOKENS)(source) == expected


def _made(tokens, way, **options):
    """A scan as it looks for its tokens: by anchors, each token (its first sources), or each token always."""
    scan = TokenScan(tokens, once=way == "once", **options)
    return scan.choose_anchors() if way == "anchored" else scan


WAYS = ["anchored", "plain", "once"]


@pytest.mark.parametrize("way", WAYS)
@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=12), min_size=1, max_size=6), st.binary(max_size=40))
def test_the_scan_agrees_for_arbitrary_tokens(way, tokens, source):
    source = source + tokens[0] if source[:1] == b"\0" else source
    assert _made(tokens, way)(source) == any(token in source for token in tokens)


@settings(max_examples=40, deadline=None)
@given(st.lists(sources, min_size=1, max_size=12))
def test_a_scan_choosing_its_anchors_midway_agrees_with_the_naive_test(batch):
    import vllm_attn_compat.codemods.engine.scan as scan_module

    saved = scan_module.PLAIN_BYTES
    scan_module.PLAIN_BYTES = 20  # a few of the generated sources, then anchors
    try:
        scan = TokenScan(RULE_TOKENS)
    finally:
        scan_module.PLAIN_BYTES = saved
    for source in batch:
        assert scan(source) == any(token in source for token in RULE_TOKENS)


def test_a_scan_chooses_anchors_once_it_has_looked_through_enough_bytes():
    # A rerun after an edit asks the rules' questions of the edited file alone: it pays for no anchors.
    scan = TokenScan(RULE_TOKENS)
    file = b"x = 1\n" * 1000
    scan(file)
    assert scan.anchors == scan.tokens
    for _ in range(PLAIN_BYTES // len(file) + 1):
        scan(file)
    assert len(scan.anchors) < len(scan.tokens)
    once = TokenScan(RULE_TOKENS, once=True)
    for _ in range(PLAIN_BYTES // len(file) + 2):
        once(file)
    assert once.anchors == once.tokens


def test_whole_words_match_identifiers_not_parts_of_longer_names():
    scan = TokenScan([b"SdpaBackend"], whole_words=True)
    assert scan(b"from plugin.sdpa import SdpaBackend\n")
    assert scan(b"class X(sdpa.SdpaBackend):\n") and scan(b"SdpaBackend")
    assert not scan(b"def setSdpaBackendsToDefault(): pass\n")
    assert not scan(b"x = SdpaBackend2\ny = _SdpaBackend\nz = \xc3\xa9SdpaBackend\n")
    assert scan(b"x = SdpaBackend2 or SdpaBackend\n")


def test_a_whole_word_ends_where_its_identifier_ends_however_its_anchor_s_window_ends():
    # Sharing the anchor `Impl`, the window around each occurrence ends where `ImplBase` would: `SdpaImpl` ends
    # before it, and what follows it there decides.
    scan = TokenScan([b"SdpaImpl", b"ImplBase"], whole_words=True).choose_anchors()
    assert len(scan.anchors) == 1
    assert not scan(b"SdpaImplBase") and not scan(b"SdpaImplB") and not scan(b"SdpaImpl_x = ImplBases")
    assert scan(b"SdpaImplB = SdpaImpl\n") and scan(b"x.ImplBase(") and scan(b"SdpaImpl")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([b"Impl", b"Base", b"_", b" ", b"(", b".", b"x", b"\n", b"\xc3\xa9"]), max_size=10))
def test_whole_words_agree_with_a_tokenizing_definition(parts):
    import re

    source = b"".join(parts)
    words = set(re.findall(rb"[A-Za-z0-9_\x80-\xff]+", source))
    assert TokenScan([b"Impl", b"ImplBase"], whole_words=True)(source) == bool({b"Impl", b"ImplBase"} & words)


# Class names made of a few CamelCase words, many sharing a word (so several share one short anchor).
WORDS = [b"Sdpa", b"Plugin", b"Impl", b"Backend", b"Flash", b"Attention", b"Mla", b"X2"]
names = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(b"".join)
texts = st.lists(st.one_of(st.sampled_from([*WORDS, b"_", b" ", b"(", b".", b"\n", b"\xc3\xa9"]), names), max_size=12)


@pytest.mark.parametrize("way", WAYS)
@settings(max_examples=200, deadline=None)
@given(st.lists(names, min_size=1, max_size=12), texts.map(b"".join))
def test_whole_words_sharing_short_anchors_agree_with_the_definition(way, tokens, source):
    scan = _made(tokens, way, whole_words=True)
    assert scan(source) == any(contains_word(source, token) for token in tokens)


def test_whole_words_must_be_identifiers():
    with pytest.raises(ValueError, match="whole words must be identifiers"):
        TokenScan([b"class A("], whole_words=True)


def test_class_names_share_a_capitalized_word_as_their_anchor():
    scan = TokenScan([b"PluginBackend", b"PluginImpl", b"LoggingAttention"], whole_words=True).choose_anchors()
    assert len(scan.anchors) == 2 and b"Plugin" in scan.anchors
    prefilter = TokenScan(RULE_TOKENS).choose_anchors()
    assert all(len(anchor) >= 8 for anchor in prefilter.anchors)  # the prefilter's stay long


PLAIN, GUARDED = prefilter_groups(all_rules())
guarded_pieces = st.sampled_from(
    [b"vllm", b"vll", *PLAIN[:8], *(t for _, tokens in GUARDED for t in tokens), *(t[:-1] for t in PLAIN[:8])]
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(guarded_pieces, st.binary(max_size=4)), max_size=8).map(b"".join))
def test_the_guarded_scan_agrees_with_the_naive_test(source):
    naive = any(token in source for token in PLAIN) or any(
        any(token in source for token in required) and any(token in source for token in tokens)
        for required, tokens in GUARDED
    )
    assert GuardedScan(PLAIN, GUARDED)(source) == naive


def test_a_rule_requiring_more_than_its_tokens_reports_only_where_it_is():
    """Every example of such a rule that it changes or reports holds its requirement (`Rule.requires`), and
    the prefilter keeps it; without its requirement, the same text holds nothing for the rule."""
    from rule_testing import run

    requiring = [rule for rule in all_rules() if rule.requires]
    assert requiring and GUARDED
    for rule in requiring:
        for example in rule.examples:
            text = example.source().encode()
            if example.findings or example.expected(unsafe=True) != example.source():
                assert any(token in text for token in rule.requires), (rule.code, example.title)
                assert GuardedScan(PLAIN, GUARDED)(text)
                for token in rule.requires:
                    text = text.replace(token, b"other")
                result = run(text, [rule.code], target=example.release())
                assert result.findings == [] and result.source == text, (rule.code, example.title)
