"""The `Rule` base class: what every rule module declares, and how rules register themselves.

A rule is one module in ``vllm_attn_compat.codemods.rules`` defining one `Rule` subclass. It
declares its code, name, summary, fix safety, what it matches (tokens) and reads, and examples as class attributes,
and reacts to libcst nodes through ``visit_<NodeType>(self, node)`` methods that the engine
calls during its single traversal of the file. Findings and fixes go through ``self.ctx``
(`vllm_attn_compat.codemods.engine.scope.FileContext`). Rule modules import libcst inside their
methods only, so listing rules (``vllm-attn-compat rules``) and prefiltering stay fast.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from vllm_attn_compat.codemods.findings import FixSafety, Status, TargetRelease

# Rules see the engine's face only: they import `Questions` and `interface_of` from here.
from vllm_attn_compat.codemods.index.questions import Questions as Questions
from vllm_attn_compat.codemods.index.questions import interface_of as interface_of

if TYPE_CHECKING:
    from collections.abc import Iterator

    from vllm_attn_compat.codemods.engine.scope import FileContext

_REGISTRY: dict[str, type[Rule]] = {}
_CODE = re.compile(r"VAC\d{3}")
_NAME = re.compile(r"[a-z]+(-[a-z0-9]+)*")


@dataclass(frozen=True)
class Example:
    """A source file before the rule runs, and what the rule makes of it.

    ``after`` is the result of `migrate` (safe fixes); ``None`` means the file stays
    byte-identical. ``unsafe_after`` is the result with ``--unsafe-fixes`` when it differs from
    ``after``. ``findings`` lists the status of each finding of this rule, in source order. ``target`` is the
    ``--target-version`` the example runs with (None: the newest release the manifest knows).
    """

    title: str
    before: str
    after: str | None = None
    unsafe_after: str | None = None
    findings: tuple[Status, ...] = ()
    target: str | None = None

    def release(self) -> TargetRelease | None:
        """What the rules see of the example's target (`FileContext.target`)."""
        if self.target is None:
            return None
        from vllm_attn_compat.manifest import resolve

        release = resolve(self.target)
        return TargetRelease(release, release)

    def source(self) -> str:
        return textwrap.dedent(self.before).lstrip("\n")

    def expected(self, *, unsafe: bool) -> str:
        text = self.after if not unsafe or self.unsafe_after is None else self.unsafe_after
        return self.source() if text is None else textwrap.dedent(text).lstrip("\n")


def short_release(release: str) -> str:
    """``0.29.0`` -> ``0.29``, as people name a minor release in a message (a patch release keeps its number)."""
    return release.removesuffix(".0") if release.count(".") == 2 else release


def class_source(header: str, body: str) -> str:
    """Example text: ``header`` (ending in a ``class`` line) with ``body`` as that class's body."""
    return textwrap.dedent(header).lstrip("\n") + textwrap.indent(textwrap.dedent(body).lstrip("\n"), "    ")


def narrowed_to(pattern: re.Pattern[bytes]) -> tuple[Any, Any]:
    """`Rule.facts` and `Rule.acts_in` of a rule that can report only in a file where ``pattern`` is found (an old
    name standing whole): ``facts, acts_in = narrowed_to(PATTERN)`` in its class body, with ``narrows = True``."""

    def facts(cls: type[Rule], source: bytes) -> bool:
        return pattern.search(source) is not None

    def acts_in(cls: type[Rule], facts: Any, run: Questions, path: str, release: str) -> bool:
        return bool(facts)

    return classmethod(facts), classmethod(acts_in)


def narrowed_to_methods(*kinds: str) -> Any:
    """`Rule.acts_in` of a rule on ``output`` that can report only where the module defines methods of one of
    ``kinds`` (`Questions.buffer_methods`: ``buffer``, ``layer``, ``forward``): ``acts_in =
    narrowed_to_methods("buffer")`` in its class body, with ``narrows = True``."""
    wanted = frozenset(kinds)

    def acts_in(cls: type[Rule], facts: Any, run: Questions, path: str, release: str) -> bool:
        return not wanted.isdisjoint(run.buffer_methods(path).split(","))

    return classmethod(acts_in)


