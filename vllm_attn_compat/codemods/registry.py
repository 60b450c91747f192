"""Find the rules: every module of the ``rules`` package is imported, each registers its class.

There is no central list: adding a rule means adding one module.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from functools import lru_cache

from vllm_attn_compat.codemods import rules as _rules_package
from vllm_attn_compat.codemods.engine.rule import _REGISTRY, Rule


@lru_cache(maxsize=1)
def _import_rule_modules() -> None:
    for module in pkgutil.iter_modules(_rules_package.__path__, _rules_package.__name__ + "."):
        importlib.import_module(module.name)


def all_rules() -> list[type[Rule]]:
    """Every registered rule, sorted by code."""
    _import_rule_modules()
    return [_REGISTRY[code] for code in sorted(_REGISTRY)]


def select_rules(select: Sequence[str] = (), ignore: Sequence[str] = ()) -> list[type[Rule]]:
    """Rules whose code starts with a prefix in ``select`` (all when empty) and none in ``ignore``.

    Raises ``ValueError`` naming a prefix that matches no rule, with the known codes.
    """
    rules = all_rules()
    codes = [rule.code for rule in rules]
    for prefix in (*select, *ignore):
        if not any(code.startswith(prefix.upper()) for code in codes):
            raise ValueError(f"unknown rule code {prefix!r}: expected a code or a prefix of one of {', '.join(codes)}")
    wanted = [p.upper() for p in select]
    unwanted = [p.upper() for p in ignore]
    return [
        rule
        for rule in rules
        if (not wanted or rule.code.startswith(tuple(wanted))) and not rule.code.startswith(tuple(unwanted))
    ]
