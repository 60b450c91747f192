"""The releases the manifest knows, and a version string resolved to one of them.

The list is ``releases.txt`` (one release a line, oldest first, written with the data by
scripts/attention_manifest.py), so that resolving a ``--target-version`` reads a few hundred bytes and no JSON.
"""

from __future__ import annotations

import os
import re

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "releases.txt")
_known: list[tuple[str, ...]] = []

_VERSION = re.compile(
    r"v?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?"
    r"(?:[-_.]?(post|rev|r)[-_.]?(\d*))?(?:[-_.]?(dev)[-_.]?(\d*))?(?:\+[\w.]+)?"
)
_STAGES = {"a": -3, "alpha": -3, "b": -2, "beta": -2, "c": -1, "rc": -1, "pre": -1, "preview": -1}


class UnknownRelease(ValueError):
    """A version the manifest cannot resolve; the message names it and the releases the manifest holds."""


def releases() -> tuple[str, ...]:
    """Every vLLM release the manifest describes, oldest first (patch releases included)."""
    if not _known:
        with open(PATH, encoding="utf-8") as handle:
            _known.append(tuple(line.strip() for line in handle if line.strip()))
    return _known[0]


def newest() -> str:
    """The newest release the manifest describes."""
    return releases()[-1]


def version_key(version: str) -> tuple[tuple[int, ...], int, int, int]:
    """A PEP 440 ordering key: (release, stage, number, dev) with stage -4 dev, -3 a, -2 b, -1 rc, 0 final,
    1 post. Raises ValueError for text that is no version."""
    match = _VERSION.fullmatch(version.strip().lower())
    if match is None:
        raise ValueError(f"{version!r} is not a version (expected something like 0.34 or 0.34.0)")
    release, pre, pre_n, post, post_n, dev, dev_n = match.groups()
    parts = tuple(int(p) for p in release.split("."))
    while len(parts) > 1 and parts[-1] == 0:
        parts = parts[:-1]
    if pre:
        stage, number = _STAGES[pre], int(pre_n or 0)
    elif post:
        stage, number = 1, int(post_n or 0)
    else:
        stage, number = (-4 if dev else 0), 0
    return parts, stage, number, (int(dev_n or 0) - 10**9 if dev else 0)


def resolve(version: str, *, nearest: bool = False) -> str:
    """The manifest's release for ``version``.

    "0.34.0" (or "v0.34.0", "0.34.0+cpu": a local label is dropped) is that release; "0.34" is the newest patch
    release of 0.34 the manifest knows. With ``nearest``, a version the manifest lacks (a dev build, a post or
    pre-release, a release newer than the data) resolves to the newest known release not after it: what a
    running vLLM most likely shares its interface with. Raises UnknownRelease otherwise, or when no known release
    is old enough."""
    known = releases()
    text = version.strip().lower().removeprefix("v").split("+", 1)[0]
    try:
        wanted = version_key(text)
    except ValueError as error:
        raise UnknownRelease(f"{error}; the manifest knows {_listing(known)}") from None
    if text in known:
        return text
    if re.fullmatch(r"\d+\.\d+", text):
        series = [r for r in known if r.startswith(text + ".")]
        if series:
            return series[-1]
        wanted = version_key(text + ".0")
    if nearest:
        older = [r for r in known if version_key(r) <= wanted]
        if older:
            return older[-1]
    raise UnknownRelease(f"vLLM {version!r} is not a release the manifest knows; it knows {_listing(known)}")


def _listing(known: tuple[str, ...]) -> str:
    return f"{len(known)} releases from {known[0]} to {known[-1]} ({', '.join(known)})"
