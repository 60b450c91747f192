"""Reading calls without parsing: whether a file may use a method, checked against the exact index
(`index_module`), which records every use the call-site analysis follows."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.index.calltext import may_use, uses_pattern
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
        ('getattr(impl, "pre" "fill")', True),  # one constant string to the parser: `getattr` is looked for
        ('getattr(impl, ("pre"\n    "fill"))', True),
        ('getattr(impl, "pre\\x66ill")', True),  # an escape
        ('getattr(impl, "x"', True),
        ("impl.\uff50refill(q)", True),  # the parser reads identifiers in their NFKC form: `prefill`
        ("def prefill(self, q):\n    return q\n", True),  # a definition: looked at by the parse, which tells
        ("# prefill", True),  # likewise a comment
        ("impl.prefill_all(q)", False),
        ("x = 'preFILL'", False),
    ],
)
def test_may_use_finds_every_use_the_index_records(text, uses):
    """The accounting looks for the names of the methods with a fix still safe and, while there are any, for
    reflection's words (a string can only become an attribute through reflection): whatever the index records as
    a use of one of those names, the text scan finds."""
    names = frozenset({"prefill", "forward"}) | REFLECTION_WORDS
    assert may_use(text.encode(), names, uses_pattern(names)) is uses
    if not uses:  # and indeed the exact index records none
        assert not {use.name for use in index_module(text.encode(), "m.py").calls.uses} & names


def test_text_that_is_no_identifier_is_looked_for_as_it_is():
    names = frozenset({"vllm::", "unified_attention"})
    assert may_use(b'op = "vllm::" + name', names, uses_pattern(names))
    assert not may_use(b"op = unified_attention_with_output", names, uses_pattern(names))
