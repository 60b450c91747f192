"""How the installed vLLM calls the hooks VAC012 holds overrides to, read from its sources with ``ast``: each
hook whose required parameters the rule takes by name (`vac012_signature_drift.PASSED_BY_NAME`) is called so at
some call site of vLLM's, and each other drifted hook is called with its required arguments by position. Runs in
the ``vllm`` tier (0.20.0 here; CI's matrix runs it on 0.30.0 and the newest release too)."""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.vllm

SPEC = importlib.util.find_spec("vllm")
if SPEC is None or not SPEC.submodule_search_locations:
    pytest.skip("the real vLLM package is not installed (run scripts/install-vllm-tier.sh)", allow_module_level=True)

from vllm_attn_compat.codemods.rules.vac012_signature_drift import PASSED_BY_NAME  # noqa: E402
from vllm_attn_compat.manifest.types import EVERY  # noqa: E402

# Drifted hooks vLLM calls with its required arguments by position (the names it shares with other code, such as
# `forward` and `process_weights_after_loading`, aside).
POSITIONAL = ("supports_combination", "do_kv_cache_update", "maybe_recompute_cu_seqlens")


@functools.cache
def call_sites() -> dict[str, list[tuple[int, frozenset[str]]]]:
    """Each hook's calls in vLLM's sources (``x.hook(...)``, not ``super().hook(...)``): how many positional
    arguments, and the keywords (``**`` for a mapping unpacked)."""
    hooks = {*PASSED_BY_NAME, *POSITIONAL}
    found: dict[str, list[tuple[int, frozenset[str]]]] = {hook: [] for hook in hooks}
    for path in _sources():
        with open(path, "rb") as handle:
            try:
                tree = ast.parse(handle.read())
            except SyntaxError:
                continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in hooks):
                continue
            if isinstance(node.func.value, ast.Call):  # super().hook(...): a class of vLLM's calling its base
                continue
            keywords = frozenset(keyword.arg or "**" for keyword in node.keywords)
            found[node.func.attr].append((len(node.args), keywords))
    return found


def _sources() -> Iterator[str]:
    assert SPEC is not None and SPEC.submodule_search_locations
    for root in SPEC.submodule_search_locations:
        for folder, _, names in os.walk(root):
            yield from (os.path.join(folder, name) for name in names if name.endswith(".py"))


@pytest.mark.parametrize("hook", sorted(PASSED_BY_NAME))
def test_vllm_names_what_the_rule_takes_by_name(hook: str) -> None:
    named = PASSED_BY_NAME[hook]
    sites = call_sites()[hook]
    if named is EVERY:
        assert any(count == 0 and keywords for count, keywords in sites), sites
    else:
        assert isinstance(named, frozenset)
        assert any(named <= keywords for _, keywords in sites), sites


@pytest.mark.parametrize("hook", POSITIONAL)
def test_vllm_passes_the_other_hooks_required_arguments_by_position(hook: str) -> None:
    sites = call_sites()[hook]
    assert sites, hook
    assert all(count > 0 for count, _ in sites), sites
