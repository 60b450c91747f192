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
from functools import cached_property

from vllm_attn_compat.codemods.index import children
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
    def _locals(self) -> dict[str, list[ast.expr] | None]:
        """Each name the function's own body binds, with the values of its plain assignments; None for a name bound
        any other way too (a loop, ``with``, a walrus, unpacking, an augmented assignment, ``global``, ...)."""
        bound: dict[str, list[ast.expr] | None] = {}
        stack: list[ast.AST] = list(self.function.body) if self.function is not None else []
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound[node.name] = None
                continue
            if isinstance(node, ast.Lambda):
                continue
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        values = bound.setdefault(target.id, [])
                        if values is not None:
                            values.append(node.value)
                    else:
                        stack.append(target)
                stack.append(node.value)
                continue
            if isinstance(node, (ast.Global, ast.Nonlocal)):
                bound.update(dict.fromkeys(node.names))
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                bound[node.id] = None
            elif isinstance(node, ast.alias):
                bound[(node.asname or node.name).partition(".")[0]] = None
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound[node.name] = None
            stack += children.child_nodes(node)
        return bound

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
            values = self._locals.get(name)
            if not values or name in _seen:
                return False  # a global, a name bound otherwise, or one whose value reads itself
            return all(self.cannot_be_none(item, line, _seen | {name}) for item in values)
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
