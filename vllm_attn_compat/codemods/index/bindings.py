"""What a function binds in its own scope, read in one walk of its body, and the two questions the index asks of it.

- `Bindings.constructed`: the names bound exactly once, to what a call returns (``impl = MyImpl(...)``). Such a
  name holds what that call made wherever the function reads it, so a call on it (``impl.forward(...)`` in a
  test) is a call on an instance of the class called, when the callee is a class of the run (`callsites`
  decides: a factory function's result stays unknown). Any other binding makes the name unknown: a parameter, a
  second assignment, a loop or ``with`` target, an import, a ``global`` or ``nonlocal`` declaration (one in a
  nested function included), ``del``, a walrus, a comprehension's target.
- `Bindings.local_names` and `shadows`: where one of the names is a reflection builtin's (``dir``, ``vars``,
  ``getattr``), the function's code means its own variable by it, not the builtin (``os.path.join(dir, "x")``
  in ``def find(dir)``). Python decides this when it compiles the function: a name the function assigns,
  imports, defines, loops over, takes as a parameter or deletes anywhere in its body is local throughout the body
  (``nonlocal``: an enclosing function's). What is left out leaves the name to the builtin, the side that
  withholds fixes: anything bound inside a comprehension (its targets are its own scope's), the bindings of a
  class body, and any name the function declares ``global`` (the module may bind it, or not yet).

Each question errs on its own safe side, so a binding whose scope the walk does not decide (in a comprehension)
makes a name unknown to the first and leaves it to the builtin in the second.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterable

from vllm_attn_compat.codemods.index.children import push_children

Function = ast.FunctionDef | ast.AsyncFunctionDef
_DEFINITIONS = frozenset({ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda})
_COMPREHENSIONS = frozenset({ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp})
# The nodes that bind a name themselves, not through a `Name` they hold, and the assignments, which may bind one
# to a call (the parser makes no subclasses: types are compared exactly).
_BINDING = frozenset(
    {ast.Global, ast.Nonlocal, ast.Import, ast.ImportFrom, ast.ExceptHandler, ast.MatchAs, ast.MatchStar,
     ast.MatchMapping, ast.Assign, ast.AnnAssign}
)  # fmt: skip


class Bindings:
    """One function's bindings: ``counts`` (each binding by ``name = ...`` counts 1, any other 2), ``made``
    (``name = callee(...)``: the callee), ``declared`` (``global``), ``uncertain`` (bound in a comprehension)."""

    __slots__ = ("_constructed", "_local_names", "counts", "declared", "made", "uncertain")

    def __init__(self, function: Function) -> None:
        arguments = function.args
        self.counts = Counter(
            a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg,
                            arguments.kwarg] if a is not None
        )  # fmt: skip
        self.made: dict[str, ast.expr] = {}
        self.declared: set[str] = set()
        self.uncertain: set[str] = set()
        self._constructed: dict[str, ast.expr] | None = None
        self._local_names: tuple[frozenset[str], frozenset[str]] | None = None
        self._walk(function.body)

    @property
    def constructed(self) -> dict[str, ast.expr]:
        """Each name bound exactly once, by ``name = callee(...)``, with the callee (asked for each call on a name)."""
        if self._constructed is None:
            counts, uncertain = self.counts, self.uncertain
            self._constructed = {
                name: callee for name, callee in self.made.items() if counts[name] == 1 and name not in uncertain
            }
        return self._constructed

    @property
    def local_names(self) -> tuple[frozenset[str], frozenset[str]]:
        """(the names bound in the function's own scope, the names it declares ``global``)."""
        if self._local_names is None:  # (asked at each reflection builtin's use, of each function around it)
            bound = {name for name, count in self.counts.items() if count} - self.declared
            self._local_names = frozenset(bound), frozenset(self.declared)
        return self._local_names

    def _walk(self, body: list[ast.stmt]) -> None:
        # Every function of every indexed module is walked: types are compared exactly, the commonest first, and
        # the fields followed come from a table (`children`), not from `ast.iter_child_nodes`, four times slower.
        counts = self.counts
        stack: list[object] = list(body)
        name, load, constant = ast.Name, ast.Load, ast.Constant
        while stack:
            node = stack.pop()
            kind = type(node)
            if kind is name:
                if type(node.ctx) is not load:  # type: ignore[attr-defined]
                    counts[node.id] += 1  # type: ignore[attr-defined]
                continue
            if kind is constant:
                continue
            if kind in _DEFINITIONS:
                self._nested(node, stack)  # type: ignore[arg-type]
                continue
            if kind in _COMPREHENSIONS:
                self._comprehension(node)  # type: ignore[arg-type]
                continue
            if kind in _BINDING:
                self._bind(node)  # type: ignore[arg-type]
            push_children(node, stack)

    def _bind(self, node: ast.stmt | ast.excepthandler | ast.pattern) -> None:
        """Count the names a node of `_BINDING` binds itself (not through a `Name` it holds: that is counted where
        it stands), and record ``name = callee(...)``."""
        counts = self.counts
        if isinstance(node, ast.Global):
            self.declared.update(node.names)
            counts.update({name: 2 for name in node.names})
        elif isinstance(node, ast.Nonlocal):
            counts.update({name: 2 for name in node.names})  # an enclosing function's: no builtin either
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            counts.update({(a.asname or a.name).partition(".")[0]: 2 for a in node.names})
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
            if node.name:
                counts[node.name] += 2
        elif isinstance(node, ast.MatchMapping):
            if node.rest:
                counts[node.rest] += 2
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                self.made[targets[0].id] = node.value.func

    def _nested(self, node: ast.AST, stack: list[object]) -> None:
        """A definition inside the function: its name is bound here, what runs here (decorators, defaults, bases)
        is walked, and its body only for ``nonlocal`` declarations, which rebind the function's names."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.counts[node.name] += 2
            stack.extend(node.decorator_list)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(d for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None)
        if isinstance(node, ast.ClassDef):
            stack.extend([*node.bases, *node.keywords])
        inner: list[object] = [node]
        while inner:
            found = inner.pop()
            if type(found) is ast.Nonlocal:
                self.counts.update({name: 2 for name in found.names})
            else:
                push_children(found, inner)

    def _comprehension(self, node: ast.expr) -> None:
        """A comprehension: every name bound in it, its targets (its own scope) and its assignment expressions
        (the function's), is uncertain."""
        inner: list[object] = [node]
        while inner:
            found = inner.pop()
            if type(found) is ast.Name:
                if type(found.ctx) is not ast.Load:
                    self.uncertain.add(found.id)
            else:
                push_children(found, inner)


def shadows(name: str, scopes: Iterable[tuple[frozenset[str], frozenset[str]]]) -> bool:
    """Whether code means a variable by ``name``, not the builtin, where ``scopes`` are the `Bindings.local_names`
    of the functions it is in, the innermost first."""
    for bound, declared in scopes:
        if name in declared:
            return False
        if name in bound:
            return True
    return False
