"""Hypothesis strategies that write a runnable old-API plugin reached in the dynamic ways real code reaches methods,
the flag and op names (issue #50): aliases, dispatch tables and registering decorators, computed names,
reflection, metaclasses and ``__init_subclass__``, class-body reads, None-valued fields and attributes, doctests,
op names in data that is no op list, and a file that does not parse.

The plugin: a backend (vLLM's ``AttentionBackend`` of a stub of vLLM 0.20, whose base no longer declares the flag)
that may declare ``accept_output_buffer = True``, and an impl whose method ``prefill`` takes ``output`` in the old
form (``output=None``), with an allocation fallback, an ``assert output is not None`` or neither. Each drawn shape
adds the code that reaches them that way (in the backend's module, in the callers', or in a module of its own) and a
caller: a module-level function without arguments in ``callers.py`` returning something JSON can hold. Lists stand
in for tensors (``alloc.empty_like`` is an allocation as VAC003 sees one): running them needs no torch.

These shapes are examples for the generator, not the tests: each is drawn with its variations (how it is written,
where, in which file), and any number of them come together, with the plain calls that make a fix clearly safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from vllm_attn_compat.codemods.run.runner import Options, run_paths

from . import legacy_callers
from .legacy_callers import write_tree
from .legacy_flags import STUBS_020

METHOD = "prefill"

# Each shape: the code it adds (by file: "backend-class" is the impl's class body, "backend-module" the backend
# module's top, "backend-init" the impl's `__init__`, "callers" and any other file as they are), and the callers'
# bodies (one expression each, with `impl = GenImpl()` and `backend = GenBackend` bound before).
SHAPES: dict[str, tuple[dict[str, list[str]], list[str]]] = {
    # A plain call passing a fresh buffer: proven unaffected (with no other shape, the fixes are made).
    "buffer": ({}, ["impl.prefill([1, 2], output=alloc.empty_like([1, 2]))"]),
    "alias": ({"backend-class": ["run = prefill"]}, ["impl.run([1, 2])"]),
    "alias-elsewhere": ({"backend-module": ["GenImpl.warm = GenImpl.prefill"]}, ["impl.warm([1, 2])"]),
    "table-in-class": ({"backend-class": ['TABLE = {"p": prefill}']}, ['GenImpl.TABLE["p"](impl, [1, 2])']),
    "table-in-init": ({"backend-init": ['self.table = {"p": self.prefill}']}, ['impl.table["p"]([1, 2])']),
    "table-list": ({"backend-class": ["STEPS = [prefill]"]}, ["GenImpl.STEPS[0](impl, [1, 2])"]),
    "registering-decorator": (
        {
            "backend-module-top": [
                "REGISTRY = {}",
                "",
                "",
                "def register(name):",
                "    def deco(function):",
                "        REGISTRY[name] = function",
                "        return function",
                "",
                "    return deco",
            ],
            "decorator": ['@register("p")'],
        },
        ['backend_module.REGISTRY["p"](impl, [1, 2])'],
    ),
    "computed-name": ({}, ['getattr(impl, "pre" + "fill")([1, 2])']),
    "computed-name-variable": ({}, ['getattr(impl, "".join(["pre", "fill"]))([1, 2])']),
    "literal-name-variable": ({"callers-top": ['NAME = "prefill"']}, ["getattr(impl, NAME)([1, 2])"]),
    "vars": ({}, ['vars(GenImpl)["prefill"](impl, [1, 2])']),
    "dict": ({}, ['type(impl).__dict__["prefill"](impl, [1, 2])']),
    "getmembers": ({}, ['dict(inspect.getmembers(impl))["prefill"]([1, 2])']),
    "dir": ({}, ['[getattr(impl, n)([1, 2]) for n in dir(impl) if n == "prefill"][0]']),
    "attrgetter": ({}, ['operator.attrgetter("prefill")(impl)([1, 2])']),
    "methodcaller": ({}, ['operator.methodcaller("prefill", [1, 2])(impl)']),
    "none-attribute": ({"backend-init": ["self.buf = None"]}, ["impl.prefill([1, 2], output=impl.buf)"]),
    "none-field": ({"backend-class": ["spare = None"]}, ["impl.prefill([1, 2], output=GenImpl.spare)"]),
    "none-from-call": ({"callers-top": ["def pick():", "    return None"]}, ["impl.prefill([1, 2], output=pick())"]),
    "doctest": (
        {
            "docs": [
                '"""Usage, checked by doctest.',
                "",
                ">>> from plugin.backend import GenImpl",
                ">>> GenImpl().prefill([1, 2])",
                "[2, 4]",
                '"""',
            ]
        },
        ["doctest.testmod(importlib.import_module('plugin.docs')).failed"],
    ),
    # The flag: read in the class body, by a metaclass, by `__init_subclass__`, by reflection.
    "class-body-read": ({"backend-body": ["supports = accept_output_buffer"]}, ["backend.supports"]),
    "metaclass": (
        {
            "backend-module-top": [
                "class Meta(type):",
                "    def flagged(cls):",
                '        return getattr(cls, "accept_output_buffer", False)',
            ],
            "backend-metaclass": ["Meta"],
        },
        ["backend.flagged()"],
    ),
    "init-subclass": (
        {
            "backend-body": [
                "def __init_subclass__(cls, **kwargs):",
                "    super().__init_subclass__(**kwargs)",
                '    cls.inherited = getattr(cls, "accept_output_buffer", False)',
            ],
            "callers-top": ["class Sub(GenBackend):", "    pass"],
        },
        ["Sub.inherited"],
    ),
    "flag-vars": ({}, ['"accept_output_buffer" in vars(backend)']),
    "flag-dir": ({}, ['"accept_output_buffer" in dir(backend)']),
    "flag-computed": ({}, ['getattr(backend, "accept_" + "output_buffer", None)']),
    # Old op names in data that is no op list, and composed op names.
    "op-pairs": (
        {"config": ['PAIRS = [("vllm::unified_attention", "vllm::unified_attention_with_output")]']},
        ["sorted(dict(config.PAIRS).items())"],
    ),
    "op-removed": (
        {"config": ['REMOVED = ("vllm::unified_attention", "vllm::unified_mla_attention")']},
        ["[op in config.REMOVED for op in config.SPLITTING_OPS]"],
    ),
    "op-composed": ({"callers-top": ['OLD = "vllm::" + "unified_attention"']}, ["OLD in config.SPLITTING_OPS"]),
    "op-compared": ({}, ['"vllm::unified_attention" in config.SPLITTING_OPS']),
    # A caller in a file that does not parse: once its syntax is mended, it must still work.
    "broken-file": ({"broken": ["def warm(impl):", "    return impl.prefill([1, 2]", ""]}, []),
}


