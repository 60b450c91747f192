"""Handing files to the worker started early as soon as their migration is settled.

The class hierarchy grows round after round (see :mod:`runner`), and a file's migration depends on it
only through whether the file's own classes are attention classes. That answer only ever turns from
no to yes as rounds add classes, so a file whose classes are all attention classes already, or which
defines none, migrates now exactly as it would after the last round: it goes to the early worker at once,
and its migration overlaps the rounds still to come instead of waiting for them.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence

from vllm_attn_compat.codemods.engine import migrate
from vllm_attn_compat.codemods.engine.rule import Rule
from vllm_attn_compat.codemods.index.classscan import ScannedIndex
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, ModuleIndex
from vllm_attn_compat.codemods.run import worker
from vllm_attn_compat.codemods.run.prefork import PreforkedWorker

# Tasks sent to the early worker carry the run's settings (it started before they were known);
# past this size (a hierarchy of thousands of classes) a fresh pool that gets them once is cheaper.
SETTINGS_SENT_PER_TASK_UP_TO = 1 << 16  # bytes


def settles(index: ModuleIndex, hierarchy: ClassHierarchy) -> bool:
    """Whether later rounds can no longer change how the file of ``index`` migrates. A method whose fix
    calls in other files can withhold (`callsites`) waits for them: later rounds may find more."""
    from vllm_attn_compat.codemods.index import callsites

    if isinstance(index, ScannedIndex):  # its classes were not indexed: a later round may parse it
        return False
    if callsites.has_methods(index):
        return False
    return hierarchy.patches_decided(index) and all(
        hierarchy.is_attention_class(f"{index.module}.{entry.qualname}") for entry in index.classes
    )


def candidate_rules(
    rules: Sequence[type[Rule]], index: object, hierarchy: ClassHierarchy, path: str
) -> Sequence[type[Rule]]:
    """The rules that can act in a file: all of them where its index shows an attention class, else
    only those that act anywhere."""
    if isinstance(index, ModuleIndex) and hierarchy.has_attention_classes(path):
        return rules
    return [rule for rule in rules if not rule.scoped]


class Handoff:
    """Sends settled candidates to ``warm`` after each round, up to ``limit`` files (one early worker
    should not take on a whole fork's worth of files: past that, a full pool does the rest)."""

    def __init__(
        self, warm: PreforkedWorker, rules: Sequence[type[Rule]], unsafe_fixes: bool, limit: int,
        old_op_calls: str = "with-output", verify: bool = True,
    ) -> None:  # fmt: skip
        self.warm = warm
        self.rules = rules
        self.unsafe_fixes = unsafe_fixes
        self.old_op_calls = old_op_calls
        self.verify = verify
        self.limit = limit
        self.sent: set[str] = set()

    def settings(self, hierarchy: ClassHierarchy) -> bytes | None:
        """The pickled settings tasks carry, or None when they are too large to send with each task."""
        pickled = pickle.dumps((self.rules, hierarchy, self.unsafe_fixes, self.old_op_calls, self.verify))
        return pickled if len(pickled) <= SETTINGS_SENT_PER_TASK_UP_TO else None

    def send(self, path: str, source: bytes, pickled: bytes) -> None:
        self.warm.submit(path, worker.migrate_file_with, (pickled, source, path))
        self.sent.add(path)

    def after_round(
        self, hierarchy: ClassHierarchy, indexes: Mapping[str, object], sources: Mapping[str, bytes]
    ) -> None:
        names = hierarchy.attention_class_names()
        pickled: bytes | None = None
        for path, index in indexes.items():
            if len(self.sent) >= self.limit:
                return
            if path in self.sent or not isinstance(index, ModuleIndex) or not settles(index, hierarchy):
                continue
            if not migrate.needs_parsing(sources[path], candidate_rules(self.rules, index, hierarchy, path), names):
                continue
            pickled = pickled or self.settings(hierarchy)
            if pickled is None:
                return
            self.send(path, sources[path], pickled)
