"""Each question a run asks of a file's bytes, made from its kind and spelled terms alone, answers as the test
it stands for; with ``once`` (a rerun asking an edited file) too. An unknown kind is said, with the known."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_attn_compat.codemods import registry
from vllm_attn_compat.codemods.engine import migrate
from vllm_attn_compat.codemods.index.calltext import holds_names, may_use, names_needles, uses_pattern
from vllm_attn_compat.codemods.index.names import BASE_TOKENS, FLAG_BYTES
from vllm_attn_compat.codemods.run import scans
from vllm_attn_compat.codemods.run.answers import spell

from whole_words import contains_word

RULES = registry.all_rules()
NAMES = ["PluginImpl", "FastBackend", "Impl"]
METHODS = ["forward", "prefill"]
pieces = st.sampled_from(
    [token for rule in RULES for token in rule.tokens] + list(BASE_TOKENS)
    + [n.encode() for n in NAMES] + [b".forward(", b'getattr(x, "prefill")', b"vllm", FLAG_BYTES]
    + [b" ", b"\n", b"_", b"x = 1", b"# c\n"]
)  # fmt: skip
sources = st.lists(pieces, max_size=8).map(b"".join)
rule_sets = st.lists(st.sampled_from(RULES), unique=True)


def _both(kind, terms):
    spelled = spell(terms)
    return scans.test(kind, spelled), scans.test(kind, spelled, once=True)


@settings(max_examples=200, deadline=None)
@given(sources, rule_sets, st.sets(st.sampled_from(NAMES)), st.sets(st.sampled_from(METHODS)))
def test_each_kind_answers_as_the_test_it_stands_for(source, rules, names, methods):
    tokens = migrate.prefilter_tokens(rules)
    expected = {
        "prefilter": (tokens, any(token in source for token in tokens)),
        "words": (names, any(contains_word(source, name.encode()) for name in names)),
        "vllm": ((), b"vllm" in source),
        "flag": ((), FLAG_BYTES in source),
        "uses": (methods, may_use(source, frozenset(methods), uses_pattern(frozenset(methods)))),
        "names": (methods, holds_names(source, names_needles(frozenset(methods)))),
        "parse": (
            [*scans.rule_terms(rules), *(f"class {name}" for name in names)],
            migrate.needs_parsing(source, rules, frozenset(names)),
        ),
        "probable": (
            scans.rule_terms(rules),
            migrate.needs_parsing(source, [r for r in rules if not r.scoped])
            or (b"vllm" in source and migrate.needs_parsing(source, rules)),
        ),
    }
    assert expected.keys() == scans.KINDS
    for kind, (terms, answer) in expected.items():
        assert [test(source) for test in _both(kind, terms)] == [answer, answer], kind


def test_an_unknown_kind_is_named_with_the_known_ones():
    with pytest.raises(scans.UnknownQuestion, match=r"'colour'.*flag, names, parse, prefilter"):
        scans.test("colour", ())
