"""Which names a function binds in its own scope: where one of them is a reflection builtin's name (``dir``, ``vars``,
``getattr``), the function's code means its own variable by it, not the builtin (``os.path.join(dir, "x")`` in
``def find(dir)``).

Python decides this when it compiles the function: a name the function assigns, imports, defines, loops over, takes
as a parameter or deletes anywhere in its body is local throughout the body (``nonlocal``: an enclosing function's).
What is left out here leaves the name to the builtin, the side that withholds fixes: the targets of a
comprehension (its own scope) and the assignment expressions in it, the bindings of a class body, and any name the
function declares ``global`` (the module may bind it, or not yet).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from vllm_attn_compat.codemods.index.children import push_children

Function = ast.FunctionDef | ast.AsyncFunctionDef

_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def local_names(function: Function) -> tuple[frozenset[str], frozenset[str]]:
    """(the names ``function`` binds in its own scope, the names it declares ``global``)."""
    arguments = function.args
    bound = {
        a.arg
        for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
        if a is not None
    }
    declared: set[str] = set()
    stack: list[object] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Load):
                bound.add(node.id)
            continue
        if isinstance(node, _COMPREHENSIONS):
            continue
        if isinstance(node, ast.Global):
            declared.update(node.names)
        elif isinstance(node, ast.Nonlocal):
            bound.update(node.names)  # an enclosing function's: no builtin either
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).partition(".")[0] for alias in node.names)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
        if isinstance(node, _DEFINITIONS):
            bound.add(node.name)
            stack.extend(node.decorator_list)  # what runs here; the body is a scope of its own
        if isinstance(node, _FUNCTIONS):
            stack.extend(d for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None)
        if isinstance(node, (*_DEFINITIONS, ast.Lambda)):
            continue
        push_children(node, stack)
    return frozenset(bound - declared), frozenset(declared)


def shadows(name: str, scopes: Iterable[tuple[frozenset[str], frozenset[str]]]) -> bool:
    """Whether code means a variable by ``name``, not the builtin, where ``scopes`` are the `local_names` of the
    functions it is in, the innermost first."""
    for bound, declared in scopes:
        if name in declared:
            return False
        if name in bound:
            return True
    return False
