"""Questions about the attention interface of a release: classes, members (inherited ones included), histories,
what a release no longer has or calls, ops and module names. Releases are the manifest's own strings (``resolve``
first); classes are qualified names (``vllm.v1.attention.backend.AttentionBackend``), ``find_class`` maps an
import path or a short name to one."""

from __future__ import annotations

import itertools
from typing import Any

from . import data
from .releases import releases
from .types import ClassInfo, DeadHook, Member, MemberHistory, Op, Removal, Signature, Successor

_SIGNATURE_FIELDS = ("kind", "params", "returns", "abstract", "annotation", "value", "async")


def classes(release: str) -> tuple[str, ...]:
    """The qualified names of the classes ``release`` defines in the manifest's modules, sorted."""
    return tuple(q for q, entry in data.load()["classes"].items() if data.state_at(entry["history"], release))


def class_info(release: str, cls: str) -> ClassInfo | None:
    """The class ``cls`` at ``release`` (bases, kind, metaclass, deprecation), or None where it has none."""
    entry = data.load()["classes"].get(cls)
    state = data.state_at(entry["history"], release) if entry else None
    if state is None:
        return None
    return ClassInfo(cls, tuple(state["bases"]), state["kind"], state.get("metaclass"), state.get("deprecated"))


def find_class(release: str, name: str) -> str | None:
    """The qualified name of the class ``name`` means at ``release``: a qualified name, an import path through a
    module that re-exports it (``vllm.model_executor.layers.attention.Attention``), or a short name that one
    class alone has. None where nothing matches."""
    if class_info(release, name) is not None:
        return name
    module, _, short = name.rpartition(".")
    if module:
        kind = data.state_at(data.load()["modules"].get(module, {}).get(short, []), release)
        if isinstance(kind, str) and kind.startswith("import "):
            return find_class(release, kind.removeprefix("import "))
        return None
    matches = [q for q in classes(release) if q.rpartition(".")[2] == name]
    return matches[0] if len(matches) == 1 else None


def mro(release: str, cls: str) -> tuple[str, ...]:
    """``cls`` and its bases that the manifest holds at ``release``, in C3 method resolution order (bases outside
    the manifest, as ``abc.ABC`` or torch's ``nn.Module``, are left out)."""
    info = class_info(release, cls)
    if info is None:
        return ()
    bases = [b for b in info.bases if class_info(release, b) is not None]
    sequences = [list(mro(release, b)) for b in bases] + [bases]
    order = [cls]
    while any(sequences):
        for sequence in sequences:
            head = sequence[0] if sequence else None
            if head is not None and not any(head in s[1:] for s in sequences):
                break
        else:  # no consistent order (Python would refuse the class); fall back to depth-first
            head = next(s[0] for s in sequences if s)
        order.append(head)
        sequences = [[c for c in s if c != head] for s in sequences]
    return tuple(order)


def own_members(release: str, cls: str) -> dict[str, Member]:
    """The members the body of ``cls`` defines at ``release`` (none where the class is absent)."""
    entry = data.load()["classes"].get(cls)
    if entry is None:
        return {}
    found = {}
    for name, history in entry["members"].items():
        state = data.state_at(history, release)
        if state is not None:
            found[name] = data.member(cls, name, state)
    return found


def members(release: str, cls: str, *, inherited: bool = True) -> dict[str, Member]:
    """{name: Member} of ``cls`` at ``release``: its own members and, with ``inherited``, those of its bases in
    the manifest, each from the first class of its MRO that defines it."""
    if not inherited:
        return own_members(release, cls)
    found: dict[str, Member] = {}
    for owner in mro(release, cls):
        for name, value in own_members(release, owner).items():
            found.setdefault(name, value)
    return found


def member(release: str, cls: str, name: str, *, inherited: bool = True) -> Member | None:
    """The member ``name`` of ``cls`` at ``release``, or None where it has none."""
    return members(release, cls, inherited=inherited).get(name)


def signature(release: str, cls: str, name: str) -> Signature | None:
    """The signature vLLM declares for ``cls.name`` at ``release`` (inherited included): the parameters vLLM's
    callers may pass to an override. None for attributes, fields and absent members."""
    found = member(release, cls, name)
    return None if found is None else found.signature


