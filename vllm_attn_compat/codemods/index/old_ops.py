"""The functions of the ops vLLM 0.20 deleted, as a module defines them: vLLM <= 0.19 and its forks define
``unified_attention`` and ``unified_mla_attention`` and register them as ops; a plugin may keep a copy of such a
body and call it directly. What to do about a call in one that omits `output` is to delete the op, not to mend
the call (`callsites`), and the index records them (`hierarchy.index_module`), so a rerun parses no file again
to tell."""

from __future__ import annotations

import ast
from typing import NamedTuple

from vllm_attn_compat.codemods.index import children

FUNCTIONS = frozenset({"unified_attention", "unified_mla_attention"})


class OldOpBody(NamedTuple):
    """A module-level function named as a deleted op: its lines, its name, and whether the module registers it."""

    first: int
    last: int
    op: str
    registered: bool


def old_op_bodies(tree: ast.Module) -> tuple[OldOpBody, ...]:
    """The module-level functions of ``tree`` named as the deleted ops, and whether the module registers each as an
    op (an ``op_name="..."`` argument, or ``"vllm::..."`` with or without its schema, anywhere in it)."""
    functions = [
        node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in FUNCTIONS
    ]
    if not functions:
        return ()
    registered: set[str] = set()
    for call in children.walk(tree):
        if isinstance(call, ast.Call):
            # direct_register_custom_op(op_name="unified_attention", ...); torch.library.custom_op("vllm::...", ...);
            # torch.library.define("vllm::unified_attention(Tensor q) -> Tensor")
            named = [keyword.value for keyword in call.keywords if keyword.arg == "op_name"]
            for value in [*named, *call.args]:
                text = value.value if isinstance(value, ast.Constant) else None
                if isinstance(text, str) and (value in named or text.startswith("vllm::")):
                    registered.add(text.removeprefix("vllm::").partition("(")[0])
    return tuple(
        OldOpBody(node.lineno, node.end_lineno or node.lineno, node.name, node.name in registered) for node in functions
    )
