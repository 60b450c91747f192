"""Who calls the methods whose ``output`` a fix would make required (VAC002), whose None fallback a fix
would delete (VAC003), or whose ``assert output is not None`` a fix would delete (VAC001), across the run.

A safe fix preserves the behaviour of every call the run can see. vLLM >= 0.20 passes ``output`` to
an impl's ``forward``, but a plugin's own warm-up path, test or subclass may call a method without
it, relying on the default or the fallback; making ``output`` required breaks that call. So both
fixes are safe only when every call of the method that the run can see passes ``output`` (by
keyword, or positionally at its index) and the method is never handed on as a value (a callback,
``functools.partial``, ``getattr``), which would make its callers unknowable. Otherwise the fix is
withheld (``[unsafe]``) and each call that omits ``output`` is reported where it is. Deleting the assert
changes only a call that passes None: such a call fails at the assert today and would fail later, after work
the assert stopped (a test may expect the `AssertionError`). Where ``output`` defaults to None, the uses that
withhold VAC002's fix withhold it too, and so does ``output=None``.

Every file of the run counts, whatever it imports. The files the class-hierarchy pass indexes (those
mentioning vLLM or naming an attention class of the run) have their call sites recorded while that pass
parses them (stdlib ``ast``); any other file is indexed too once a whole-word scan of its bytes finds a
use of a method with a fix still safe (`open_method_names`; the runner asks after each round). A call
whose receiver cannot be proven to be something else (``engine.attn_impl.prefill(...)`` in a
``runner.py`` importing nothing) counts, unless it could not bind to the method's signature anyway (it
raises ``TypeError`` today, so no working call changes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from vllm_attn_compat.codemods.findings import Finding, Status
from vllm_attn_compat.codemods.index.accounting import (
    PASSES_NONE,
    Blocker,
    Located,
    occurrence_blockers,
    order,
    summary,
)
from vllm_attn_compat.codemods.index.calls import UNSHOWN, CallIndex, OutputMethod, Signature, Use
from vllm_attn_compat.codemods.index.classgraph import ClassGraph
from vllm_attn_compat.codemods.index.names import RunModules, is_vllm_base, normalize_path
from vllm_attn_compat.codemods.index.occurrences import Occurrences
from vllm_attn_compat.codemods.index.old_ops import OldOpBody

if TYPE_CHECKING:
    import libcst as cst


# What the analysis reads of `hierarchy.ClassHierarchy` and `hierarchy.ModuleIndex`: protocols, since the
# hierarchy module imports this one to index calls and to decide which fixes they withhold.
class ClassHierarchy(Protocol):
    @property
    def graph(self) -> ClassGraph: ...

    def all_modules(self) -> RunModules: ...

    def is_attention_class(self, full_name: str) -> bool: ...

    def is_layer_class(self, full_name: str) -> bool: ...

    def is_mla_layer_class(self, full_name: str) -> bool: ...


class ModuleIndex(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def module(self) -> str: ...

    @property
    def calls(self) -> CallIndex: ...

    @property
    def old_ops(self) -> tuple[OldOpBody, ...]: ...

    @property
    def occurrences(self) -> Occurrences: ...


class CallQuestions(Protocol):
    def reason(self, class_name: str, method: str, code: str, path: str) -> str | None:
        """Why the run's uses of ``class_name.method`` withhold ``code``'s fix (None: they do not)."""
        ...


# What a rule's context offers of the run's calls (`questions.Questions`).
class RunCalls(Protocol):
    @property
    def calls(self) -> CallQuestions: ...


class RuleContext(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def module_name(self) -> str: ...

    @property
    def hierarchy(self) -> RunCalls: ...


class ClassFrame(Protocol):
    @property
    def qualname(self) -> str: ...


class MethodFrame(Protocol):
    @property
    def node(self) -> cst.FunctionDef | cst.Lambda: ...

    @property
    def attention_class(self) -> ClassFrame | None: ...


# The rules whose fixes a call omitting ``output`` can block, in the order a caller finding picks its code.
REQUIRED_OUTPUT = "VAC002"
NONE_FALLBACK = "VAC003"
ASSERT_OUTPUT = "VAC001"
# Where VAC002 has no fix (a defaulted parameter before ``output``), the change it asks for by hand: ``output``
# keyword-only and required. The uses that change breaks are listed at the method, never reported where they are
# (they withhold no fix).
REQUIRED_BY_HAND = "VAC002 by hand"
# The uses that may pass a method no buffer: VAC003 names them at a test of `output` against None it reports (no
# fix), which those uses still need.
NONE_TESTED = "VAC003 by hand"
# How the finding at the method introduces the uses it names, for those two: they withhold nothing, and only the
# uses on a receiver the run knows are named (a generic name gathers calls of other classes' `forward`).
_BY_HAND_LEADS = {
    REQUIRED_BY_HAND: "that breaks the run's uses of the method that do not pass it by keyword",
    NONE_TESTED: "once the run's uses of the method pass one",
}
# nn.Module layers run ``forward`` through ``layer(...)``: calls the run cannot attribute to them.
_MODULE_BASES = frozenset({"Attention", "MLAAttention", "AttentionLayerBase", "Module"})


# --- analysis over the run (main process, after each hierarchy round) ----------------------------------


# (class full name, method name) -> rule code -> what withholds that rule's fix there
Withheld = dict[tuple[str, str], dict[str, tuple[Blocker, ...]]]


@dataclass
class CallAnalysis:
    """Which fixes the run's calls withhold; small and picklable (it travels to the workers)."""

    withheld: Withheld = field(default_factory=dict)
    methods: dict[tuple[str, str], OutputMethod] = field(default_factory=dict)  # every target
    # The calls that omit the `output` a method requires (vLLM >= 0.20's signature, or an unsafe fix's), binding
    # all else: each raises TypeError where the receiver is an instance of the method's class. Reported at the call
    # under VAC002, so that a run after `--unsafe-fixes` still fails there. Not one on a receiver the run cannot
    # tell that another attention class's method takes whole (`alternatives`): that call may be meant for it.
    missing: dict[tuple[str, str], tuple[Blocker, ...]] = field(default_factory=dict)
    # The calls passing on their method's own `output` (`PassedOn`): in ``withheld`` where that method may be given
    # None, as settled (`_settled`); kept to settle again with another module's uses (`merged`).
    passed_on: tuple[PassedOn, ...] = ()
    # The functions named as the ops vLLM 0.20 deleted, by the normalized path of their module (`old_ops`).
    old_ops: dict[str, tuple[OldOpBody, ...]] = field(default_factory=dict)
    # The methods of the run's attention classes (layers included) that take no `output`, by name.
    alternatives: dict[str, tuple[Signature, ...]] = field(default_factory=dict)

    def blockers(self, class_name: str, method: str, code: str) -> tuple[Blocker, ...]:
        """What withholds ``code``'s fix in ``class_name.method`` (empty: the fix stays safe)."""
        return self.withheld.get((class_name, method), {}).get(code, ())

    def reason(self, class_name: str, method: str, code: str, path: str) -> str | None:
        """Why the fix is withheld, for the finding at the method (None when it is not): the use that withheld it
        (the plainest, where a generic name such as ``forward`` gathers uses from all over a tree), and how many
        more there are. The uses are named here, never reported where they are (#50: one finding per fix)."""
        found = self.blockers(class_name, method, code)
        lead = _BY_HAND_LEADS.get(code)
        if lead is not None:
            found = tuple(blocker for blocker in found if blocker.resolved)
        if not found:
            return None
        return f"{lead or 'withheld'}: {summary(found, method, normalize_path(path), _PLAINEST)}"

    def merged(self, other: CallAnalysis) -> CallAnalysis:
        withheld: Withheld = {key: dict(codes) for key, codes in self.withheld.items()}
        for key, codes in other.withheld.items():
            mine = withheld.setdefault(key, {})
            for code, found in codes.items():
                mine[code] = _in_order({*mine.get(code, ()), *found})
        missing = dict(self.missing)
        for key, found in other.missing.items():
            missing[key] = _in_order({*missing.get(key, ()), *found})
        methods = {**self.methods, **other.methods}
        passed_on = (*self.passed_on, *other.passed_on)
        alternatives = _merged_alternatives(self.alternatives, other.alternatives)
        old_ops = {**self.old_ops, **other.old_ops}
        return _settled(CallAnalysis(withheld, methods, missing, passed_on, old_ops, alternatives))


