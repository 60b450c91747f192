"""Whether libcst must see a file, in terms of the rules' tokens, against the definition rule by rule: some
rule has one of its own tokens in the file and, if it acts only in attention code, a scope token or an
attention class's name is there too."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_attn_compat.codemods import registry
from vllm_attn_compat.codemods.engine.tokens import needs_libcst, own_tokens, probably_libcst
from vllm_attn_compat.codemods.index.names import BASE_TOKENS

RULES = registry.all_rules()
NAMES = ("PluginImpl", "FastBackend")
pieces = st.sampled_from(
    [token for rule in RULES for token in rule.tokens] + list(BASE_TOKENS) + [n.encode() for n in NAMES]
    + [b"vllm", b"output", b" ", b"\n", b"x = 1"]
)  # fmt: skip
sources = st.lists(pieces, max_size=6).map(b"".join)
subsets = st.lists(st.sampled_from(RULES), unique=True).map(lambda rules: sorted(rules, key=lambda r: r.code))


def _by_rule(source: bytes, rules, names) -> bool:
    """The definition: some rule has its own token and, if scoped, a scope token or a class name."""
    in_scope = any(token in source for token in BASE_TOKENS) or any(name.encode() in source for name in names)
    return any(any(t in source for t in rule.tokens) and (not rule.scoped or in_scope) for rule in rules)


@settings(max_examples=300, deadline=None)
@given(sources, subsets, st.sets(st.sampled_from(NAMES)))
def test_needs_libcst_is_the_rules_definition(source, rules, names):
    anywhere, scoped = own_tokens(rules, scoped=False), own_tokens(rules, scoped=True)
    assert needs_libcst(source, anywhere, scoped, names) == _by_rule(source, rules, names)


@settings(max_examples=300, deadline=None)
@given(sources, subsets)
def test_probably_libcst_asks_scoped_rules_for_vllm_too(source, rules):
    unscoped = [rule for rule in rules if not rule.scoped]
    expected = _by_rule(source, unscoped, ()) or (b"vllm" in source and _by_rule(source, rules, ()))
    assert probably_libcst(source, own_tokens(rules, scoped=False), own_tokens(rules, scoped=True)) == expected


def test_the_tokens_are_split_by_where_their_rules_act():
    scoped = own_tokens(RULES, scoped=True)
    anywhere = own_tokens(RULES, scoped=False)
    assert b"output is not None" in scoped and b"unified_attention" in anywhere
    assert {token for rule in RULES for token in rule.tokens} == set(scoped) | set(anywhere)
