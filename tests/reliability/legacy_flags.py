"""Hypothesis strategies that write class hierarchies declaring ``accept_output_buffer``, with code reading it.

Each class derives from vLLM's ``AttentionBackend``, from a base class of the project's own (an ``ABC`` that
imports nothing of vLLM, as vllm-omni's diffusion backends have), or from an earlier class, 1 to 4 levels
deep, spread over up to three modules (a class's module never precedes its base's: no import cycle). A
class may declare the flag, plain or annotated, True or False, and may have the shape of a backend vLLM uses
without its base (``get_name``, ``get_impl_cls``, in a module that imports vLLM), or a method reading
``self.accept_output_buffer``. Readers, in ``plugin/callers.py`` and in another module whose functions it
imports, read the flag of some classes: on the class, through a module, through ``getattr`` (with and
without a default) and ``hasattr``, through an instance, through the method reading ``self``, and through a
variable. Each reader is a function without arguments, so `legacy_callers.PROBE` runs them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from .legacy_callers import STUBS

# vLLM >= 0.20's base class: it no longer declares the flag (what the safe fix targets).
STUBS_020 = {
    **STUBS,
    "vllm/v1/attention/backend.py": "class AttentionBackend:\n    pass\n\n\nclass AttentionImpl:\n    pass\n",
}

_FLAGS = (None, " = True", ": bool = True", " = False", ": bool = False")
# How a reader reads the flag of class C; "{c}" is the class's name, "{m}" its module's short name.
_READS = {
    "class": "{c}.accept_output_buffer",
    "module": "{m}.{c}.accept_output_buffer",
    "getattr": 'getattr({c}, "accept_output_buffer")',
    "getattr default": 'getattr({c}, "accept_output_buffer", "absent")',
    "hasattr": 'hasattr({c}, "accept_output_buffer")',
    "instance": "{c}().accept_output_buffer",
    "method": "{c}().describe()",
    "variable": None,  # written apart: `cls = C` first
}


@dataclass(frozen=True)
class FlagClass:
    name: str
    parent: int | None  # an earlier class's number; None: `root`
    root: str  # "vllm" (vLLM's AttentionBackend) or "own" (the project's own ABC); the parent's when it has one
    module: int
    flag: str | None  # one of _FLAGS
    shaped: bool  # get_name and get_impl_cls in the body
    describes: bool  # a method returning self.accept_output_buffer


@dataclass(frozen=True)
class Reader:
    kind: str  # a key of _READS
    target: int  # the class read


@dataclass(frozen=True)
class FlagPlugin:
    files: dict[str, str]
    callers: tuple[str, ...]
    classes: tuple[FlagClass, ...]
    readers: tuple[Reader, ...]
    vllm_modules: frozenset[int]  # the modules that import vLLM
    own_flag: str | None  # the project's own ABC's declaration of the flag (one of _FLAGS)

    def ancestors(self, number: int) -> list[int]:
        found = []
        parent = self.classes[number].parent
        while parent is not None:
            found.append(parent)
            parent = self.classes[parent].parent
        return found

    def method_holder(self, number: int) -> bool:
        return any(self.classes[n].describes for n in (number, *self.ancestors(number)))

    def deletable(self, number: int) -> bool:
        """Whether the model says the safe fix deletes this class's flag: it is True, the class is a vLLM
        backend (derives from vLLM's base, or has its shape in a module importing vLLM while its own base
        does not declare the flag), no base declares the flag but True, and no reader can see the deletion
        (a read of the class or of a subclass, or through a variable, which could be any class; a method reading
        ``self.accept_output_buffer``, called or not)."""
        cls = self.classes[number]
        if cls.flag not in (" = True", ": bool = True"):
            return False
        ancestors = self.ancestors(number)
        if cls.root == "own":
            if self.own_flag is not None or any(self.classes[a].flag for a in ancestors):
                return False
            if not (cls.shaped and cls.module in self.vllm_modules):
                return False
        elif any(self.classes[a].flag not in (None, " = True", ": bool = True") for a in ancestors):
            return False
        for reader in self.readers:
            if reader.kind == "variable" or number in (reader.target, *self.ancestors(reader.target)):
                return False
        # A method reading `self.accept_output_buffer` is a read of every class it can be called on: its own
        # class's subclasses (single inheritance here: those of its line).
        for other, holder in enumerate(self.classes):
            if holder.describes and (number == other or number in self.ancestors(other) or other in ancestors):
                return False
        return True


def _class_lines(cls: FlagClass, base: str) -> list[str]:
    body = []
    if cls.flag is not None:
        body.append(f"    accept_output_buffer{cls.flag}")
    if cls.shaped:
        body += [
            "",
            "    @staticmethod",
            "    def get_name():",
            f'        return "{cls.name.upper()}"',
            "",
            "    @staticmethod",
            "    def get_impl_cls():",
            "        return None",
        ]
    if cls.describes:
        body += ["", "    def describe(self):", "        return self.accept_output_buffer"]
    return ["", "", f"class {cls.name}({base}):", *(body or ["    pass"])]


@st.composite
def flag_plugins(draw: st.DrawFn) -> FlagPlugin:
    count = draw(st.integers(1, 6))
    classes: list[FlagClass] = []
    depth: list[int] = []
    for number in range(count):
        parents = [n for n in range(number) if depth[n] < 4]
        parent = draw(st.one_of(st.none(), st.sampled_from(parents))) if parents else None
        root = classes[parent].root if parent is not None else draw(st.sampled_from(["vllm", "vllm", "own"]))
        lowest = classes[parent].module if parent is not None else 0
        classes.append(
            FlagClass(
                name=f"Backend{number}",
                parent=parent,
                root=root,
                module=draw(st.integers(lowest, 2)),
                flag=draw(st.sampled_from(_FLAGS)),
                shaped=draw(st.booleans()),
                describes=draw(st.integers(0, 4)) == 0,  # rare: it reads the flag of a whole line of classes
            )
        )
        depth.append(depth[parent] + 1 if parent is not None else 1)
    own_flag = draw(st.sampled_from(_FLAGS))
    modules = sorted({cls.module for cls in classes})
    vllm_modules = frozenset(
        m for m in modules if any(c.module == m and c.root == "vllm" and c.parent is None for c in classes)
    ) | frozenset(draw(st.sets(st.sampled_from(modules))))
    readers = []
    # A read through a variable may read any class: one withholds every fix of the run, so it is drawn rarely.
    kinds = st.sampled_from([*sorted(set(_READS) - {"variable"})] * 3 + ["variable"])
    for kind in draw(st.lists(kinds, max_size=3)):
        target = draw(st.integers(0, count - 1))
        if kind == "method" and not any(
            classes[n].describes
            for n in (target, *FlagPlugin({}, (), tuple(classes), (), frozenset(), None).ancestors(target))
        ):
            kind = "class"
        readers.append(Reader(kind, target))
    plugin = FlagPlugin({}, (), tuple(classes), tuple(readers), vllm_modules, own_flag)
    return FlagPlugin(
        _files(plugin, draw(st.lists(st.booleans(), min_size=len(readers), max_size=len(readers)))),
        tuple(f"read_{n}" for n in range(len(readers))),
        plugin.classes,
        plugin.readers,
        vllm_modules,
        own_flag,
    )


def _files(plugin: FlagPlugin, elsewhere: list[bool]) -> dict[str, str]:
    """The tree: the own base, the modules of classes, the readers (those ``elsewhere`` in another module)."""
    own = ["from abc import ABC", "", "", "class OwnBackend(ABC):"]
    own.append(f"    accept_output_buffer{plugin.own_flag}" if plugin.own_flag else "    pass")
    files = {"plugin/__init__.py": "", "plugin/own.py": "\n".join(own) + "\n"}
    for module in sorted({cls.module for cls in plugin.classes}):
        lines = []
        if module in plugin.vllm_modules:
            lines.append("from vllm.v1.attention.backend import AttentionBackend")
        lines.append("from plugin.own import OwnBackend")
        for cls in plugin.classes:
            if cls.module != module:
                continue
            if cls.parent is not None:
                parent = plugin.classes[cls.parent]
                if parent.module != module:
                    lines.append(f"from plugin.m{parent.module} import {parent.name}")
                base = parent.name
            else:
                base = "AttentionBackend" if cls.root == "vllm" else "OwnBackend"
            lines += _class_lines(cls, base)
        files[f"plugin/m{module}.py"] = "\n".join(lines) + "\n"
    here, there = ["import plugin"], ["import plugin"]
    for number, (reader, away) in enumerate(zip(plugin.readers, elsewhere, strict=True)):
        cls = plugin.classes[reader.target]
        lines = there if away else here
        lines.insert(0, f"import plugin.m{cls.module} as m{cls.module}")
        lines.insert(0, f"from plugin.m{cls.module} import {cls.name}")
        lines += ["", "", f"def read_{number}():"]
        if reader.kind == "variable":
            lines += [f"    cls = {cls.name}", "    return cls.accept_output_buffer"]
        else:
            lines.append("    return " + _READS[reader.kind].format(c=cls.name, m=f"m{cls.module}"))
        if away:
            here.insert(0, f"from plugin.readers import read_{number}")
    files["plugin/readers.py"] = "\n".join(there) + "\n"
    files["plugin/callers.py"] = "\n".join(here) + "\n"
    return files