@dataclass(frozen=True)
class PassedOn:
    """A call in a method of the run (``outer``) passing on that method's own ``output`` (``self._decode(query,
    output)`` in ``forward(..., output=None)``): it passes None where ``outer`` is given None or nothing."""

    outer: tuple[str, str]
    key: tuple[str, str]  # the method called
    codes: tuple[str, ...]  # the fixes it withholds there if it may pass None
    blocker: Blocker


def _settled(analysis: CallAnalysis) -> CallAnalysis:
    """``analysis`` with each call passing on its method's own ``output`` withholding what it would where that
    method may be given None (a use of it that may pass no buffer is a blocker of `NONE_TESTED`); again until
    nothing changes, as such methods chain (``forward`` to ``_run`` to ``_decode``)."""
    withheld: Withheld = {key: dict(codes) for key, codes in analysis.withheld.items()}
    pending = list(analysis.passed_on)
    while True:
        given_none = [passed for passed in pending if withheld.get(passed.outer, {}).get(NONE_TESTED)]
        if not given_none:
            break
        for passed in given_none:
            pending.remove(passed)
            mine = withheld.setdefault(passed.key, {})
            for code in passed.codes:
                mine[code] = _in_order({*mine.get(code, ()), passed.blocker})
    return CallAnalysis(
        withheld, analysis.methods, analysis.missing, analysis.passed_on, analysis.old_ops, analysis.alternatives
    )


