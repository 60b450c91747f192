"""How a run reads its files (`run/reading.py`): the files the prefilter keeps, found as they are asked for."""

from __future__ import annotations

from vllm_attn_compat.codemods.run.reading import Kept


def test_kept_files_are_tested_once_each_and_come_in_the_same_order_every_time():
    tested: list[int] = []

    def even(number):
        tested.append(number)
        return number % 2 == 0

    kept = Kept(range(10), even)
    assert kept  # the first kept file found: the others are not tested yet
    assert tested == [0]
    first = iter(kept)
    assert next(first) == 0 and tested == [0]
    assert list(kept) == [0, 2, 4, 6, 8] and list(first) == [2, 4, 6, 8] and list(kept) == [0, 2, 4, 6, 8]
    assert tested == list(range(10))
    assert not Kept([1, 3], even)
