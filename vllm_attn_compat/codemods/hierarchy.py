"""Which classes are vLLM attention classes, decided by where their bases come from.

A class is an attention class when one of its bases is one of vLLM's attention base classes
imported from vLLM's attention modules, or another attention class defined anywhere in the
same run (a plugin's base class in one file, its backends in others; classes nested in
functions too). Names alone never decide: other projects have their own ``AttentionBackend``.

Stdlib ``ast`` only: this pass runs over every candidate file before libcst is imported, and
its results travel between processes, so they are plain picklable dataclasses.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from vllm_attn_compat.codemods import callsites

# Module prefixes (dotted) where vLLM defines its attention base classes, old and new layouts.
VLLM_ATTENTION_MODULES = (
    "vllm.v1.attention",
    "vllm.attention",
    "vllm.model_executor.layers.attention",
    "vllm.model_executor.layers.attention_layer_base",
)
VLLM_BASE_NAMES = frozenset(
    {
        "AttentionBackend",
        "AttentionImpl",
        "AttentionImplBase",
        "MLAAttentionImpl",
        "AttentionLayer",
        "AttentionLayerBase",
        "Attention",
        "MLAAttention",
    }
)
# vLLM's in-tree backends (FlashAttentionBackend, MLACommonImpl, ...) are attention classes
# too; a plugin deriving from them is found by these suffixes on names from the modules above.
_IN_TREE_SUFFIXES = ("Backend", "Impl")

# A file defining an attention class either imports from a vLLM attention module (its text
# then contains one of these), defines vLLM's own bases (a fork of vLLM), or derives from an
# attention class of the run, whose names the runner adds as tokens
# (`ClassHierarchy.attention_class_names`).
BASE_TOKENS: tuple[bytes, ...] = (
    b"vllm.v1.attention",
    b"vllm.attention",
    b"vllm.model_executor.layers.attention",
    b"import attention",
    b"class AttentionBackend",
    b"class AttentionImpl",
    b"class MLAAttentionImpl",
    b"class AttentionLayer",
    b"class Attention(",
    b"class MLAAttention(",
)


@dataclass(frozen=True)
class ClassEntry:
    qualname: str  # as Python's __qualname__: "Outer.Inner", "factory.<locals>.Impl"
    bases: tuple[str, ...]  # dotted names resolved through the module's imports
    line: int


@dataclass(frozen=True)
class ModuleIndex:
    path: str
    module: str  # dotted name guessed from the path
    classes: tuple[ClassEntry, ...]
    calls: callsites.CallIndex = callsites.EMPTY  # methods taking `output`, and attribute calls


def normalize_path(path: str) -> str:
    return path if path == "-" else os.path.normpath(os.path.abspath(path))


@lru_cache(maxsize=4096)
def guess_module_name(path: str) -> str:
    """``pkg/sub/mod.py`` -> ``pkg.sub.mod``, walking up while folders hold an ``__init__.py``."""
    if path == "-":
        return "__stdin__"
    head, name = os.path.split(normalize_path(path))
    stem = name.rsplit(".", 1)[0]
    parts = [] if stem == "__init__" else [stem]
    while head and os.path.isfile(os.path.join(head, "__init__.py")):
        head, package = os.path.split(head)
        parts.insert(0, package)
        if not package:
            break
    return ".".join(parts) or stem


def is_vllm_base(dotted: str) -> bool:
    """True for vLLM's attention base classes (and in-tree backends) by their full dotted name."""
    module, _, name = dotted.rpartition(".")
    if not any(module == prefix or module.startswith(prefix + ".") for prefix in VLLM_ATTENTION_MODULES):
        return False
    return name in VLLM_BASE_NAMES or name.endswith(_IN_TREE_SUFFIXES)


# Where statements nest, by statement type, in the order ``ast.NodeVisitor`` would reach them.
# Classes, functions and imports are statements, so walking these bodies finds every one of them
# (classes nested in functions, imports inside ``try``) without visiting a single expression.
_NESTED_BODIES: dict[type, tuple[str, ...]] = {
    ast.If: ("body", "orelse"),
    ast.For: ("body", "orelse"),
    ast.AsyncFor: ("body", "orelse"),
    ast.While: ("body", "orelse"),
    ast.With: ("body",),
    ast.AsyncWith: ("body",),
    ast.Try: ("body", "handlers", "orelse", "finalbody"),
    ast.ExceptHandler: ("body",),
}
if hasattr(ast, "TryStar"):  # Python >= 3.11
    _NESTED_BODIES[ast.TryStar] = ("body", "handlers", "orelse", "finalbody")
if hasattr(ast, "Match"):  # Python >= 3.10
    _NESTED_BODIES[ast.Match] = ("cases",)
    _NESTED_BODIES[ast.match_case] = ("body",)


