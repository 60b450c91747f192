"""Which classes are vLLM attention classes, decided by where their bases come from.

A class is an attention class when one of its bases is one of vLLM's attention base classes
imported from vLLM's attention modules, or another class of the run deriving from one (a plugin's
base class in one file, its backends in others; classes nested in functions too): provenance, not
names, decides (other projects have their own ``AttentionBackend``). A backend vLLM uses without its
base (duck-typed) is one too, but makes no backends of its subclasses, and a class whose
``accept_output_buffer`` overrides that of its project's own base is that project's kind of backend. So are the
classes the run hands vLLM by name (`handed`): the impl a backend returns, the backend a platform names.

Stdlib ``ast`` only: this pass runs over every candidate file before libcst is imported, and
its results travel between processes, so they are plain picklable dataclasses.
"""

from __future__ import annotations

import ast
import gc
import os
from collections.abc import Callable, Iterable, Iterator, Sequence, Set
from dataclasses import dataclass, field
from typing import Protocol

from vllm_attn_compat.codemods.index import (
    accounting,
    calls,
    callsites,
    children,
    flags,
    handed,
    interface,
    occurrences,
    runtime_patches,
)
from vllm_attn_compat.codemods.index.calls import Use
from vllm_attn_compat.codemods.index.classgraph import ClassGraph
from vllm_attn_compat.codemods.index.flag_owners import FlagOwners
from vllm_attn_compat.codemods.index.interface import BACKEND_SHAPE, ClassFacts, Interfaces
from vllm_attn_compat.codemods.index.names import (
    FLAG,
    VLLM_LAYER_NAMES,
    RunModules,
    guess_module_name,
    is_vllm_base,
    normalize_path,
)
from vllm_attn_compat.codemods.index.names import (
    names_match as _names_match,
)
from vllm_attn_compat.codemods.index.occurrences import EMPTY as EMPTY_OCCURRENCES
from vllm_attn_compat.codemods.index.occurrences import Occurrences
from vllm_attn_compat.codemods.index.old_ops import OldOpBody, old_op_bodies
from vllm_attn_compat.codemods.index.runtime_patches import PatchEntry


@dataclass(frozen=True)
class ClassEntry:
    qualname: str  # as Python's __qualname__: "Outer.Inner", "factory.<locals>.Impl"
    bases: tuple[str, ...]  # dotted names resolved through the module's imports
    line: int
    # A backend vLLM uses without its base class: `get_name` and `get_impl_cls`, sets
    # `accept_output_buffer`, in a module that imports vLLM.
    duck_typed: bool = False
    declares_flag: bool = False  # `accept_output_buffer` is set in the class body
    flag_true: bool = False  # ... to the literal True
    members: tuple[str, ...] = ()  # the names its body defines (methods, attributes), sorted
    abstract: bool = False  # its body declares an abstract method
    # It defines a backend's `get_name` and `get_impl_cls`, in a module that imports vLLM (`interface`).
    backend_shaped: bool = False
    # The functions defined in its scope (its body, and the blocks of its body: the methods the engine's scopes
    # see, `engine.scope.FunctionFrame.attention_class`), and of them those taking an ``output`` parameter.
    methods: tuple[str, ...] = ()
    output_methods: tuple[str, ...] = ()
    # The classes its `get_impl_cls` and its `get_builder_cls` return, dotted, resolved through the module's names
    # (`handed`).
    impls: tuple[str, ...] = ()
    builders: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModuleIndex:
    path: str
    module: str  # dotted name guessed from the path
    classes: tuple[ClassEntry, ...]
    patches: tuple[PatchEntry, ...] = ()  # code this module copies onto classes at run time
    calls: calls.CallIndex = calls.EMPTY  # methods taking `output`, and attribute calls
    flag_reads: tuple[flags.FlagRead, ...] = ()  # reads of `accept_output_buffer`
    old_ops: tuple[OldOpBody, ...] = ()  # functions named as the ops vLLM 0.20 deleted
    # What else names what a fix changes: reflection, class-body reads, doctests, op strings (`occurrences`).
    occurrences: Occurrences = EMPTY_OCCURRENCES
    # The backends it names to vLLM by their dotted paths (`handed`): those a platform's `get_attn_backend_cls` returns,
    # and those vLLM's `register_backend` registers.
    backends: tuple[str, ...] = ()


# Classes, functions and imports are statements, so walking the bodies statements nest in finds every one of them
# (classes nested in functions, imports inside ``try``) without visiting a single expression.
_NESTED_BODIES = children.STATEMENT_BODIES

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# The statements that can copy code onto a class (`runtime_patches.from_statement` reads them).
_MAY_PATCH = (ast.Assign, ast.Expr, ast.AnnAssign, ast.For)


