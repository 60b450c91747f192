"""What one module holds for the call-site analysis (`callsites`): its methods taking an ``output`` parameter,
the signatures of its classes' other methods, and its attribute calls, references and ``getattr`` uses, collected
from the syntax tree the class-hierarchy pass parsed (stdlib ``ast``; no other file is parsed for them). Plain
picklable data."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeAlias

from vllm_attn_compat.codemods.index import bindings, children, occurrences
from vllm_attn_compat.codemods.index.forwarded import Parameters, is_none, none_tested, reaches
from vllm_attn_compat.codemods.index.names import ALLOCATORS


class ModuleNames(Protocol):
    @property
    def imports(self) -> Mapping[str, str]: ...

    @property
    def module_classes(self) -> Set[str]: ...

    def resolve(self, expr: ast.expr, local_scopes: list[dict[str, str]]) -> str | None: ...


# What `withheld_reason` reads of `engine.scope.FileContext` and `FunctionFrame`: protocols, since scope
# imports the hierarchy, which imports this module.


@dataclass(frozen=True)
class OutputMethod:
    """A method taking an ``output`` parameter, as its class defines it."""

    owner: str  # the class's qualname
    name: str
    line: int
    kind: str  # "method", "static" or "class"
    positional: tuple[str, ...]  # positional parameters after the implicit self/cls
    required: frozenset[str]  # parameters without a default (after the implicit one)
    keywords: frozenset[str]  # parameters that may be passed by keyword
    varargs: bool
    varkw: bool
    output_default_none: bool
    fallback: str | None  # the allocation of an ``if output is None: output = ...`` opening the method
    asserts_output: bool = False  # its body holds ``assert output is not None`` (VAC001 deletes it)
    # Its decorators that may hand the function on (a registry, a dispatch table): its callers there are unknown.
    decorators: tuple[str, ...] = ()

    @property
    def output_may_lose_default(self) -> bool:
        """Whether VAC002 has a fix here: ``output`` defaults to None and no positional parameter before it has a
        default (else ``= None`` cannot simply go, and the rule only reports)."""
        if not self.output_default_none:
            return False
        if "output" not in self.positional:  # keyword-only
            return True
        return all(name in self.required for name in self.positional[: self.positional.index("output")])


class Signature(NamedTuple):  # a tuple of text: a fork's index holds thousands, made and pickled on each run
    """A method of a class that takes no ``output`` parameter, as a call binds to it. A call omitting the
    ``output`` that a method of the run requires, on a receiver the run cannot tell, may be meant for another
    attention class's method of the same name: where that one's named parameters take the call whole, the call
    is not reported (`callsites`)."""

    owner: str  # the class's qualname
    name: str
    # The parameters after the implicit self/cls as a ``def`` lists them, without annotations or default values:
    # ``"layer, /, query, key=, *, scale="`` (``=`` marks a default; ``/`` and ``*`` as in a ``def``, ``*`` standing
    # for ``*args`` too; ``**kwargs`` is left out, as it takes any keyword).
    parameters: str

    def takes(self, positional: int, keywords: Set[str]) -> bool:
        """Whether a call passing ``positional`` arguments and ``keywords`` binds here with each argument taken by a
        parameter of its own (``*args`` or ``**kwargs`` take anything, so they tell nothing of what the call is
        for) and every required parameter given."""
        names = self.parameters.split(", ") if self.parameters else []
        star = names.index("*") if "*" in names else len(names)
        slash = names.index("/") if "/" in names else -1
        by_position = [name.rstrip("=") for name in names[:star] if name != "/"]
        if positional > len(by_position) or not keywords.isdisjoint(by_position[:positional]):
            return False  # (one given twice raises TypeError)
        if not keywords <= {name.rstrip("=") for name in names[slash + 1 :] if name != "*"}:
            return False
        given = set(by_position[:positional]) | keywords
        return all(name in given for name in names if name not in ("/", "*") and not name.endswith("="))


# How a receiver that is no dotted name (a call's result, a subscript) reads in messages: `(...).forward(...)`.
UNSHOWN = "(...)"


class Use(NamedTuple):  # a tuple: tens of thousands are made and pickled on a fork
    """An attribute call (``x.m(...)``), an attribute handed on as a value, or ``getattr(x, "m")``."""

    name: str
    line: int
    column: int  # 1-based
    end_line: int
    kind: str  # "call", "reference", "signature" (`SIGNATURE_READERS`) or "getattr"
    # "self", "super", "class" (a name bound by an import or a class), "instance" (a local name bound once to what
    # a call of such a name made, `bindings`) or "other"
    receiver: str
    scope: str | None  # qualname of the class whose method holds it (self and super receivers)
    target: str | None  # dotted name of a "class" receiver
    text: str  # how the receiver reads, for messages
    positional: int = 0
    none_at: tuple[int, ...] = ()  # positional arguments that are a literal None
    keywords: frozenset[str] = frozenset()
    output_none: bool = False  # ``output=None`` by keyword
    starred: bool = False  # ``*args`` or ``**kwargs``: what they hold cannot be seen
    # Positional arguments, and ``output=`` by keyword, passing on a parameter of the calling function that may be
    # None (`forwarded`): ``self._decode(query, output)`` in a ``forward(..., output=None)``.
    forwarded_at: tuple[int, ...] = ()
    output_forwarded: bool = False
    # Of those, the calling method's own `output` (it may be None only where that method is called without a
    # buffer: `callsites` follows its uses), and that method's name, of the class ``scope``.
    relayed_at: tuple[int, ...] = ()
    output_relayed: bool = False
    relayed_from: str | None = None
    # Positional arguments, and ``output=`` by keyword, that are no buffer the run can prove (an attribute that may
    # hold None, what a call returns, a global): values, not just arguments (`forwarded.Parameters.cannot_be_none`).
    maybe_none_at: tuple[int, ...] = ()
    output_maybe_none: bool = False


@dataclass(frozen=True)
class CallIndex:
    methods: tuple[OutputMethod, ...] = ()
    uses: tuple[Use, ...] = ()  # in the order of the source: of the attribute names ``names`` only
    signatures: tuple[Signature, ...] = ()  # the classes' methods taking no `output`
    # The attribute names whose uses were recorded (None: all of them), and every attribute name the module uses
    # (read, called, handed to `getattr`): a run records the uses of the methods its analysis reads alone, and
    # indexes a module again where it uses one it did not record (`lacks`).
    names: frozenset[str] | None = None
    attributes: frozenset[str] = frozenset()

    def uses_named(self, names: Set[str]) -> list[Use]:
        """The uses of the attribute ``names``, in the order of the source: what the call-site analysis reads."""
        return [use for use in self.uses if use.name in names]

    def lacks(self, names: Set[str]) -> bool:
        """Whether the module uses one of the attribute ``names`` whose uses were not recorded."""
        return self.names is not None and not (self.attributes & names) <= self.names


EMPTY = CallIndex()


# --- indexing (runs where hierarchy.index_module runs, on the tree it parsed) ------------------------


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _tests_output(test: ast.expr, operator: type[ast.cmpop]) -> bool:
    """Whether ``test`` is ``output is None`` (``operator`` `ast.Is`) or ``output is not None`` (`ast.IsNot`)."""
    return none_tested(test, operator) == "output"


def _fallback(body: list[ast.stmt]) -> str | None:
    """The allocation of an ``if output is None: output = <alloc>(...)`` that opens ``body`` (after a
    docstring, asserts or ``pass``): the fallback VAC003 deletes."""
    for statement in body:
        if isinstance(statement, (ast.Assert, ast.Pass)) or (
            isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
        ):
            continue
        if not (isinstance(statement, ast.If) and not statement.orelse and len(statement.body) == 1):
            return None
        test, assign = statement.test, statement.body[0]
        if not _tests_output(test, ast.Is):
            return None
        if not (
            isinstance(assign, ast.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0], ast.Name)
            and assign.targets[0].id == "output"
            and isinstance(assign.value, ast.Call)
        ):
            return None
        func = _dotted(assign.value.func) or ""
        return ast.unparse(assign.value) if func.rpartition(".")[2] in ALLOCATORS else None
    return None


def _names_output(node: ast.expr) -> bool:
    return type(node) is ast.Name and node.id == "output"


def _asserts_output(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the method's own body (not a nested definition's) asserts ``output is not None``."""
    pending: list[ast.AST] = list(node.body)
    while pending:
        statement = pending.pop()
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(statement, ast.Assert) and _tests_output(statement.test, ast.IsNot):
            return True
        pending.extend(children.child_nodes(statement))
    return False