@dataclass(frozen=True)
class DynamicPlugin:
    files: dict[str, str]  # relative path -> text, the run's tree
    callers: tuple[str, ...]  # the callers' names, in callers.py
    shapes: tuple[str, ...]


def _impl_method(kind: str, decorators: list[str]) -> list[str]:
    lines = [f"    {line}" for line in decorators]
    # "assert-required": the new API's signature, still asserting (a caller passing None fails there today).
    lines.append(f"    def {METHOD}(self, query, output{'' if kind == 'assert-required' else '=None'}):")
    if kind == "fallback":
        lines += ["        if output is None:", "            output = alloc.empty_like(query)"]
    elif kind in ("assert", "assert-required"):
        lines.append("        assert output is not None")
    lines += ["        output[:] = [x * 2 for x in query]", "        return output"]
    return lines


_FLAG_SHAPES = ("flag", "class-body", "metaclass", "init")


@st.composite
def dynamic_plugins(draw: st.DrawFn) -> DynamicPlugin:
    shapes = draw(st.lists(st.sampled_from(sorted(SHAPES)), min_size=1, max_size=3, unique=True))
    return build_plugin(
        tuple(shapes),
        method=draw(st.sampled_from(["fallback", "fallback", "assert", "assert-required", "plain"])),
        flag=draw(st.booleans()) or any(shape.startswith(_FLAG_SHAPES) for shape in shapes),
        splitting_ops=draw(st.sampled_from(["old", "old-and-new"])),
    )


