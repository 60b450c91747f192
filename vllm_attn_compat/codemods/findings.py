"""Types shared by the rules, the engine and the runner.

Kept free of libcst and torch so that the runner, the reporters and the CLI can
import them before deciding whether any file needs parsing; and of dataclasses, whose import (it imports
``inspect``) costs a tenth of a rerun the cache replays.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class FixSafety(enum.Enum):
    """How a rule's fix may be applied (ruff's vocabulary)."""

    SAFE = "safe"  # applied by `migrate`
    UNSAFE = "unsafe"  # applied only with --unsafe-fixes
    DISPLAY_ONLY = "display-only"  # reported, never applied


class Status(enum.Enum):
    """What became of one finding in this run."""

    FIXED = "fixed"  # the fix was applied (with --check/--diff, would be: the reports say "fixable" then)
    UNSAFE_FIX_AVAILABLE = "unsafe-fix-available"  # withheld: needs --unsafe-fixes
    MANUAL = "manual"  # no automatic fix; a person must act
    SUPPRESSED = "suppressed"  # silenced by a noqa comment


class Finding(NamedTuple):
    """One site in one file. ``line`` is 1-based, ``column`` 1-based (as editors show). ``release``: the vLLM
    release whose change the finding is about (``0.29.0`` for a hook it removed), where one is."""

    line: int
    column: int
    code: str
    message: str
    status: Status
    release: str | None = None


class TargetRelease(NamedTuple):
    """The vLLM release a run targets, as the rules see it: ``release``, the one findings are computed for (what it
    no longer has or calls), and ``oldest``, the lowest release the project supports, for the fixes' safety (a fix
    whose code needs a newer release is withheld; None where nothing bounds it)."""

    release: str
    oldest: str | None = None
