"""The classes a run hands vLLM by name, whatever their bases: the impl a backend's ``get_impl_cls`` returns, which
vLLM's attention layer instantiates and calls with the output buffer, and the backend a platform's
``get_attn_backend_cls`` names by its dotted path, or vLLM's ``register_backend`` registers (by its path, or as the
class it decorates: vLLM's own docs show ``@register_backend(AttentionBackendEnum.CUSTOM)`` on a class of no base),
which vLLM imports and uses as the layer's backend (vllm-mlx's platform names a backend whose module never imports
vLLM). Such an impl's ``forward`` that returns a new tensor leaves vLLM's buffer unwritten as surely as a subclass of
``AttentionImpl`` would. And the metadata builder a backend's ``get_builder_cls`` returns, which vLLM makes and calls
as it would a subclass of ``AttentionMetadataBuilder`` (its ``build_for_drafting`` dies with vLLM's).

Stdlib ``ast`` only, as the rest of the class index.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from vllm_attn_compat.codemods.index.classgraph import ClassGraph

IMPL_HOOK = "get_impl_cls"
BUILDER_HOOK = "get_builder_cls"
PLATFORM_HOOK = "get_attn_backend_cls"
REGISTER = "register_backend"
# What a file must hold to hand vLLM a class: a hook's name, or `register_backend` (the class scan parses a file holding
# a hook's name, or `register_backend` where it names vLLM: torch's dynamo has one too; the prefilter keeps a file
# naming vLLM that holds any of them). A backend handing a builder (`BUILDER_HOOK`) is read as the backend it is: by
# its `get_impl_cls`, or its base's name.
HOOK_BYTES = (IMPL_HOOK.encode(), PLATFORM_HOOK.encode())
REGISTER_BYTES = REGISTER.encode()


def may_hand(source: bytes) -> bool:
    """Whether the file may hand vLLM a class by name (its index then says which)."""
    return any(hook in source for hook in HOOK_BYTES) or (REGISTER_BYTES in source and b"vllm" in source)


_DOTTED_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def returned_values(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.expr]:
    """The values the function's own ``return`` statements may give, each branch of ``a if c else b`` apart (not
    those of functions or classes it defines)."""
    return [
        value
        for node in _own_nodes(function)
        if isinstance(node, ast.Return) and node.value is not None
        for value in _alternatives(node.value)
    ]


def _own_nodes(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """The nodes of the function's body, but those of the functions, classes and lambdas it defines."""
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _NESTED):
            stack.extend(ast.iter_child_nodes(node))


def _alternatives(value: ast.expr) -> list[ast.expr]:
    """The values an expression may give: each branch of ``a if c else b``."""
    if isinstance(value, ast.IfExp):
        return [*_alternatives(value.body), *_alternatives(value.orelse)]
    return [value]


def named_paths(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    """The dotted paths the function's own body spells as string literals: what a platform's `get_attn_backend_cls`
    may return, whether it returns the literal, a name bound to it, or an entry of a table of them (vllm-ascend's
    ``backend_map[key]``, vllm-rbln's ``attn_backend_cls = "..."`` then ``return attn_backend_cls``)."""
    return dotted_paths(node for node in _own_nodes(function) if isinstance(node, ast.Constant))


def dotted_paths(values: Iterable[ast.expr]) -> tuple[str, ...]:
    """The string literals among ``values`` that spell a dotted path (``"plugin.attention.MyBackend"``)."""
    paths = {
        value.value
        for value in values
        if isinstance(value, ast.Constant) and isinstance(value.value, str) and _DOTTED_PATH.fullmatch(value.value)
    }
    return tuple(sorted(paths))


def registration(call: ast.expr) -> tuple[ast.expr, str | None] | None:
    """``(callee, path)`` of a call named ``register_backend`` registering an attention backend: the dotted path it
    gives (second argument, ``class_path=``), or None where it decorates the class; None for any other expression,
    a Mamba backend's registration (``is_mamba``, which no attention layer uses) or a path it computes. Whether the
    callee is vLLM's is the caller's to resolve (`registers`: torch's dynamo has a ``register_backend`` too)."""
    if not isinstance(call, ast.Call):
        return None
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name != REGISTER:
        return None
    mamba = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "is_mamba"), None)
    if mamba is not None and not (isinstance(mamba, ast.Constant) and mamba.value is False):
        return None
    path = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "class_path"), None)
    if path is None or (isinstance(path, ast.Constant) and path.value is None):
        return func, None
    paths = dotted_paths([path])
    return (func, paths[0]) if paths else None


