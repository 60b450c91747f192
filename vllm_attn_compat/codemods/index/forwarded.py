"""Which arguments of a call pass on a parameter of the function making it that may be None.

``forward(self, ..., output=None)`` calling ``self._decode(query, output)`` passes ``_decode`` whatever its own
caller passed: None, for a caller that gives no buffer. Such an argument is no buffer, for the call-site
analysis (`callsites`): deleting ``_decode``'s ``if output is None`` fallback or its assert changes what that
caller gets. A parameter is taken to be possibly None where it defaults to None and no statement of the
function's body before the call's, at the top of the body, makes sure it is not (``if output is None: output =
...``, or ``raise``, and ``assert output is not None``): a statement at the top of a body runs before every
later one. A function's other parameters are what its callers pass, which the run does not follow here.

What else an argument may be is asked too (`Parameters.cannot_be_none`): only a value that cannot be None is a
buffer, for a fix that deletes a None test (issue #50: values, not just arguments). A fresh tensor (an allocation),
a literal, a parameter that is required or defaults to a value, a local name every binding of which is such a value,
and a slice or view of one are buffers; an attribute (``self.buffer``, a field that may default to None), a call of
anything else, a global, a literal None are not.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import cached_property

from vllm_attn_compat.codemods.index.children import STATEMENT_BODIES
from vllm_attn_compat.codemods.index.names import ALLOCATORS

# Tensor methods that return a tensor of the one they are called on (a view, a copy, a cast): not None where it is
# not None.
_TENSOR_OF = frozenset(
    {"view", "reshape", "flatten", "narrow", "transpose", "permute", "contiguous", "squeeze", "unsqueeze", "select",
     "view_as", "reshape_as", "expand", "expand_as", "as_strided", "to", "type_as", "float", "half", "bfloat16",
     "detach", "clone", "unflatten", "movedim", "t", "fill_", "zero_", "copy_", "chunk", "split", "__getitem__"}
)  # fmt: skip
_LITERALS = (ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.SetComp, ast.DictComp, ast.JoinedStr)


def is_none(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


class Parameters:
    """What one function's parameters may hold where it calls something (`may_be_none`), and what its locals may
    (`cannot_be_none`; ``walrus``: whether its module holds an assignment expression, which binds in an expression)."""

    def __init__(self, function: ast.FunctionDef | ast.AsyncFunctionDef | None, walrus: bool = True) -> None:
        self.function = function
        self.walrus = walrus

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

    @property
    def names(self) -> frozenset[str]:
        """The names of the function's parameters (``*args`` and ``**kwargs`` included)."""
        return (
            self._parameters
            | frozenset(a.arg for a in (self.function.args.vararg, self.function.args.kwarg) if a is not None)
            if self.function is not None
            else frozenset()
        )

    @cached_property
    def _parameters(self) -> frozenset[str]:
        if self.function is None:
            return frozenset()
        arguments = self.function.args
        every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
        return frozenset(argument.arg for argument in every)

    @cached_property
    def _locals(self) -> dict[str, list[tuple[int, ast.expr | None]]]:
        """Each name the function's own body binds, with each binding's line and value: the value of a plain
        assignment, None for any other binding (a loop, ``with``, unpacking, an augmented assignment, ``global``, an
        import, ...). Only statements bind names in a function, but for a walrus: a function holding one is walked
        whole."""
        bound: dict[str, list[tuple[int, ast.expr | None]]] = {}
        if self.function is None:
            return bound

        def other(target: ast.AST, line: int) -> None:  # the names a target binds (an attribute or subscript none)
            if isinstance(target, ast.Name):
                bound.setdefault(target.id, []).append((line, None))
            elif isinstance(target, (ast.Tuple, ast.List)):
                for element in target.elts:
                    other(element, line)
            elif isinstance(target, ast.Starred):
                other(target.value, line)

        def named(names: Iterable[str], line: int) -> None:
            for name in names:
                bound.setdefault(name, []).append((line, None))

        stack: list[ast.AST] = list(self.function.body)
        while stack:
            node = stack.pop()
            line = getattr(node, "lineno", 0)
            if isinstance(node, ast.Assign) or (isinstance(node, ast.AnnAssign) and node.value is not None):
                value = node.value
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):
                        bound.setdefault(target.id, []).append((line, value))
                    else:
                        other(target, line)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                named([node.name], line)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
                other(node.target, line)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        other(item.optional_vars, line)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                named(((alias.asname or alias.name).partition(".")[0] for alias in node.names), line)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                named(node.names, 0)  # from anywhere
            elif isinstance(node, ast.Delete):
                for target in node.targets:
                    other(target, line)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                named([node.name], line)
            elif isinstance(node, ast.match_case):
                for inner in ast.walk(node.pattern):
                    for name in (getattr(inner, "name", None), getattr(inner, "rest", None)):
                        if isinstance(name, str):
                            named([name], node.pattern.lineno)
            for field in STATEMENT_BODIES.get(type(node), ()):
                stack += getattr(node, field)
        if self.walrus:
            for inner in ast.walk(self.function):
                if isinstance(inner, ast.NamedExpr) and isinstance(inner.target, ast.Name):
                    named([inner.target.id], 0)
        return bound

    @cached_property
    def loops(self) -> list[tuple[int, int]]:
        """The lines of the function's loops: a binding in one may reach a use above it in the same loop."""
        return loops(self.function) if self.function is not None else []

    def reaching(self, name: str, line: int) -> list[tuple[int, ast.expr | None]] | None:
        """The bindings of the local ``name`` that may hold when ``line`` runs: those above it, or in a loop holding it
        too (a later statement runs before it only through a loop); None where the name is no local of the function."""
        bindings = self._locals.get(name)
        if bindings is None:
            return None
        return [(at, value) for at, value in bindings if reaches(at, line, self.loops)]

    def cannot_be_none(self, value: ast.expr, line: int, _seen: frozenset[str] = frozenset()) -> bool:
        """Whether ``value``, an argument of a call on ``line`` of the function, cannot be None there."""
        if isinstance(value, ast.Constant):
            return value.value is not None
        if isinstance(value, _LITERALS):
            return True
        if isinstance(value, ast.Name):
            name = value.id
            if name in self._parameters:
                return name not in self._defaults_none or not self.may_be_none(value, line)
            bindings = self.reaching(name, line)
            if not bindings or name in _seen:
                return False  # a global, unbound here, or a name whose value reads itself
            return all(item is not None and self.cannot_be_none(item, at, _seen | {name}) for at, item in bindings)
        if isinstance(value, ast.Subscript):
            return self.cannot_be_none(value.value, line, _seen)
        if isinstance(value, ast.IfExp):
            return self.cannot_be_none(value.body, line, _seen) and self.cannot_be_none(value.orelse, line, _seen)
        if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.Or):
            return self.cannot_be_none(value.values[-1], line, _seen)
        if isinstance(value, ast.Call):
            func = value.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ALLOCATORS:
                return True
            if isinstance(func, ast.Attribute) and name in _TENSOR_OF:
                return self.cannot_be_none(func.value, line, _seen)
            return False
        return False

    def may_be_none(self, argument: ast.expr, line: int) -> bool:
        """Whether ``argument`` of a call on ``line`` names a parameter that may be None there."""
        if type(argument) is not ast.Name or argument.id not in self._defaults_none:
            return False
        guarded = self._guards.get(argument.id)
        return guarded is None or guarded >= line


def loops(function: ast.AST) -> list[tuple[int, int]]:
    """The first and last lines of each loop in ``function``'s own body (not in nested definitions)."""
    found: list[tuple[int, int]] = []
    stack: list[ast.AST] = list(getattr(function, "body", []))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            found.append((node.lineno, node.end_lineno or node.lineno))
        for field in STATEMENT_BODIES.get(type(node), ()):
            stack += getattr(node, field)
    return found


def reaches(binding: int, use: int, spans: list[tuple[int, int]]) -> bool:
    """Whether a binding on line ``binding`` may hold at a use on line ``use`` (0: a binding from anywhere): it comes
    first, or a loop holds both."""
    return (
        binding < use or not binding or any(first <= binding <= last and first <= use <= last for first, last in spans)
    )


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
