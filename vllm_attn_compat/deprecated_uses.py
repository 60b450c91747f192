"""Counting every deprecated use a process makes, for the pytest plugin (:mod:`vllm_attn_compat.pytest_plugin`).

:mod:`compat.deprecation` hands each deprecated use to :data:`tally` when one is set: every call, whether its
warning is shown (once per call site), filtered, raised as an error or silenced by ``VLLM_ATTN_COMPAT_WARNINGS``.
No torch, no libcst: the plugin imports this module in every pytest session, before the code under test loads.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from types import CodeType

# The wording of compat.deprecation's messages, read back: the old API and the rule that migrates it
# (removed_api_message's, and dead_overrides' "`X.hook` overrides a hook vLLM ... no longer calls").
_MESSAGE = re.compile(
    r"(?P<old>.+?) (?:was removed in vLLM [\w.]+;|overrides a hook) .*\(rule (?P<rule>VAC\d+)\)\.\Z", re.DOTALL
)
# How removed_api_message says that `migrate` cannot find a use (nothing in the source marks it).
BY_HAND = "change it by hand"
_REPLACEMENT = re.compile(
    r" was removed in vLLM [\w.]+; (?P<replacement>.*)\. vllm-attn-compat keeps it working", re.DOTALL
)


def replacement(message: str) -> str | None:
    """What ``message`` (worded by ``removed_api_message``) says to write instead, or None."""
    found = _REPLACEMENT.search(message)
    return found.group("replacement") if found else None


@dataclass(frozen=True)
class Use:
    """A deprecated API used at one place (``path:line``), ``count`` times. ``rule`` is the codemod rule that
    migrates it (``VAC005``), None for a message not worded by ``removed_api_message``."""

    old_api: str
    rule: str | None
    path: str
    line: int
    count: int
    message: str

    def as_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Use:
        return cls(**data)  # type: ignore[arg-type]  # the fields as_json wrote, each of its declared type


class Tally:
    """Deprecated uses by (message, place); a place is a line of a code object or, for warnings about a class
    (reported at its definition), the class. Places are resolved to ``path:line`` only by :meth:`uses`."""

    def __init__(self) -> None:
        # (message, id(place), line) -> (place, count); the place is held so that its id cannot be reused.
        self._counts: dict[tuple[str, int, int | None], tuple[type | CodeType, int]] = {}
        self._lock = threading.Lock()

    def at_line(self, message: str, code: CodeType, line: int) -> None:
        self._add(message, code, line)

    def at_class(self, message: str, cls: type) -> None:
        self._add(message, cls, None)

    def _add(self, message: str, place: type | CodeType, line: int | None) -> None:
        key = (message, id(place), line)
        with self._lock:
            entry = self._counts.get(key)
            self._counts[key] = (place, 1 if entry is None else entry[1] + 1)

    def __bool__(self) -> bool:
        return bool(self._counts)

    def uses(self) -> list[Use]:
        with self._lock:
            entries = [(message, line, place, count) for (message, _, line), (place, count) in self._counts.items()]
        return merge(_use(message, place, line, count) for message, line, place, count in entries)


def _use(message: str, place: type | CodeType, line: int | None, count: int) -> Use:
    if line is None:
        assert isinstance(place, type), "at_class counts a class, without a line"
        path, line = definition_site(place)
    else:
        assert isinstance(place, CodeType), "at_line counts a code object and its line"
        path = place.co_filename
    parsed = _MESSAGE.match(message)
    old, rule = (parsed["old"], parsed["rule"]) if parsed else (message, None)
    return Use(old_api=old, rule=rule, path=path, line=line, count=count, message=message)


def definition_site(cls: type) -> tuple[str, int]:
    """Where ``cls`` is defined (file, first line): the place of a use reported at a class."""
    import inspect

    try:
        return inspect.getsourcefile(cls) or "<unknown>", inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        module = sys.modules.get(cls.__module__)
        return getattr(module, "__file__", None) or f"<{cls.__module__}>", 1


def merge(uses: Iterable[Use]) -> list[Use]:
    """The same use seen by several processes (or through one code object compiled twice) counted once, with
    the counts added up; sorted by path, line and rule."""
    totals: dict[tuple[str, int, str, str], Use] = {}
    for use in uses:
        key = (use.path, use.line, use.message, use.old_api)
        seen = totals.get(key)
        totals[key] = use if seen is None else Use(**{**asdict(use), "count": seen.count + use.count})
    return sorted(totals.values(), key=lambda use: (use.path, use.line, use.rule or "", use.old_api))


# Set by the pytest plugin for its session; None otherwise, which costs compat.deprecation one test per use.
tally: Tally | None = None
