"""Fold the releases' snapshots into histories, and write them as the package data's JSON.

A history is a list of ``[release, state]`` pairs, oldest first, one where the state changed: the first release
that has the thing, each release where its state differs from the one before, and ``[release, null]`` where it
is gone (again a state where it comes back). The state at a release is the last pair at or before it.

The data (``vllm_attn_compat/manifest/attention_api.json``)::

    {"schema": 1,
     "releases": ["0.19.0", ...],                        oldest first
     "modules": {module: {name: history of its kind}},
     "classes": {qualified name: {"history": history of {"bases", "kind", ...},
                                  "members": {name: history of the member's state}}},
     "functions": {qualified name: history},
     "ops": {"vllm::name": history},
     "left_out": {concrete class of vLLM's: history of the abstract members it does not implement},
     "module_files": {module of vLLM's attention packages: history of "package" or "module"},
     "successors": {"<class>.<member>": {"use": text, "member": name?, "source": where vLLM says so}}}

Written with one history per line, keys sorted, so that a new release shows as a readable diff.
"""

from __future__ import annotations

import json
from typing import Any

from .release import Snapshot

SCHEMA = 1
History = list[list[Any]]


def fold(states: list[tuple[str, Any]]) -> History:
    """A history from (release, state or None) for every release, oldest first."""
    history: History = []
    previous: Any = None
    for release, state in states:
        if state != previous:
            history.append([release, state])
            previous = state
    return history


def build(snapshots: list[tuple[str, Snapshot]], successors: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The manifest of ``snapshots`` ((release, snapshot), oldest first)."""
    releases = [release for release, _ in snapshots]

    def keys(section: str) -> list[str]:
        return sorted({key for _, snapshot in snapshots for key in snapshot[section]})

    modules: dict[str, dict[str, History]] = {}
    for module in keys("modules"):
        names = sorted({n for _, s in snapshots for n in s["modules"].get(module, {})})
        modules[module] = {n: fold([(r, s["modules"].get(module, {}).get(n)) for r, s in snapshots]) for n in names}
    classes: dict[str, dict[str, Any]] = {}
    for qualified in keys("classes"):
        states = [(r, s["classes"].get(qualified)) for r, s in snapshots]
        outline = [(r, None if c is None else {k: v for k, v in c.items() if k != "members"}) for r, c in states]
        members = sorted({m for _, c in states if c for m in c["members"]})
        classes[qualified] = {
            "history": fold(outline),
            "members": {m: fold([(r, c["members"].get(m) if c else None) for r, c in states]) for m in members},
        }
    return {
        "schema": SCHEMA,
        "releases": releases,
        "modules": modules,
        "classes": classes,
        "functions": {q: fold([(r, s["functions"].get(q)) for r, s in snapshots]) for q in keys("functions")},
        "ops": {q: fold([(r, s["ops"].get(q)) for r, s in snapshots]) for q in keys("ops")},
        "left_out": {q: fold([(r, s["left_out"].get(q)) for r, s in snapshots]) for q in keys("left_out")},
        "module_files": {q: fold([(r, s["module_files"].get(q)) for r, s in snapshots]) for q in keys("module_files")},
        "successors": dict(sorted(successors.items())),
    }


def at(history: History, releases: list[str], release: str) -> Any:
    """The state a history gives ``release`` (None where absent)."""
    index = releases.index(release)
    state = None
    for changed, value in history:
        if releases.index(changed) > index:
            break
        state = value
    return state


def snapshot_at(manifest: dict[str, Any], release: str) -> Snapshot:
    """The snapshot of ``release`` that ``manifest`` holds: what ``release.snapshot`` read (the inverse of build)."""
    releases = manifest["releases"]
    result: Snapshot = {"modules": {}, "classes": {}, "functions": {}, "ops": {}, "left_out": {}, "module_files": {}}
    for module, names in manifest["modules"].items():
        present = {n: k for n, h in names.items() if (k := at(h, releases, release)) is not None}
        if present:
            result["modules"][module] = present
    for qualified, entry in manifest["classes"].items():
        outline = at(entry["history"], releases, release)
        if outline is not None:
            members = {m: s for m, h in entry["members"].items() if (s := at(h, releases, release)) is not None}
            result["classes"][qualified] = {**outline, "members": members}
    for section in ("functions", "ops", "left_out", "module_files"):
        for key, history in manifest[section].items():
            state = at(history, releases, release)
            if state is not None:
                result[section][key] = state
    return result


def dumps(manifest: dict[str, Any]) -> str:
    """The JSON text: objects spread over lines, each list (a history, the releases) on one line."""
    return _dump(manifest, 0) + "\n"


def _dump(value: Any, depth: int) -> str:
    if not isinstance(value, dict) or not value:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    indent = " " * (depth + 1)
    items = [f"{indent}{json.dumps(key)}:{_dump(value[key], depth + 1)}" for key in value]
    return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