class _Indexer:
    def __init__(self, module: str, is_package: bool, helper_lines: runtime_patches.HelperLines) -> None:
        self.module = module
        self.is_package = is_package
        self.helper_lines = helper_lines
        self.imports: dict[str, str] = {}  # bound name -> dotted target
        self.module_classes: set[str] = set()
        self.scopes: list[tuple[str, dict[str, str]]] = []  # (qualname prefix, local classes)
        self.pending: list[tuple[str, list[ast.expr], int, list[dict[str, str]]]] = []
        self.module_functions: set[str] = set()
        self.duck_classes: set[str] = set()  # qualnames of classes shaped like a backend
        self.flag_classes: set[str] = set()  # qualnames of classes setting `accept_output_buffer`
        self.true_flags: set[str] = set()  # ... to the literal True
        self.facts: dict[str, tuple[tuple[str, ...], bool]] = {}  # qualname -> (members, declares an abstract method)
        self.methods: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # qualname -> (methods, output_methods)
        # qualname -> what its `get_impl_cls` and `get_builder_cls` return, and the scopes their names resolve in
        self.hooks: dict[str, tuple[list[ast.expr], list[ast.expr], list[dict[str, str]]]] = {}
        self.platform_paths: set[str] = set()  # the dotted paths a `get_attn_backend_cls` spells
        # Calls of something named `register_backend`: (callee, scopes, the path it registers or the qualname of the
        # class it decorates), resolved once the module's imports are known (`handed.registration`).
        self.registrations: list[tuple[ast.expr, list[dict[str, str]], str]] = []
        # Statements and decorated definitions that may patch a class, with the scopes to resolve them in.
        self.pending_patches: list[tuple[ast.stmt, str | None, list[dict[str, str]]]] = []

    def _prefix(self) -> str:
        return self.scopes[-1][0] if self.scopes else ""

    def visit_body(self, statements: Sequence[ast.AST]) -> None:  # statements, handlers or match cases
        for node in statements:
            # The exact type first (the parser makes no subclasses): most nodes fail it cheaper than
            # isinstance, which then only narrows the type, on its fast path.
            kind = type(node)
            if kind is ast.ClassDef and isinstance(node, ast.ClassDef):
                self.visit_ClassDef(node)
            elif kind in _FUNCTIONS and isinstance(node, _FUNCTIONS):
                self._visit_function(node)
            elif kind is ast.ImportFrom and isinstance(node, ast.ImportFrom):
                self.visit_ImportFrom(node)
            elif kind is ast.Import and isinstance(node, ast.Import):
                self.visit_Import(node)
            else:
                if (
                    kind in _MAY_PATCH
                    and isinstance(node, _MAY_PATCH)
                    and runtime_patches.may_patch(node, self.helper_lines)
                ):
                    self.pending_patches.append((node, None, [scope for _, scope in self.scopes]))
                if kind is ast.Expr and isinstance(node, ast.Expr) and type(node.value) is ast.Call:
                    found = handed.registration(node.value)
                    if found is not None and found[1] is not None:
                        self.registrations.append((found[0], [scope for _, scope in self.scopes], found[1]))
                fields = _NESTED_BODIES.get(kind)
                if fields:
                    for name in fields:
                        self.visit_body(getattr(node, name))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.imports[alias.asname] = alias.name
            else:
                head = alias.name.split(".", 1)[0]
                self.imports[head] = head

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            parts = self.module.split(".")
            drop = node.level - 1 if self.is_package else node.level
            package = ".".join(parts[: len(parts) - drop]) if drop < len(parts) else ""
            base = ".".join(p for p in (package, base) if p)
        for alias in node.names:
            if alias.name != "*":
                self.imports[alias.asname or alias.name] = f"{base}.{alias.name}" if base else alias.name

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        qualname = self._prefix() + node.name
        if self.scopes:
            self.scopes[-1][1][node.name] = qualname
        else:
            self.module_classes.add(node.name)
        local_scopes = [scope for _, scope in self.scopes]
        self.pending.append((qualname, list(node.bases), node.lineno, local_scopes))
        if node.decorator_list:
            self.pending_patches.append((node, qualname, local_scopes))
            for decorator in node.decorator_list:
                found = handed.registration(decorator)
                if found is not None:
                    path = found[1] if found[1] is not None else f"{self.module}.{qualname}"
                    self.registrations.append((found[0], local_scopes, path))
        defined = _defined_in_body(node)
        methods = list(_methods_in_scope(node.body))
        self.facts[qualname] = (tuple(sorted(defined)), _declares_abstract(node))
        self.methods[qualname] = (
            tuple(sorted({m.name for m in methods})),
            tuple(sorted({m.name for m in methods if calls.takes_output(m)})),
        )
        impls = [value for m in methods if m.name == handed.IMPL_HOOK for value in handed.returned_values(m)]
        builders = [value for m in methods if m.name == handed.BUILDER_HOOK for value in handed.returned_values(m)]
        if impls or builders:
            self.hooks[qualname] = (impls, builders, local_scopes)
        self.platform_paths.update(
            path for m in methods if m.name == handed.PLATFORM_HOOK for path in handed.named_paths(m)
        )
        if "accept_output_buffer" in defined:
            self.flag_classes.add(qualname)
            if _sets_flag_true(node):
                self.true_flags.add(qualname)
            if {"get_name", "get_impl_cls"} <= defined:
                self.duck_classes.add(qualname)
        self.scopes.append((qualname + ".", {}))
        self.visit_body(node.body)
        self.scopes.pop()

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        qualname = self._prefix() + node.name
        if self.scopes:
            self.scopes[-1][1].setdefault(node.name, qualname)
        else:
            self.module_functions.add(node.name)
        if node.decorator_list or self.helper_lines.may_build(node):
            self.pending_patches.append((node, qualname, [scope for _, scope in self.scopes]))
        self.scopes.append((self._prefix() + node.name + ".<locals>.", {}))
        self.visit_body(node.body)
        self.scopes.pop()

    def resolve(self, expr: ast.expr, local_scopes: list[dict[str, str]]) -> str | None:
        if isinstance(expr, ast.Subscript):  # AttentionImpl[Metadata]
            return self.resolve(expr.value, local_scopes)
        attrs: list[str] = []
        while isinstance(expr, ast.Attribute):
            attrs.insert(0, expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        head = expr.id
        for scope in reversed(local_scopes):
            if head in scope:
                return ".".join([self.module, scope[head], *attrs])
        if head in self.imports:
            return ".".join([self.imports[head], *attrs])
        if head in self.module_classes or head in self.module_functions:
            return ".".join([self.module, head, *attrs])
        return ".".join([head, *attrs])

    def resolve_bound(self, expr: ast.expr, local_scopes: list[dict[str, str]]) -> str | None:
        """Like `resolve`, but None unless the name is bound by an import or a definition of the module
        (a parameter or a computed value cannot be resolved)."""
        head = expr
        while isinstance(head, (ast.Attribute, ast.Subscript)):
            head = head.value
        if not isinstance(head, ast.Name):
            return None
        name = head.id
        bound = name in self.imports or name in self.module_classes or name in self.module_functions
        if not (bound or any(name in scope for scope in local_scopes)):
            return None
        return self.resolve(expr, local_scopes)

    def patches(self) -> tuple[PatchEntry, ...]:
        """The patches found, those without a resolved target only where the module uses vLLM."""
        entries: list[PatchEntry] = []
        for node, qualname, local_scopes in self.pending_patches:

            def resolve(expr: ast.expr, scopes: list[dict[str, str]] = local_scopes) -> str | None:
                return self.resolve_bound(expr, scopes)

            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                entries += runtime_patches.from_decorators(node, f"{self.module}.{qualname}", resolve)
                builder = (
                    None
                    if isinstance(node, ast.ClassDef)
                    else runtime_patches.builder_entry(node, f"{self.module}.{qualname}", resolve)
                )
                entries += [builder] if builder else []
            else:
                entries += runtime_patches.from_statement(node, resolve)
        uses_vllm = self.uses_vllm()
        return tuple(entry for entry in entries if entry.targets or uses_vllm)

    def uses_vllm(self) -> bool:
        return self.module.partition(".")[0] == "vllm" or any(
            target == "vllm" or target.startswith("vllm.") for target in self.imports.values()
        )


def _defined_in_body(node: ast.ClassDef) -> set[str]:
    defined: set[str] = set()
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(statement.name)
        elif isinstance(statement, ast.Assign):
            defined.update(target.id for target in statement.targets if isinstance(target, ast.Name))
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            defined.add(statement.target.id)
    return defined


def _methods_in_scope(body: Sequence[ast.AST]) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions defined in a class's scope: in its body, or in a block of it (``if TYPE_CHECKING:``, ``try:``),
    not in a nested function or class."""
    for statement in body:
        if isinstance(statement, _FUNCTIONS):
            yield statement
        else:
            for name in _NESTED_BODIES.get(type(statement), ()):
                yield from _methods_in_scope(getattr(statement, name))


def _declares_abstract(node: ast.ClassDef) -> bool:
    """Whether the class body defines a method decorated ``@abstractmethod`` (``@abc.abstractmethod``)."""
    return any(
        isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef))
        and any(
            (decorator.attr if isinstance(decorator, ast.Attribute) else getattr(decorator, "id", None))
            == "abstractmethod"
            for decorator in statement.decorator_list
        )
        for statement in node.body
    )


def _sets_flag_true(node: ast.ClassDef) -> bool:
    """Whether the class body's last assignment of ``accept_output_buffer`` is the literal True."""
    value: ast.expr | None = None
    for statement in node.body:
        if isinstance(statement, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == flags.FLAG for target in statement.targets
        ):
            value = statement.value
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            if statement.target.id == flags.FLAG:
                value = statement.value
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == flags.FLAG:
            value = None
    return isinstance(value, ast.Constant) and value.value is True


# Bases that make no class of anything: what derives from them alone has no interface of its own.
_PLAIN_BASES = frozenset({"object", "ABC", "Generic", "Protocol"})


def _is_torch_module(graph: ClassGraph, full_name: str) -> bool:
    """Whether the class derives from ``torch.nn.Module`` (however imported: ``nn.Module``)."""
    return any(base == "nn.Module" or base.endswith(".nn.Module") for base in graph.outside_bases(full_name))


def unparsed_index(source: bytes, path: str) -> ModuleIndex:
    """The index of a file that does not parse: its text's names, each a use the run cannot account for
    (`occurrences.unparsed_occurrences`), so that the fixes it may use stay withheld until it is mended."""
    found = occurrences.unparsed_occurrences(source)
    return ModuleIndex(normalize_path(path), guess_module_name(path), (), occurrences=found)


def index_module(
    source: bytes,
    path: str,
    parsed: Callable[[ast.Module], object] = lambda tree: None,
    names: Set[str] | None = None,
) -> ModuleIndex:
    """Index the classes of one module. Raises ``SyntaxError`` on unparsable input. ``parsed`` is given the
    syntax tree (the caller may keep it: it is not changed here). ``names``: the attribute names whose uses to
    record (`calls.CallIndex.names`), besides those of the module's own methods taking ``output`` (None: all)."""
    # The parse makes an object of every name and operator of the file, none of them in a reference cycle (a
    # tree frees itself): the cyclic collector, started again and again by those allocations, would scan the
    # growing tree (and all the run holds) for nothing, a fifth of the time of this function on a fork.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _index_module(source, path, parsed, names)
    finally:
        if collecting:
            gc.enable()


def _index_module(
    source: bytes, path: str, parsed: Callable[[ast.Module], object], names: Set[str] | None
) -> ModuleIndex:
    tree = ast.parse(source, filename=path)
    parsed(tree)
    module = guess_module_name(path)
    helper_lines = runtime_patches.HelperLines(source)
    indexer = _Indexer(module, os.path.basename(path) == "__init__.py", helper_lines)
    indexer.visit_body(tree.body)
    classes = []
    uses_vllm = indexer.uses_vllm()
    duck = indexer.duck_classes if uses_vllm else set()
    for qualname, bases, line, local_scopes in indexer.pending:
        resolved = (indexer.resolve(base, local_scopes) for base in bases)
        bases_found = tuple(name for name in resolved if name)
        flag = qualname in indexer.flag_classes
        true = qualname in indexer.true_flags
        members, abstract = indexer.facts[qualname]
        shaped = uses_vllm and set(members) >= BACKEND_SHAPE
        impls, builders, hook_scopes = indexer.hooks.get(qualname, ([], [], []))
        handing = [
            tuple(sorted({cls for value in values if (cls := indexer.resolve_bound(value, hook_scopes))}))
            for values in (impls, builders)
        ]
        entry = ClassEntry(
            qualname, bases_found, line, qualname in duck, flag, true, members, abstract, shaped,
            *indexer.methods[qualname], *handing,
        )  # fmt: skip
        classes.append(entry)
    if names is not None:
        names = {*names, *(name for _, own in indexer.methods.values() for name in own)}
    found_calls, found = calls.index_calls_and_occurrences(tree, indexer, b":=" in source, names)
    doctests = occurrences.doctest_uses(tree) if b">>>" in source else []
    ops = occurrences.op_strings(tree) if occurrences.OP_SOURCE.search(source) else []
    if doctests or ops:
        named = tuple(sorted((*found.named, *doctests), key=lambda use: (use.line, use.column)))
        found = Occurrences(found.class_names, found.reflection, named, tuple(ops), found.stores)
    reads: tuple[flags.FlagRead, ...] = ()
    if flags.FLAG_BYTES in source:
        reads = flags.index_flag_reads(tree, module, lambda expr: indexer.resolve_bound(expr, []))
    registered = {
        found
        for callee, scopes, found in indexer.registrations
        if handed.registers(indexer.resolve_bound(callee, scopes))
    }
    return ModuleIndex(
        normalize_path(path),
        module,
        tuple(classes),
        backends=tuple(sorted(registered | indexer.platform_paths)),
        patches=indexer.patches(),
        calls=found_calls,
        flag_reads=reads,
        old_ops=old_op_bodies(tree),
        occurrences=found,
    )


class Scopes(Protocol):
    """What `class_scope` and `layer_given_buffer` ask (`questions.Questions` has it, and so has the hierarchy)."""

    def is_attention_class(self, full_name: str) -> bool: ...

    def patch_scope(self, full_name: str, kind: str) -> str | None: ...

    def is_mla_layer_class(self, full_name: str) -> bool: ...


def class_scope(hierarchy: Scopes, full_name: str) -> tuple[bool, bool, bool]:
    """``(is_attention, unresolved_patch, built)`` of `ClassFrame` for the class ``full_name``: an attention
    class, or a "methods" class copied onto a class that could not be resolved, or of which a decorator
    builds a vLLM attention class (`runtime_patches.BUILT`): the rules act there, showing only."""
    if hierarchy.is_attention_class(full_name):
        return True, False, False
    scope = hierarchy.patch_scope(full_name, runtime_patches.MEMBERS)
    unresolved = scope in ("unresolved", "built")
    return unresolved, unresolved, scope == "built"


def layer_given_buffer(hierarchy: Scopes, layer: str, method: str) -> bool:
    """Whether vLLM passes the method ``method`` of the attention layer ``layer`` its buffer: an MLA layer's
    ``forward_impl`` alone. The layer allocates the buffer (its ``forward`` is called as ``layer(q, k, v)``); what its
    other methods take as ``output`` is its own code's to pass."""
    return method == "forward_impl" and hierarchy.is_mla_layer_class(layer)


def uses_read(hierarchy: ClassHierarchy) -> frozenset[str]:
    """The attribute names whose uses the analysis of ``hierarchy`` reads (`calls.CallIndex.names`): its call sites'
    targets, the methods whose fixes they may withhold (`callsites`), and the members whose parameters some release
    changed (what reads their signatures withholds VAC012's fix: `_drift`)."""
    from vllm_attn_compat.manifest.interface import drifted_names

    return frozenset({*drifted_names(), *(name for _, name in hierarchy.calls.methods)})


@dataclass
class ClassHierarchy:
    """Attention-ness of every class of a run; built once, queried per class."""

    modules: dict[str, str] = field(default_factory=dict)  # normalized path -> module name
    graph: ClassGraph = field(default_factory=ClassGraph)  # the run's classes and their bases
    _by_module: dict[str, list[str]] = field(default_factory=dict)  # module -> full class names
    _attention: dict[str, bool] = field(default_factory=dict)
    duck_typed: set[str] = field(default_factory=set)  # full names of backends shaped like one
    # vLLM's own `AttentionBackend`s of the run that declare `accept_output_buffer` (the run is a fork).
    flag_bases: set[str] = field(default_factory=set)
    # Every class of the run declaring `accept_output_buffer` -> whether to the literal True.
    flag_classes: dict[str, bool] = field(default_factory=dict)
    # Every read of the flag in the run, with the path of its file.
    flag_reads: list[tuple[str, flags.FlagRead]] = field(default_factory=list)
    # Code copied onto classes at run time: the source's last name -> (source, kind, targets, patching module).
    patches: dict[str, list[tuple[str, str, tuple[str, ...], str]]] = field(default_factory=dict)
    # Which fixes the run's calls withhold (`callsites`); set by `build` and `extended`.
    calls: callsites.CallAnalysis = field(default_factory=callsites.CallAnalysis)
    # Every module's occurrences of names that no attribute use accounts for (`accounting`), and, per old op an op
    # list of the run names, the strings that withhold its renaming (VAC006).
    occurrences: list[accounting.Located] = field(default_factory=list)
    ops: dict[str, tuple[accounting.Blocker, ...]] = field(default_factory=dict)
    _patched: list[tuple[str, str]] | None = None  # `_patched_in_scope`, once asked (asked once per file)
    _from_vllm: dict[str, bool] = field(default_factory=dict)
    _names: frozenset[str] | None = None  # `attention_class_names`, once asked (each round asks it twice)
    _flags: FlagOwners | None = None  # `flags`, once asked
    # The module names of every file of the run, indexed or not (`build`): an object a name of one of them binds
    # may be anything, one from elsewhere is outside the run (`accounting.reaches`).
    run_modules: frozenset[str] = frozenset()
    _all_modules: RunModules | None = None  # `all_modules`, once asked
    # What each class's body defines (`interface`), and the interfaces asked so far.
    facts: dict[str, ClassFacts] = field(default_factory=dict)
    methods: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)  # `ClassEntry.methods`
    _interfaces: Interfaces | None = None
    # The methods VAC012 may add parameters to (`interface.drift_candidates`), and the uses of the run reading the
    # signature of a method of one of their names (set by `build` and `extended`).
    drift: set[tuple[str, str]] = field(default_factory=set)
    signature_uses: list[tuple[str, Use]] = field(default_factory=list)
    _hands: handed.Handed | None = None  # the impls and backends the run's classes hand vLLM by name (`handed`)

    @property
    def _handed(self) -> handed.Handed:
        if self._hands is None:
            self._hands = handed.Handed(self.graph)
        return self._hands

    @classmethod
    def build(cls, indexes: Iterable[ModuleIndex], run_modules: Iterable[str] = ()) -> ClassHierarchy:
        """The hierarchy of ``indexes``; ``run_modules``: the module names of the run's other files (not indexed)."""
        hierarchy = cls()
        indexes = list(indexes)
        hierarchy.run_modules = frozenset(run_modules)
        for index in indexes:
            hierarchy.add(index)
        hierarchy.calls = callsites.analyse(hierarchy, indexes)
        hierarchy.ops = hierarchy.op_blockers()
        hierarchy.drift, hierarchy.signature_uses = hierarchy._drift(indexes)
        return hierarchy

    def _drift(self, indexes: Iterable[ModuleIndex]) -> tuple[set[tuple[str, str]], list[tuple[str, Use]]]:
        """VAC012's candidates, and the uses of ``indexes`` reading the signature of a method of one of their
        names."""
        drift = interface.drift_candidates(self.interfaces, self.graph)
        names = {name for _, name in drift}
        if not names:
            return drift, []
        uses = [
            (index.path, use) for index in indexes for use in index.calls.uses_named(names) if use.kind == "signature"
        ]
        return drift, uses

    def parameters_withheld(self, full_name: str, method: str, path: str) -> str | None:
        """Why adding parameters with defaults to ``full_name.method`` is withheld (VAC012's fix): a use of the run
        that may see the method's signature, by reading it or by reflection that may reach the class, a name a
        string looks up, a doctest, text that does not parse (`accounting.occurrence_blockers`). None: none."""
        found = interface.signature_readers(self.signature_uses, method)
        found += accounting.occurrence_blockers(self.occurrences, method, full_name, self.graph, self.all_modules())
        if not found:
            return None
        return f"withheld: {accounting.summary(found, method, normalize_path(path), {})}"

    def op_blockers(self) -> dict[str, tuple[accounting.Blocker, ...]]:
        """Per old op an op list of the run names, what withholds renaming it (`accounting.op_blockers`)."""
        sites = accounting.op_sites(self.occurrences)
        return {op: found for op, found in accounting.op_blockers(self.occurrences).items() if op in sites}

    def open_flags(self) -> list[str]:
        """The classes whose ``accept_output_buffer = True`` VAC004 may still delete safely (nothing withholds it)."""
        if self.declares_flag_in_base():
            return []
        return [
            full
            for full, true in self.flag_classes.items()
            if true
            and self.is_attention_class(full)
            and self.own_flag_base(full) is None
            and self.flag_readers(full) is None
        ]

    def accounting_terms(self) -> frozenset[str]:
        """What a file the run has not indexed must not hold for the safe fixes still made to stay safe (#50): the
        names of the methods with a fix nothing withholds yet, the flag's while a deletion of it is still safe,
        reflection's words while either is, and an old op's name, or a prefix composing op names, while its
        renaming in op lists is safe. A file holding one is indexed (`calltext.may_use` asks it); once every fix a
        name decides is withheld, its further occurrences change nothing, and the name is no longer looked for."""
        terms = set(callsites.open_method_names(self.calls))
        if self.open_flags():
            terms.add(FLAG)
        if terms:
            terms |= occurrences.REFLECTION_WORDS
        if any(not self.ops.get(op) for op in accounting.op_sites(self.occurrences)):
            terms |= occurrences.OP_TEXTS
        drifting = {name for full, name in self.drift if self.parameters_withheld(full, name, "") is None}
        if drifting:
            terms |= drifting | occurrences.REFLECTION_WORDS
        return frozenset(terms)

    def op_renaming_withheld(self, op: str, path: str) -> str | None:
        """Why renaming the old op ``op`` (``unified_attention``) in the op lists of the run is withheld, for the
        finding at ``path``; None when it is not (VAC006's safe fix)."""
        return accounting.op_reason(self.ops.get(op, ()), path)

    def add(self, index: ModuleIndex) -> None:
        self.modules[index.path] = index.module
        for entry in index.classes:
            full = f"{index.module}.{entry.qualname}"
            self.graph.add(full, entry.bases)
            self._by_module.setdefault(index.module, []).append(full)
            if entry.duck_typed:
                self.duck_typed.add(full)
            if entry.declares_flag and entry.qualname == "AttentionBackend" and is_vllm_base(full):
                self.flag_bases.add(full)
            if entry.declares_flag:
                self.flag_classes[full] = entry.flag_true
            self.facts[full] = ClassFacts(entry.members, entry.abstract, entry.backend_shaped)
            self.methods[full] = (entry.methods, entry.output_methods)
            self._handed.hands(full, entry.impls, entry.builders)
        self._handed.name(index.backends)
        self.flag_reads += [(index.path, read) for read in index.flag_reads]
        found = index.occurrences
        if found.class_names or found.reflection or found.named or found.op_strings or found.stores:
            self.occurrences.append(accounting.Located(index.path, index.module, found))
        for patch in index.patches:
            record = (patch.source, patch.kind, patch.targets, index.module)
            self.patches.setdefault(patch.source.rpartition(".")[2], []).append(record)
        self._attention.clear()
        self._from_vllm.clear()
        self._patched = None
        self._names = None
        self._flags = None
        self._all_modules = None
        self._interfaces = None

    def extended(self, index: ModuleIndex) -> ClassHierarchy:
        """A copy that also holds ``index`` (the hierarchy itself is left alone)."""
        copy = ClassHierarchy(
            dict(self.modules),
            self.graph.copy(),
            {k: list(v) for k, v in self._by_module.items()},
            duck_typed=set(self.duck_typed),
            flag_bases=set(self.flag_bases),
            flag_classes=dict(self.flag_classes),
            flag_reads=list(self.flag_reads),
            patches={k: list(v) for k, v in self.patches.items()},
            occurrences=list(self.occurrences),
            run_modules=self.run_modules,
            facts=dict(self.facts),
            methods=dict(self.methods),
        )
        copy._hands = self._handed.copy(copy.graph)
        copy.add(index)
        copy.calls = callsites.extend(self.calls, copy, index)
        copy.ops = copy.op_blockers()
        drift, uses = copy._drift([index])
        copy.drift, copy.signature_uses = self.drift | drift, [*self.signature_uses, *uses]
        return copy

    def all_modules(self) -> RunModules:
        """The module names of every file of the run, indexed or not."""
        if self._all_modules is None:
            stores = {store for place in self.occurrences for store in place.found.stores}
            self._all_modules = RunModules(self.run_modules | frozenset(self.modules.values()), stores)
        return self._all_modules

    @property
    def flags(self) -> FlagOwners:
        """Who owns the flag each class declares, and what reads it (`flag_owners`)."""
        if self._flags is None:
            self._flags = FlagOwners(
                self.graph,
                self.all_modules(),
                self.flag_classes,
                self.flag_reads,
                self.from_vllm,
                self.occurrences,
            )
        return self._flags

    def own_flag_base(self, full_name: str) -> str | None:
        return self.flags.own_flag_base(full_name)

    def flag_readers(self, full_name: str) -> str | None:
        return self.flags.flag_readers(full_name)

    def missing_classes(self) -> set[str]:
        """The classes (dotted names) the run has not indexed whose bases or members decide a fix: the flag owners'
        (`flag_owners.FlagOwners.missing_flag_classes`), and, while a fix of a class is still safe, what reflection
        is given by a name of one of the run's modules that names no class indexed (``getattr(Config, name)``: a
        class of a file not read yet, or any object); and the classes of the run's modules handed to vLLM by name
        (`handed`). The runner indexes the files that may define them."""
        missing = self.flags.missing_flag_classes()
        modules = self.all_modules()
        missing.update(
            ref for ref in self._handed.missing(self._is_backend) if accounting.global_of_the_run(ref, modules)
        )
        if callsites.open_method_names(self.calls) or self.open_flags():
            missing.update(
                target
                for place in self.occurrences
                for reflection in place.found.reflection
                if reflection.receiver in ("class", "instance")
                and (target := reflection.target) is not None
                and not self.graph.named(target)
                and accounting.global_of_the_run(target, modules)
            )
        return missing

    def covers(self, path: str) -> bool:
        return normalize_path(path) in self.modules

    def module_name(self, path: str) -> str:
        return self.modules.get(normalize_path(path)) or guess_module_name(path)

    def is_attention_class(self, full_name: str) -> bool:
        """``full_name`` is ``module.qualname`` as `module_name` and ``__qualname__`` give it."""
        known = self._attention.get(full_name)
        if known is not None:
            return known
        self._attention[full_name] = False  # breaks cycles (class A(B), class B(A) across files)
        # A duck-typed class whose flag overrides its own base's is that base's kind of backend, not vLLM's.
        result = (
            self.from_vllm(full_name)
            or (full_name in self.duck_typed and self.own_flag_base(full_name) is None)
            or self._handed_to_vllm(full_name)
        )
        self._attention[full_name] = result
        return result

    def _handed_to_vllm(self, full_name: str) -> bool:
        """Whether vLLM is handed the class by name (`handed`): a platform of the run names it as its backend, or a
        backend returns it from ``get_impl_cls`` and it is no torch module. (vLLM's attention layer is the module,
        and calls its impl with the buffer; a backend of no attention layer, a Mamba mixer's or an indexer's, hands
        its own layer, which vLLM never calls with one.) Its subclasses are not: vLLM is handed this class."""
        return self._handed.named_backend(full_name) or self._handed_impl(full_name)

    def _handed_impl(self, full_name: str) -> bool:
        """Whether a backend hands vLLM the class as its impl (`_handed_to_vllm`)."""
        backends = self._handed.impl_of(full_name)
        return bool(backends) and not _is_torch_module(self.graph, full_name) and any(map(self._is_backend, backends))

    def _duck_impl(self, full_name: str) -> bool:
        """Whether the class is an impl vLLM is handed that derives from nothing (but ``object``, ``ABC``,
        ``Generic``): it implements vLLM's impl interface by its shape alone (`interface.Interfaces`). One deriving
        from a class, vLLM's or the run's, has that class's interface or none."""
        return self._derives_from_nothing(full_name) and self._handed_impl(full_name)

    def _duck_builder(self, full_name: str) -> bool:
        """Whether the class is the metadata builder a backend hands vLLM (``get_builder_cls``) and derives from nothing
        (but ``object``, ``ABC``, ``Generic``): vLLM makes it and calls its hooks (``build``, and where a release
        still calls them ``build_for_drafting``, ``use_cascade_attention``) as it would a subclass of
        ``AttentionMetadataBuilder``'s (`interface.Interfaces`). It takes no output buffer: no attention code."""
        return self._derives_from_nothing(full_name) and any(map(self._is_backend, self._handed.builder_of(full_name)))

    def _derives_from_nothing(self, full_name: str) -> bool:
        """Whether the class's bases are none but ``object``, ``ABC``, ``Generic``, ``Protocol``."""
        return all(base.rpartition(".")[2] in _PLAIN_BASES for base in self.graph.bases.get(full_name, ()))

    def _is_backend(self, full_name: str) -> bool:
        """Whether vLLM may use the class as a backend: an attention class (a platform names it, or it derives from
        vLLM's), or one with a backend's shape in a module importing vLLM that derives from no class of the run (a
        project's own backend ABC is not vLLM's)."""
        if self.is_attention_class(full_name):
            return True
        facts = self.facts.get(full_name)
        return facts is not None and facts.backend_shaped and not self.graph.parents(full_name)

    def from_vllm(self, full_name: str) -> bool:
        """Whether the class is vLLM's (or a fork's copy of vLLM's base), derives from one through classes of
        the run, or has its members copied onto one: what makes a base's subclasses attention classes.
        (A duck-typed backend is an attention class, but is not vLLM's base: its subclasses are not.)"""
        known = self._from_vllm.get(full_name)
        if known is not None:
            return known
        self._from_vllm[full_name] = False  # breaks cycles (`patch_scope` asks of other classes)
        result = bool(self.graph.provenance(full_name)) or any(
            self.patch_scope(name, runtime_patches.MEMBERS) == "attention" for name in self.graph.lineage(full_name)
        )
        self._from_vllm[full_name] = result
        return result

    def is_layer_class(self, full_name: str) -> bool:
        """Whether the class is one of vLLM's attention layers (`names.VLLM_LAYER_NAMES`) or derives from one through
        the run's classes, and from none of its impls: vLLM calls its ``forward`` as ``layer(q, k, v)``, never
        with ``output`` (which the layer allocates), so what the rules say of ``output`` there does not hold."""
        names = {base.rpartition(".")[2] for base in self.graph.vllm_bases(full_name)}
        return bool(names & VLLM_LAYER_NAMES) and not any(name.endswith(("Impl", "ImplBase")) for name in names)

    def is_mla_layer_class(self, full_name: str) -> bool:
        """Whether the class is vLLM's MLA layer (``MLAAttention``) or a layer deriving from it: the one layer of
        which vLLM calls a method with the buffer (``forward_impl``, from its ``unified_mla_attention_with_output``
        op; a plugin's own layer's ``forward_impl`` is called by the plugin's code)."""
        names = {base.rpartition(".")[2] for base in self.graph.vllm_bases(full_name)}
        return "MLAAttention" in names and self.is_layer_class(full_name)

    def _is_attention_reference(self, reference: str) -> bool:
        return is_vllm_base(reference) or any(self.is_attention_class(other) for other in self.graph.named(reference))

    def patch_scope(self, full_name: str, kind: str) -> str | None:
        """``"attention"`` when the function (``kind`` ATTRIBUTE) or class (MEMBERS) ``full_name`` is copied
        onto an attention class at run time, ``"unresolved"`` when onto a class that cannot be resolved."""
        scope = None
        records = self.patches.get(full_name.rpartition(".")[2], ())
        if kind == runtime_patches.MEMBERS and any(
            patch_kind == runtime_patches.BUILT and _names_match(source, full_name) and self._builds_backends(targets)
            for source, patch_kind, targets, _ in records
        ):
            return "built"
        for source, patch_kind, targets, _ in records:
            if patch_kind != kind or not _names_match(source, full_name):
                continue
            if any(self._is_attention_reference(target) for target in targets):
                return "attention"
            if not targets:
                scope = "unresolved"
        return scope

    def _builds_backends(self, decorators: tuple[str, ...]) -> bool:
        """Whether one of ``decorators`` is a function of the run that builds a class deriving from an
        attention class, or from a class it is given (a parameter: counted where the builder's module
        uses vLLM, as `_Indexer.patches` keeps such entries only there)."""
        for decorator in decorators:
            for source, kind, bases, _ in self.patches.get(decorator.rpartition(".")[2], ()):
                if kind != runtime_patches.BUILDER or not _names_match(source, decorator):
                    continue
                if not bases or any(self._is_attention_reference(base) for base in bases):
                    return True
        return False

    def _patched_in_scope(self) -> list[tuple[str, str]]:
        """(source, patching module) of every patch that makes its source attention code, or code to report."""
        if self._patched is None:
            self._patched = [
                (source, module)
                for records in self.patches.values()
                for source, kind, _, module in records
                if kind != runtime_patches.BUILDER and self.patch_scope(source, _asked(kind)) is not None
            ]
        return self._patched

    @property
    def interfaces(self) -> Interfaces:
        """Which of vLLM's interface classes each class derives from (`interface`)."""
        if self._interfaces is None:
            self._interfaces = Interfaces(
                self.graph, self.facts, self._duck_impl, self._handed.named_backend, self._duck_builder
            )
        return self._interfaces

    def vllm_interface(self, full_name: str) -> str | None:
        """The manifest classes the class derives from, comma-separated (None: none); a backend by its shape alone
        has ``AttentionBackend`` with a ``~`` before it."""
        found = self.interfaces.of(full_name)
        if not found:
            return None
        return ("~" if self.interfaces.duck_typed(full_name) else "") + ",".join(found)

    def concrete_members(self, full_name: str) -> str | None:
        """The names the class and its ancestors in the run define, comma-separated, where it is a concrete
        subclass of an interface class (`interface.Interfaces.concrete_members`); None otherwise."""
        found = self.interfaces.concrete_members(full_name)
        return None if found is None else ",".join(found)

    def run_defines(self, manifest_class: str, member: str) -> bool:
        """Whether a class of the run deriving from vLLM's ``manifest_class`` defines ``member`` itself."""
        return self.interfaces.defines(manifest_class, member)

    def has_interface_classes(self, path: str) -> bool:
        """Whether the module at ``path`` defines a class deriving from vLLM's interface (`vllm_interface`)."""
        return any(self.interfaces.of(full) for full in self._by_module.get(self.module_name(path), ()))

    def interface_classes(self, path: str) -> str:
        """The full names of the classes of the module at ``path`` deriving from vLLM's interface, comma-separated."""
        return ",".join(full for full in self._by_module.get(self.module_name(path), ()) if self.interfaces.of(full))

    def in_run(self, module: str) -> bool:
        """Whether the module ``module`` is one of the run's files (a fork's ``vllm.v1.attention.backend``), by its
        full name (a guessed one may have more before it: a fork's ``src/vllm/...``)."""
        return self.all_modules().ends_with(module)

    def has_attention_classes(self, path: str) -> bool:
        """Whether the module at ``path`` defines any attention class, or a function patched onto one."""
        module = self.module_name(path)
        if any(self.is_attention_class(full) for full in self._by_module.get(module, ())):
            return True
        return any(_in_module(source, module) for source, _ in self._patched_in_scope())

    def methods_of(self, full_name: str) -> str:
        """The functions defined in the class's scope (`ClassEntry.methods`), comma-separated."""
        return ",".join(self.methods.get(full_name, ((), ()))[0])

    def buffer_methods(self, path: str) -> str:
        """What the module at ``path`` defines of the methods the rules on ``output`` act in, comma-separated:
        ``buffer``, a method taking ``output`` that vLLM passes the buffer (`engine.scope.FileContext.output_method`:
        of an attention class other than a layer, an MLA layer's ``forward_impl``, a function copied onto a class);
        ``layer``, a layer's own method taking ``output`` (`layer_output_method`); ``forward``, an attention class's
        ``forward`` or ``forward_mha`` that is no layer's (VAC009 reports one taking no ``output``)."""
        module = self.module_name(path)
        kinds = set()
        if any(_in_module(source, module) for source, _ in self._patched_in_scope()):
            kinds.add("buffer")
        for full in self._by_module.get(module, ()):
            methods, takes_output = self.methods.get(full, ((), ()))
            if not (methods and class_scope(self, full)[0]):
                continue
            layer = self.is_layer_class(full)
            if not layer and {"forward", "forward_mha"} & set(methods):
                kinds.add("forward")
            for name in takes_output:
                given = not layer or layer_given_buffer(self, full, name)
                kinds.add("buffer" if given else "layer")
        return ",".join(sorted(kinds))

    def attention_class_names(self) -> frozenset[str]:
        """Plain names (``PluginBase``) of the attention classes of the run, for the prefilter; with them the
        names of functions patched onto one from another module (their file is attention code too)."""
        if self._names is None:
            classes = {full.rpartition(".")[2] for full in self.graph if self.is_attention_class(full)}
            functions = {
                source.rpartition(".")[2]
                for source, module in self._patched_in_scope()
                if not _in_module(source, module)
            }
            self._names = frozenset(classes | functions)
        return self._names

    def scope_class_names(self) -> frozenset[str]:
        """`attention_class_names` and the plain names of the classes deriving from vLLM's interface: a file naming
        one may hold code the scoped rules act on (a subclass), so the rounds index it."""
        return self.attention_class_names() | self.interfaces.names(self.graph)

    def declares_flag_in_base(self) -> bool:
        """Whether the run is a fork whose own ``AttentionBackend`` still declares ``accept_output_buffer``:
        there a backend without the attribute reads the base's False."""
        return bool(self.flag_bases)

    def is_flag_base(self, full_name: str) -> bool:
        return full_name in self.flag_bases

    def patches_decided(self, index: ModuleIndex) -> bool:
        """Whether every patch of ``index`` is known to be attention code or unresolved (later rounds,
        finding more attention classes, could still turn the others)."""
        # A class builder decides nothing in its own module: the classes it builds are elsewhere.
        return all(
            patch.kind == runtime_patches.BUILDER or self.patch_scope(patch.source, _asked(patch.kind)) is not None
            for patch in index.patches
        )


def _asked(kind: str) -> str:
    """The kind `ClassHierarchy.patch_scope` is asked about for a patch entry of ``kind``: a class a
    decorator is applied to (`runtime_patches.BUILT`) is in scope as a "methods" class ("built")."""
    return runtime_patches.MEMBERS if kind == runtime_patches.BUILT else kind


def _in_module(dotted: str, module: str) -> bool:
    """Whether ``dotted`` names something defined in ``module`` (see `_names_match` on guessed names)."""
    owner = dotted.rpartition(".")[0]
    while owner:
        if _names_match(owner, module):
            return True
        owner = owner.rpartition(".")[0]  # a method or a nested function: its class or function is in it
    return False
