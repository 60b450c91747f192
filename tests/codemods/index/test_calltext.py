"""Reading calls without parsing: whether a file may use a method, checked against the exact index
(`index_module`), which records every use the call-site analysis follows."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.index.calltext import may_use, uses_pattern
from vllm_attn_compat.codemods.index.hierarchy import index_module


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
