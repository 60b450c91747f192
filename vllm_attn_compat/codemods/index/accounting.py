"""Every use of what a safe fix changes, accounted for: proven unaffected, or withholding the fix (issue #50).

A safe fix changes a name: a method's (VAC001-VAC003 change what its callers may pass), the flag's (VAC004 deletes
a class's ``accept_output_buffer``), an old op's (VAC006 renames it in an op list). Before it is made, every
occurrence of that name in every file the run reads is looked at: in code, in strings and doctests, through
reflection, in the text of a file that does not parse. The index records them (`calls.Use`, `flags.FlagRead`,
`occurrences`); this module decides, for each, whether it can reach what the fix changes. It is a closed world:
what the index records and this module does not prove unaffected withholds the fix, and the fix's finding names
the first such occurrence (a :class:`Blocker`).

What is proven unaffected here: reflection whose receiver is no instance of the class (``self`` of a class no
class of the run derives from along with it, a module (one `importlib.import_module` returns too), a literal, a
class of the run that does not derive from it or an instance a call makes of one, an object from outside the run),
or that names other members (``for name in ("a", "b"): getattr(x, name)``), an instance's ``__dict__`` (it holds
neither methods nor class attributes), a class-body read in another class, an op's name in an op list that the fix
renames too, in a registration or in prose. The attribute uses of a method are
the call-site analysis's (`callsites`), the flag's reads the flag owners' (`flag_owners`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass

from vllm_attn_compat.codemods.index.classgraph import ClassGraph
from vllm_attn_compat.codemods.index.names import FLAG, RunModules, normalize_path, shown_path
from vllm_attn_compat.codemods.index.occurrences import Occurrences, Reflection

# Calls do not read as `x.m(...)` where the use is no call.
_NOT_CALLS = ("getattr", "reference", "signature")
# Passing `output` that may be None.
PASSES_ON = ("forwards", "relays")
PASSES_NONE = ("none", "maybe-none", *PASSES_ON)
# Occurrences that may reach a class's every member, or a member by its name, in ways the run cannot follow.
OCCURRENCE_KINDS = ("alias", "reflection", "lookup", "doctest", "syntax", "unparsed", "decorator")


@dataclass(frozen=True)
class Blocker:
    """A use of what a fix changes that the run cannot prove unaffected: it withholds the fix."""

    path: str  # normalized path of the file holding it ("" for a layer's ``forward``: no site)
    line: int
    column: int
    end_line: int
    # How it uses the method: "omits", "none", "maybe-none", "forwards", "relays", "starred", "positional",
    # "reference", "signature", "getattr", "layer", "missing"; or an occurrence (`OCCURRENCE_KINDS`)
    how: str
    text: str  # the receiver as written (a call's), or the occurrence's text
    # False where the run cannot tell what the receiver is (`calls.Use.receiver` "other"): the use counts, since
    # it may reach the method, but it may as well be another class's method of the same name.
    resolved: bool = True

    def describe(self, name: str, here: str) -> str:
        """One short clause: what the use is, and where."""
        where = f"line {self.line}" if self.path == here else f"{shown_path(self.path)}:{self.line}"
        call = f"`{self.text}.{name}(...)`" if self.how not in _NOT_CALLS else f"`{self.text}.{name}`"
        texts = {
            "omits": f"{call} at {where} does not pass `output`",
            "none": f"{call} at {where} passes `output=None`",
            "maybe-none": f"{call} at {where} passes an `output` that may be None",
            "starred": f"{call} at {where} passes `*args`/`**kwargs` that may lack `output`",
            "getattr": f'`getattr({self.text}, "{name}")` at {where} hands it on',
            "reference": f"{call} at {where} hands it on as a value",
            "signature": f"{call} at {where} reads its signature",
            "positional": f"{call} at {where} passes `output` by position",
            "alias": f"`{name}` is read in the class body at {where}",
            "reflection": f"`{self.text}` at {where} may reach it (reflection)",
            "lookup": f"`{self.text}` at {where} looks `{name}` up by name",
            "doctest": f"a doctest at {where} uses `{name}`",
            "syntax": f"syntax this tool does not know ({self.text}) at {where} names `{name}`",
            "unparsed": f"`{name}` at {where}, in a file that does not parse",
            "decorator": f"its decorator `@{self.text}` at {where} may hand it on",
            "layer": "a layer's `forward` runs through `layer(...)` calls, which cannot be attributed to it",
        }
        if self.how in PASSES_ON:
            return f"{call} at {where} passes on, as `output`, a parameter of its own that may be None"
        return texts.get(self.how, f"{call} at {where} uses it")


def summary(blockers: Collection[Blocker], name: str, here: str, plainest: dict[str, int]) -> str:
    """The first blocker (the plainest: ``plainest`` ranks its kind) described, and how many more there are."""
    shown = min(blockers, key=lambda blocker: (plainest.get(blocker.how, 3), blocker.path != here, order(blocker)))
    more = f" (and {len(blockers) - 1} more)" if len(blockers) > 1 else ""
    return shown.describe(name, here) + more


def order(blocker: Blocker) -> tuple[str, int, int, str]:
    return (blocker.path, blocker.line, blocker.column, blocker.how)


# --- who reflection may reach -----------------------------------------------------------------------------------


def reaches(
    reflection: Reflection, module: str, target: str, graph: ClassGraph, modules: RunModules, member: str
) -> bool:
    """Whether ``reflection`` in ``module`` may read or write the member ``member`` of the class ``target`` (or of an
    instance of it)."""
    if reflection.names and member not in reflection.names:
        return False
    receiver, kind = reflection.receiver, reflection.kind
    if receiver == "none":
        return False
    if receiver == "namespace":  # `vars()` in a class body: that class's own members
        return f"{module}.{reflection.target}" == target
    if receiver in ("self", "cls"):
        owner = f"{module}.{reflection.target}"
        if graph.is_metaclass(owner):  # its instances are classes: any class of the run
            return True
        if receiver == "self" and kind == "dict":
            return False  # an instance's `__dict__`: no method, no class attribute
        return graph.related(owner, target)
    if receiver in ("class", "instance"):
        dotted = reflection.target or ""
        named = graph.named(dotted)
        if named:
            if kind == "dict":  # a class's own namespace; an instance's holds no member of the class
                return receiver == "class" and target in named
            return any(graph.derives(other, target) for other in named)
        if receiver == "instance":
            return True  # what a function or a class outside the run returned: anything
        # A global of the run's modules may be anything; an object from elsewhere only what code of the run set it
        # to (a module, a class or function defined there holds nothing of the run's otherwise).
        return global_of_the_run(dotted, modules) or dotted in modules.stores
    return True


def global_of_the_run(dotted: str, modules: RunModules) -> bool:
    """Whether ``dotted`` (no class of the run) may be a global variable of one of the run's modules (any object);
    not a module of the run itself, nor anything from outside the run."""
    return dotted not in modules and modules.holds(dotted)


# --- the occurrences of a run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Located:
    path: str
    module: str
    found: Occurrences


def occurrence_blockers(
    located: Iterable[Located],
    name: str,
    owner: str,
    graph: ClassGraph,
    modules: RunModules,
) -> Iterator[Blocker]:
    """The occurrences that may use ``owner``'s member ``name`` (a method, or the flag's declaration) and that no
    record of attribute uses accounts for: class-body reads in ``owner``, reflection that may reach it, names
    looked up from strings, doctests, unknown syntax, text that does not parse."""
    for place in located:
        found = place.found
        for read in found.class_names:
            if read.name == name and f"{place.module}.{read.owner}" == owner:
                yield Blocker(place.path, read.line, read.column, read.line, "alias", name)
        for use in found.named:
            if use.name == name:
                yield Blocker(place.path, use.line, use.column, use.line, use.kind, use.text, resolved=False)
        for reflection in found.reflection:
            if reaches(reflection, place.module, owner, graph, modules, name):
                line = reflection.line
                yield Blocker(place.path, line, reflection.column, line, "reflection", reflection.text, False)


def flag_blockers(located: Iterable[Located], owner: str, graph: ClassGraph, modules: RunModules) -> list[Blocker]:
    """The occurrences besides the flag's reads (`flags.FlagRead`) that may see ``owner``'s declaration of it."""
    return sorted(occurrence_blockers(located, FLAG, owner, graph, modules), key=order)


# --- old op names (VAC006) ---------------------------------------------------------------------------------------

# Where an old op's name stands without any effect on the renaming of op lists (`occurrences.OpString.place`).
_OP_UNAFFECTED = frozenset({"list", "registration", "prose"})


def op_blockers(located: Iterable[Located]) -> dict[str, tuple[Blocker, ...]]:
    """Per old op (``unified_attention``, ...), the strings that withhold renaming it in op lists: anywhere but an
    op list, a registration or prose, it may be compared with what the list holds. A prefix composing op names
    (``"vllm::" + name``) withholds every op's renaming."""
    found: dict[str, list[Blocker]] = {}
    for place in located:
        for string in place.found.op_strings:
            if string.place in _OP_UNAFFECTED:
                continue
            how = "unparsed" if string.place == "unparsed" else "op-string"
            blocker = Blocker(place.path, string.line, string.column, string.line, how, string.text, False)
            for op in (string.op,) if string.op else ("unified_attention", "unified_mla_attention"):
                found.setdefault(op, []).append(blocker)
    return {op: tuple(sorted(blockers, key=order)) for op, blockers in found.items()}


def op_sites(located: Iterable[Located]) -> frozenset[str]:
    """The old ops that an op list of the run names: those whose renaming the run decides."""
    return frozenset(string.op for place in located for string in place.found.op_strings if string.place == "list")


def op_reason(blockers: tuple[Blocker, ...], path: str) -> str | None:
    """Why renaming an old op in op lists is withheld (None: it is not)."""
    if not blockers:
        return None
    here = normalize_path(path)
    first = blockers[0]
    where = f"line {first.line}" if first.path == here else f"{shown_path(first.path)}:{first.line}"
    what = "in a file that does not parse" if first.how == "unparsed" else "may be compared with the list"
    more = f" (and {len(blockers) - 1} more)" if len(blockers) > 1 else ""
    return f"withheld: {first.text} at {where} {what}{more}"