_PLAINEST = {"layer": 0, "omits": 1, "none": 1, "decorator": 1, "alias": 1, "starred": 2, "maybe-none": 2}


def _in_order(blockers: Iterable[Blocker]) -> tuple[Blocker, ...]:
    return tuple(sorted(blockers, key=order))


class _Relations:
    """What the analysis asks of the run's class graph (`classgraph`), where a reference is loose: a class re-exported
    by a package (``plugin.MyImpl`` for ``plugin.backend.MyImpl``) is the same class."""

    def __init__(self, graph: ClassGraph) -> None:
        self.graph = graph

    def named(self, reference: str, *, exactly: bool = False) -> tuple[str, ...]:
        """The run's classes ``reference`` may name; ``exactly``: by its dotted name alone (`names_match`)."""
        return self.graph.named(reference) if exactly else self.graph.named_loosely(reference)

    def ancestors(self, full: str) -> tuple[str, ...]:
        """The run's classes ``full`` derives from, itself included."""
        return self.graph.lineage(full)

    def related(self, first: str, second: str) -> bool:
        """Whether one instance can be of both classes: some class of the run derives from both."""
        return self.graph.related(first, second)

    def is_layer(self, full: str) -> bool:
        return any(
            base.rpartition(".")[2] in _MODULE_BASES and (is_vllm_base(base) or base.endswith("nn.Module"))
            for ancestor in self.graph.lineage(full)
            for base in self.graph.bases.get(ancestor, ())
        )


def _how(use: Use, module: str, target: str, method: OutputMethod, relations: _Relations) -> tuple[str, ...]:
    """How ``use`` (in ``module``) involves ``method`` of class ``target``: nothing when it cannot be a call of it,
    or cannot bind to it today, or passes a buffer as ``output``; "positional" too where it passes ``output`` by
    position and VAC002 has no fix (the change it asks for by hand makes ``output`` keyword-only)."""
    explicit_self = False
    if use.receiver == "self":
        if use.scope is None or not relations.related(f"{module}.{use.scope}", target):
            return ()
    elif use.receiver == "super":
        scope = f"{module}.{use.scope}" if use.scope else None
        if scope is None or scope == target or not relations.related(scope, target):
            return ()
    elif use.receiver == "class":
        classes = relations.named(use.target or "")
        if not any(target in relations.ancestors(other) for other in classes):
            return ()  # a module, or a class the method does not belong to
        explicit_self = method.kind == "method"
    elif use.receiver == "instance":
        # By the callee's dotted name alone: a function sharing a class's last name must not pass for it.
        classes = relations.named(use.target or "", exactly=True)
        if classes and not any(target in relations.ancestors(other) for other in classes):
            return ()  # an instance of a class the method does not belong to (a factory's result counts)
    if use.kind != "call":
        return (use.kind,)
    parameters = (("<self>",) if explicit_self else ()) + method.positional
    if use.positional > len(parameters) and not method.varargs:
        return ()  # raises TypeError today
    if any(name not in method.keywords for name in use.keywords) and not method.varkw:
        return ()  # likewise, whatever ``*args`` or ``**kwargs`` hold
    if use.starred:
        if "output" in use.keywords:
            return _passes(use.output_none, use.output_relayed, use.output_forwarded, use.output_maybe_none)
        return ("starred",)
    bound = set(parameters[: use.positional]) | use.keywords
    if explicit_self and use.positional == 0:
        return ()
    if not method.required <= bound:
        # The method requires `output` and the call binds all else: it raises TypeError (`CallAnalysis.missing`).
        return ("missing",) if method.required - bound == {"output"} else ()
    if "output" in parameters[: use.positional]:
        at = parameters.index("output")
        # Fine as long as `output` stays where it is, which it cannot where VAC002 has no fix (`REQUIRED_BY_HAND`).
        moved = ("positional",) if method.output_default_none and not method.output_may_lose_default else ()
        passed = _passes(at in use.none_at, at in use.relayed_at, at in use.forwarded_at, at in use.maybe_none_at)
        return moved + passed
    if "output" in use.keywords:
        return _passes(use.output_none, use.output_relayed, use.output_forwarded, use.output_maybe_none)
    return ("omits",)


