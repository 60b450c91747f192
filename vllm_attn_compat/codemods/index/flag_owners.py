"""Whose ``accept_output_buffer`` a class declares, and what in the run reads it: what VAC004 asks before its
safe fix deletes ``accept_output_buffer = True`` (issue #25).

The flag is vLLM's where the class derives from vLLM's base (or a fork's copy of it) through classes of the run;
where it overrides the flag of a base of the run that is not vLLM's (a project's own ABC), it is the project's,
and no deletion is safe (:meth:`FlagOwners.own_flag_base`). A vLLM backend's flag may go only where no read of
the run (`flags.FlagRead`) can see the difference on vLLM >= 0.20, whose base no longer declares it
(:meth:`FlagOwners.flag_readers`). A mixin of `hierarchy.ClassHierarchy`, which holds the data it reads.
"""

from __future__ import annotations

from vllm_attn_compat.codemods.index import callsites, flags
from vllm_attn_compat.codemods.index.names import is_vllm_base, names_match


class FlagOwners:
    # Held by `hierarchy.ClassHierarchy` (its fields; see there).
    modules: dict[str, str]
    bases: dict[str, tuple[str, ...]]
    flag_classes: dict[str, bool]
    flag_reads: list[tuple[str, flags.FlagRead]]
    _subclasses: dict[str, list[str]] | None

    # Answered by `hierarchy.ClassHierarchy`, which derives from this class.
    def _classes_named(self, reference: str) -> list[str]:
        raise NotImplementedError

    def from_vllm(self, full_name: str) -> bool:
        raise NotImplementedError

    def _ancestors(self, full_name: str) -> list[str]:
        """The classes of the run ``full_name`` derives from, nearest first (breadth first)."""
        found: list[str] = []
        queue = [full_name]
        seen = {full_name}
        while queue:
            for base in self.bases.get(queue.pop(0), ()):
                for other in self._classes_named(base):
                    if other not in seen:
                        seen.add(other)
                        found.append(other)
                        queue.append(other)
        return found

    def _derives(self, full_name: str, ancestor: str) -> bool:
        return full_name == ancestor or ancestor in self._ancestors(full_name)

    def own_flag_base(self, full_name: str) -> str | None:
        """The nearest class of the run ``full_name`` derives from that declares ``accept_output_buffer`` and
        is not vLLM's (`from_vllm`): a package's own base, whose flag is its own. None when there is none."""
        for ancestor in self._ancestors(full_name):
            if ancestor in self.flag_classes and not self.from_vllm(ancestor):
                return ancestor
        return None

    def flag_readers(self, full_name: str) -> str | None:
        """Why deleting ``accept_output_buffer = True`` from the class would change what code of the run reads
        (on vLLM >= 0.20, whose base no longer declares the flag, a read of the class, a subclass or an instance
        would raise or see another class's value); None when nothing in the run can see the deletion."""
        for ancestor in self._ancestors(full_name):
            if ancestor in self.flag_classes and not self.flag_classes[ancestor]:
                short = ancestor.rpartition(".")[2]
                return f"`{short}`, a base class of the run, declares it too, and not True: the class would read that"
        reads = sorted((path, read) for path, read in self.flag_reads if self._read_reaches(read, full_name))
        if not reads:
            return None
        path, read = reads[0]
        more = f" (and {len(reads) - 1} more read(s) in the run)" if len(reads) > 1 else ""
        return f"`{read.text}` at {callsites._shown(path)}:{read.line} reads it{more}"

    def _read_reaches(self, read: flags.FlagRead, full_name: str) -> bool:
        if read.target is None or read.kind == "any":
            return True
        named = self._classes_named(read.target)
        if not named:
            # No class of the run: a function's result, or a variable of one of the run's modules, may be any
            # class; a name from outside the run is none of the run's classes.
            return read.kind == "instance" or self._names_in_run(read.target)
        if read.kind != "subclass":  # the class itself, or an instance of it
            return any(self._derives(other, full_name) for other in named)
        # `self` in a method of K: an instance of any class deriving from K; one deriving from both sees it.
        return any(self._derives(sub, full_name) for other in named for sub in self._subclasses_of(other))

    def _names_in_run(self, dotted: str) -> bool:
        owner = dotted.rpartition(".")[0]
        modules = set(self.modules.values())
        while owner:
            if any(names_match(owner, module) for module in modules) or self._classes_named(owner):
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
            for name in (full_name, *self._ancestors(full_name)):
                for base in self.bases.get(name, ()):
                    if not is_vllm_base(base) and not self._classes_named(base):
                        missing.add(base)
        for _, read in self.flag_reads:
            if read.kind == "instance" and read.target is not None and not self._classes_named(read.target):
                missing.add(read.target)
        return missing

    def _subclasses_of(self, full_name: str) -> list[str]:
        """``full_name`` and every class of the run deriving from it."""
        if self._subclasses is None:
            self._subclasses = {}
            for name, bases in self.bases.items():
                for base in bases:
                    for other in self._classes_named(base):
                        self._subclasses.setdefault(other, []).append(name)
        found = [full_name]
        for name in found:
            found += [sub for sub in self._subclasses.get(name, ()) if sub not in found]
        return found
