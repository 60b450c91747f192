"""Whose ``accept_output_buffer`` a class declares, and what in the run reads it: what VAC004 asks before its
safe fix deletes ``accept_output_buffer = True`` (issue #25).

The flag is vLLM's where the class derives from vLLM's base (or a fork's copy of it) through classes of the run;
where it overrides the flag of a base of the run that is not vLLM's (a project's own ABC), it is the project's,
and no deletion is safe (:meth:`FlagOwners.own_flag_base`). A vLLM backend's flag may go only where no read of
the run (`flags.FlagRead`) can see the difference on vLLM >= 0.20, whose base no longer declares it
(:meth:`FlagOwners.flag_readers`). Its classes' relations are the run's class graph's (`classgraph`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from vllm_attn_compat.codemods.index import accounting, flags
from vllm_attn_compat.codemods.index.accounting import Located
from vllm_attn_compat.codemods.index.classgraph import ClassGraph
from vllm_attn_compat.codemods.index.names import FLAG, RunModules, is_vllm_base, shown_path


class FlagOwners:
    """The flag's declarations and reads of a run, asked through its class graph."""

    def __init__(
        self,
        graph: ClassGraph,
        modules: RunModules,
        flag_classes: Mapping[str, bool],
        flag_reads: Sequence[tuple[str, flags.FlagRead]],
        from_vllm: Callable[[str], bool],
        occurrences: Sequence[Located] = (),
    ) -> None:
        """``modules``: the run's module names; ``flag_classes``: every class declaring ``accept_output_buffer`` ->
        whether to the literal True; ``flag_reads``: every read of the flag with the path of its file;
        ``from_vllm``: whether a class is vLLM's or derives from it (`hierarchy.ClassHierarchy.from_vllm`);
        ``occurrences``: the run's other occurrences of names (`accounting`: reflection, class-body reads, ...)."""
        self.graph = graph
        self.modules = modules
        self.flag_classes = flag_classes
        self.flag_reads = flag_reads
        self.from_vllm = from_vllm
        self.occurrences = occurrences

    def own_flag_base(self, full_name: str) -> str | None:
        """The nearest class of the run ``full_name`` derives from that declares ``accept_output_buffer`` and
        is not vLLM's (`from_vllm`): a package's own base, whose flag is its own. None when there is none."""
        for ancestor in self.graph.ancestors(full_name):
            if ancestor in self.flag_classes and not self.from_vllm(ancestor):
                return ancestor
        return None

    def flag_readers(self, full_name: str) -> str | None:
        """Why deleting ``accept_output_buffer = True`` from the class would change what code of the run reads
        (on vLLM >= 0.20, whose base no longer declares the flag, a read of the class, a subclass or an instance
        would raise or see another class's value); None when nothing in the run can see the deletion."""
        for ancestor in self.graph.ancestors(full_name):
            if ancestor in self.flag_classes and not self.flag_classes[ancestor]:
                short = ancestor.rpartition(".")[2]
                return f"`{short}`, a base class of the run, declares it too, and not True: the class would read that"
        reads = sorted(
            (path, read.line, f"`{read.text}` at {shown_path(path)}:{read.line} reads it")
            for path, read in self.flag_reads
            if self._read_reaches(read, full_name)
        )
        others = accounting.flag_blockers(self.occurrences, full_name, self.graph, self.modules)
        uses = reads + [(b.path, b.line, b.describe(FLAG, "")) for b in others]
        if not uses:
            return None
        first = min(uses)[2]
        return first + (f" (and {len(uses) - 1} more)" if len(uses) > 1 else "")

    def _read_reaches(self, read: flags.FlagRead, full_name: str) -> bool:
        if read.target is None or read.kind == "any":
            return True
        named = self.graph.named(read.target)
        if not named:
            # No class of the run: a function's result, or a variable of one of the run's modules, may be any
            # class; a name from outside the run is none of the run's classes.
            return read.kind == "instance" or self._names_in_run(read.target)
        if read.kind != "subclass":  # the class itself, or an instance of it
            return any(self.graph.derives(other, full_name) for other in named)
        # `self` in a method of K: an instance of any class deriving from K; one deriving from both sees it. In a
        # metaclass's method, `cls` is a class made with it: any class.
        return any(self.graph.related(other, full_name) or self.graph.is_metaclass(other) for other in named)

    def _names_in_run(self, dotted: str) -> bool:
        owner = dotted.rpartition(".")[0]
        while owner:
            if owner in self.modules or self.graph.named(owner):
                return True
            owner = owner.rpartition(".")[0]
        return False

    def missing_flag_classes(self) -> set[str]:
        """The classes (dotted names) that are none of the run's classes nor vLLM's, and that the flag's owners
        depend on: the bases of the classes declaring ``accept_output_buffer`` and of their bases in the run (a
        project's own base declaring the flag there would make it the project's own), and the classes whose
        instances a read of the flag reads (``X().accept_output_buffer``: unknown, such a read counts for every
        class; known, only for X's bases). The runner indexes the files that may define them."""
        if not self.flag_classes:
            return set()
        missing: set[str] = set()
        for full_name in self.flag_classes:
            for base in self.graph.outside_bases(full_name):
                if not is_vllm_base(base):
                    missing.add(base)
        for _, read in self.flag_reads:
            if read.kind == "instance" and read.target is not None and not self.graph.named(read.target):
                missing.add(read.target)
        return missing
