"""What a release asks of code written against its attention interface: the hooks it no longer has or calls, the
names it removed, the signatures it passes, the members it leaves abstract. The questions the codemods' rules
VAC010-VAC013 ask of a class deriving from vLLM's interface classes (``classes``: manifest classes, as
``resolve_class`` finds them from the names a project imports), each for one target release.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from . import data
from .query import class_info, dead_hooks, members, mro
from .releases import releases
from .types import DeadHook, Member

# Names of vLLM's old and new module layouts under which a short name still means the manifest's class of that
# name (``vllm.attention.backends.abstract.AttentionBackend``, moved to ``vllm.v1.attention.backend``).
_ATTENTION_WORD = "attention"


class Abstract(NamedTuple):
    """An abstract member a release requires of a concrete subclass: its name, the manifest class declaring it
    abstract, and the first release from which it is so (the manifest's first release: at or before it)."""

    name: str
    owner: str
    since: str


def resolve_class(dotted: str) -> str | None:
    """The manifest class ``dotted`` (a name as a project imports it) means in some release: a qualified name of
    the manifest, an import path through a module re-exporting it, or, under a module of vLLM's attention code in
    any layout (``vllm.attention.backends.abstract.AttentionBackend``, ``vllm.v1.attention.backends.mla.common.
    MLACommonBackend``), a short name that one manifest class alone has. None otherwise."""
    manifest = data.load()
    if dotted in manifest["classes"]:
        return dotted
    module, _, short = dotted.rpartition(".")
    for _, state in manifest["modules"].get(module, {}).get(short, ()):
        if isinstance(state, str) and state.startswith("import "):
            return resolve_class(state.removeprefix("import "))
    if not module.startswith("vllm.") or _ATTENTION_WORD not in module:
        return None
    matches = [name for name in manifest["classes"] if name.rpartition(".")[2] == short]
    return matches[0] if len(matches) == 1 else None


def reaches(dotted: str) -> bool:
    """Whether an import binding ``dotted`` (``from M import n``: ``M.n``; ``import M as n``: ``M``) can lead to a
    manifest class, as `resolve_class` finds one from the name or an attribute path through it: ``dotted`` is a
    manifest class, in a module re-exporting classes, or a package or module above either; or lies in vLLM's
    attention code. (An attribute path naming an attention module below an import that is none of these, such as
    ``vllm._C`` then ``.attention.X``, leads to no class: vLLM's attention code is never reached that way.)"""
    manifest = data.load()
    return (
        dotted in _paths()
        or dotted.rpartition(".")[0] in manifest["modules"]
        or (dotted.startswith("vllm.") and _ATTENTION_WORD in dotted)
    )


@functools.cache
def _paths() -> frozenset[str]:
    """Every manifest class and module, and every package above one (``vllm``, ``vllm.v1``, ...)."""
    manifest = data.load()
    found: set[str] = set()
    for name in (*manifest["classes"], *manifest["modules"]):
        parts = name.split(".")
        found.update(".".join(parts[:end]) for end in range(1, len(parts) + 1))
    return frozenset(found)


def derives(cls: str, base: str) -> bool:
    """Whether the manifest class ``cls`` is ``base`` or derives from it in some release."""
    return cls == base or any(base in mro(release, cls) for release in releases())


def present(release: str, classes: Iterable[str]) -> tuple[str, ...]:
    """Those of ``classes`` that ``release`` has, in their order."""
    return tuple(cls for cls in classes if class_info(release, cls) is not None)


def dead_overrides(release: str, classes: Sequence[str]) -> Mapping[str, DeadHook]:
    """{name: DeadHook} of the members that ``classes`` (the vLLM bases of one class) had in an earlier release
    and that ``release`` no longer has or calls on any of them: an override of one is code vLLM ignores. Dunder
    methods are Python's, never dead. The first class naming a hook gives its record."""
    return _dead_overrides(release, tuple(classes))


@functools.cache  # (asked for every method of every interface class of a run, of a few sets of bases)
def _dead_overrides(release: str, classes: tuple[str, ...]) -> Mapping[str, DeadHook]:
    kept = present(release, classes)
    alive = {name for cls in kept for name, value in members(release, cls).items() if value.referenced}
    found: dict[str, DeadHook] = {}
    for cls in kept:
        for name, hook in dead_hooks(release, cls).items():
            if name not in alive and not (name.startswith("__") and name.endswith("__")):
                found.setdefault(name, hook)
    return MappingProxyType(found)


def base_member(release: str, classes: Sequence[str], name: str) -> Member | None:
    """The member ``name`` that the first of ``classes`` having it offers at ``release`` (inherited included)."""
    for cls in present(release, classes):
        value = members(release, cls).get(name)
        if value is not None:
            return value
    return None


def last_change(owner: str, name: str, release: str) -> str | None:
    """The release, at or before ``release``, that last changed the signature (or kind) of ``owner.name``; None
    where the member kept its shape since it appeared."""
    changes = data.load()["classes"].get(owner, {}).get("members", {}).get(name, [])
    position = data.index(release)
    last = None
    before = None
    for changed, state in changes:
        if data.index(changed) > position:
            break
        if before is not None and state is not None and _shape(before) != _shape(state):
            last = changed
        before = state
    return last


def _shape(state: dict[str, object]) -> tuple[object, ...]:
    """What a caller's arguments bind to: the kind, and each parameter's name, kind and whether it has a default
    (annotations and default values aside)."""
    params = state.get("params")
    listed = tuple((p[0], p[1], p[2] is not None) for p in params) if isinstance(params, list) else None
    return state.get("kind"), listed


@functools.cache
def hook_names() -> frozenset[str]:
    """Every member name (dunders and enum members aside) that some release of the manifest removed from a class,
    or kept without using: the names a dead override can have (VAC010's tokens)."""
    return frozenset(
        name
        for entry in data.load()["classes"].values()
        for name, changes in entry["members"].items()
        if not (name.startswith("__") and name.endswith("__"))
        and any(state is not None and state["kind"] != "enum_member" for _, state in changes)
        and (
            _removed_after_present(changes) or any(s is not None and not s.get("referenced", True) for _, s in changes)
        )
    )


@functools.cache
def removed_names() -> frozenset[str]:
    """Every module-level name and class member (dunders aside) that some release of the manifest removed: what
    an import or a read of a removed name can name (VAC011's tokens)."""
    manifest = data.load()
    modules = {
        n for names in manifest["modules"].values() for n, changes in names.items() if _removed_after_present(changes)
    }
    members = {
        name
        for entry in manifest["classes"].values()
        for name, changes in entry["members"].items()
        if _removed_after_present(changes) and not (name.startswith("__") and name.endswith("__"))
    }
    return frozenset(modules | members)


@functools.cache
def drifted_names() -> frozenset[str]:
    """Every member name whose parameters (names, kinds, defaults' presence) some release of the manifest changed:
    the names an override whose signature drifted can have (VAC012's tokens). Constructors aside: vLLM makes its
    objects in ways of their own (the MLA layer names an impl's dimensions, a builder is made positionally), which
    a signature alone does not tell."""
    found = set()
    for entry in data.load()["classes"].values():
        for name, changes in entry["members"].items():
            if name == "__init__":
                continue
            present = [state for _, state in changes if state is not None and "params" in state]
            if any(_shape(a) != _shape(b) for a, b in itertools.pairwise(present)):
                found.add(name)
    return frozenset(found)


def _removed_after_present(changes: list[list[object]]) -> bool:
    seen = False
    for _, state in changes:
        if state is not None:
            seen = True
        elif seen:
            return True
    return False


def missing_abstract(release: str, classes: Sequence[str], implemented: Iterable[str]) -> dict[str, Abstract]:
    """{name: Abstract} of the members abstract in one of ``classes`` at ``release`` that none of them offers
    concretely and ``implemented`` (the names a subclass and its own bases define) does not hold; none where
    vLLM itself ships a class lacking the same (`shaped_like_vllms_own`)."""
    kept = present(release, classes)
    defined = set(implemented)
    concrete = {name for cls in kept for name, value in members(release, cls).items() if not value.abstract}
    found: dict[str, Abstract] = {}
    for cls in kept:
        for name, value in members(release, cls).items():
            if value.abstract and name not in defined and name not in concrete and name not in found:
                found[name] = Abstract(name, value.owner, _abstract_since(value.owner, name, release))
    if found and shaped_like_vllms_own(release, found.values()) is not None:
        return {}
    return found


def shaped_like_vllms_own(release: str, lacking: Iterable[Abstract]) -> str | None:
    """One of vLLM's own concrete classes at ``release`` that leaves out exactly the abstract members ``lacking``
    of classes vLLM never instantiates, or None. Python asks for an abstract member only when a class is
    instantiated, which vLLM never does to a class of static and class methods (a backend): there a member is
    needed where vLLM calls it, and vLLM's own backends serving no attention layer (Mamba's, the indexers') go
    without ``get_impl_cls``, which only an attention layer asks for. A class lacking what none of vLLM's lacks
    (an attention backend without ``get_kv_cache_shape``, up to 0.28) still breaks, as does any class vLLM
    instantiates (an impl, a builder) that lacks one."""
    owners = {item.owner for item in lacking}
    if not all(_never_instantiated(release, owner) for owner in owners):
        return None
    return _left_out(release).get(frozenset(f"{item.owner}.{item.name}" for item in lacking))


def _never_instantiated(release: str, cls: str) -> bool:
    """Whether ``cls`` holds static and class methods and attributes alone (vLLM calls them on the class)."""
    return all(
        value.kind in ("staticmethod", "classmethod", "attribute", "class", "enum_member")
        for value in members(release, cls).values()
    )


def left_out(release: str) -> dict[str, frozenset[str]]:
    """{concrete class of vLLM's own at ``release``: the abstract members of the interface it does not implement
    ("owner.member" each)}, as the manifest read them from the release's sources."""
    found = {}
    for cls, history in data.load()["left_out"].items():
        lacking = data.state_at(history, release)
        if lacking:
            found[cls] = frozenset(lacking)
    return found


@functools.cache
def _left_out(release: str) -> dict[frozenset[str], str]:
    """`left_out` by what is left out: the first class by name for each."""
    found: dict[frozenset[str], str] = {}
    for cls, lacking in sorted(left_out(release).items()):
        found.setdefault(lacking, cls)
    return found


def _abstract_since(owner: str, name: str, release: str) -> str:
    """The first release of the run of abstract states of ``owner.name`` that ends at ``release``."""
    changes = data.load()["classes"][owner]["members"][name]
    position = data.index(release)
    since: str | None = releases()[0]
    for changed, state in changes:
        if data.index(changed) > position:
            break
        if state is None or not state.get("abstract"):
            since = None
        elif since is None:
            since = changed
    return since or release


class RemovedName(NamedTuple):
    """A module-level name an earlier release had and ``release`` lacks: ``removed_in`` is the first release
    without it, ``kind`` what it was ("class", "function", "variable", "import ...")."""

    module: str
    name: str
    kind: str
    removed_in: str


def removed_name(release: str, module: str, name: str) -> RemovedName | None:
    """The removal of ``from <module> import <name>`` at ``release``: None where ``release`` has the name, or no
    release of the manifest ever had it (a module outside the manifest's scope, a name vLLM never put there)."""
    history = data.load()["modules"].get(module, {}).get(name)
    if not history or data.state_at(history, release) is not None:
        return None
    found = _removal(history, release)
    if found is None:
        return None  # added after ``release``: a name of a newer release, not a removal
    kind, removed_in = found
    return RemovedName(module, name, str(kind), removed_in)


# vLLM's attention packages, old layout and new, whose every module the manifest lists (`module_files`: the generator's
# ``MODULE_TREES``).
MODULE_TREES = ("vllm.attention", "vllm.v1.attention", "vllm.model_executor.layers.attention")


class MissingModule(NamedTuple):
    """A module of vLLM's attention packages that ``release`` lacks, so that importing it raises ImportError there:
    ``gone`` is the module or package above it that went, ``removed_in`` the first release without it (None: no release
    of the manifest has it, the old layout's ``vllm.attention``, gone before the first)."""

    module: str
    gone: str
    removed_in: str | None


def missing_module(release: str, module: str) -> MissingModule | None:
    """Whether ``import <module>`` fails at ``release`` for a module an earlier release had (or, under a package of
    vLLM's attention code that no release of the manifest has, for any module). None where ``release`` has it, where
    it is outside vLLM's attention packages, and for a module no release of the manifest had under a package they
    have (an older one's, a newer one's, none: not for the manifest to say)."""
    root = next((tree for tree in MODULE_TREES if module == tree or module.startswith(tree + ".")), None)
    if root is None:
        return None
    files = data.load()["module_files"]
    if root not in files:
        return MissingModule(module, root, None)
    parts = module.split(".")
    for end in range(root.count(".") + 1, len(parts) + 1):
        name = ".".join(parts[:end])
        history = files.get(name)
        if history is None:
            return None
        if data.state_at(history, release) is None:
            found = _removal(history, release)
            return None if found is None else MissingModule(module, name, found[1])
    return None


# The bytes a prefilter token needs to be selective in ordinary code (`engine.migrate.prefilter_tokens`).
_SELECTIVE = 10


@functools.cache
def removed_module_tokens() -> frozenset[str]:
    """What a file importing a module some release of the manifest lacks holds (VAC011's tokens): each package of
    `MODULE_TREES` no release has, and the name of each module one removed (its last part, with the part before it
    where that is short: ``attention.pcp``, ``backends.tree_attn``), less those within a removed package."""
    files = data.load()["module_files"]
    gone = {name for name, changes in files.items() if _removed_after_present(changes)}
    found = {tree for tree in MODULE_TREES if tree not in files}
    for name in gone:
        if any(name.startswith(f"{package}.") for package in gone):
            continue
        last = name.rpartition(".")[2]
        found.add(last if len(last) >= _SELECTIVE else ".".join(name.split(".")[-2:]))
    return frozenset(found)


def removed_op(release: str, op: str) -> str | None:
    """The release that removed the custom op ``op`` (``vllm::maybe_calc_kv_scales``), where ``release`` lacks it and
    an earlier one registered it; else None."""
    history = data.load()["ops"].get(op)
    if not history or data.state_at(history, release) is not None:
        return None
    found = _removal(history, release)
    return found[1] if found else None


def _removal(history: list[list[object]], release: str) -> tuple[object, str] | None:
    """(the last state, the first release without it) of a history whose thing ``release`` lacks after an earlier
    release had it; None otherwise."""
    position = data.index(release)
    state = None
    removed_in = None
    for changed, value in history:
        if data.index(str(changed)) > position:
            break
        if value is not None:
            state, removed_in = value, None
        elif state is not None and removed_in is None:
            removed_in = str(changed)
    return None if state is None or removed_in is None else (state, removed_in)


def removed_member(release: str, cls: str, name: str) -> DeadHook | None:
    """The removal of ``cls.name`` (inherited included) at ``release``, or None where it still has it or never
    had it."""
    hook = dead_hooks(release, cls).get(name)
    return hook if hook is not None and hook.reason == "removed" else None
