"""Small libcst predicates shared by the rules (rule modules import this lazily)."""

from __future__ import annotations

import libcst as cst


def is_name(node: cst.CSTNode | None, value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value


def none_test(node: cst.BaseExpression, name: str = "output") -> str | None:
    """``"is"`` for ``<name> is None``, ``"is not"`` for ``<name> is not None``, else None."""
    if not isinstance(node, cst.Comparison) or len(node.comparisons) != 1:
        return None
    target = node.comparisons[0]
    if not (is_name(node.left, name) and is_name(target.comparator, "None")):
        return None
    if isinstance(target.operator, cst.Is):
        return "is"
    if isinstance(target.operator, cst.IsNot):
        return "is not"
    return None


class _NoneTests(cst.CSTVisitor):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.found = False

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if none_test(node, self.name):
            self.found = True


def contains_none_test(node: cst.CSTNode, name: str = "output") -> bool:
    visitor = _NoneTests(name)
    node.visit(visitor)
    return visitor.found


class _Assignments(cst.CSTVisitor):
    """Does a function body bind ``name`` (nested functions and classes are other scopes)?"""

    def __init__(self, name: str, ignore: tuple[cst.CSTNode, ...]) -> None:
        super().__init__()
        self.name = name
        self.ignore = ignore
        self.found = False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if any(node is skipped for skipped in self.ignore):
            return False
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        targets: list[cst.CSTNode] = []
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor)):
            targets = [node.target]
        elif isinstance(node, cst.NamedExpr):
            targets = [node.target]
        elif isinstance(node, cst.AsName):
            targets = [node.name]
        elif isinstance(node, cst.Del):
            targets = [node.target]
        for target in targets:
            if _binds(target, self.name):
                self.found = True
        return not self.found


def _binds(target: cst.CSTNode, name: str) -> bool:
    if is_name(target, name):
        return True
    if isinstance(target, (cst.Tuple, cst.List)):
        return any(_binds(element.value, name) for element in target.elements)
    if isinstance(target, cst.StarredElement):
        return _binds(target.value, name)
    return False


def rebinds(function: cst.FunctionDef, name: str, *, ignore: tuple[cst.CSTNode, ...] = ()) -> bool:
    """True when the body of ``function`` assigns ``name`` outside the ``ignore`` nodes."""
    visitor = _Assignments(name, ignore)
    function.body.visit(visitor)
    return visitor.found


def is_docstring(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


class _NoneGuards(cst.CSTVisitor):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.found: list[cst.If] = []

    def visit_If(self, node: cst.If) -> None:
        if none_test(node.test, self.name) == "is":
            self.found.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False


def rebinds_outside_none_guards(function: cst.FunctionDef, name: str) -> bool:
    """Like `rebinds`, but assignments under ``if <name> is None:`` do not count: they are the
    old fallbacks, not a local variable shadowing the parameter."""
    guards = _NoneGuards(name)
    function.body.visit(guards)
    return rebinds(function, name, ignore=tuple(guards.found))
