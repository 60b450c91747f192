"""Which arguments of a call pass on a parameter of the function making it that may be None.

``forward(self, ..., output=None)`` calling ``self._decode(query, output)`` passes ``_decode`` whatever its own
caller passed: None, for a caller that gives no buffer. Such an argument is no buffer, for the call-site
analysis (`callsites`): deleting ``_decode``'s ``if output is None`` fallback or its assert changes what that
caller gets. A parameter is taken to be possibly None where it defaults to None and no statement of the
function's body before the call's, at the top of the body, makes sure it is not (``if output is None: output =
...``, or ``raise``, and ``assert output is not None``): a statement at the top of a body runs before every
later one. A function's other parameters are what its callers pass, which the run does not follow here.
"""

from __future__ import annotations

import ast
from functools import cached_property


def is_none(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


class Parameters:
    """What one function's parameters may hold where it calls something (`may_be_none`)."""

    def __init__(self, function: ast.FunctionDef | ast.AsyncFunctionDef | None) -> None:
        self.function = function

    @cached_property
    def _defaults_none(self) -> frozenset[str]:
        if self.function is None:
            return frozenset()
        arguments = self.function.args
        positional = [*arguments.posonlyargs, *arguments.args]
        with_defaults = zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults, strict=True)
        names = {argument.arg for argument, default in with_defaults if is_none(default)}
        keyword_only = zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
        return frozenset(names | {argument.arg for argument, default in keyword_only if is_none(default)})

    @cached_property
    def _guards(self) -> dict[str, int]:
        """Per parameter defaulting to None, the last line of the first statement at the top of the body that
        makes sure it is not None from there on."""
        guards: dict[str, int] = {}
        for statement in self.function.body if self.function is not None else ():
            name = _guarded(statement)
            if name is not None and name in self._defaults_none and name not in guards:
                guards[name] = statement.end_lineno or statement.lineno
        return guards

    def may_be_none(self, argument: ast.expr, line: int) -> bool:
        """Whether ``argument`` of a call on ``line`` names a parameter that may be None there."""
        if type(argument) is not ast.Name or argument.id not in self._defaults_none:
            return False
        guarded = self._guards.get(argument.id)
        return guarded is None or guarded >= line


def _guarded(statement: ast.stmt) -> str | None:
    """The name ``statement`` makes sure is not None after it: ``assert name is not None``, or ``if name is
    None:`` whose block ends binding the name or raising (no ``else``)."""
    if isinstance(statement, ast.Assert):
        return none_tested(statement.test, ast.IsNot)
    if not isinstance(statement, ast.If) or statement.orelse:
        return None
    name = none_tested(statement.test, ast.Is)
    last = statement.body[-1]
    if isinstance(last, ast.Raise):
        return name
    if not isinstance(last, ast.Assign) or is_none(last.value):
        return None
    return name if any(type(target) is ast.Name and target.id == name for target in last.targets) else None


def none_tested(test: ast.expr, operator: type[ast.cmpop]) -> str | None:
    """The name ``test`` compares with None (``name is None``: `ast.Is`; ``name is not None``: `ast.IsNot`)."""
    if (
        isinstance(test, ast.Compare)
        and type(test.left) is ast.Name
        and len(test.ops) == 1
        and isinstance(test.ops[0], operator)
        and is_none(test.comparators[0])
    ):
        return test.left.id
    return None
