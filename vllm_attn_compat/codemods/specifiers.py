"""A PEP 508 requirement's name and version specifiers, and which final releases they allow: the part of
``packaging`` the target version needs (the plain install has no ``packaging``: libcst depends on pyyaml alone).

Only final releases (``0.34.0``) are ever tested against a specifier, so PEP 440's rules for pre-, post- and dev
releases matter only in the specifier's own versions (``>=0.30.0rc1``), which ``version_key`` orders.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from vllm_attn_compat.manifest import version_key

# name, extras, then either "@ url" or the specifiers (bare or in parentheses), then "; markers".
_REQUIREMENT = re.compile(
    r"\s*(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[(?P<extras>[^\]]*)\])?\s*"
    r"(?:@\s*(?P<url>[^;\s]+)\s*|\(?(?P<specifiers>[^;()]*)\)?)\s*(?:;(?P<marker>.*))?$"
)
_CLAUSE = re.compile(r"\s*(===|==|!=|~=|<=|>=|<|>)\s*([0-9A-Za-z][^\s,]*)\s*")


class SpecifierError(ValueError):
    """A requirement or specifier that cannot be read; the message quotes it and says what was expected."""


class Requirement(NamedTuple):
    """A requirement's normalized name, its specifiers as written (``>=0.30,<0.35``, "" for none), and its URL
    for a direct reference (``vllm @ git+https://...``)."""

    name: str
    specifiers: str
    url: str | None
    text: str


def normalize(name: str) -> str:
    """A project name as PEP 503 compares them (``vLLM``, ``v_llm`` -> ``vllm``, ``v-llm``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirement(text: str) -> Requirement:
    """The requirement a PEP 508 string states. Raises SpecifierError for text that is none."""
    match = _REQUIREMENT.fullmatch(text.strip())
    if match is None:
        raise SpecifierError(f"{text.strip()!r} is not a requirement (expected a name and specifiers, like vllm>=0.30)")
    specifiers = (match.group("specifiers") or "").strip()
    if specifiers:
        clauses(specifiers)  # validate now: a bad specifier is named where it is read
    return Requirement(normalize(match.group("name")), specifiers, match.group("url"), text.strip())


def clauses(specifiers: str) -> list[tuple[str, str]]:
    """[(operator, version)] of a comma-separated specifier set. Raises SpecifierError naming a bad clause."""
    found = []
    for clause in specifiers.split(","):
        if not clause.strip():
            raise SpecifierError(f"{specifiers!r}: an empty clause (expected clauses like >=0.30 separated by commas)")
        match = _CLAUSE.fullmatch(clause)
        if match is None:
            raise SpecifierError(f"{specifiers!r}: {clause.strip()!r} is no version clause (expected e.g. >=0.30)")
        operator, version = match.groups()
        if operator != "===":
            try:
                version_key(version.removesuffix(".*"))
            except ValueError:
                raise SpecifierError(f"{specifiers!r}: {version!r} is no version") from None
            if version.endswith(".*") and operator not in ("==", "!="):
                raise SpecifierError(f"{specifiers!r}: {clause.strip()!r}: only == and != take a .* suffix")
            if operator == "~=" and len(version.split(".")) < 2:
                raise SpecifierError(f"{specifiers!r}: ~= needs at least two version parts, found {version!r}")
        found.append((operator, version))
    return found


def allows(specifiers: str, release: str) -> bool:
    """Whether the final release ``release`` satisfies every clause of ``specifiers`` ("" allows anything)."""
    if not specifiers.strip():
        return True
    key = version_key(release)
    return all(_clause_allows(operator, version, release, key) for operator, version in clauses(specifiers))


def _clause_allows(operator: str, version: str, release: str, key: tuple[object, ...]) -> bool:
    if operator == "===":
        return release == version
    if version.endswith(".*"):
        prefix = _release_parts(version.removesuffix(".*"))
        parts = _release_parts(release)
        matches = (parts + (0,) * len(prefix))[: len(prefix)] == prefix
        return matches if operator == "==" else not matches
    if "+" in version and operator in ("==", "!="):  # a local label matches only itself, and releases have none
        return operator == "!="
    wanted = version_key(version)
    if operator == "==":
        return key == wanted
    if operator == "!=":
        return key != wanted
    if operator == "<":
        return key < wanted
    if operator == "<=":
        return key <= wanted
    if operator == ">":
        return key > wanted
    if operator == ">=":
        return key >= wanted
    # ~=X.Y.Z: >= X.Y.Z and == X.Y.*
    prefix = _release_parts(version)[:-1]
    parts = _release_parts(release)
    return key >= wanted and (parts + (0,) * len(prefix))[: len(prefix)] == prefix


def _release_parts(version: str) -> tuple[int, ...]:
    match = re.match(r"v?(\d+(?:\.\d+)*)", version.strip().lower())
    if match is None:
        raise SpecifierError(f"{version!r} is no version")
    return tuple(int(part) for part in match.group(1).split("."))
