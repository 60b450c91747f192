"""Example counts for the reliability tier: a few hundred in CI, thousands in the long mode.

The long mode (``VAC_RELIABILITY=long``, run by scripts/reliability_long.sh, not by CI) multiplies the
example counts and draws fresh random inputs on every run; the CI mode is derandomized, so a CI
failure reproduces on any machine with the same command. Settings are applied per test, never through
a global profile, so the other test tiers keep their own hypothesis settings.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

LONG = os.environ.get("VAC_RELIABILITY", "").lower() == "long"


def reliability_settings(ci: int, long: int) -> settings:
    """Hypothesis settings for one property: ``ci`` examples by default, ``long`` in the long mode."""
    return settings(
        max_examples=long if LONG else ci,
        deadline=None,  # shared 2-core CI machines: time limits per example would only measure the neighbours
        derandomize=not LONG,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def scaled(ci: int, long: int) -> int:
    """A count of non-hypothesis repetitions (interruption trials, processes) for the current mode."""
    return long if LONG else ci