def _passes(none: bool, relayed: bool, forwarded: bool, maybe: bool = False) -> tuple[str, ...]:
    """How a call passes `output` that may be None: None itself, the calling method's own `output` ("relays"),
    another parameter of the calling function that may be None ("forwards"), or a value the run cannot prove is a
    buffer ("maybe-none": an attribute, a call's result, a global); nothing where it passes a buffer."""
    if none:
        return ("none",)
    return ("relays",) if relayed else ("forwards",) if forwarded else ("maybe-none",) if maybe else ()


def _resolved(use: Use, relations: _Relations) -> bool:
    """Whether the run knows what the receiver of ``use`` is: not for an "other" one, nor for a local name bound to
    what a callable that is no class of the run returned."""
    if use.receiver == "instance":
        return bool(relations.named(use.target or "", exactly=True))
    return use.receiver != "other"


# The uses of a method requiring `output` that cannot give it None: they leave its assert's deletion safe.
_CANNOT_PASS_NONE = frozenset({"omits", "missing", "signature", "positional"})


def _codes(method: OutputMethod, how: str) -> tuple[str, ...]:
    if how == "positional":
        return (REQUIRED_BY_HAND,)
    codes = []
    # A call passing None, or what may be None, binds `output` whether or not it has a default.
    if method.output_default_none and how not in PASSES_NONE:
        codes.append(REQUIRED_OUTPUT if method.output_may_lose_default else REQUIRED_BY_HAND)
    if how == "signature":
        return tuple(codes)  # read, never called: only the signature's change shows (`calls.SIGNATURE_READERS`)
    if method.fallback is not None:
        codes.append(NONE_FALLBACK)
    # Deleting the assert changes what a call passing None does (it fails later, maybe after writing the KV
    # cache, or not at all; a test may expect the AssertionError): every use that may pass None withholds it, as
    # it withholds VAC002's fix, and `output=None`. Where `output` is required already, a call omitting it raises
    # TypeError with the assert or without, and a read of the signature calls nothing: every other use may pass
    # None (a call passing what may be None, `*args`, the method handed on as a value, reflection).
    if method.asserts_output and (method.output_default_none or how not in _CANNOT_PASS_NONE):
        codes.append(ASSERT_OUTPUT)
    if method.output_default_none or how in PASSES_NONE:
        codes.append(NONE_TESTED)
    return tuple(codes)


def _targets(hierarchy: ClassHierarchy, indexes: Iterable[ModuleIndex]) -> dict[tuple[str, str], OutputMethod]:
    """The methods of attention classes whose ``output`` VAC002 would make required or whose fallback VAC003
    would delete (those whose assert VAC001 would delete are among the first), and those that require
    ``output`` (calls omitting it raise TypeError)."""
    methods: dict[tuple[str, str], OutputMethod] = {}
    for index in indexes:
        for method in index.calls.methods:
            full = f"{index.module}.{method.owner}"
            wanted = method.output_default_none or method.fallback or "output" in method.required
            if wanted and hierarchy.is_attention_class(full) and not _layer_s_own(hierarchy, full, method.name):
                methods[(full, method.name)] = method
    return methods


def _layer_s_own(hierarchy: ClassHierarchy, full: str, name: str) -> bool:
    """Whether the method is a vLLM layer's whose ``output`` is the project's own: vLLM passes a layer's method the
    buffer only to an MLA layer's ``forward_impl`` (`scope.FileContext.output_method`). The rules leave the others
    alone, and so do their calls."""
    if not hierarchy.is_layer_class(full):
        return False
    return name != "forward_impl" or not hierarchy.is_mla_layer_class(full)