def build_plugin(shapes: tuple[str, ...], *, method: str, flag: bool, splitting_ops: str) -> DynamicPlugin:
    """The plugin with ``shapes`` (keys of `SHAPES`); ``method``: how ``prefill`` treats a missing buffer
    ("fallback", "assert", "assert-required", "plain"); ``flag``: whether the backend declares
    ``accept_output_buffer = True``."""
    parts: dict[str, list[str]] = {}
    callers: list[str] = []
    for shape in shapes:
        code, calls = SHAPES[shape]
        for where, lines in code.items():
            parts.setdefault(where, []).extend(lines)
        callers += calls
    metaclass = ", metaclass=Meta" if parts.get("backend-metaclass") else ""
    backend = ["import alloc", "from vllm.v1.attention.backend import AttentionBackend, AttentionImpl", "", ""]
    if parts.get("backend-module-top"):
        backend += [*parts["backend-module-top"], "", ""]
    body = ["    accept_output_buffer = True"] if flag else []
    body += [f"    {line}" for line in parts.get("backend-body", [])]
    body += ["", "    @staticmethod", "    def get_impl_cls():", "        return GenImpl"]
    backend += [f"class GenBackend(AttentionBackend{metaclass}):", *body, "", ""]
    backend += ["class GenImpl(AttentionImpl):", "    def __init__(self):", "        self.ready = True"]
    backend += [f"        {line}" for line in parts.get("backend-init", [])]
    backend += ["", *_impl_method(method, parts.get("decorator", []))]
    backend += [f"    {line}" for line in parts.get("backend-class", [])]
    if parts.get("backend-module"):
        backend += ["", "", *parts["backend-module"]]
    ops = ["vllm::unified_attention"]
    ops += ["vllm::unified_attention_with_output"] if splitting_ops == "old-and-new" else []
    config = ["# Piecewise CUDA graphs split the model at these ops.", f"SPLITTING_OPS = {ops!r}".replace("'", '"')]
    config += parts.get("config", [])
    imports = ["import doctest", "import importlib", "import inspect", "import operator", "", "import alloc"]
    imports += ["from plugin import backend as backend_module", "from plugin import config"]
    imports += ["from plugin.backend import GenBackend, GenImpl", "", ""]
    lines = [*imports, *parts.get("callers-top", []), "", ""]
    names = []
    for number, expression in enumerate(callers):
        names.append(f"call_{number}")
        lines += [f"def call_{number}():", "    impl = GenImpl()", "    backend = GenBackend"]
        lines.append(f"    return {expression}")
        lines += ["", ""]
    files = {
        "plugin/__init__.py": "",
        "plugin/backend.py": "\n".join(backend) + "\n",
        "plugin/config.py": "\n".join(config) + "\n",
        "plugin/callers.py": "\n".join(lines).rstrip("\n") + "\n",
    }
    if parts.get("docs"):
        files["plugin/docs.py"] = "\n".join(parts["docs"]) + "\n"
    if parts.get("broken"):
        files["plugin/broken.py"] = "\n".join(parts["broken"])
    return DynamicPlugin(files, tuple(names), shapes)


# Calls every caller and prints, as JSON, what each returned or raised; a callers module that does not import is
# every caller raising (a class-body read of a deleted flag makes the backend's module raise NameError).
PROBE = """
import contextlib
import json
import sys

sys.path[:0] = [sys.argv[1], sys.argv[2]]
results = {}
try:
    from plugin import callers
except Exception as error:
    callers = None
    failure = ["raised", "import: " + type(error).__name__]
for name in sys.argv[3:]:
    if callers is None:
        results[name] = failure
        continue
    try:
        with contextlib.redirect_stdout(sys.stderr):  # (doctest reports on standard output)
            results[name] = ["returned", getattr(callers, name)()]
    except Exception as error:
        results[name] = ["raised", type(error).__name__]
print(json.dumps(results, default=repr))
"""


def probe(root: Path, callers: tuple[str, ...]) -> dict[str, list]:
    return legacy_callers.probe(root, callers, PROBE)


def migrate_and_probe(root: Path, plugin: DynamicPlugin):
    """Write the plugin and vLLM 0.20's stub under ``root``, probe the callers, migrate (safe fixes), probe again:
    ``(before, after, report)``."""
    write_tree(root / "stubs", STUBS_020)
    write_tree(root / "tree", plugin.files)
    say = note if currently_in_test_context() else (lambda text: None)
    for relative, text in plugin.files.items():
        say(f"--- {relative} ---\n{text}")
    before = probe(root, plugin.callers)
    report = run_paths([str(root / "tree")], Options(jobs=1))
    assert [error for error in report.errors if not error.path.endswith("broken.py")] == []
    for relative in plugin.files:
        say(f"--- {relative} after ---\n{(root / 'tree' / relative).read_text()}")
    return before, probe(root, plugin.callers), report
