"""Helpers for the rule tests: run the real engine on dedented source text."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence

from vllm_attn_compat.codemods.engine.migrate import MigrationResult, migrate_source
from vllm_attn_compat.codemods.findings import Status, TargetRelease
from vllm_attn_compat.codemods.index import callsites
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module
from vllm_attn_compat.codemods.registry import select_rules


def source(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def assert_names_use(message: str, lead: str, where: str, use: str | None) -> None:
    """``message`` names, after ``lead``, the use at ``where`` (``path:line``) as ``use`` says; names none if None."""
    if use is None:
        assert lead not in message
    else:
        assert f"{lead}: " in message and f"at {where} {use}" in message


def run(
    text: str | bytes,
    select: Sequence[str] = (),
    *,
    unsafe: bool = False,
    path: str = "plugin_mod.py",
    others: Sequence[tuple[str, str]] = (),
    old_op_calls: str = "with-output",
    target: TargetRelease | None = None,
) -> MigrationResult:
    """Migrate ``text`` (dedented when a str) with the selected rules; ``others`` are more
    (path, source) files of the same run, for the class hierarchy and its calls. The findings include
    those the runner adds at calls in this file that withhold a fix (`callsites`)."""
    data = source(text).encode() if isinstance(text, str) else text
    indexes = [index_module(data, path)] + [index_module(source(s).encode(), p) for p, s in others]
    hierarchy = ClassHierarchy.build(indexes)
    rules = select_rules(select)
    result = migrate_source(
        data,
        path=path,
        rules=rules,
        hierarchy=hierarchy,
        unsafe_fixes=unsafe,
        old_op_calls=old_op_calls,
        target=target,
    )
    callers = callsites.caller_findings(hierarchy.calls, path, data, [rule.code for rule in rules])
    result = dataclasses.replace(result, findings=sorted([*result.findings, *callers]))
    again = migrate_source(
        result.source,
        path=path,
        rules=select_rules(select),
        hierarchy=ClassHierarchy.build([index_module(result.source, path), *indexes[1:]]),
        unsafe_fixes=unsafe,
        old_op_calls=old_op_calls,
        target=target,
    )
    assert again.source == result.source, "a second run changed the file again"
    return result


def fixed(text: str, select: Sequence[str] = (), **kwargs: object) -> str:
    return run(text, select, **kwargs).source.decode()  # type: ignore[arg-type]


def statuses(result: MigrationResult, code: str | None = None) -> list[Status]:
    return [f.status for f in result.findings if code is None or f.code == code]