def _alternatives(hierarchy: ClassHierarchy, indexes: Iterable[ModuleIndex]) -> dict[str, tuple[Signature, ...]]:
    """The methods of the attention classes in ``indexes`` that take no ``output``, by name."""
    found: dict[str, list[Signature]] = {}
    for index in indexes:
        attention: dict[str, bool] = {}
        for signature in index.calls.signatures:
            owner = signature.owner
            if owner not in attention:
                attention[owner] = hierarchy.is_attention_class(f"{index.module}.{owner}")
            if attention[owner]:
                found.setdefault(signature.name, []).append(signature)
    return {name: tuple(signatures) for name, signatures in found.items()}


def _merged_alternatives(
    first: Mapping[str, tuple[Signature, ...]], second: Mapping[str, tuple[Signature, ...]]
) -> dict[str, tuple[Signature, ...]]:
    merged = dict(first)
    for name, signatures in second.items():
        # (`extend` merges the run's whole set with itself: a tuple's membership tests would be quadratic)
        merged[name] = tuple(dict.fromkeys((*merged.get(name, ()), *signatures)))
    return merged


def analyse(hierarchy: ClassHierarchy, indexes: Iterable[ModuleIndex]) -> CallAnalysis:
    """Which VAC001-VAC003 fixes the uses in ``indexes`` withhold, given the run's ``hierarchy``."""
    indexes = list(indexes)
    return _withheld(hierarchy, indexes, _targets(hierarchy, indexes), _alternatives(hierarchy, indexes))


def _withheld(
    hierarchy: ClassHierarchy,
    indexes: Sequence[ModuleIndex],
    methods: dict[tuple[str, str], OutputMethod],
    alternatives: dict[str, tuple[Signature, ...]],
) -> CallAnalysis:
    old_ops = {index.path: index.old_ops for index in indexes if index.old_ops}
    if not methods:
        return CallAnalysis(old_ops=old_ops, alternatives=alternatives)
    relations = _Relations(hierarchy.graph)
    by_name: dict[str, list[tuple[tuple[str, str], OutputMethod]]] = {}
    for key, method in methods.items():
        by_name.setdefault(method.name, []).append((key, method))
    found: dict[tuple[str, str], dict[str, set[Blocker]]] = {}
    missing: dict[tuple[str, str], set[Blocker]] = {}
    passed_on: list[PassedOn] = []

    def block(key: tuple[str, str], codes: tuple[str, ...], blocker: Blocker) -> None:
        for code in codes:
            found.setdefault(key, {}).setdefault(code, set()).add(blocker)

    for key, method in methods.items():
        if method.name == "forward" and relations.is_layer(key[0]):
            block(key, _codes(method, "layer"), Blocker("", 0, 0, 0, "layer", "layer"))
    # What else may use the methods: their own decorators, reads in their class bodies, reflection, names looked up
    # from strings, doctests, unknown syntax, the text of files that do not parse (`accounting`).
    modules = hierarchy.all_modules()
    located = [Located(index.path, index.module, index.occurrences) for index in indexes]
    for key, method in methods.items():
        for blocker in occurrence_blockers(located, method.name, key[0], hierarchy.graph, modules):
            block(key, _codes(method, blocker.how), blocker)
    for index in indexes:
        for method in index.calls.methods:
            key = (f"{index.module}.{method.owner}", method.name)
            if method.decorators and key in methods:
                decorator = Blocker(index.path, method.line, 1, method.line, "decorator", method.decorators[0])
                block(key, _codes(method, "decorator"), decorator)
    for index in indexes:
        for use in index.calls.uses_named(by_name.keys()):
            for key, method in by_name[use.name]:
                for how in _how(use, index.module, key[0], method, relations):
                    resolved = _resolved(use, relations)
                    blocker = Blocker(index.path, use.line, use.column, use.end_line, how, use.text, resolved)
                    if how == "missing":
                        # On any receiver: after `--unsafe-fixes` the calls they break go through `self.impl`,
                        # which the run cannot tell. One it cannot tell says so (`_unresolved`), unless the call
                        # fits another attention class's method (vLLM's layer's `forward(query, key, value)`): a
                        # report says the call raises, which the run has no ground to say.
                        if resolved or not _fits_another(use, alternatives):
                            missing.setdefault(key, set()).add(blocker)
                        continue
                    # What a method of the run passes on of its own `output` is None where it is given None; what
                    # another function passes on, anything its callers give it (the run does not follow them).
                    outer = (f"{index.module}.{use.scope}", use.relayed_from or "")
                    if how == "relays" and outer in methods:
                        passed_on.append(PassedOn(outer, key, _codes(method, how), blocker))
                    else:
                        block(key, _codes(method, how), blocker)
    withheld = {key: {code: _in_order(blockers) for code, blockers in codes.items()} for key, codes in found.items()}
    missing_in_order = {key: _in_order(found) for key, found in missing.items()}
    return _settled(CallAnalysis(withheld, methods, missing_in_order, tuple(passed_on), old_ops, alternatives))