def abstract_members(release: str, cls: str) -> frozenset[str]:
    """The names a concrete subclass of ``cls`` must implement at ``release``: members abstract in the first class
    of the MRO that defines them."""
    return frozenset(name for name, value in members(release, cls).items() if value.abstract)


def history(cls: str, name: str) -> MemberHistory:
    """The history of the member ``name`` of ``cls`` (its own body's). Raises KeyError naming the member when no
    release of the manifest has it."""
    entry = data.load()["classes"].get(cls, {}).get("members", {}).get(name)
    if entry is None:
        raise KeyError(f"no release of the manifest has a member {name!r} on {cls}")
    return _history(cls, name, entry)


def _history(cls: str, name: str, changes: list[list[Any]]) -> MemberHistory:
    states = tuple((release, None if state is None else data.member(cls, name, state)) for release, state in changes)
    present = [(r, s) for r, s in changes if s is not None]
    changed = tuple(
        release
        for (_, before), (release, after) in itertools.pairwise(changes)
        if before is not None and after is not None and _shape(before) != _shape(after)
    )
    deprecations = [(r, s["deprecated"]) for r, s in present if s.get("deprecated")]
    last_release, last_state = changes[-1]
    removed = last_release if last_state is None else None
    unreferenced_since = None
    if last_state is not None and not last_state.get("referenced", True):
        unreferenced_since = last_release
        for release, state in reversed(changes[:-1]):
            if state is None or state.get("referenced", True):
                break
            unreferenced_since = release
    return MemberHistory(
        owner=cls,
        name=name,
        added=present[0][0] if present else None,
        removed=removed,
        changed=changed,
        deprecated=deprecations[-1][1] if deprecations else None,
        deprecated_since=deprecations[0][0] if deprecations else None,
        unreferenced_since=unreferenced_since,
        successor=data.successor(f"{cls}.{name}"),
        states=states,
    )


