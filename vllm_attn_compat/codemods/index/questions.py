"""What a file's migration may ask of the run's class hierarchy, and a record of what it asked.

A migration depends on the other files of the run only through these questions (is this class attention
code, what withholds this method's fix, ...): the engine and the rules are typed against
:class:`Questions`, not the hierarchy itself, so they can ask nothing else. A migration asks them of a
:class:`Recorder`, which writes down every question and its answer. The cache (`run/cache.py`) keeps that
record with the file's result: a later run whose hierarchy gives every recorded answer again
(:func:`still_holds`) would migrate the file the same, byte for byte and finding for finding, however
much the other files changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.index.callsites import CallQuestions
    from vllm_attn_compat.codemods.index.hierarchy import ModuleIndex

# The answer of a question is plain data: a bool, a string or None.
Answer: TypeAlias = bool | str | None
# ((question, its arguments), answer), in the order first asked; the question is a method name of
# `Questions`, or "calls.reason" for `CallQuestions.reason`.
Answers: TypeAlias = tuple[tuple[tuple[str, tuple[str, ...]], Answer], ...]


def interface_of(answer: str | None) -> tuple[tuple[str, ...], bool]:
    """A `Questions.vllm_interface` answer as the manifest classes the class derives from (() for none) and whether
    it is a backend by its shape alone (``~`` before them: `index.hierarchy.ClassHierarchy.vllm_interface`)."""
    if not answer:
        return (), False
    return tuple(answer.lstrip("~").split(",")), answer.startswith("~")


class Questions(Protocol):
    """The class hierarchy as a migration sees it (`hierarchy.ClassHierarchy` is one)."""

    @property
    def calls(self) -> CallQuestions: ...

    def covers(self, path: str) -> bool: ...

    def module_name(self, path: str) -> str: ...

    def is_attention_class(self, full_name: str) -> bool: ...

    def is_layer_class(self, full_name: str) -> bool: ...

    def is_mla_layer_class(self, full_name: str) -> bool: ...

    def patch_scope(self, full_name: str, kind: str) -> str | None: ...

    def has_attention_classes(self, path: str) -> bool: ...

    def declares_flag_in_base(self) -> bool: ...

    def is_flag_base(self, full_name: str) -> bool: ...

    def own_flag_base(self, full_name: str) -> str | None: ...

    def flag_readers(self, full_name: str) -> str | None: ...

    def op_renaming_withheld(self, op: str, path: str) -> str | None: ...

    def vllm_interface(self, full_name: str) -> str | None: ...

    def concrete_members(self, full_name: str) -> str | None: ...

    def has_interface_classes(self, path: str) -> bool: ...

    def interface_classes(self, path: str) -> str: ...

    def buffer_methods(self, path: str) -> str: ...

    def methods_of(self, full_name: str) -> str: ...

    def in_run(self, module: str) -> bool: ...

    def run_defines(self, manifest_class: str, member: str) -> bool: ...

    def parameters_withheld(self, full_name: str, method: str, path: str) -> str | None: ...

    def extended(self, index: ModuleIndex) -> Questions: ...


class Recorder:
    """Answers as ``hierarchy`` does, writing down each question and its answer (:attr:`answers`)."""

    def __init__(self, hierarchy: Questions) -> None:
        self._hierarchy = hierarchy
        self._answers: dict[tuple[str, tuple[str, ...]], Answer] = {}
        # A question that makes a new hierarchy (`extended`: the file is outside the run's index) cannot
        # be asked of a later run's hierarchy: such a migration has no record.
        self.complete = True
        self.calls = _CallRecorder(hierarchy.calls, self._answers)

    @property
    def answers(self) -> Answers | None:
        """Every question asked so far with its answer; None when the record cannot be replayed."""
        return tuple(self._answers.items()) if self.complete else None

    def _asked(self, question: str, arguments: tuple[str, ...], answer: Answer) -> Answer:
        self._answers.setdefault((question, arguments), answer)
        return answer

    def covers(self, path: str) -> bool:
        return self._asked("covers", (path,), self._hierarchy.covers(path)) is True

    def module_name(self, path: str) -> str:
        return str(self._asked("module_name", (path,), self._hierarchy.module_name(path)))

    def is_attention_class(self, full_name: str) -> bool:
        return self._asked("is_attention_class", (full_name,), self._hierarchy.is_attention_class(full_name)) is True

    def is_layer_class(self, full_name: str) -> bool:
        return self._asked("is_layer_class", (full_name,), self._hierarchy.is_layer_class(full_name)) is True

    def is_mla_layer_class(self, full_name: str) -> bool:
        answer = self._asked("is_mla_layer_class", (full_name,), self._hierarchy.is_mla_layer_class(full_name))
        return answer is True

    def patch_scope(self, full_name: str, kind: str) -> str | None:
        answer = self._asked("patch_scope", (full_name, kind), self._hierarchy.patch_scope(full_name, kind))
        return None if answer is None else str(answer)

    def has_attention_classes(self, path: str) -> bool:
        return self._asked("has_attention_classes", (path,), self._hierarchy.has_attention_classes(path)) is True

    def declares_flag_in_base(self) -> bool:
        return self._asked("declares_flag_in_base", (), self._hierarchy.declares_flag_in_base()) is True

    def is_flag_base(self, full_name: str) -> bool:
        return self._asked("is_flag_base", (full_name,), self._hierarchy.is_flag_base(full_name)) is True

    def own_flag_base(self, full_name: str) -> str | None:
        answer = self._asked("own_flag_base", (full_name,), self._hierarchy.own_flag_base(full_name))
        return None if answer is None else str(answer)

    def flag_readers(self, full_name: str) -> str | None:
        answer = self._asked("flag_readers", (full_name,), self._hierarchy.flag_readers(full_name))
        return None if answer is None else str(answer)

    def op_renaming_withheld(self, op: str, path: str) -> str | None:
        answer = self._asked("op_renaming_withheld", (op, path), self._hierarchy.op_renaming_withheld(op, path))
        return None if answer is None else str(answer)

    def vllm_interface(self, full_name: str) -> str | None:
        answer = self._asked("vllm_interface", (full_name,), self._hierarchy.vllm_interface(full_name))
        return None if answer is None else str(answer)

    def concrete_members(self, full_name: str) -> str | None:
        answer = self._asked("concrete_members", (full_name,), self._hierarchy.concrete_members(full_name))
        return None if answer is None else str(answer)

    def has_interface_classes(self, path: str) -> bool:
        return self._asked("has_interface_classes", (path,), self._hierarchy.has_interface_classes(path)) is True

    def interface_classes(self, path: str) -> str:
        return str(self._asked("interface_classes", (path,), self._hierarchy.interface_classes(path)))

    def buffer_methods(self, path: str) -> str:
        return str(self._asked("buffer_methods", (path,), self._hierarchy.buffer_methods(path)))

    def methods_of(self, full_name: str) -> str:
        return str(self._asked("methods_of", (full_name,), self._hierarchy.methods_of(full_name)))

    def in_run(self, module: str) -> bool:
        return self._asked("in_run", (module,), self._hierarchy.in_run(module)) is True

    def run_defines(self, manifest_class: str, member: str) -> bool:
        answer = self._hierarchy.run_defines(manifest_class, member)
        return self._asked("run_defines", (manifest_class, member), answer) is True

    def parameters_withheld(self, full_name: str, method: str, path: str) -> str | None:
        arguments = (full_name, method, path)
        answer = self._asked("parameters_withheld", arguments, self._hierarchy.parameters_withheld(*arguments))
        return None if answer is None else str(answer)

    def extended(self, index: ModuleIndex) -> Questions:
        self.complete = False
        return self._hierarchy.extended(index)


class _CallRecorder:
    def __init__(self, calls: CallQuestions, answers: dict[tuple[str, tuple[str, ...]], Answer]) -> None:
        self._calls = calls
        self._answers = answers

    def reason(self, class_name: str, method: str, code: str, path: str) -> str | None:
        arguments = (class_name, method, code, path)
        answer = self._answers.setdefault(("calls.reason", arguments), self._calls.reason(*arguments))
        return None if answer is None else str(answer)


_QUESTIONS = frozenset(
    {
        "covers",
        "module_name",
        "is_attention_class",
        "is_layer_class",
        "is_mla_layer_class",
        "patch_scope",
        "has_attention_classes",
        "declares_flag_in_base",
        "is_flag_base",
        "own_flag_base",
        "flag_readers",
        "op_renaming_withheld",
        "vllm_interface",
        "concrete_members",
        "has_interface_classes",
        "interface_classes",
        "buffer_methods",
        "methods_of",
        "in_run",
        "run_defines",
        "parameters_withheld",
    }
)


def ask(hierarchy: Questions, question: str, arguments: tuple[str, ...]) -> Answer:
    """The answer ``hierarchy`` gives to a recorded question. Raises ``ValueError`` for a question that
    is none of :class:`Questions` (a record from elsewhere)."""
    try:
        if question == "calls.reason":
            return hierarchy.calls.reason(*arguments)
        if question in _QUESTIONS:
            answer: Answer = getattr(hierarchy, question)(*arguments)
            return answer
    except TypeError as error:  # another number of arguments
        raise ValueError(f"{question} cannot take {len(arguments)} arguments: {error}") from None
    raise ValueError(f"no such question: {question!r}")


def still_holds(answers: Answers, hierarchy: Questions) -> bool:
    """Whether ``hierarchy`` gives every recorded answer again."""
    return all(ask(hierarchy, question, arguments) == answer for (question, arguments), answer in answers)
