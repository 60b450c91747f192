"""One module of one vLLM release, read with ``ast``: its classes and their members, its functions, the names it
provides, and the custom ops it registers. Every value is JSON-ready; source text is ``ast.unparse``'s, so a
reformatted line is no change.

A member's state (``member_state``) is a dict with, always, ``kind``; then as they apply:
``params`` ([name, kind, default or None, annotation or None] each, ``self``/``cls`` included), ``returns``,
``abstract``, ``deprecated`` (vLLM's message), ``deprecated_params`` ({name: message}), ``annotation``,
``value`` (an attribute's or enum member's source), ``setter`` (a property with one). ``referenced: false``
is added by release.py where vLLM no longer uses the name (references.py).
"""

from __future__ import annotations

import ast
import builtins
from typing import Any

from . import deprecation

# Parameter kinds, short for inspect.Parameter's POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD, VAR_POSITIONAL,
# KEYWORD_ONLY and VAR_KEYWORD (the loader gives them those names).
POSITIONAL_ONLY = "po"
POSITIONAL_OR_KEYWORD = "pk"
VAR_POSITIONAL = "var"
KEYWORD_ONLY = "ko"
VAR_KEYWORD = "varkw"

_ENUM_BASES = {"enum.Enum", "enum.IntEnum", "enum.StrEnum", "enum.Flag", "enum.IntFlag"}
_ABSTRACT = {"abstractmethod", "abstractproperty", "abstractclassmethod", "abstractstaticmethod"}
_PROPERTIES = {"property", "cached_property", "functools.cached_property", "abc.abstractproperty"}
# The names of vLLM's registration helper and torch's decorator, as the modules call them.
_REGISTER = "direct_register_custom_op"
_REGISTER_PARAMS = ("op_name", "op_func", "mutates_args", "fake_impl", "target_lib", "dispatch_key", "tags")

State = dict[str, Any]


