"""Which of vLLM's interface classes each class of the run derives from, and what it implements: what the rules
of the target release (VAC010-VAC013) ask of a class.

A class's interface is the manifest's classes (`manifest.interface.resolve_class`) that the bases of the class and
of its ancestors in the run name from outside the run (`classgraph.ClassGraph.outside_bases`): provenance, never a
name alone. A project's own ``AttentionBackend`` ABC is a class of the run, so its subclasses have no interface;
in a fork of vLLM, whose interface classes are the run's own, no class has one. A class vLLM uses as a backend
without deriving from its base (it defines ``get_name`` and ``get_impl_cls`` in a module that imports vLLM), and
the run's classes deriving from it, have ``AttentionBackend``'s interface, duck-typed; so has a backend a platform
names by its path, and an impl vLLM is handed (`handed`) that derives from nothing has ``AttentionImpl``'s
(``MLAAttentionImpl``'s where it defines ``forward_mqa``). Stdlib only; the manifest's data is read the first time a
base can be one of its classes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from vllm_attn_compat.codemods.index.accounting import Blocker
from vllm_attn_compat.codemods.index.calls import Use
from vllm_attn_compat.codemods.index.classgraph import ClassGraph
from vllm_attn_compat.codemods.index.names import named_as_base

BACKEND = "vllm.v1.attention.backend.AttentionBackend"
# What vLLM calls an impl it is handed by name (`handed`) as: its MLA layer calls `forward_mqa`, its other layers
# `forward`.
IMPL = "vllm.v1.attention.backend.AttentionImpl"
MLA_IMPL = "vllm.v1.attention.backend.MLAAttentionImpl"
BUILDER = "vllm.v1.attention.backend.AttentionMetadataBuilder"
# The methods that make a class vLLM uses as a backend without its base (ATOM's ``AiterMhaBackendForVllm``).
BACKEND_SHAPE = frozenset({"get_name", "get_impl_cls"})
_FORK_PREFIX = "vllm."


@dataclass(frozen=True)
class ClassFacts:
    """What a class's own body defines: its members' names, whether it declares an abstract method, and whether it
    has a backend's shape in a module that imports vLLM."""

    members: tuple[str, ...]
    abstract: bool = False
    backend_shaped: bool = False


def _handed_nothing(full_name: str) -> bool:
    return False


@dataclass
class Interfaces:
    """The interface of each class of ``graph`` (`of`), asked once per class."""

    graph: ClassGraph
    facts: dict[str, ClassFacts]
    # Whether vLLM is handed the class as a backend's impl (`handed`): duck-typed too, as the impl of its kind.
    handed_impl: Callable[[str], bool] = field(default=_handed_nothing)
    # Whether vLLM is named the class as a backend (`handed`): a backend by its shape, whatever its module imports.
    named_backend: Callable[[str], bool] = field(default=_handed_nothing)
    # Whether vLLM is handed the class as a backend's metadata builder (`handed`): duck-typed too, as a builder.
    handed_builder: Callable[[str], bool] = field(default=_handed_nothing)
    _of: dict[str, tuple[tuple[str, ...], bool]] = field(default_factory=dict)

    def of(self, full_name: str) -> tuple[str, ...]:
        """The manifest classes the class derives from (qualified names, sorted); () for none."""
        return self._interface(full_name)[0]

    def duck_typed(self, full_name: str) -> bool:
        """Whether the class's interface is a backend's by shape alone (it derives from no interface class)."""
        return self._interface(full_name)[1]

    def _interface(self, full_name: str) -> tuple[tuple[str, ...], bool]:
        known = self._of.get(full_name)
        if known is None:
            found = {
                resolved for base in self.graph.outside_bases(full_name) if (resolved := _resolved(base)) is not None
            }
            shaped = not found and any(
                self.facts.get(name, _NONE).backend_shaped or self.named_backend(name)
                for name in self.graph.lineage(full_name)
            )
            if shaped:
                known = ((BACKEND,), True)
            elif not found and self.handed_impl(full_name):
                mla = any(
                    "forward_mqa" in self.facts.get(name, _NONE).members for name in self.graph.lineage(full_name)
                )
                known = ((MLA_IMPL if mla else IMPL,), True)
            elif not found and self.handed_builder(full_name):
                known = ((BUILDER,), True)
            else:
                known = (tuple(sorted(found)), False)
            self._of[full_name] = known
        return known

    def concrete_members(self, full_name: str) -> tuple[str, ...] | None:
        """The names the class and its ancestors in the run define, where the class is a concrete subclass of an
        interface class: none of the run's classes derives from it (else it is one's base, whose subclasses
        implement the rest), its name does not say it is one (``PluginImplBase``, ``BaseImpl``, ``AbstractImpl``,
        ``CacheMixin``: a run over some of a project's files may hold a base without its subclasses), its body
        declares no abstract method, and it derives from an interface class (a duck-typed backend is no subclass:
        Python asks nothing of it). None otherwise."""
        facts = self.facts.get(full_name)
        if facts is None or facts.abstract or not self.of(full_name) or self.duck_typed(full_name):
            return None
        if named_as_base(full_name.rpartition(".")[2]):
            return None
        if self.graph.descendants(full_name) != {full_name}:
            return None
        names = {name for cls in self.graph.lineage(full_name) for name in self.facts.get(cls, _NONE).members}
        return tuple(sorted(names))

    def defines(self, manifest_class: str, member: str) -> bool:
        """Whether a class of the run that derives from ``manifest_class`` defines ``member`` itself (a read of it on
        an instance of ``manifest_class`` may then find the project's)."""
        from vllm_attn_compat.manifest.interface import derives

        return any(
            member in facts.members and any(derives(cls, manifest_class) for cls in self.of(full))
            for full, facts in self.facts.items()
        )

    def names(self, classes: Iterable[str]) -> frozenset[str]:
        """The plain names of those of ``classes`` that have an interface."""
        return frozenset(full.rpartition(".")[2] for full in classes if self.of(full))


_NONE = ClassFacts(())


def _resolved(base: str) -> str | None:
    """The manifest class an outside base names, if any (the manifest is read only for a name of vLLM's attention
    code)."""
    if not base.startswith(_FORK_PREFIX) or "attention" not in base.rpartition(".")[0]:
        return None
    from vllm_attn_compat.manifest.interface import resolve_class

    return resolve_class(base)


# --- the accounting of VAC012's fix: parameters added with defaults -------------------------------------------


def drift_candidates(interfaces: Interfaces, classes: Iterable[str]) -> set[tuple[str, str]]:
    """(class, method) of the methods that VAC012 may add parameters to, at some release: those the interface
    classes' members have whose parameters some release changed (`manifest.interface.drifted_names`)."""
    from vllm_attn_compat.manifest.interface import drifted_names

    with_interface = [full for full in classes if interfaces.of(full)]
    if not with_interface:
        return set()
    drifted = drifted_names()
    return {
        (full, name) for full in with_interface for name in interfaces.facts.get(full, _NONE).members if name in drifted
    }


def signature_readers(uses: Iterable[tuple[str, Use]], name: str) -> list[Blocker]:
    """The uses reading the signature of a method named ``name`` (``inspect.signature(x.m)``), whatever the
    receiver: parameters added with defaults change what they see, and nothing else of a call that binds today
    (the method takes neither ``*args`` nor ``**kwargs``: `engine.signatures.appended`)."""
    return [
        Blocker(path, use.line, use.column, use.end_line, "signature", use.text, use.receiver != "other")
        for path, use in uses
        if use.name == name and use.kind == "signature"
    ]
