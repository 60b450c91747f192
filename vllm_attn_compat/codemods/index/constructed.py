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

Function = ast.FunctionDef | ast.AsyncFunctionDef
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def constructed(function: Function) -> dict[str, ast.expr]:
    """Each name ``function`` binds exactly once, by ``name = callee(...)``, with the callee."""
    arguments = function.args
    bindings = Counter(
        a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg,
                        arguments.kwarg] if a is not None
    )  # fmt: skip
    made: dict[str, ast.expr] = {}
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, _NESTED):
            _nested(node, bindings, stack)
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bindings[node.id] += 1
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bindings.update({name: 2 for name in node.names})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bindings.update({(a.asname or a.name).partition(".")[0]: 2 for a in node.names})
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            bindings[node.name] += 2
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bindings[node.rest] += 2
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                made[targets[0].id] = node.value.func
        stack.extend(ast.iter_child_nodes(node))
    return {name: callee for name, callee in made.items() if bindings[name] == 1}


def _nested(node: ast.AST, bindings: Counter[str], stack: list[ast.AST]) -> None:
    """A definition inside the function: its name is bound here, what runs here (decorators, defaults, bases)
    is walked, and its body only for ``nonlocal`` declarations, which rebind the function's names."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        bindings[node.name] += 2
        stack.extend(node.decorator_list)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        stack.extend(d for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None)
    if isinstance(node, ast.ClassDef):
        stack.extend([*node.bases, *node.keywords])
    for inner in ast.walk(node):
        if isinstance(inner, ast.Nonlocal):
            bindings.update({name: 2 for name in inner.names})
