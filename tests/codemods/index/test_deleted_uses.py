"""Which withholding uses a run's own fixes deleted (codemods/index/deleted_uses.py)."""

from __future__ import annotations

from typing import NamedTuple

from vllm_attn_compat.codemods.index.deleted_uses import deleted


class Site(NamedTuple):
    line: int
    column: int
    end_line: int
    how: str


BEFORE = b"""\
def forward(self, q):
    if self.use_output:
        self.impl.forward(
            q,
            output=q,
        )
    else:
        return self.impl.forward(
            q,
        )
    table = [self.impl.forward]
    return self.impl.forward(q)
"""
# The kept branch dedented, the `else` gone, the reference and the last call kept.
AFTER = b"""\
def forward(self, q):
    self.impl.forward(
        q,
        output=q,
    )
    table = [self.impl.forward]
    return self.impl.forward(q)
"""


def test_a_use_the_rewrite_deleted_is_gone_and_one_it_kept_is_not():
    sites = [Site(8, 16, 10, "omits"), Site(11, 15, 11, "reference"), Site(12, 12, 12, "omits")]
    assert deleted(BEFORE, AFTER, sites) == {(8, 16)}


def test_a_kept_branch_is_found_whatever_its_indentation():
    passing = Site(3, 9, 6, "none")  # (a use of that text: what it is does not matter here)
    assert deleted(BEFORE, AFTER, [passing]) == set()
    assert deleted(BEFORE, AFTER.replace(b"output=q", b"output=None"), [passing]) == {(3, 9)}


def test_a_call_whose_text_is_still_somewhere_stays_reported():
    """Two identical calls, one deleted: the one left may be either, so neither is dropped."""
    before = b"def f(impl, q, flag):\n    if flag:\n        return impl.forward(q)\n    return impl.forward(q)\n"
    after = b"def f(impl, q, flag):\n    return impl.forward(q)\n"
    assert deleted(before, after, [Site(3, 16, 3, "omits"), Site(4, 12, 4, "omits")]) == set()


def test_a_site_that_is_no_use_of_its_kind_or_a_source_that_does_not_parse_drops_nothing():
    assert deleted(BEFORE, b"", [Site(11, 15, 11, "omits")]) == set()  # an attribute where a call was looked for
    assert deleted(b"def (:\n", b"", [Site(1, 1, 1, "omits")]) == set()


def test_sources_in_another_encoding_are_read_as_declared():
    before = "# -*- coding: latin-1 -*-\ndef f(impl, q):\n    return impl.forward('é', q)\n".encode("latin-1")
    assert deleted(before, before, [Site(3, 12, 3, "omits")]) == set()
    assert deleted(before, b"# -*- coding: latin-1 -*-\n", [Site(3, 12, 3, "omits")]) == {(3, 12)}