def _shape(state: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(repr(state.get(key)) for key in _SIGNATURE_FIELDS)


def dead_hooks(release: str, cls: str) -> dict[str, DeadHook]:
    """{name: DeadHook} of the members ``cls`` or one of its manifest bases had in an earlier release that
    ``release`` no longer has on ``cls`` (inherited included), or has but never uses: an override of one is
    ignored by vLLM at ``release``. Empty where the class is absent at ``release``."""
    current = members(release, cls)
    if not current and class_info(release, cls) is None:
        return {}
    known = releases()
    position = data.index(release)
    found: dict[str, DeadHook] = {}
    for owner in _ancestry(cls, known[: position + 1]):
        for name, changes in data.load()["classes"][owner]["members"].items():
            if name in found:
                continue
            hook = _not_called(current[name], release) if name in current else _removed(owner, name, changes, release)
            if hook is not None:
                found[name] = hook
    return found


def _ancestry(cls: str, upto: tuple[str, ...]) -> list[str]:
    """``cls`` and every manifest class that was its base (directly or not) in any of the releases ``upto``."""
    order: list[str] = []
    pending = [cls]
    while pending:
        name = pending.pop(0)
        if name in order or name not in data.load()["classes"]:
            continue
        order.append(name)
        for release in upto:
            info = class_info(release, name)
            if info is not None:
                pending += [b for b in info.bases if b not in order]
    return order


def _not_called(value: Member, release: str) -> DeadHook | None:
    if value.referenced:
        return None
    changes = data.load()["classes"][value.owner]["members"][value.name]
    past = [(r, s) for r, s in changes if data.index(r) <= data.index(release)]
    since, last = release, None
    for changed, state in reversed(past):  # back through the run of unused states that ends at ``release``
        if state is None:
            break
        if state.get("referenced", True):
            last = releases()[data.index(since) - 1]
            break
        since = changed
    return DeadHook(value.owner, value.name, value.kind, "not called", since, last, value.deprecated, _successor(value))


def _removed(owner: str, name: str, changes: list[list[Any]], release: str) -> DeadHook | None:
    position = data.index(release)
    last_present = None
    removed_in = None
    for changed, state in changes:
        if data.index(changed) > position:
            break
        if state is not None:
            last_present, removed_in = state, None
        elif last_present is not None and removed_in is None:
            removed_in = changed
    if last_present is None or removed_in is None:
        return None
    value = data.member(owner, name, last_present)
    last = releases()[data.index(removed_in) - 1]
    return DeadHook(owner, name, value.kind, "removed", removed_in, last, value.deprecated, _successor(value))


def _successor(value: Member) -> Successor | None:
    return data.successor(f"{value.owner}.{value.name}")


def forwardable_members(release: str, cls: str) -> dict[str, DeadHook]:
    """The members of ``cls`` (inherited included) that ``release`` removed and whose value vLLM's sources state
    as code over the instance (``successor.kind == "expression"``): what a deprecated forwarder may compute."""
    return {
        name: hook
        for name, hook in dead_hooks(release, cls).items()
        if hook.reason == "removed" and hook.successor is not None and hook.successor.kind == "expression"
    }


def removed_between(old: str, new: str) -> tuple[Removal, ...]:
    """What ``old`` has and ``new`` lacks: classes, class members (each on the class whose body defined it; the
    members of a removed class are the class's removal), module-level functions, other module-level names and
    ops, each with the first release after ``old`` that lacked it. ``old`` must not be after ``new``."""
    if data.index(old) > data.index(new):
        raise ValueError(f"removed_between: {old} is after {new}")
    manifest = data.load()
    found: list[Removal] = []

    def gone(history: list[list[Any]]) -> str | None:
        if data.state_at(history, old) is None or data.state_at(history, new) is not None:
            return None
        return str(next(r for r, s in history if s is None and data.index(old) < data.index(r) <= data.index(new)))

    for cls, entry in manifest["classes"].items():
        removed_in = gone(entry["history"])
        if removed_in is not None:
            info = class_info(old, cls)
            found.append(Removal("class", cls, removed_in, info.deprecated if info else None, None))
            continue
        for name, changes in entry["members"].items():
            removed_in = gone(changes)
            if removed_in is not None:
                state = data.state_at(changes, old)
                found.append(
                    Removal(
                        "member", f"{cls}.{name}", removed_in, state.get("deprecated"), data.successor(f"{cls}.{name}")
                    )
                )
    for name, changes in manifest["functions"].items():
        removed_in = gone(changes)
        if removed_in is not None:
            found.append(Removal("function", name, removed_in, data.state_at(changes, old).get("deprecated"), None))
    for module, names in manifest["modules"].items():
        for name, changes in names.items():
            removed_in = gone(changes)
            if removed_in is not None and data.state_at(changes, old) not in ("class", "function"):
                found.append(Removal("name", f"{module}.{name}", removed_in, None, None))
    for name, changes in manifest["ops"].items():
        removed_in = gone(changes)
        if removed_in is not None:
            found.append(Removal("op", name, removed_in, None, None))
    return tuple(found)


def modules(release: str) -> tuple[str, ...]:
    """The modules of the manifest's scope that ``release`` has (``vllm.v1.attention.backend``, ...), sorted."""
    return tuple(
        m for m, names in data.load()["modules"].items() if any(data.state_at(h, release) for h in names.values())
    )


def module_names(release: str, module: str) -> dict[str, str]:
    """{name: kind} of what ``from <module> import name`` finds at ``release`` among what vLLM put there: "class",
    "function", "variable", or "import <target>" for a re-export. Empty for a module the release lacks."""
    names = data.load()["modules"].get(module, {})
    return {n: k for n, h in names.items() if (k := data.state_at(h, release)) is not None}


def name_history(module: str, name: str) -> tuple[tuple[str, str | None], ...]:
    """(release, kind or None) where the module-level ``name`` of ``module`` appeared, changed or went."""
    return tuple((r, k) for r, k in data.load()["modules"].get(module, {}).get(name, []))


def functions(release: str) -> dict[str, Signature]:
    """{qualified name: signature} of the module-level functions of the manifest's modules at ``release``."""
    found = {}
    for name, changes in data.load()["functions"].items():
        state = data.state_at(changes, release)
        if state is not None:
            found[name] = data.signature(state) or Signature((), None)
    return found


def ops(release: str) -> dict[str, Op]:
    """{"vllm::name": Op} of the custom ops the manifest's modules register at ``release``."""
    found = {}
    for name, changes in data.load()["ops"].items():
        state = data.state_at(changes, release)
        if state is not None:
            mutates = state.get("mutates_args", [])
            found[name] = Op(
                name,
                state["module"],
                state.get("function"),
                data.signature(state),
                tuple(mutates) if isinstance(mutates, list) else (mutates,),
            )
    return found