def interface_methods(run: Questions, path: str) -> Iterator[tuple[tuple[str, ...], list[str]]]:
    """For each class of the module at ``path`` deriving from vLLM's interface, the manifest classes it derives
    from and the methods its scope defines: what decides whether a rule on overrides can act in the file."""
    for full in filter(None, run.interface_classes(path).split(",")):
        yield interface_of(run.vllm_interface(full))[0], run.methods_of(full).split(",")


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    fix_safety: ClassVar[FixSafety]
    # What the rule matches, as literal byte strings: a file, class or function containing none of them cannot hold
    # a finding of this rule (the engine derives the prefilter from them, and what libcst is handed: `spans`).
    tokens: ClassVar[tuple[bytes, ...]]
    # True when the rule acts only inside vLLM attention classes (see `hierarchy`); such a rule
    # also needs a hierarchy token or attention-class name in the file to be worth parsing.
    scoped: ClassVar[bool] = True
    # Besides one of its tokens, what a file must hold for a rule acting anywhere to report anything in it (VAC011:
    # ``vllm``, which both an import of vLLM and ``torch.ops.vllm`` hold): the prefilter asks it first, in one pass,
    # so that a large tree without it (torch's) is spared the rule's many tokens, and the rule does not run, nor
    # has the file parsed, where it is missing.
    requires: ClassVar[tuple[bytes, ...]] = ()
    # True when the rule acts only in classes deriving from vLLM's interface classes as the manifest lists them
    # (`index/interface.py`: builders and metadata too, not only attention classes); such a rule is scoped too.
    interface: ClassVar[bool] = False
    # True when a rule that acts anywhere decides its fix safety from the class hierarchy too (a fork's own
    # base class): the hierarchy's files then take part in the run even when no scoped rule is selected.
    reads_hierarchy: ClassVar[bool] = False
    # What the rule reads besides the code holding its tokens, by the names that mark it. libcst is handed the rest
    # as stubs of the same shape (`spans`); every example is migrated with those stubs and without, and must come
    # out the same (tests/codemods/rules/test_examples.py): a rule that reads more than it declares fails its own
    # tests. Code naming one of ``reads`` anywhere in a file holding one of its tokens (an import it follows);
    # code naming one of ``reads_in_class`` in a class holding one (an attribute another method sets); and of the
    # body of a function it acts in, every statement (None), or only the statements naming one of its tokens or
    # of ``reads_statements`` (and the asserts, `pass`, `raise`, docstrings and definitions, never stubbed).
    reads: ClassVar[tuple[bytes, ...]] = ()
    # The vLLM release whose change the rule handles (its findings are grouped under it in the run's summary), and
    # the oldest release on which its fix's result is correct: below it (the target's oldest allowed release,
    # `FileContext.target`), a safe fix is withheld as unsafe, saying why.
    since: ClassVar[str | None] = None
    fix_requires: ClassVar[str | None] = None
    reads_in_class: ClassVar[tuple[bytes, ...]] = ()
    reads_statements: ClassVar[tuple[bytes, ...] | None] = None
    examples: ClassVar[tuple[Example, ...]] = ()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        missing = [a for a in ("code", "name", "summary", "fix_safety", "tokens") if not hasattr(cls, a)]
        if missing:
            raise TypeError(f"rule {cls.__qualname__} lacks class attribute(s) {', '.join(missing)}")
        if not _CODE.fullmatch(cls.code):
            raise TypeError(f"rule {cls.__qualname__}: code must look like 'VAC001', found {cls.code!r}")
        if not _NAME.fullmatch(cls.name):
            raise TypeError(f"rule {cls.code}: name must be kebab-case, found {cls.name!r}")
        if not cls.tokens or not all(isinstance(t, bytes) and len(t) >= 6 for t in cls.tokens):
            raise TypeError(f"rule {cls.code}: tokens must be selective byte strings, found {cls.tokens!r}")
        for what in ("reads", "reads_in_class", "reads_statements"):
            names = getattr(cls, what)
            if not ((names is None and what == "reads_statements") or (
                isinstance(names, tuple) and all(isinstance(name, bytes) and name for name in names)
            )):  # fmt: skip
                raise TypeError(f"rule {cls.code}: {what} must be a tuple of byte strings, found {names!r}")
        if not (isinstance(cls.requires, tuple) and all(isinstance(t, bytes) and t for t in cls.requires)):
            raise TypeError(f"rule {cls.code}: requires must be a tuple of byte strings, found {cls.requires!r}")
        if cls.requires and cls.scoped:
            raise TypeError(f"rule {cls.code}: a scoped rule's prefilter is the scope's tokens: requires is for others")
        if cls.interface and not cls.scoped:
            raise TypeError(f"rule {cls.code}: a rule acting in vLLM's interface classes is scoped to them")
        if not cls.__doc__:
            raise TypeError(f"rule {cls.code}: the docstring must explain why the rule exists")
        other = _REGISTRY.get(cls.code)
        if other is not None and other.__qualname__ != cls.__qualname__:
            raise TypeError(f"rule code {cls.code} is used by both {other.__qualname__} and {cls.__qualname__}")
        _REGISTRY[cls.code] = cls

    # A rule whose tokens admit many more files than it can act in (VAC011's removed members are common words in
    # vLLM's own tree) narrows them: ``facts(source)`` reads what decides it from a file's bytes (the run keeps it
    # with the file's answers), and ``acts_in(facts, run, path, release)`` says from it, the run and the target
    # release whether the rule can report anything in the file. False only where it cannot: every example is
    # migrated with the narrowing and without, in a run of its own and in a fork's (tests/codemods/rules/
    # test_narrowing.py).
    narrows: ClassVar[bool] = False

    @classmethod
    def facts(cls, source: bytes) -> Any:
        """What of ``source`` decides `acts_in`: JSON data (a rule that narrows defines it)."""
        return None

    @classmethod
    def acts_in(cls, facts: Any, run: Questions, path: str, release: str) -> bool:
        """Whether the rule can report anything in the file at ``path``, with these ``facts``, in this run, for
        the target ``release``."""
        return True

    @classmethod
    def span_tokens(cls, facts: Any, run: Questions, path: str, release: str) -> tuple[bytes, ...]:
        """Of the rule's `tokens`, those marking the code it can act on in a file where it acts (`acts_in`) with these
        ``facts``: what libcst is handed of the file for it (`spans`). All of them unless the facts tell more
        (VAC011 in a file where it can only report an op)."""
        return cls.tokens

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx

    @classmethod
    def description(cls) -> str:
        import inspect  # not at module level: the CLI imports this module on every run

        return inspect.cleandoc(cls.__doc__ or "")
