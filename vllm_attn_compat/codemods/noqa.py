"""``# noqa`` and ``# noqa: VAC001, VAC004`` comments (ruff's syntax)."""

from __future__ import annotations

import re

_NOQA = re.compile(r"#\s*noqa(?::\s?(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)

ALL_CODES = "*"


def noqa_codes(comment: str) -> frozenset[str] | None:
    """Codes a comment suppresses (``{"*"}`` for a bare noqa), or None without a noqa."""
    match = _NOQA.search(comment)
    if match is None:
        return None
    codes = match.group("codes")
    if not codes:
        return frozenset({ALL_CODES})
    return frozenset(code.upper() for code in re.split(r"[,\s]+", codes) if code)


def suppresses(codes: frozenset[str], code: str) -> bool:
    return ALL_CODES in codes or code in codes