def registers(callee: str | None) -> bool:
    """Whether ``callee`` (resolved through the module's imports) is vLLM's ``register_backend``."""
    return callee is not None and callee.startswith("vllm.") and callee.endswith(".registry." + REGISTER)


@dataclass
class Handed:
    """What the run hands vLLM: each class's ``get_impl_cls`` returns (dotted references), and the backends its
    modules name (`ModuleIndex.backends`). Asked by class (`impl_of`, `named_backend`) once the run's classes are in
    ``graph``."""

    graph: ClassGraph
    impls: dict[str, tuple[str, ...]] = field(default_factory=dict)  # class -> the references its hook returns
    backends: set[str] = field(default_factory=set)  # the dotted paths the modules name
    builders: dict[str, tuple[str, ...]] = field(default_factory=dict)  # class -> what its `get_builder_cls` returns
    _handed_by: dict[str, dict[str, set[str]]] | None = None  # hook -> class -> the backends returning it
    _named: set[str] | None = None

    def hands(self, full_name: str, impls: tuple[str, ...], builders: tuple[str, ...] = ()) -> None:
        """The class's ``get_impl_cls`` returns ``impls``, its ``get_builder_cls`` ``builders``."""
        if impls:
            self.impls[full_name] = impls
        if builders:
            self.builders[full_name] = builders
        self._handed_by = self._named = None  # (what a reference names changes with each class the graph gains)

    def name(self, backends: Iterable[str]) -> None:
        """A module names ``backends`` (dotted paths) to vLLM."""
        self.backends.update(backends)
        self._handed_by = self._named = None

    def copy(self, graph: ClassGraph) -> Handed:
        return Handed(graph, dict(self.impls), set(self.backends), dict(self.builders))

    def impl_of(self, full_name: str) -> set[str]:
        """The classes of the run whose ``get_impl_cls`` may return ``full_name``."""
        return self._by(IMPL_HOOK).get(full_name, set())

    def builder_of(self, full_name: str) -> set[str]:
        """The classes of the run whose ``get_builder_cls`` may return ``full_name``."""
        return self._by(BUILDER_HOOK).get(full_name, set())

    def _by(self, hook: str) -> dict[str, set[str]]:
        if self._handed_by is None:
            self._handed_by = {}
            for name, returned in ((IMPL_HOOK, self.impls), (BUILDER_HOOK, self.builders)):
                found = self._handed_by[name] = {}
                for backend, references in returned.items():
                    for reference in references:
                        for cls in self.graph.named(reference):
                            found.setdefault(cls, set()).add(backend)
        return self._handed_by[hook]

    def named_backend(self, full_name: str) -> bool:
        """Whether a platform of the run names the class as its attention backend."""
        if self._named is None:
            self._named = {full for path in self.backends for full in self.graph.named(path)}
        return full_name in self._named

    def missing(self, is_backend: Callable[[str], bool]) -> Iterator[str]:
        """The references to classes the run has not indexed: the backends the platforms name, and what the backends
        (``is_backend``) hand as impls and builders; the runner indexes the files that may define them."""
        yield from (path for path in self.backends if not self.graph.named(path))
        for returned in (self.impls, self.builders):
            for backend, references in returned.items():
                if is_backend(backend):
                    yield from (reference for reference in references if not self.graph.named(reference))
