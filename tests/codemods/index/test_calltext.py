"""Reading calls without parsing: whether a file may use a method, checked against the exact index
(`index_module`), which records every use the call-site analysis follows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_attn_compat.codemods.index.calltext import holds_names, may_use, names_needles, uses_pattern
from vllm_attn_compat.codemods.index.hierarchy import index_module
from vllm_attn_compat.codemods.index.occurrences import REFLECTION_WORDS


@pytest.mark.parametrize(
    ("text", "uses"),
    [
        ("impl.prefill(q)", True),
        ("(impl.  # warm-up\n    prefill)(q)", True),
        ("impl.\\\n    prefill", True),
        ("f = impl.prefill", True),
        ('getattr(impl, "prefill")', True),
        ("getattr(impl, 'prefill', None)", True),
        ('getattr(impl, """prefill""")', True),
        ('getattr(impl, "pre" "fill")', True),  # one constant string to the parser
        ('getattr(impl, ("pre"\n    "fill"))', True),
        ('getattr(impl, "pre\\x66ill")', True),  # an escape: counted, not decoded
        ('getattr(impl, "x"', True),  # no end: counted
        ("def prefill(self, q):\n    return q\n", False),  # a definition is no use
        ('getattr(impl, "other")\n# prefill\nx = "prefill"', False),  # words elsewhere
        ("impl.prefill_all(q)", False),
    ],
)
def test_may_use_finds_every_use_the_call_site_index_records(text, uses):
    names = frozenset({"prefill", "forward"})
    assert may_use(text.encode(), names, uses_pattern(names)) is uses
    if not uses:  # and indeed the exact index records none
        assert not {use.name for use in index_module(text.encode(), "m.py").calls.uses} & names


@pytest.mark.parametrize(
    ("text", "holds"),
    [
        ("impl.prefill(q)", True),
        ('getattr(impl, "pre" "fill")', True),  # `getattr` is looked for too, while a fix of a class is open
        ("impl.\uff50refill(q)", True),  # the parser reads identifiers in their NFKC form: `prefill`
        ("def prefill(self, q):\n    return q\n", True),  # a definition: the parse tells it is no use
        ("# prefill", True),  # likewise a comment
        ("impl.prefill_all(q)", False),
        ("x = 'preFILL'", False),
        ('op = "vllm::" + name', True),  # a text that is no identifier, as it is
        ("op = unified_attention_with_output", False),
    ],
)
def test_holds_names_finds_every_occurrence_the_index_records(text, holds):
    """The accounting looks for the names of the methods with a fix still safe and, while there are any, for
    reflection's words (a string becomes an attribute only through reflection), and for op texts: whatever the
    index records as an occurrence of one of those, the scan finds."""
    names = frozenset({"prefill", "forward", "vllm::"}) | REFLECTION_WORDS
    assert holds_names(text.encode(), names_needles(names)) is holds


_PIECES = ["prefill", "vllm", "::", ".", '"', "'", "{", "unified_", "x", " ", "\n", "_", "é"]


@given(st.lists(st.sampled_from(_PIECES), max_size=14), st.sets(st.sampled_from(["prefill", "x_prefill"]), max_size=2))
def test_holds_names_is_a_whole_word_or_a_text_as_it_is(pieces, words):
    """The scan (one pattern for the op texts, `find` for the words) says what the plain definition says."""
    import re

    from vllm_attn_compat.codemods.index.occurrences import OP_TEXTS

    text = "".join(pieces).encode()
    names = frozenset(words) | OP_TEXTS
    expected = any(t.encode() in text for t in OP_TEXTS) or any(
        re.search(rb"(?<![A-Za-z0-9_\x80-\xff])" + w.encode() + rb"(?![A-Za-z0-9_\x80-\xff])", text) for w in words
    )
    assert holds_names(text, names_needles(names)) is expected
