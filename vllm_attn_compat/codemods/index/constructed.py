"""The local names a function binds exactly once, to what a call returns (``impl = MyImpl(...)``).

Such a name holds what that call made wherever the function reads it, so a call on it (``impl.forward(...)``
in a test) is a call on an instance of the class called, when the callee is a class of the run
(`callsites` decides: a factory function's result stays unknown). Any other binding of the name in the
function makes it unknown too: a parameter, a second assignment, a loop or ``with`` target, an import, a
``global`` or ``nonlocal`` declaration (one in a nested function included), ``del``, a walrus.
"""

from __future__ import annotations

import ast
from collections import Counter

from vllm_attn_compat.codemods.index.children import push_children

Function = ast.FunctionDef | ast.AsyncFunctionDef
_NESTED = frozenset({ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda})
# What `_bind` reads (the parser makes no subclasses): the nodes that bind a name themselves, not through a `Name`
# they hold, and the assignments, which may make one (`name = callee(...)`).
_BINDING = frozenset(
    {ast.Global, ast.Nonlocal, ast.Import, ast.ImportFrom, ast.ExceptHandler, ast.MatchAs, ast.MatchStar,
     ast.MatchMapping, ast.Assign, ast.AnnAssign}
)  # fmt: skip


def constructed(function: Function) -> dict[str, ast.expr]:
    """Each name ``function`` binds exactly once, by ``name = callee(...)``, with the callee."""
    arguments = function.args
    bindings = Counter(
        a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg,
                        arguments.kwarg] if a is not None
    )  # fmt: skip
    made: dict[str, ast.expr] = {}
    stack: list[object] = list(function.body)
    # Every function of every indexed module is walked: types are compared exactly, the commonest first, and
    # the fields followed come from a table (`children`), not from `ast.iter_child_nodes`, four times slower.
    name, load, constant = ast.Name, ast.Load, ast.Constant
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is name:
            if type(node.ctx) is not load:  # type: ignore[attr-defined]
                bindings[node.id] += 1  # type: ignore[attr-defined]
            continue
        if kind is constant:
            continue
        if kind in _NESTED:
            _nested(node, bindings, stack)  # type: ignore[arg-type]
            continue
        if kind in _BINDING:
            _bind(node, bindings, made)  # type: ignore[arg-type]
        push_children(node, stack)
    return {name: callee for name, callee in made.items() if bindings[name] == 1}


def _bind(node: ast.stmt | ast.excepthandler | ast.pattern, bindings: Counter[str], made: dict[str, ast.expr]) -> None:
    """Count the names a node of `_BINDING` binds itself (not through a `Name` it holds: that is counted where it
    stands), and record ``name = callee(...)`` in ``made``."""
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        bindings.update({name: 2 for name in node.names})
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        bindings.update({(a.asname or a.name).partition(".")[0]: 2 for a in node.names})
    elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
        if node.name:
            bindings[node.name] += 2
    elif isinstance(node, ast.MatchMapping):
        if node.rest:
            bindings[node.rest] += 2
    elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if len(targets) == 1 and isinstance(targets[0], ast.Name):
            made[targets[0].id] = node.value.func


def _nested(node: ast.AST, bindings: Counter[str], stack: list[object]) -> None:
    """A definition inside the function: its name is bound here, what runs here (decorators, defaults, bases)
    is walked, and its body only for ``nonlocal`` declarations, which rebind the function's names."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        bindings[node.name] += 2
        stack.extend(node.decorator_list)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        stack.extend(d for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None)
    if isinstance(node, ast.ClassDef):
        stack.extend([*node.bases, *node.keywords])
    inner: list[object] = [node]
    while inner:
        found = inner.pop()
        if type(found) is ast.Nonlocal:
            bindings.update({name: 2 for name in found.names})
        else:
            push_children(found, inner)
