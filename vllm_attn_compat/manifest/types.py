"""The manifest's vocabulary: named tuples, built from the data on demand. No dependency beyond the standard
library's ``typing``, so the CLI (no torch, no libcst) and the runtime half share them."""

from __future__ import annotations

from collections.abc import Container
from typing import Literal, NamedTuple

ParameterKind = Literal["POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL", "KEYWORD_ONLY", "VAR_KEYWORD"]
MemberKind = Literal["method", "classmethod", "staticmethod", "property", "attribute", "field", "enum_member", "class"]


class Parameter(NamedTuple):
    """One parameter as vLLM's source declares it; ``kind`` is ``inspect.Parameter.kind``'s name, ``default``
    and ``annotation`` are source text (``ast.unparse``'s), None where there is none."""

    name: str
    kind: ParameterKind
    default: str | None
    annotation: str | None

    @property
    def has_default(self) -> bool:
        return self.default is not None


class Signature(NamedTuple):
    """A function's parameters (``self``/``cls`` included for methods and class methods) and return annotation."""

    parameters: tuple[Parameter, ...]
    returns: str | None

    def names(self) -> tuple[str, ...]:
        return tuple(parameter.name for parameter in self.parameters)


class Successor(NamedTuple):
    """What replaces a removed or deprecated member, where vLLM's sources say so.

    ``kind`` "member": another member of the same class took over the role (``use`` is its name; an override
    belongs there now). ``kind`` "expression": ``use`` is code over the instance (``self.seq_lens.cpu()``) that
    gives the member's value. ``source`` cites where in vLLM's sources it was read."""

    use: str
    kind: Literal["member", "expression"]
    source: str


class Member(NamedTuple):
    """A class member at one release. ``owner`` is the qualified name of the class whose body defines it.

    ``signature`` is set for methods, class and static methods and properties. ``deprecated`` is vLLM's own
    message; ``deprecated_parameters`` maps parameter names to theirs. ``referenced`` says whether vLLM's code at
    that release still uses the name anywhere outside its own definitions (an attribute access or a string
    holding the name): False is a hook vLLM still has but no longer calls. ``annotation`` and ``value`` are an
    attribute's, field's or enum member's source text."""

    owner: str
    name: str
    kind: MemberKind
    signature: Signature | None
    abstract: bool
    deprecated: str | None
    deprecated_parameters: dict[str, str]
    referenced: bool
    annotation: str | None
    value: str | None


class ClassInfo(NamedTuple):
    """A class at one release: its bases (qualified; ``typing.Generic`` for ``Generic[T]``), its kind ("class",
    "dataclass", "enum", "protocol", "namedtuple", "typeddict"), its metaclass and deprecation message if any."""

    name: str
    bases: tuple[str, ...]
    kind: str
    metaclass: str | None
    deprecated: str | None


class MemberHistory(NamedTuple):
    """A member across the manifest's releases.

    ``added``: the first release that has it (the manifest's first release means "at or before it").
    ``removed``: the release that removed it, when the newest release lacks it; else None.
    ``changed``: the releases where its kind, signature, abstract-ness or value changed.
    ``deprecated``/``deprecated_since``: vLLM's latest deprecation message and the first release giving one.
    ``unreferenced_since``: the release since which vLLM no longer uses it while still having it (None when the
    newest release that has it still uses it). ``states``: (release, Member or None) where anything changed."""

    owner: str
    name: str
    added: str | None
    removed: str | None
    changed: tuple[str, ...]
    deprecated: str | None
    deprecated_since: str | None
    unreferenced_since: str | None
    successor: Successor | None
    states: tuple[tuple[str, Member | None], ...]


class DeadHook(NamedTuple):
    """A member a class (or its vLLM bases) once had that a release no longer has or no longer calls.

    ``reason``: "removed" (``since`` is the release that removed it, ``last`` the last release having it) or
    "not called" (``since`` is the first release of the run in which vLLM has it but never uses it, ``last`` the
    last release that used it, or None when none in the manifest did)."""

    owner: str
    name: str
    kind: MemberKind
    reason: Literal["removed", "not called"]
    since: str
    last: str | None
    deprecated: str | None
    successor: Successor | None


class Removal(NamedTuple):
    """Something one release has and a later one lacks. ``what``: "class", "member", "function", "name" (a
    module-level name other than a class or function, a re-export among them) or "op"; ``name``: qualified
    (``<module>.<name>``, ``<class>.<member>``, ``vllm::<op>``); ``removed_in``: the first release without it."""

    what: Literal["class", "member", "function", "name", "op"]
    name: str
    removed_in: str
    deprecated: str | None
    successor: Successor | None


class Op(NamedTuple):
    """A custom op a release registers: ``name`` ("vllm::unified_attention_with_output"), the module registering
    it, its Python function and that function's signature, and the arguments it declares mutated."""

    name: str
    module: str
    function: str | None
    signature: Signature | None
    mutates_args: tuple[str, ...]


class Drift(NamedTuple):
    """Why an override cannot take the calls its base's signature allows (see ``incompatibilities``)."""

    missing: tuple[Parameter, ...]  # the base's parameters the override cannot accept
    extra_required: tuple[Parameter, ...]  # the override's parameters without default that the base does not have

    @property
    def compatible(self) -> bool:
        return not (self.missing or self.extra_required)


class _Every:
    """Every parameter name: those a hook's caller passes by name where it names each one."""

    def __contains__(self, name: object) -> bool:
        return True


EVERY: Container[str] = _Every()

_POSITIONAL = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
_BY_NAME = ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")


def incompatibilities(base: Signature, override: Signature) -> Drift:
    """The calls ``base``'s signature allows that ``override`` rejects, parameter by parameter.

    Both are signatures of the same kind of callable (``self`` included in both, or in neither). vLLM may pass
    any of the base's parameters, positionally where the base allows it and by name where it allows that, and
    passes nothing else: a base parameter is missing from the override when the override has no parameter at its
    position (nor ``*args``) or, for one the base lets callers name, no parameter of its name (nor ``**kwargs``);
    an override's parameter without a default that the base lacks is never passed."""
    positional = [p for p in override.parameters if p.kind in _POSITIONAL]
    named = {p.name for p in override.parameters if p.kind in _BY_NAME}
    var_positional = any(p.kind == "VAR_POSITIONAL" for p in override.parameters)
    var_keyword = any(p.kind == "VAR_KEYWORD" for p in override.parameters)
    missing = []
    for index, parameter in enumerate(base.parameters):
        if parameter.kind == "VAR_POSITIONAL":
            ok = var_positional
        elif parameter.kind == "VAR_KEYWORD":
            ok = var_keyword
        else:
            ok = True
            if parameter.kind in _POSITIONAL:
                ok = index < len(positional) or var_positional
            if parameter.kind in _BY_NAME:
                ok = ok and (parameter.name in named or var_keyword)
        if not ok:
            missing.append(parameter)
    base_positional = sum(p.kind in _POSITIONAL for p in base.parameters)
    base_names = {p.name for p in base.parameters if p.kind in _BY_NAME}
    extra = [
        p
        for index, p in enumerate(override.parameters)
        if p.default is None
        and p.kind not in ("VAR_POSITIONAL", "VAR_KEYWORD")
        and not (p.kind in _POSITIONAL and index < base_positional)
        and not (p.kind in _BY_NAME and p.name in base_names)
    ]
    return Drift(tuple(missing), tuple(extra))