def _fits_another(use: Use, alternatives: Mapping[str, tuple[Signature, ...]]) -> bool:
    return any(signature.takes(use.positional, use.keywords) for signature in alternatives.get(use.name, ()))


def extend(analysis: CallAnalysis, hierarchy: ClassHierarchy, index: ModuleIndex) -> CallAnalysis:
    """``analysis`` with the uses and methods of one more module (a file outside the run's index)."""
    targets = {**analysis.methods, **_targets(hierarchy, [index])}
    alternatives = _merged_alternatives(analysis.alternatives, _alternatives(hierarchy, [index]))
    return analysis.merged(_withheld(hierarchy, [index], targets, alternatives))


def open_method_names(analysis: CallAnalysis) -> frozenset[str]:
    """The names of the methods with a fix the run's uses do not withhold yet: only a use of one of them
    can still change a fix (a use of a method whose fixes are all withheld is reported only where its
    file is read anyway). Once withheld, a fix stays withheld as the run reads more files."""
    # (What a use may withhold: what a call omitting `output` does, and what a reference does, which may pass
    # None to a method requiring `output`.)
    return frozenset(
        method.name
        for key, method in analysis.methods.items()
        if not {*_codes(method, "omits"), *_codes(method, "reference")} <= set(analysis.withheld.get(key, ()))
    )


# --- the caller findings ---------------------------------------------------------------------------


_NOQA_WORD = re.compile(rb"noqa", re.IGNORECASE)


def _noqa_lines(source: bytes) -> dict[int, frozenset[str]]:
    import io
    import tokenize

    from vllm_attn_compat.codemods.noqa import noqa_codes

    lines: dict[int, frozenset[str]] = {}
    try:
        # CPython reads \r\n and \r as \n (the lines `ast` counts); the tokenize module splits at \n only.
        universal = source.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        for token in tokenize.tokenize(io.BytesIO(universal).readline):
            if token.type == tokenize.COMMENT:
                codes = noqa_codes(token.string)
                if codes is not None:
                    lines[token.start[0]] = lines.get(token.start[0], frozenset()) | codes
    except (tokenize.TokenError, SyntaxError):
        pass  # the file parsed with `ast`; a tokenizer disagreeing only costs its suppressions
    return lines


def caller_findings(
    analysis: CallAnalysis,
    path: str,
    source: bytes,
    codes: Iterable[str],
    unsafe_fixes: bool = False,
    rewritten: bytes | None = None,
) -> list[Finding]:
    """The findings at the calls in the file at ``path`` that omit the ``output`` a method requires (vLLM >= 0.20's
    signature, or one an unsafe fix made): each raises TypeError. Reported under VAC002 (selected in ``codes``), so
    ``# noqa: VAC002`` on the line silences one. A use that withholds a fix is no finding of its own: the fix's
    finding names it (#50). ``rewritten``: the file as the run's fixes left it, where they changed it: a call they
    deleted is not reported (`deleted_uses`). (``unsafe_fixes`` changes nothing here.)"""
    from vllm_attn_compat.codemods.noqa import suppresses

    if REQUIRED_OUTPUT not in set(codes):
        return []
    here = normalize_path(path)
    sites: dict[tuple[int, int], list[tuple[tuple[str, str], Blocker]]] = {}
    for key, blockers in analysis.missing.items():
        for blocker in blockers:
            if blocker.path == here:
                sites.setdefault((blocker.line, blocker.column), []).append((key, blocker))
    if sites and rewritten is not None:
        from vllm_attn_compat.codemods.index import deleted_uses

        for site in deleted_uses.deleted(source, rewritten, [entries[0][1] for entries in sites.values()]):
            del sites[site]
    if not sites:
        return []
    # The tokenizer finds which `noqa` is a comment; it runs only when a call's lines hold one.
    lines = source.splitlines()  # the line breaks `ast` counts: \n, \r\n and \r
    spans = [(line, blocker.end_line) for (line, _), entries in sites.items() for _, blocker in entries]
    may_suppress = any(_NOQA_WORD.search(b"\n".join(lines[start - 1 : end])) for start, end in spans)
    noqa = _noqa_lines(source) if may_suppress else {}
    old_ops = analysis.old_ops.get(here, ())
    findings = []
    for (line, column), entries in sorted(sites.items()):
        blocker = entries[0][1]
        keys = sorted({key for key, _ in entries})
        suppressed = any(
            suppresses(noqa[number], REQUIRED_OUTPUT) for number in range(line, blocker.end_line + 1) if number in noqa
        )
        old_op = next(((op, registered) for first, last, op, registered in old_ops if first <= line <= last), None)
        message = _missing_message(blocker, keys, old_op)
        status = Status.SUPPRESSED if suppressed else Status.MANUAL
        findings.append(Finding(line, column, REQUIRED_OUTPUT, message, status))
    return findings


