"""The progress bar of a run's stages (``--progress``), on stderr, for runs long enough to show it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

Item = TypeVar("Item")


def bar(outcomes: Iterable[Item], total: int | None, enabled: bool, stage: str) -> Iterable[Item]:
    if not enabled:
        return outcomes
    from tqdm import tqdm

    # No monitor thread: the worker processes are forked while the bar is alive.
    tqdm.monitor_interval = 0
    shown: Iterable[Item] = tqdm(outcomes, total=total, unit="file", desc=stage, delay=0.5, leave=False)
    return shown