class _Indexer:
    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.is_package = is_package
        self.imports: dict[str, str] = {}  # bound name -> dotted target
        self.module_classes: set[str] = set()
        self.scopes: list[tuple[str, dict[str, str]]] = []  # (qualname prefix, local classes)
        self.pending: list[tuple[str, list[ast.expr], int, list[dict[str, str]]]] = []

    def _prefix(self) -> str:
        return self.scopes[-1][0] if self.scopes else ""

    def visit_body(self, statements: list) -> None:
        for node in statements:
            kind = type(node)
            if kind is ast.ClassDef:
                self.visit_ClassDef(node)
            elif kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
                self._visit_function(node)
            elif kind is ast.ImportFrom:
                self.visit_ImportFrom(node)
            elif kind is ast.Import:
                self.visit_Import(node)
            else:
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
        self.scopes.append((qualname + ".", {}))
        self.visit_body(node.body)
        self.scopes.pop()

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
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
        if head in self.module_classes:
            return ".".join([self.module, head, *attrs])
        return ".".join([head, *attrs])


def index_module(source: bytes, path: str) -> ModuleIndex:
    """Index the classes of one module. Raises ``SyntaxError`` on unparsable input."""
    tree = ast.parse(source, filename=path)
    module = guess_module_name(path)
    indexer = _Indexer(module, is_package=os.path.basename(path) == "__init__.py")
    indexer.visit_body(tree.body)
    classes = []
    for qualname, bases, line, local_scopes in indexer.pending:
        resolved = (indexer.resolve(base, local_scopes) for base in bases)
        classes.append(ClassEntry(qualname, tuple(name for name in resolved if name), line))
    calls = callsites.index_calls(tree, indexer)
    return ModuleIndex(normalize_path(path), module, tuple(classes), calls)


def _names_match(reference: str, defined: str) -> bool:
    # Module names guessed from paths may lack their package prefix (no __init__.py, src
    # layouts), so a reference matches a class whose dotted name it ends with, or vice versa.
    return reference == defined or defined.endswith("." + reference) or reference.endswith("." + defined)


@dataclass
class ClassHierarchy:
    """Attention-ness of every class of a run; built once, queried per class."""

    modules: dict[str, str] = field(default_factory=dict)  # normalized path -> module name
    bases: dict[str, tuple[str, ...]] = field(default_factory=dict)  # full class name -> bases
    _by_last: dict[str, list[str]] = field(default_factory=dict)
    _by_module: dict[str, list[str]] = field(default_factory=dict)  # module -> full class names
    _attention: dict[str, bool] = field(default_factory=dict)
    # Which fixes the run's calls withhold (`callsites`); set by `build` and `extended`.
    calls: callsites.CallAnalysis = field(default_factory=callsites.CallAnalysis)

    @classmethod
    def build(cls, indexes: Iterable[ModuleIndex]) -> ClassHierarchy:
        hierarchy = cls()
        indexes = list(indexes)
        for index in indexes:
            hierarchy.add(index)
        hierarchy.calls = callsites.analyse(hierarchy, indexes)
        return hierarchy

    def add(self, index: ModuleIndex) -> None:
        self.modules[index.path] = index.module
        for entry in index.classes:
            full = f"{index.module}.{entry.qualname}"
            self.bases[full] = self.bases.get(full, ()) + entry.bases
            self._by_last.setdefault(full.rpartition(".")[2], []).append(full)
            self._by_module.setdefault(index.module, []).append(full)
        self._attention.clear()

    def extended(self, index: ModuleIndex) -> ClassHierarchy:
        """A copy that also holds ``index`` (the hierarchy itself is left alone)."""
        copy = ClassHierarchy(
            dict(self.modules),
            dict(self.bases),
            {k: list(v) for k, v in self._by_last.items()},
            {k: list(v) for k, v in self._by_module.items()},
        )
        copy.add(index)
        copy.calls = callsites.extend(self.calls, copy, index)
        return copy

    def covers(self, path: str) -> bool:
        return normalize_path(path) in self.modules

    def module_name(self, path: str) -> str:
        return self.modules.get(normalize_path(path)) or guess_module_name(path)

    def _classes_named(self, reference: str) -> list[str]:
        candidates = self._by_last.get(reference.rpartition(".")[2], ())
        return [full for full in candidates if _names_match(reference, full)]

    def is_attention_class(self, full_name: str) -> bool:
        """``full_name`` is ``module.qualname`` as `module_name` and ``__qualname__`` give it."""
        known = self._attention.get(full_name)
        if known is not None:
            return known
        self._attention[full_name] = False  # breaks cycles (class A(B), class B(A) across files)
        result = is_vllm_base(full_name) or any(
            is_vllm_base(base) or any(self.is_attention_class(other) for other in self._classes_named(base))
            for base in self.bases.get(full_name, ())
        )
        self._attention[full_name] = result
        return result

    def has_attention_classes(self, path: str) -> bool:
        """Whether the module at ``path`` defines any attention class."""
        return any(self.is_attention_class(full) for full in self._by_module.get(self.module_name(path), ()))

    def attention_class_names(self) -> frozenset[str]:
        """Plain names (``PluginBase``) of the attention classes of the run, for the prefilter."""
        return frozenset(
            full.rpartition(".")[2] for full in self.bases if self.is_attention_class(full)
        )
