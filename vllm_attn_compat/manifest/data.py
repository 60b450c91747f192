"""The package data (``attention_api.json``, written by scripts/attention_manifest.py), read once on first use, and
the conversion of its states into the named tuples of ``types``.

A history in the data is ``[[release, state or null], ...]``, one pair where the state changed, oldest first
(see scripts/manifest_gen/history.py); ``state_at`` reads it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .releases import PATH as RELEASES_PATH
from .releases import releases
from .types import Member, MemberKind, Parameter, ParameterKind, Signature, Successor

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_api.json")
SCHEMA = 1

_KINDS: dict[str, ParameterKind] = {
    "po": "POSITIONAL_ONLY",
    "pk": "POSITIONAL_OR_KEYWORD",
    "var": "VAR_POSITIONAL",
    "ko": "KEYWORD_ONLY",
    "varkw": "VAR_KEYWORD",
}

History = list[list[Any]]
_loaded: dict[str, Any] = {}


def load() -> dict[str, Any]:
    """The data, parsed once per process."""
    data = _loaded.get("data")
    if data is None:
        with open(PATH, encoding="utf-8") as handle:
            data = json.load(handle)
        if data.get("schema") != SCHEMA:
            raise RuntimeError(f"{PATH}: expected manifest schema {SCHEMA}, found {data.get('schema')!r}")
        if tuple(data["releases"]) != releases():
            raise RuntimeError(f"{PATH} and {RELEASES_PATH} list different releases: regenerate both")
        _loaded["data"] = data
        _loaded["index"] = {release: i for i, release in enumerate(data["releases"])}
    return data  # type: ignore[no-any-return]


def index(release: str) -> int:
    """The position of a known release in the data's list (oldest first)."""
    load()
    return _loaded["index"][release]  # type: ignore[no-any-return]


def state_at(history: History, release: str) -> Any:
    """The state ``history`` gives ``release``: that of its last change at or before it (None: absent)."""
    position = index(release)
    state = None
    for changed, value in history:
        if index(changed) > position:
            break
        state = value
    return state


def signature(state: dict[str, Any]) -> Signature | None:
    if "params" not in state:
        return None
    parameters = tuple(
        Parameter(name, _KINDS[kind], default, annotation) for name, kind, default, annotation in state["params"]
    )
    return Signature(parameters, state.get("returns"))


def member(owner: str, name: str, state: dict[str, Any]) -> Member:
    kind: MemberKind = state["kind"]
    return Member(
        owner=owner,
        name=name,
        kind=kind,
        signature=signature(state),
        abstract=bool(state.get("abstract")),
        deprecated=state.get("deprecated"),
        deprecated_parameters=dict(state.get("deprecated_params", {})),
        referenced=bool(state.get("referenced", True)),
        annotation=state.get("annotation"),
        value=state.get("value"),
    )


def successor(key: str) -> Successor | None:
    entry = load()["successors"].get(key)
    return None if entry is None else Successor(entry["use"], entry["kind"], entry["source"])
