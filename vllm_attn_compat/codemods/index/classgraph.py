"""The classes of a run and how they derive from one another: the one class graph of the index.

Every question the index asks about inheritance goes through :class:`ClassGraph`: which classes of the run a
dotted name may name, a class's ancestors and descendants among them, whether two classes can share an
instance, and where a class's vLLM interface comes from (:meth:`ClassGraph.provenance`). The hierarchy
(`hierarchy.ClassHierarchy`: which classes are attention classes), the flag's owners (`flag_owners`) and the
call sites (`callsites`) all ask it; none walks the bases itself.

A class is known by its full name, ``module.qualname`` (``plugin.backend.MyImpl``); its bases by the dotted
names its module's imports resolve them to. Module names guessed from paths may lack a package prefix, so a
base names the classes of the run whose full name it ends with, or which end with it (`names.names_match`).
The answers are computed once per graph, when first asked, and kept until a class is added. Plain data:
the graph travels to the worker processes inside the hierarchy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from vllm_attn_compat.codemods.index.names import is_vllm_base, names_match

_METACLASS_ENDINGS = ("Meta", "Metaclass", "MetaClass", "EnumType")


class ClassGraph:
    """The run's classes (full names) with their bases (dotted names, as resolved by their modules)."""

    def __init__(self) -> None:
        self.bases: dict[str, tuple[str, ...]] = {}
        self._by_last: dict[str, list[str]] = {}
        self._forget()

    def _forget(self) -> None:
        self._named: dict[str, tuple[str, ...]] = {}
        self._ancestors: dict[str, tuple[str, ...]] = {}
        self._descendants: dict[str, frozenset[str]] | None = None
        self._provenance: dict[str, dict[str, tuple[str, ...]]] = {}

    def add(self, full_name: str, bases: Iterable[str]) -> None:
        """Add a class (a name added twice, as two modules guessed alike, gets both lists of bases)."""
        if full_name not in self.bases:
            self._by_last.setdefault(full_name.rpartition(".")[2], []).append(full_name)
        self.bases[full_name] = self.bases.get(full_name, ()) + tuple(bases)
        self._forget()

    def copy(self) -> ClassGraph:
        copy = ClassGraph()
        copy.bases = dict(self.bases)
        copy._by_last = {last: list(names) for last, names in self._by_last.items()}
        return copy

    def __contains__(self, full_name: object) -> bool:
        return full_name in self.bases

    def __iter__(self) -> Iterator[str]:
        return iter(self.bases)

    # --- names ---------------------------------------------------------------------------------------------

    def named(self, reference: str) -> tuple[str, ...]:
        """The classes of the run the dotted name ``reference`` may name (`names.names_match`)."""
        known = self._named.get(reference)
        if known is None:
            candidates = self._by_last.get(reference.rpartition(".")[2], ())
            known = self._named[reference] = tuple(full for full in candidates if names_match(reference, full))
        return known

    def named_loosely(self, reference: str) -> tuple[str, ...]:
        """`named`, or else every class of the run of the same last name: a package may re-export a class
        (``plugin.MyImpl`` for ``plugin.backend.MyImpl``)."""
        return self.named(reference) or tuple(self._by_last.get(reference.rpartition(".")[2], ()))

    def same_last_name(self, full_name: str) -> tuple[str, ...]:
        """The classes of the run whose last name is ``full_name``'s."""
        return tuple(self._by_last.get(full_name.rpartition(".")[2], ()))

    # --- inheritance ---------------------------------------------------------------------------------------

    def parents(self, full_name: str) -> list[str]:
        """The classes of the run that the bases of ``full_name`` name, in the order of its bases."""
        return [other for base in self.bases.get(full_name, ()) for other in self.named(base)]

    def ancestors(self, full_name: str) -> tuple[str, ...]:
        """The classes of the run ``full_name`` derives from, itself excluded, nearest first (breadth first)."""
        known = self._ancestors.get(full_name)
        if known is None:
            found: list[str] = []
            seen = {full_name}
            queue = deque([full_name])
            while queue:
                for other in self.parents(queue.popleft()):
                    if other not in seen:
                        seen.add(other)
                        found.append(other)
                        queue.append(other)
            known = self._ancestors[full_name] = tuple(found)
        return known

    def lineage(self, full_name: str) -> tuple[str, ...]:
        """``full_name`` and its `ancestors`."""
        return (full_name, *self.ancestors(full_name))

    def derives(self, full_name: str, ancestor: str) -> bool:
        """Whether ``full_name`` is ``ancestor`` or derives from it through the run's classes."""
        return full_name == ancestor or ancestor in self.ancestors(full_name)

    def descendants(self, full_name: str) -> frozenset[str]:
        """``full_name`` and every class of the run deriving from it."""
        if self._descendants is None:
            table: dict[str, set[str]] = {}
            for name in self.bases:
                for ancestor in self.lineage(name):
                    table.setdefault(ancestor, set()).add(name)
            self._descendants = {name: frozenset(found) for name, found in table.items()}
        return self._descendants.get(full_name, frozenset({full_name}))

    def related(self, first: str, second: str) -> bool:
        """Whether one instance can be of both classes: they are one, or some class of the run derives from both."""
        return first == second or not self.descendants(first).isdisjoint(self.descendants(second))

    def outside_bases(self, full_name: str) -> tuple[str, ...]:
        """The bases of ``full_name`` and of its ancestors that name no class of the run (vLLM's, torch's, ...)."""
        return tuple(
            base for name in self.lineage(full_name) for base in self.bases.get(name, ()) if not self.named(base)
        )

    def is_metaclass(self, full_name: str) -> bool:
        """Whether the class may be a metaclass (its instances are classes): it or an ancestor derives from ``type``
        or from a class named like a metaclass (``ABCMeta``, ``EnumType``, ``...Meta``, ``...Metaclass``)."""
        return any(
            last == "type" or last.endswith(_METACLASS_ENDINGS)
            for last in (base.rpartition(".")[2] for base in self.outside_bases(full_name))
        ) or any(name.rpartition(".")[2].endswith(_METACLASS_ENDINGS) for name in self.lineage(full_name))

    # --- provenance ----------------------------------------------------------------------------------------

    def provenance(self, full_name: str) -> dict[str, tuple[str, ...]]:
        """Where the class's vLLM interface comes from: each of vLLM's attention base classes (`names.is_vllm_base`)
        it is or derives from, with the chain of classes of the run from ``full_name`` to the one naming it as a
        base (``{}``: none; a class that is vLLM's own, in a fork, maps itself to ``(full_name,)``). The nearest
        chain is given where several lead to one base."""
        known = self._provenance.get(full_name)
        if known is not None:
            return known
        found: dict[str, tuple[str, ...]] = {}
        chains: dict[str, tuple[str, ...]] = {full_name: (full_name,)}
        queue = deque([full_name])
        while queue:
            name = queue.popleft()
            if is_vllm_base(name):
                found.setdefault(name, chains[name])
            for base in self.bases.get(name, ()):
                if is_vllm_base(base):
                    found.setdefault(base, chains[name])
                for other in self.named(base):
                    if other not in chains:
                        chains[other] = (*chains[name], other)
                        queue.append(other)
        self._provenance[full_name] = found
        return found

    def vllm_bases(self, full_name: str) -> frozenset[str]:
        """vLLM's attention base classes the class is or derives from (the keys of `provenance`)."""
        return frozenset(self.provenance(full_name))
