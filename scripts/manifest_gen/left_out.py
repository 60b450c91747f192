"""The abstract members of the interface that vLLM's own concrete classes leave out, in one release.

vLLM never instantiates a backend class (it calls its static methods), so Python never asks one for its abstract
members: vLLM 0.34 ships 22 backends that serve no attention layer (Mamba's, the DeepSeek indexers') without
``AttentionBackend.get_impl_cls``, which only an attention layer calls. A plugin's backend of the same shape is as
sound, and VAC013 must not ask it for the member; one lacking what no class of vLLM's goes without still breaks
(an attention backend without ``get_kv_cache_shape``, up to 0.28). So, for each of the release's own classes that
derive from the snapshot's classes and are concrete, the abstract members of those it defines nowhere in its
ancestry are recorded, as ``owner.member`` (the snapshot's ``left_out`` section).

A class counts as concrete here as VAC013 counts a plugin's: no class of the tree derives from it, it declares no
abstract method of its own, and its name does not say it is a base (`named_as_base`, VAC013's own test). Bases are
resolved through the modules' imports, a package's re-exports followed. A class with a base of vLLM's that the tree
cannot show is passed over (the base may implement what seems left out): a class missed here is one record fewer,
so the rule reports more, as it did before the record existed.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from typing import Any

from vllm_attn_compat.codemods.index.names import named_as_base

from .extract import Module

# A class statement's header: its name and the text of its bases, if any (up to the first closing parenthesis).
_HEADER = re.compile(r"^[ \t]*class[ \t]+(\w+)[ \t]*(?:\(([^)]*))?", re.MULTILINE)
# An import alias: ``from m import Name as Alias``, ``import m.Name as Alias``.
_ALIAS = re.compile(r"(?:\.|\b)(\w+)[ \t]+as[ \t]+(\w+)")


def left_out(modules: Iterable[tuple[str, bool, str]], classes: dict[str, Any]) -> dict[str, list[str]]:
    """{qualified name of a concrete class of vLLM's: ["<interface class>.<member>", ...] it does not implement},
    over the release's ``modules`` ((dotted name, is a package, source) each) and its snapshot's ``classes``;
    the classes that implement every abstract member are left out."""
    sources = list(modules)
    tree: dict[str, tuple[list[str], set[str], set[str]]] = {}  # qualified -> (bases, defined, declared abstract)
    read: dict[str, Module] = {}
    needed = _needed(sources, {qualified.rpartition(".")[2] for qualified in classes})
    for name, is_package, text in sources:
        defines = {header[0] for header in _HEADER.findall(text)}
        if not (defines & needed or (is_package and any(word in text for word in needed))):
            continue
        try:
            module = Module(name, text, is_package)
        except SyntaxError:
            continue
        read[name] = module
        for node in module.tree.body:
            if isinstance(node, ast.ClassDef):
                members = module.members(node, "class")
                abstract = {member for member, state in members.items() if state.get("abstract")}
                tree[f"{name}.{node.name}"] = ([module.resolve(base) for base in node.bases], set(members), abstract)
    resolved = {qualified: [_follow(base, tree, read) for base in entry[0]] for qualified, entry in tree.items()}
    derived = {base for bases in resolved.values() for base in bases}
    found: dict[str, list[str]] = {}
    for qualified in sorted(tree):
        if (
            qualified in classes
            or qualified in derived
            or tree[qualified][2]
            or named_as_base(qualified.rpartition(".")[2])
        ):
            continue
        lineage = _ancestry(qualified, resolved)
        if any(base.startswith("vllm.") and base not in tree for cls in lineage for base in resolved[cls]):
            continue  # a base of vLLM's the tree cannot show may implement what seems left out
        concrete = {member for cls in lineage for member in tree[cls][1] - tree[cls][2]}
        lacking: dict[str, str] = {}  # member -> the nearest interface class declaring it abstract (as the rule asks)
        for cls in lineage:
            for member, state in classes[cls]["members"].items() if cls in classes else ():
                if state.get("abstract") and member not in concrete:
                    lacking.setdefault(member, cls)
        if lacking:
            found[qualified] = sorted(f"{cls}.{member}" for member, cls in lacking.items())
    return found


def _needed(sources: list[tuple[str, bool, str]], interface: set[str]) -> set[str]:
    """The names of the classes whose headers show they may derive from the ``interface`` classes (by their short
    names, through any number of classes and import aliases), and of every class named among their bases, through
    theirs: the classes whose modules are parsed. Read from the class headers' and aliases' text alone, which costs
    a fraction of a parse."""
    headers = [(cls, set(re.findall(r"\w+", bases))) for _, _, text in sources for cls, bases in _HEADER.findall(text)]
    aliases = {pair for _, _, text in sources for pair in _ALIAS.findall(text)}
    reaching = set(interface)
    while True:
        more = {cls for cls, bases in headers if bases & reaching} | {
            alias for name, alias in aliases if name in reaching
        }
        if more <= reaching:
            break
        reaching |= more
    needed = set(reaching)
    while True:
        more = {word for cls, bases in headers if cls in needed for word in bases}
        more |= {name for name, alias in aliases if alias in needed}
        if more <= needed:
            return needed
        needed |= more


def _follow(dotted: str, tree: dict[str, Any], modules: dict[str, Module]) -> str:
    """The class ``dotted`` names, through the modules' imports (a package re-exporting a class)."""
    for _ in range(8):
        if dotted in tree:
            return dotted
        module, _, name = dotted.rpartition(".")
        target = modules[module].imports.get(name) if module in modules else None
        if target is None:
            return dotted
        dotted = target
    return dotted


def _ancestry(qualified: str, resolved: dict[str, list[str]]) -> list[str]:
    """The class and its ancestors that the tree holds, nearest first."""
    order: list[str] = []
    queue = [qualified]
    while queue:
        cls = queue.pop(0)
        if cls in order or cls not in resolved:
            continue
        order.append(cls)
        queue += resolved[cls]
    return order