def _missing_message(blocker: Blocker, keys: list[tuple[str, str]], old_op: tuple[str, bool] | None) -> str:
    """One line: the call, the method(s) requiring ``output``, what happens; ``old_op``: the deleted op whose body
    (`old_ops.old_op_bodies`) holds the call, and whether the module registers it, if one does."""
    full, name = keys[0]
    owner = full.rpartition(".")[2] if "<locals>" not in full else full.rsplit(".", 1)[1]
    method = f"`{owner}.{name}`" + (f" and {len(keys) - 1} other method(s) of the run" if len(keys) > 1 else "")
    requires = "requires" if len(keys) == 1 else "require"
    broken = f"`{blocker.text}.{name}(...)` does not pass `output`, which {method} {requires} (vLLM >= 0.20)"
    if old_op is not None:
        op, registered = old_op
        if registered:
            return f"{broken}: the call raises TypeError; this is the body of `vllm::{op}`: delete it (VAC007)"
        return f"{broken}: the call raises TypeError; this function is named as the deleted op `vllm::{op}`"
    if not blocker.resolved:
        receiver = "its receiver" if blocker.text == UNSHOWN else f"`{blocker.text}`"
        return f"{broken}: the call raises TypeError if {receiver} is one (the run cannot tell); pass `output=`"
    return f"{broken}: the call raises TypeError; pass the output buffer as `output=`"


def findings_for_run(
    analysis: CallAnalysis,
    files: Mapping[str, bytes],
    codes: Iterable[str],
    unsafe_fixes: bool = False,
    rewritten: Mapping[str, bytes] | None = None,
) -> list[tuple[str, Finding]]:
    """``caller_findings`` for every file of the run that holds a call omitting a required ``output``, by the path
    it was given as (the bytes of the others are not asked for); ``rewritten``: the files the run's fixes changed,
    as they left them (by path as given)."""
    codes = tuple(codes)
    holding = {b.path for bs in analysis.missing.values() for b in bs}
    found = []
    for path in files:
        if normalize_path(path) in holding:
            after = rewritten.get(path) if rewritten is not None else None
            found += [(path, f) for f in caller_findings(analysis, path, files[path], codes, unsafe_fixes, after)]
    return found


def withheld_reason(ctx: RuleContext, method: MethodFrame, code: str) -> str | None:
    """For a rule at ``method`` (a `scope.FunctionFrame` of an attention class): why the run's uses of
    the method withhold ``code``'s fix, or None when it stays safe."""
    import libcst as cst

    # A method of a class, or a function patched onto one (`FileContext.output_method`): never a lambda.
    assert isinstance(method.node, cst.FunctionDef), type(method.node)
    name = method.node.name.value
    if method.attention_class is None:
        if code in (ASSERT_OUTPUT, NONE_TESTED):
            return None  # only a call seen to pass None withholds it, and none is tied to the function
        # A module-level function patched onto a class at run time: its calls go through the patched
        # attribute of any instance, which the index does not tie to the function.
        return f"withheld: `{name}` is patched onto a class at run time, whose callers the run cannot tell"
    owner = f"{ctx.module_name}.{method.attention_class.qualname}"
    return ctx.hierarchy.calls.reason(owner, name, code, ctx.path)