class Module:
    """What one module defines; ``name`` is its dotted import path (``vllm.v1.attention.backend``)."""

    def __init__(self, name: str, source: str, is_package: bool = False) -> None:
        self.name = name
        self.is_package = is_package
        self.lines = source.splitlines()
        self.tree = ast.parse(source)
        self.imports: dict[str, str] = {}  # local name -> dotted target
        self.runtime_imports: dict[str, str] = {}  # the same, outside `if TYPE_CHECKING:`
        self._read_imports(self.tree.body, runtime=True)
        self.defined = self._defined_names()
        self.functions = {
            node.name: node for node in self.tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }

    # ------------------------------------------------------------------ names

    def _read_imports(self, body: list[ast.stmt], runtime: bool) -> None:
        for node in body:
            if isinstance(node, ast.If):
                type_checking = ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                self._read_imports(node.body, runtime and not type_checking)
                self._read_imports(node.orelse, runtime)
            elif isinstance(node, ast.Try):
                for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                    self._read_imports(block, runtime)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    self._bind(local, alias.name if alias.asname else local, runtime)
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(node.module, node.level)
                for alias in node.names:
                    if alias.name != "*":
                        self._bind(alias.asname or alias.name, f"{base}.{alias.name}", runtime)

    def _bind(self, local: str, target: str, runtime: bool) -> None:
        self.imports[local] = target
        if runtime:
            self.runtime_imports[local] = target

    def _absolute(self, module: str | None, level: int) -> str:
        if not level:
            return module or ""
        parts = self.name.split(".") if self.is_package else self.name.split(".")[:-1]
        anchor = parts[: len(parts) - (level - 1)]
        return ".".join([*anchor, *([module] if module else [])])

    def resolve(self, node: ast.expr) -> str:
        """The dotted name an expression in this module stands for (``Generic[T]`` -> ``typing.Generic``; a name
        defined here -> ``<module>.<name>``); the source text where it is no name."""
        while isinstance(node, ast.Subscript):
            node = node.value
        dotted = deprecation.decorator_name(node) if isinstance(node, ast.Name | ast.Attribute) else ""
        if not dotted:
            return ast.unparse(node)
        head, _, rest = dotted.partition(".")
        if head in self.imports:
            target = self.imports[head]
        elif head in self.defined:
            target = f"{self.name}.{head}"
        elif hasattr(builtins, head):
            target = f"builtins.{head}"
        else:
            target = head
        return f"{target}.{rest}" if rest else target

    def _defined_names(self) -> dict[str, str]:
        """{name: kind} of what the module's top level defines: "class", "function", "variable"."""
        found: dict[str, str] = {}
        for node in _top_level(self.tree.body):
            if isinstance(node, ast.ClassDef):
                found[node.name] = "class"
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found[node.name] = "function"
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in _assigned_names(target):
                        found.setdefault(name, "variable")
        return found

    def provided_names(self) -> dict[str, str]:
        """{name: kind} of what ``from <module> import name`` finds that vLLM put there: what the module defines,
        and the vLLM names it imports at run time when it is a package's ``__init__`` or lists them in
        ``__all__`` (kind ``import <target>``)."""
        names = dict(self.defined)
        exported = self._all()
        for local, target in self.runtime_imports.items():
            if local in names or not target.startswith("vllm."):
                continue
            if self.is_package or local in exported:
                names[local] = f"import {target}"
        return names

    def _all(self) -> set[str]:
        for node in self.tree.body:
            names = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in names):
                assert isinstance(node, ast.Assign)
                if isinstance(node.value, ast.List | ast.Tuple):
                    return {
                        e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                    }
        return set()

    # ------------------------------------------------------------------ classes

    def classes(self) -> dict[str, State]:
        """{qualified name: {"bases", "kind", "deprecated"?, "metaclass"?, "members": {name: state}}}."""
        found: dict[str, State] = {}
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef):
                found[f"{self.name}.{node.name}"] = self.class_state(node, found)
        return found

    def class_state(self, node: ast.ClassDef, earlier: dict[str, State]) -> State:
        bases = [self.resolve(base) for base in node.bases]
        state: State = {"bases": bases, "kind": self._class_kind(node, bases, earlier)}
        for keyword in node.keywords:
            if keyword.arg == "metaclass":
                state["metaclass"] = self.resolve(keyword.value)
        message = deprecation.from_decorators(node.decorator_list) or deprecation.from_docstring(node, set())[0]
        if message:
            state["deprecated"] = message
        state["members"] = self.members(node, state["kind"])
        return state

    def _class_kind(self, node: ast.ClassDef, bases: list[str], earlier: dict[str, State]) -> str:
        decorators = {deprecation.decorator_name(d).split(".")[-1] for d in node.decorator_list}
        if "dataclass" in decorators:
            return "dataclass"
        for base in bases:
            if base in _ENUM_BASES or earlier.get(base, {}).get("kind") == "enum":
                return "enum"
            if base in ("typing.NamedTuple", "typing.TypedDict"):
                return base.rpartition(".")[2].lower()
            if base in ("typing.Protocol", "typing_extensions.Protocol"):
                return "protocol"
        return "class"

    def members(self, node: ast.ClassDef, class_kind: str) -> dict[str, State]:
        members: dict[str, State] = {}
        body = list(_top_level(node.body))
        commented = deprecation.comment_runs(self.lines, body)
        for position, statement in enumerate(body):
            for name, state in self._member(statement, class_kind):
                if name in members and members[name]["kind"] == "property" and state.get("kind") == "setter":
                    members[name]["setter"] = True
                    continue
                if state.get("kind") == "setter":
                    continue
                if position in commented and "deprecated" not in state:
                    state["deprecated"] = commented[position]
                if state.get("kind") == "overload":
                    continue
                members[name] = state
        return members

    def _member(self, node: ast.stmt, class_kind: str) -> list[tuple[str, State]]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return [(node.name, self.function_state(node, in_class=True))]
        if isinstance(node, ast.ClassDef):
            return [(node.name, {"kind": "class", "bases": [self.resolve(base) for base in node.bases]})]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            annotation = ast.unparse(node.annotation)
            class_var = annotation.startswith(("ClassVar", "typing.ClassVar"))
            kind = "field" if class_kind in ("dataclass", "namedtuple", "typeddict") and not class_var else "attribute"
            state: State = {"kind": kind, "annotation": annotation}
            if node.value is not None:
                state["value"] = ast.unparse(node.value)
            return [(node.target.id, state)]
        if isinstance(node, ast.Assign):
            found = []
            for target in node.targets:
                for name in _assigned_names(target):
                    kind = "enum_member" if class_kind == "enum" and _enum_member_name(name) else "attribute"
                    found.append((name, {"kind": kind, "value": ast.unparse(node.value)}))
            return found
        return []

    def function_state(self, node: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> State:
        decorators = [deprecation.decorator_name(d) for d in node.decorator_list]
        short = {name.split(".")[-1] for name in decorators}
        kind = "function"
        if in_class:
            kind = "method"
            if "staticmethod" in short:
                kind = "staticmethod"
            elif "classmethod" in short:
                kind = "classmethod"
            elif any(name in _PROPERTIES or name.split(".")[-1] in _PROPERTIES for name in decorators):
                kind = "property"
            elif any(name.endswith((".setter", ".deleter")) for name in decorators):
                return {"kind": "setter"}
            elif node.name == "__new__":  # Python makes these static and class methods without a decorator
                kind = "staticmethod"
            elif node.name in ("__init_subclass__", "__class_getitem__"):
                kind = "classmethod"
        if "overload" in short:
            return {"kind": "overload"}
        params = _parameters(node.args)
        state: State = {"kind": kind, "params": params}
        if node.returns is not None:
            state["returns"] = ast.unparse(node.returns)
        if short & _ABSTRACT:
            state["abstract"] = True
        if isinstance(node, ast.AsyncFunctionDef):
            state["async"] = True
        names = {param[0] for param in params}
        warned, warned_params = deprecation.from_warnings(node)
        documented, documented_params = deprecation.from_docstring(node, names)
        message = deprecation.from_decorators(node.decorator_list) or warned or documented
        message = message or deprecation.comment_above(
            self.lines, min([node.lineno, *(d.lineno for d in node.decorator_list)])
        )
        if message:
            state["deprecated"] = message
        by_parameter = {**documented_params, **warned_params}
        if by_parameter:
            state["deprecated_params"] = dict(sorted(by_parameter.items()))
        return state

    def module_functions(self) -> dict[str, State]:
        return {
            f"{self.name}.{name}": self.function_state(node, in_class=False) for name, node in self.functions.items()
        }

    def class_scope_uses(self) -> set[str]:
        """The names read bare in a class body outside its functions (``forward_cuda = _make_forward(...)``): a
        class-scope name is visible by its bare name there alone, so this is the one use ``references`` cannot
        see by its ``.name`` or string pattern."""
        used: set[str] = set()
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef):
                for statement in _top_level(node.body):
                    if not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        used |= {
                            n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                        }
        return used

    # ------------------------------------------------------------------ ops

    def ops(self) -> dict[str, State]:
        """{"<namespace>::<name>": {"function", "params", "mutates_args", "fake_impl"?, "dispatch_key"?, "tags"?}}
        for each ``direct_register_custom_op(...)`` call and ``@torch.library.custom_op("ns::name", ...)``
        function of the module."""
        found: dict[str, State] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and deprecation.decorator_name(node.func).split(".")[-1] == _REGISTER:
                name, state = self._registered(node)
                found[name] = state
        for function in self.functions.values():
            for decorator in function.decorator_list:
                if isinstance(decorator, ast.Call) and deprecation.decorator_name(decorator).endswith("custom_op"):
                    name, state = self._decorated(function, decorator)
                    found[name] = state
        return dict(sorted(found.items()))

    def _registered(self, call: ast.Call) -> tuple[str, State]:
        given: dict[str, ast.expr] = dict(zip(_REGISTER_PARAMS, call.args, strict=False))
        given.update({k.arg: k.value for k in call.keywords if k.arg})
        op_name = deprecation.string_text(given.get("op_name")) or ast.unparse(given["op_name"])
        namespace = "vllm" if "target_lib" not in given else ast.unparse(given["target_lib"])
        state: State = {"registered_by": _REGISTER}
        function = given.get("op_func")
        if function is not None:
            state["function"] = ast.unparse(function)
            if isinstance(function, ast.Name) and function.id in self.functions:
                state["params"] = _parameters(self.functions[function.id].args)
                returns = self.functions[function.id].returns
                if returns is not None:
                    state["returns"] = ast.unparse(returns)
        state["mutates_args"] = _string_list(given.get("mutates_args"))
        for key in ("fake_impl", "dispatch_key", "tags"):
            if key in given:
                state[key] = ast.unparse(given[key])
        return f"{namespace}::{op_name}", state

    def _decorated(self, function: ast.FunctionDef | ast.AsyncFunctionDef, decorator: ast.Call) -> tuple[str, State]:
        name = deprecation.string_text(decorator.args[0]) if decorator.args else None
        state: State = {"registered_by": "custom_op", "function": function.name, "params": _parameters(function.args)}
        if function.returns is not None:
            state["returns"] = ast.unparse(function.returns)
        keywords = {k.arg: k.value for k in decorator.keywords if k.arg}
        state["mutates_args"] = _string_list(keywords.get("mutates_args"))
        return name or f"{self.name}.{function.name}", state


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of a body, with those of its ``if``/``try`` blocks (not ``if TYPE_CHECKING:``) in place."""
    found: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If):
            if ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                continue
            found += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            found += _top_level(node.body) + _top_level(node.orelse) + _top_level(node.finalbody)
            for handler in node.handlers:
                found += _top_level(handler.body)
        else:
            found.append(node)
    return found


def _assigned_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple | ast.List):
        return [name for element in target.elts for name in _assigned_names(element)]
    return []


def _enum_member_name(name: str) -> bool:
    """Whether ``enum`` makes a member of a name assigned in an Enum's body: not ``_sunder_``, ``__dunder__`` or a
    private ``__name`` (Python >= 3.11)."""
    sunder = len(name) > 2 and name[0] == name[-1] == "_" and name[1] != "_" and name[-2] != "_"
    return not (sunder or name.startswith("__"))


def _string_list(node: ast.expr | None) -> list[str] | str:
    """A literal list of strings as a list; anything else as its source text ("" when absent)."""
    if node is None:
        return []
    if isinstance(node, ast.List | ast.Tuple) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return [str(e.value) for e in node.elts]  # type: ignore[attr-defined]
    return ast.unparse(node)


def _parameters(args: ast.arguments) -> list[list[Any]]:
    """[name, kind, default source or None, annotation source or None] per parameter, in order."""
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    found: list[list[Any]] = []
    for index, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = POSITIONAL_ONLY if index < len(args.posonlyargs) else POSITIONAL_OR_KEYWORD
        found.append(_parameter(arg, kind, default))
    if args.vararg is not None:
        found.append(_parameter(args.vararg, VAR_POSITIONAL, None))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        found.append(_parameter(arg, KEYWORD_ONLY, default))
    if args.kwarg is not None:
        found.append(_parameter(args.kwarg, VAR_KEYWORD, None))
    return found


def _parameter(arg: ast.arg, kind: str, default: ast.expr | None) -> list[Any]:
    annotation = ast.unparse(arg.annotation) if arg.annotation is not None else None
    return [arg.arg, kind, ast.unparse(default) if default is not None else None, annotation]