def _method_kind(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    for decorator in node.decorator_list:
        name = (_dotted(decorator) or "").rpartition(".")[2]
        if name == "staticmethod":
            return "static"
        if name == "classmethod":
            return "class"
    return "method"


def _output_method(owner: str, node: ast.FunctionDef | ast.AsyncFunctionDef, kind: str) -> OutputMethod:
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    pairs = list(zip(positional, defaults, strict=True))
    if kind != "static" and pairs:
        pairs = pairs[1:]  # self / cls, bound by the call
    kw_pairs = list(zip(args.kwonlyargs, args.kw_defaults, strict=True))  # None where one has no default
    default = {a.arg: d for a, d in [*pairs, *kw_pairs]}
    return OutputMethod(
        owner=owner,
        name=node.name,
        line=node.lineno,
        kind=kind,
        positional=tuple(a.arg for a, _ in pairs),
        required=frozenset(name for name, d in default.items() if d is None),
        keywords=frozenset(a.arg for a, _ in [*pairs, *kw_pairs] if a not in args.posonlyargs),
        varargs=args.vararg is not None,
        varkw=args.kwarg is not None,
        output_default_none="output" in default and is_none(default["output"]),
        fallback=_fallback(node.body),
        asserts_output=_asserts_output(node),
        decorators=tuple(
            occurrences.shorten(decorator) for decorator in node.decorator_list if not _passes_calls_on(decorator)
        ),
    )


# Decorators that return a function calling the one they decorate with the arguments it is given (or mark it): a
# call of the method still reaches it as written. By the last name of the decorator (called or not).
_PASSING_DECORATORS = frozenset(
    {"staticmethod", "classmethod", "abstractmethod", "override", "final", "no_grad", "inference_mode",
     "enable_grad", "compile", "disable"}
)  # fmt: skip


def _passes_calls_on(decorator: ast.expr) -> bool:
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (_dotted(node) or "").rpartition(".")[2] in _PASSING_DECORATORS


def _signature(owner: str, node: ast.FunctionDef | ast.AsyncFunctionDef, kind: str) -> Signature:
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    first_default = len(positional) - len(args.defaults)
    listed = [a.arg + "=" * (place >= first_default) for place, a in enumerate(positional)]
    if args.posonlyargs:
        listed.insert(len(args.posonlyargs), "/")
    if kind != "static" and positional:
        del listed[0]  # self / cls, bound by the call
    if args.vararg is not None or args.kwonlyargs:
        listed.append("*")
    listed += [
        a.arg + "=" * (default is not None) for a, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    return Signature(owner, node.name, ", ".join(listed))


def takes_output(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    args = node.args
    return any(a.arg == "output" for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))


@dataclass
class _Scope:
    prefix: str  # qualname prefix of what is defined here
    owner: str | None  # qualname of the class whose method this is (self/super resolve to it)
    self_name: str | None
    local_classes: dict[str, str] = field(default_factory=dict)
    function: bindings.Function | None = None  # the function whose body this is
    method: str | None = None  # its name, where it is a method of the class ``owner``
    walrus: bool = True  # whether the module may hold an assignment expression (`forwarded.Parameters`)
    _parameters: Parameters | None = None
    _bindings: bindings.Bindings | None = None

    def local_names(self) -> tuple[frozenset[str], frozenset[str]]:
        """`bindings.Bindings.local_names` of the function (nothing outside one)."""
        if self.function is None:
            return frozenset(), frozenset()
        return self._bound().local_names

    def constructed(self) -> dict[str, ast.expr]:
        """`bindings.Bindings.constructed` of the function (nothing outside one)."""
        return {} if self.function is None else self._bound().constructed

    def _bound(self) -> bindings.Bindings:
        """What the function binds, read when first asked for."""
        if self._bindings is None:
            assert self.function is not None
            self._bindings = bindings.Bindings(self.function)
        return self._bindings

    def parameters(self) -> Parameters:
        """What the function's parameters may hold (`forwarded.Parameters`), found when first asked for."""
        if self._parameters is None:
            self._parameters = Parameters(self.function, self.walrus)
        return self._parameters

    def string_values(self, value: ast.expr, line: int) -> tuple[str, ...]:
        """The strings ``value`` (a name reflection is given on ``line``) may be, where each binding of that name
        that may hold there (`forwarded.reaches`) binds it to a string literal or loops it over a literal of strings
        (``for name in ("k_scale", "v_scale")``); () for any string."""
        if type(value) is not ast.Name or self.function is None or value.id in self.parameters().names:
            return ()
        name = value.id
        found: list[str] = []
        accounted: set[int] = set()  # the targets read below
        stack: list[ast.AST] = list(self.function.body)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue  # their own scopes (a `nonlocal` there binds this one: below, as any other binding)
            strings: list[ast.expr] | None = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and type(node.targets[0]) is ast.Name:
                if node.targets[0].id == name:
                    strings, accounted = [node.value], accounted | {id(node.targets[0])}
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and type(node.target) is ast.Name:
                if node.target.id == name:
                    if not isinstance(node.iter, (ast.List, ast.Tuple, ast.Set)):
                        return ()
                    strings, accounted = list(node.iter.elts), accounted | {id(node.target)}
            elif isinstance(node, ast.Name) and node.id == name and type(node.ctx) is not ast.Load:
                if id(node) not in accounted and reaches(node.lineno, line, self.parameters().loops):
                    return ()  # bound some other way: a `with` or unpacking target, a walrus, `del`
            elif isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
                return ()
            if strings is not None and reaches(getattr(node, "lineno", 0), line, self.parameters().loops):
                for item in strings:
                    if not (type(item) is ast.Constant and isinstance(item.value, str)):
                        return ()
                    found.append(item.value)
            stack += children.child_nodes(node)
        return tuple(dict.fromkeys(found))


_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_Def: TypeAlias = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
# Nodes still to walk, each list with its parent and the scope (and enclosing scopes) it belongs to.
_Pending: TypeAlias = list[tuple[Sequence[ast.AST], ast.AST | None, _Scope, list[_Scope]]]
# Functions that read a callable's signature and never call it: a method handed to one of them is not handed
# on (deleting its assert or fallback changes nothing they read; making `output` required does).
SIGNATURE_READERS = frozenset({"inspect.signature", "inspect.getfullargspec", "inspect.Signature.from_callable"})
# Where an attribute is not handed on: an operand of a comparison or of an operator (a method there raises, or is
# compared), the object of a subscript. (The object of another attribute is read apart: `_push_object`.)
_NOT_ESCAPING = frozenset({ast.Attribute, ast.Compare, ast.BinOp, ast.UnaryOp})
# The attributes of a method object that give no way to call it: reading them reads nothing a fix changes.
_INERT_DUNDERS = frozenset({"__name__", "__qualname__", "__module__", "__doc__", "__self__", "__class__"})
_DEF_TYPES = frozenset({ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda})


def _push_object(
    node: ast.Attribute,
    push: Callable[[tuple[ast.AST, ast.AST | None]], None],
    between: Callable[[ast.Attribute, str], None],
) -> None:
    """Stack what ``node`` is an attribute of, past the attributes between (``a.b.c``: ``a``): an attribute's
    object is no reference of its own. ``between`` is given each attribute between, with the name read of it (it
    may still be a way to call it, ``x.m.__func__``, or reflection, ``x.__dict__.items()``)."""
    parent, value = node, node.value
    while type(value) is ast.Attribute and isinstance(value, ast.Attribute):
        if value.attr == "__dict__" or parent.attr.startswith("__"):
            between(value, parent.attr)
        parent, value = value, value.value
    if children.CHILDREN[type(value)]:
        push((value, parent))


class _Collector:
    def __init__(self, indexer: ModuleNames, walrus: bool = True, names: Set[str] | None = None) -> None:
        """``walrus``: whether the module may hold an assignment expression (its source holds ``:=``); ``names``: the
        attribute names whose uses to record (None: all)."""
        self.indexer = indexer
        self.walrus = walrus
        self.names = names
        self.attributes: set[str] = set()
        self.methods: list[OutputMethod] = []
        self.signatures: list[Signature] = []
        self.uses: list[Use] = []
        self.bound = set(indexer.imports) | indexer.module_classes
        self.reflection: list[occurrences.Reflection] = []
        self.named: list[occurrences.NamedUse] = []
        self.class_names: list[occurrences.ClassBodyName] = []
        self.stores: set[str] = set()

    def _receiver(self, node: ast.expr, scope: _Scope, scopes: list[_Scope]) -> tuple[str, str | None, str]:
        if type(node) is ast.Name and node.id == scope.self_name and scope.owner is not None:
            return "self", None, node.id
        if type(node) is ast.Call and type(node.func) is ast.Name and node.func.id == "super":
            return "super", None, "super()"
        dotted = _dotted(node)
        if dotted is None:
            return "other", None, UNSHOWN
        local = [s.local_classes for s in scopes if s.local_classes]
        callee = scope.constructed().get(node.id) if type(node) is ast.Name else None
        if callee is not None:  # bound once, to what `callee(...)` made: an instance, if it is a class
            if type(callee) is ast.Attribute and callee.attr == "__new__":  # `Impl.__new__(Impl)`: an `Impl`
                callee = callee.value
            bound, made = self._callee(callee, local)
            return ("instance", made, dotted) if bound else ("other", None, dotted)
        if self._binds(dotted, local):
            return "class", self.indexer.resolve(node, local), dotted
        return "other", None, dotted

    def _callee(self, callee: ast.expr, local: list[dict[str, str]]) -> tuple[bool, str | None]:
        """Whether an import or a class (of the module or of ``local`` scopes) binds the head of what a call calls,
        and the dotted name it resolves to: what the call makes is known by that name."""
        dotted = _dotted(callee)
        if dotted is None or not self._binds(dotted, local):
            return False, None
        return True, self.indexer.resolve(callee, local)

    def _binds(self, dotted: str, local: list[dict[str, str]]) -> bool:
        """Whether the head of ``dotted`` is bound by an import or a class (of the module or of ``local`` scopes)."""
        head = dotted.partition(".")[0]
        return head in self.bound or any(head in classes for classes in local)

    def collect(self, tree: ast.Module) -> CallIndex:
        top = _Scope("", None, None)
        pending: _Pending = [(tree.body, None, top, [top])]
        while pending:
            nodes, parent, scope, scopes = pending.pop()
            self._scope(nodes, parent, scope, scopes, pending)
        self.uses.sort(key=lambda use: (use.line, use.column))
        names = None if self.names is None else frozenset(self.names)
        return CallIndex(
            tuple(self.methods), tuple(self.uses), tuple(self.signatures), names, frozenset(self.attributes)
        )

    def found(self) -> occurrences.Occurrences:
        """What the walk found besides calls (`collect` first): reflection, names used by a string, names read in
        class bodies."""
        place = lambda item: (item.line, item.column)  # noqa: E731
        return occurrences.Occurrences(
            tuple(sorted(self.class_names, key=place)),
            tuple(sorted(self.reflection, key=place)),
            tuple(sorted(self.named, key=place)),
            (),
            tuple(sorted(self.stores)),
        )

    def _store(self, owner: ast.expr, attribute: str, scopes: list[_Scope]) -> None:
        """An attribute assigned on a name the module binds by an import or a definition (`Occurrences.stores`)."""
        dotted = _dotted(owner)
        local = [s.local_classes for s in scopes if s.local_classes]
        if dotted is not None and self._binds(dotted, local):
            resolved = self.indexer.resolve(owner, local)
            if resolved is not None:
                self.stores.add(f"{resolved}.{attribute}")

    def _between(self, node: ast.Attribute, outer: str, scope: _Scope, scopes: list[_Scope]) -> None:
        """``node`` is the object of the attribute ``outer`` (`_push_object`): reflection where it is ``__dict__``, a
        reference where ``outer`` is a dunder that can call it (``x.m.__func__``; not `_INERT_DUNDERS`)."""
        if node.attr == "__dict__":
            self._reflect(node, "dict", node.value, (), scope, scopes)
        if outer.startswith("__") and outer not in _INERT_DUNDERS:
            self._through(node, scope, scopes)

    def _records(self, name: str) -> bool:
        """Whether to record the uses of the attribute ``name`` (every one counts in `CallIndex.attributes`)."""
        self.attributes.add(name)
        return self.names is None or name in self.names

    def _through(self, node: ast.Attribute, scope: _Scope, scopes: list[_Scope]) -> None:
        """``node`` is the object of a dunder attribute that can call it (``x.m.__func__``): a reference of ``m``."""
        if not self._records(node.attr):
            return
        receiver, target, text = self._receiver(node.value, scope, scopes)
        end = node.end_lineno or node.lineno
        use = Use(node.attr, node.lineno, node.col_offset + 1, end, "reference", receiver, scope.owner, target, text)
        self.uses.append(use)

    def _reflect(
        self, node: ast.AST, kind: str, receiver: ast.expr | None, names: tuple[str, ...], scope: _Scope,
        scopes: list[_Scope],
    ) -> None:  # fmt: skip
        """Record reflection at ``node`` on ``receiver`` (None: the namespace it runs in, ``vars()``)."""
        line, column = getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1
        text = occurrences.shorten(node)
        if receiver is None:
            owner = scope.owner is None and scope.function is None and scope.prefix.endswith(".") and scope.prefix
            if owner and not scope.prefix.endswith(".<locals>."):  # a class body's namespace: its members
                found = occurrences.Reflection(line, column, kind, "namespace", owner[:-1], names, text)
            else:
                found = occurrences.Reflection(line, column, kind, "none", None, names, text)
            self.reflection.append(found)
            return
        how, target = self._reflected(receiver, scope, scopes)
        self.reflection.append(occurrences.Reflection(line, column, kind, how, target, names, text))

    def _reflected(self, node: ast.expr, scope: _Scope, scopes: list[_Scope]) -> tuple[str, str | None]:
        """What a reflection's receiver may be (`occurrences.Reflection.receiver`, and its target)."""
        if isinstance(node, (ast.Constant, ast.JoinedStr, *_LITERAL_TYPES)):
            return "none", None
        if isinstance(node, ast.Attribute) and node.attr == "__class__":
            how, target = self._reflected(node.value, scope, scopes)
            return _CLASS_OF.get(how, how), target
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "type"
            and len(node.args) == 1
            and not node.keywords
        ):
            how, target = self._reflected(node.args[0], scope, scopes)
            return _CLASS_OF.get(how, how), target
        # What a call returns, as where a name is bound once to it (`_receiver`, which tells ``super()`` apart).
        if isinstance(node, ast.Call) and not (type(node.func) is ast.Name and node.func.id == "super"):
            bound, made = self._callee(node.func, [s.local_classes for s in scopes if s.local_classes])
            if made in _MODULE_IMPORTERS:  # a module, whose attributes are its globals, never a class's members
                return "none", None
            return ("instance", made) if bound else ("any", None)
        receiver, target, _ = self._receiver(node, scope, scopes)
        if receiver == "instance" and target in _MODULE_IMPORTERS:  # bound once to what one returned
            return "none", None
        if receiver in ("self", "super"):
            function = scope.function
            is_class = function is not None and (
                _method_kind(function) == "class" or function.name in ("__init_subclass__", "__new__")
            )
            return ("cls" if is_class else "self"), scope.owner
        if receiver in ("class", "instance"):
            return receiver, target
        return "any", None

    def _define(
        self, node: _Def, parent: ast.AST | None, scope: _Scope, scopes: list[_Scope], pending: _Pending
    ) -> None:
        """A class, function or lambda: its header belongs to ``scope``, its body to a new one."""
        if isinstance(node, ast.ClassDef):
            qualname = scope.prefix + node.name
            if scope.prefix:
                scope.local_classes[node.name] = qualname
            inner = _Scope(qualname + ".", None, None)
            self.class_names += occurrences.class_body_names(node, qualname)
            for child in node.body:
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    kind = _method_kind(child)
                    if takes_output(child):
                        self.methods.append(_output_method(qualname, child, kind))
                    else:
                        self.signatures.append(_signature(qualname, child, kind))
            pending.append((node.body, node, inner, [*scopes, inner]))
            pending.append(([*node.bases, *node.keywords, *node.decorator_list], node, scope, scopes))
            return
        if not isinstance(node, ast.Lambda) and isinstance(parent, ast.ClassDef):
            args = [*node.args.posonlyargs, *node.args.args]
            first = args[0].arg if args and _method_kind(node) != "static" else None
            owner = scope.prefix[:-1]
            inner = _Scope(
                scope.prefix + node.name + ".<locals>.",
                owner,
                first,
                function=node,
                method=node.name,
                walrus=self.walrus,
            )
        elif isinstance(node, ast.Lambda):
            inner = _Scope(scope.prefix + "<lambda>.<locals>.", scope.owner, scope.self_name)
        else:
            inner = _Scope(
                scope.prefix + node.name + ".<locals>.", scope.owner, scope.self_name, function=node, walrus=self.walrus
            )
        if isinstance(node, ast.Lambda):
            pending.append(([node.body], node, inner, [*scopes, inner]))
            pending.append(([node.args], node, scope, scopes))
        else:
            pending.append((node.body, node, inner, [*scopes, inner]))
            header = [node.args, *node.decorator_list, *([node.returns] if node.returns else [])]
            pending.append((header, node, scope, scopes))

    def _scope(
        self, nodes: Sequence[ast.AST], parent: ast.AST | None, scope: _Scope, scopes: list[_Scope], pending: _Pending
    ) -> None:
        # An explicit stack: a deep expression the parser accepted must not exhaust Python's recursion. Nodes
        # are taken in the order of a plain depth-first walk (uses on one column of a line keep that order),
        # but a node that records nothing itself is not stacked: its children are, in its place.
        fields = children.CHILDREN
        stack = [(node, parent) for node in nodes if fields[type(node)]]
        uses = self.uses
        push, pop = stack.append, stack.pop
        # Types are compared exactly (the parser makes no subclasses): cheaper than isinstance on every node.
        attribute, call, load = ast.Attribute, ast.Call, ast.Load
        while stack:
            node, parent = pop()
            kind = type(node)
            if kind is attribute and isinstance(node, attribute):
                # Never a call's function: a call stacks the object of its function, not the function.
                if node.attr == "__dict__" and type(node.ctx) is load:
                    self._reflect(node, "dict", node.value, (), scope, scopes)
                elif type(node.ctx) is ast.Store:
                    self._store(node.value, node.attr, scopes)
                if (
                    type(node.ctx) is load
                    and type(parent) not in _NOT_ESCAPING
                    and not (isinstance(parent, ast.Subscript) and parent.value is node)
                    and self._records(node.attr)
                ):
                    receiver, target, text = self._receiver(node.value, scope, scopes)
                    end = node.end_lineno or node.lineno
                    uses.append(
                        Use(
                            node.attr,
                            node.lineno,
                            node.col_offset + 1,
                            end,
                            "signature" if self._reads_signature(node, parent) else "reference",
                            receiver,
                            scope.owner,
                            target,
                            text,
                        )
                    )
                _push_object(node, push, lambda inner, outer: self._between(inner, outer, scope, scopes))
                continue
            if kind is call and isinstance(node, call):
                self._call(node, scope, scopes)
                func = node.func
                if type(func) is attribute:
                    # the function is called: no reference of its own
                    _push_object(func, push, lambda inner, outer: self._between(inner, outer, scope, scopes))
                elif fields[type(func)]:
                    push((func, node))
                for argument in node.args:
                    if fields[type(argument)]:
                        push((argument, node))
                for keyword in node.keywords:  # a keyword records nothing: its value, in its place
                    if fields[type(keyword.value)]:
                        push((keyword.value, keyword))
                continue
            if kind in _DEF_TYPES and isinstance(node, _DEFS):
                self._define(node, parent, scope, scopes, pending)
                continue
            if kind is ast.MatchClass and isinstance(node, ast.MatchClass):  # `case T(forward=f)` reads `forward`
                self.named += [
                    occurrences.NamedUse(name, node.lineno, node.col_offset + 1, "lookup", occurrences.shorten(node))
                    for name in node.kwd_attrs
                ]
            elif kind.__name__ not in occurrences.KNOWN_NODES:
                self.named += occurrences.unknown_syntax(node)
            for name in fields[kind]:
                value: Any = getattr(node, name, None)
                if type(value) is list:
                    for item in value:
                        if fields[type(item)]:
                            push((item, node))
                elif fields[type(value)]:
                    push((value, node))

    def _reads_signature(self, node: ast.Attribute, parent: ast.AST | None) -> bool:
        """Whether ``node`` is the callable a `SIGNATURE_READERS` function is given (its first argument)."""
        if not (type(parent) is ast.Call and isinstance(parent, ast.Call) and parent.args and parent.args[0] is node):
            return False
        dotted = _dotted(parent.func)
        if dotted is None:
            return False
        head, dot, rest = dotted.partition(".")
        bound = self.indexer.imports.get(head)
        return bound is not None and f"{bound}{dot}{rest}" in SIGNATURE_READERS

    def _call(self, node: ast.Call, scope: _Scope, scopes: list[_Scope]) -> None:
        func = node.func
        callee = func.id if type(func) is ast.Name else func.attr if type(func) is ast.Attribute else None
        reflects = callee in occurrences.BY_NAME or callee in occurrences.ALL_MEMBERS or callee == "locals"
        if reflects and callee is not None and (type(func) is not ast.Name or not _shadowed(func.id, scopes)):
            self._reflection_call(node, callee, scope, scopes)
        elif callee in occurrences.NAME_LOOKUPS or (
            type(func) is ast.Attribute and "patch" in (_dotted(func.value) or "").rpartition(".")[2].lower()
        ):
            self._lookups(node)
        for value in (*node.args, *(k.value for k in node.keywords)):  # `map(getattr, ...)`: reflection handed on
            if type(value) is ast.Name and value.id in occurrences.REFLECTION_WORDS and not _shadowed(value.id, scopes):
                self.reflection.append(
                    occurrences.Reflection(
                        value.lineno, value.col_offset + 1, "other", "any", None, (), occurrences.shorten(node)
                    )
                )
        if type(func) is ast.Name and func.id == "getattr" and len(node.args) >= 2:
            name = node.args[1]
            if type(name) is ast.Constant and isinstance(name.value, str) and self._records(name.value):
                receiver, target, text = self._receiver(node.args[0], scope, scopes)
                end = node.end_lineno or node.lineno
                self.uses.append(
                    Use(
                        name.value,
                        node.lineno,
                        node.col_offset + 1,
                        end,
                        "getattr",
                        receiver,
                        scope.owner,
                        target,
                        text,
                    )
                )
            return
        if type(func) is not ast.Attribute or not self._records(func.attr):
            return
        keywords = [k for k in node.keywords if k.arg is not None]
        output = next((k for k in keywords if k.arg == "output"), None)
        parameters = scope.parameters()
        line = node.lineno
        forwarded = output is not None and parameters.may_be_none(output.value, line)
        output_none = output is not None and is_none(output.value)
        if output is not None and not output_none and not forwarded and parameters.cannot_be_none(output.value, line):
            return  # passes a buffer: never withholds a fix
        receiver, target, text = self._receiver(func.value, scope, scopes)
        positional = [a for a in node.args if type(a) is not ast.Starred]
        forwarded_at = tuple(i for i, a in enumerate(positional) if parameters.may_be_none(a, line))
        method = scope.method  # what it passes on of its own `output` is followed through its uses
        relayed_at = tuple(i for i in forwarded_at if method and _names_output(positional[i]))
        output_relayed = bool(method and forwarded and output is not None and _names_output(output.value))
        none_at = tuple(i for i, a in enumerate(positional) if is_none(a))
        maybe_none_at = tuple(
            i
            for i, a in enumerate(positional)
            if i not in none_at and i not in forwarded_at and not parameters.cannot_be_none(a, line)
        )
        self.uses.append(
            Use(
                func.attr,
                node.lineno,
                node.col_offset + 1,
                node.end_lineno or node.lineno,
                "call",
                receiver,
                scope.owner,
                target,
                text,
                positional=len(positional),
                none_at=none_at,
                keywords=frozenset(k.arg for k in keywords if k.arg is not None),
                output_none=output_none,
                starred=len(positional) != len(node.args) or len(keywords) != len(node.keywords),
                forwarded_at=forwarded_at,
                output_forwarded=forwarded,
                relayed_at=relayed_at,
                output_relayed=output_relayed,
                relayed_from=method if relayed_at or output_relayed else None,
                maybe_none_at=maybe_none_at,
                output_maybe_none=output is not None and not output_none and not forwarded,
            )
        )

    def _reflection_call(self, node: ast.Call, callee: str, scope: _Scope, scopes: list[_Scope]) -> None:
        """``getattr(x, name)`` and the like with a name that is no literal, ``vars(x)``, ``dir()``, ...: reflection,
        recorded with its receiver and, where the name is one of known literals, those names."""
        args = node.args
        if callee in occurrences.BY_NAME:
            if len(args) < 2 or any(type(a) is ast.Starred for a in args[:2]) or node.keywords:
                self._reflect(node, "other", args[0] if args and type(args[0]) is not ast.Starred else None, (),
                              scope, scopes)  # fmt: skip
                return
            name = args[1]
            if type(name) is ast.Constant and isinstance(name.value, str):
                if callee == "setattr":
                    self._store(args[0], name.value, scopes)
                return  # a literal name: a use of that name (`getattr`'s is a `Use`; the others read no method)
            self._reflect(node, "other", args[0], scope.string_values(name, node.lineno), scope, scopes)
            return
        receiver = args[0] if args and type(args[0]) is not ast.Starred else None
        if not args and not node.keywords:
            self._reflect(node, "dict" if callee in ("vars", "locals") else "other", None, (), scope, scopes)
        else:
            self._reflect(node, "dict" if callee == "vars" else "other", receiver or node, (), scope, scopes)

    def _lookups(self, node: ast.Call) -> None:
        """A call that looks members up by names given as strings (``attrgetter("a.forward")``, ``methodcaller``,
        ``mock.patch("pkg.T.forward")``, ``patch.object(T, "forward")``, ``patch.multiple(T, forward=...)``)."""
        text = occurrences.shorten(node)
        for value in node.args:
            if type(value) is ast.Constant and isinstance(value.value, str):
                for name in dict.fromkeys(_IDENTIFIER.findall(value.value)):
                    self.named.append(occurrences.NamedUse(name, value.lineno, value.col_offset + 1, "lookup", text))
        for keyword in node.keywords:
            if keyword.arg is not None:
                self.named.append(occurrences.NamedUse(keyword.arg, node.lineno, node.col_offset + 1, "lookup", text))


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _shadowed(name: str, scopes: list[_Scope]) -> bool:
    """Whether ``name`` in the innermost of ``scopes`` is a function's own variable, not the builtin (`bindings`)."""
    return bindings.shadows(name, (s.local_names() for s in reversed(scopes) if s.function is not None))


# The receiver of ``type(x)`` (``x.__class__``) by that of ``x``: the class of an instance is that class (or, for
# ``self``, a subclass); of anything else, what it may be (a literal's class is no class of the run).
_CLASS_OF = {"self": "cls", "instance": "class"}
# What returns a module (as a name bound by ``import`` holds one).
_MODULE_IMPORTERS = frozenset({"importlib.import_module", "importlib.reload"})
_LITERAL_TYPES = (ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def index_calls(tree: ast.Module, indexer: ModuleNames) -> CallIndex:
    """Output methods and attribute uses of one module (``indexer``: hierarchy's, after its pass)."""
    return _Collector(indexer).collect(tree)


def index_calls_and_occurrences(
    tree: ast.Module, indexer: ModuleNames, walrus: bool = True, names: Set[str] | None = None
) -> tuple[CallIndex, occurrences.Occurrences]:
    """`index_calls`, and what the same walk finds for the accounting: reflection, names a string looks up, names
    read in class bodies (`occurrences`); ``walrus``: whether the module may hold an assignment expression;
    ``names``: the attribute names whose uses to record (None: all)."""
    collector = _Collector(indexer, walrus, names)
    found = collector.collect(tree)
    return found, collector.found()
