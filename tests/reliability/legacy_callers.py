"""Hypothesis strategies that write a runnable old-API plugin together with code that calls it.

The plugin's impl derives from a stub vLLM ``AttentionImpl``; its methods take an ``output`` in the old
forms (``output=None``, annotated, keyword-only, required) with or without an allocation fallback or an
``assert output is not None``. Callers, in the plugin's own module, in a subclass, in another file of the
run and in a file that imports neither vLLM nor the plugin (``engine.impl.m(...)`` on an object it is
handed), call those methods in every way Python allows: omitting ``output``, passing it positionally or by
keyword, passing ``None``, through ``super()``, ``Class.m(obj, ...)``, ``functools.partial``, ``getattr``,
``*args`` and ``**kwargs``, on a local name bound to an instance; or read its signature
(``inspect.signature``), which calls nothing. A method of the impl may pass its own ``output`` on to another
(a relay, behind an assert, a fallback or nothing), so that what the other is given is what the relay was.
Each caller is a module-level function without arguments, so a probe can call them all and compare what they
return before and after migration. Lists stand in for tensors (``alloc.empty_like`` is an allocation as
VAC003 sees one), so running them needs no torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hypothesis import note
from hypothesis import strategies as st

from vllm_attn_compat.codemods.run.runner import Options, run_paths

STUBS = {
    "vllm/__init__.py": "",
    "vllm/v1/__init__.py": "",
    "vllm/v1/attention/__init__.py": "",
    "vllm/v1/attention/backend.py": "class AttentionImpl:\n    pass\n",
    "alloc.py": "def empty_like(values):\n    return [0] * len(values)\n",
}

METHOD_NAMES = ["forward_decode", "prefill", "decode", "run_chunk"]


@dataclass(frozen=True)
class Method:
    name: str
    before: tuple[str, ...]  # parameters between self and output: (name, default or None)
    defaults: tuple[bool, ...]
    output: str  # "positional", "keyword-only"
    output_default: bool
    fallback: bool
    asserts: bool = False  # opens with `assert output is not None` (VAC001): `output=None`, no fallback
    # A relay: its body passes its own `output` on to this method of the class (by position or by keyword), after
    # its assert or fallback if it has one, and returns what that returns.
    relays_to: Method | None = None
    relay_keyword: bool = False


@dataclass(frozen=True)
class GeneratedPlugin:
    files: dict[str, str]  # relative path -> text, the run's tree
    callers: tuple[str, ...]  # names of the caller functions, in callers.py


def _method_text(method: Method, factor: int) -> list[str]:
    params = ["self"]
    for name, has_default in zip(method.before, method.defaults, strict=True):
        params.append(f"{name}=1" if has_default else name)
    default = "=None" if method.output_default else ""
    params += (["*"] if method.output == "keyword-only" else []) + [f"output{default}"]
    lines = [f"    def {method.name}({', '.join(params)}):"]
    if method.asserts:
        lines.append("        assert output is not None")
    if method.fallback:
        lines += ["        if output is None:", "            output = alloc.empty_like(query)"]
    if method.relays_to is not None:
        target = method.relays_to
        passed = ["query", *("2" for name in target.before[1:])]
        by_keyword = method.relay_keyword or target.output == "keyword-only"
        passed.append("output=output" if by_keyword else "output")
        return [*lines, f"        return self.{target.name}({', '.join(passed)})"]
    extra = " + ".join(name for name in method.before if name != "query") or "0"
    lines += [f"        output[:] = [x * {factor} + {extra} for x in query]", "        return output"]
    return lines


@st.composite
def methods(draw) -> list[Method]:
    names = draw(st.lists(st.sampled_from(METHOD_NAMES), min_size=1, max_size=3, unique=True))
    found = []
    for name in names:
        before = ("query", *draw(st.lists(st.sampled_from(["scale", "shift"]), max_size=1)))
        defaults = tuple(draw(st.booleans()) if p != "query" else False for p in before)
        output = draw(st.sampled_from(["positional", "positional", "keyword-only"]))
        output_default = draw(st.sampled_from([True, True, True, False]))
        if output == "positional" and not output_default:
            defaults = tuple(False for _ in before)  # a required parameter cannot follow a defaulted one
        fallback = draw(st.booleans())
        # The run looks for the uses that may pass None where `output` defaults to None (`callsites._codes`).
        asserts = not fallback and output_default and draw(st.booleans())
        found.append(Method(name, before, defaults, output, output_default, fallback, asserts))
    if draw(st.booleans()):  # a method passing its own `output` on to another: may it be None there?
        guard = draw(st.sampled_from(["none", "none", "assert", "fallback"]))
        target = draw(st.sampled_from(found))
        keyword = draw(st.booleans())
        found.append(
            Method(
                "relay",
                ("query",),
                (False,),
                "positional",
                True,
                guard == "fallback",
                guard == "assert",
                target,
                keyword,
            )
        )
    return found


def _arguments(method: Method, draw, *, explicit_self: str | None = None, first: str = "[1, 2, 3]") -> str:
    """An argument list for ``method``: drawn to pass ``output`` or not, in every spelling."""
    args = [explicit_self] if explicit_self else []
    args.append(first)
    for has_default in method.defaults[1:]:
        if not has_default or draw(st.booleans()):
            args.append("2")
    how = draw(st.sampled_from(["omit", "omit", "keyword", "positional", "none", "star", "double-star"]))
    if how == "keyword":
        args.append("output=[0, 0, 0]")
    elif (
        how == "positional" and method.output == "positional" and len(args) == len(method.before) + bool(explicit_self)
    ):
        args.append("[0, 0, 0]")
    elif how == "none":
        args.append("output=None")
    elif how == "star":
        return "*[" + ", ".join(args) + "]"
    elif how == "double-star":
        args.append('**{"output": [0, 0, 0]}')
    return ", ".join(args)


@st.composite
def plugins_with_callers(draw) -> GeneratedPlugin:
    found = draw(methods())
    backend = ["import functools", "", "import alloc", "from vllm.v1.attention.backend import AttentionImpl", "", ""]
    backend.append("class GenImpl(AttentionImpl):")
    for factor, method in enumerate(found, start=2):
        backend += [*_method_text(method, factor), ""]
    in_class = []
    for index in range(draw(st.integers(0, 2))):  # the impl's own warm-up paths
        method = draw(st.sampled_from(found))
        in_class.append(f"warm_{index}")
        backend += [
            f"    def warm_{index}(self):",
            f"        return self.{method.name}({_arguments(method, draw)})",
            "",
        ]
    subclass = draw(st.booleans())
    if subclass:
        method = draw(st.sampled_from(found))
        override = Method(method.name, method.before[:1], (False,), "positional", True, False)
        backend += ["", "class GenSub(GenImpl):", f"    def {method.name}(self, query, output=None):"]
        backend.append(f"        return super().{method.name}({_arguments(method, draw, first='query')})")
        found_for_sub = [override]
    else:
        found_for_sub = []

    callers = ["import functools", "import inspect", "import types", "", "from plugin import engine"]
    callers += ["from plugin.backend import GenImpl" + (", GenSub" if subclass else ""), ""]
    engine = ["# Imports nothing: its callers hand it the impl.", ""]
    names = []
    for index in range(draw(st.integers(1, 6))):
        method = draw(st.sampled_from(found + found_for_sub))
        owner = "GenSub" if method in found_for_sub or (subclass and draw(st.booleans())) else "GenImpl"
        forms = ["bound", "bound", "class", "partial", "getattr", "warm", "elsewhere", "signature", "local"]
        form = draw(st.sampled_from(forms))
        if form == "elsewhere":
            call = f"engine.impl.{method.name}({_arguments(method, draw)})"
            engine += ["", f"def warm_{index}(engine):", f"    return {call}"]
            expression = f"engine.warm_{index}(types.SimpleNamespace(impl={owner}()))"
        elif form == "warm" and in_class:
            expression = f"{owner}().{draw(st.sampled_from(in_class))}()"
        elif form == "class":
            expression = f"{owner}.{method.name}({_arguments(method, draw, explicit_self=f'{owner}()')})"
        elif form == "partial":
            expression = f"functools.partial({owner}().{method.name})({_arguments(method, draw)})"
        elif form == "signature":
            expression = f"str(inspect.signature({owner}.{method.name}))"
        elif form == "getattr":
            expression = f'getattr({owner}(), "{method.name}")({_arguments(method, draw)})'
        elif form == "local":  # on a name bound once to the instance
            expression = f"impl.{method.name}({_arguments(method, draw)})"
        else:
            expression = f"{owner}().{method.name}({_arguments(method, draw)})"
        names.append(f"call_{index}")
        bound = [f"    impl = {owner}()"] if form == "local" else []
        callers += ["", f"def call_{index}():", *bound, f"    return {expression}"]
    files = {
        "plugin/__init__.py": "",
        "plugin/backend.py": "\n".join(backend) + "\n",
        "plugin/callers.py": "\n".join(callers) + "\n",
        "plugin/engine.py": "\n".join(engine) + "\n",
    }
    return GeneratedPlugin(files, tuple(names))


# Calls every caller of plugin/callers.py and prints, as JSON, what each returned or raised.
PROBE = """
import json
import sys

sys.path[:0] = [sys.argv[1], sys.argv[2]]
from plugin import callers

results = {}
for name in sys.argv[3:]:
    try:
        results[name] = ["returned", getattr(callers, name)()]
    except Exception as error:
        results[name] = ["raised", type(error).__name__]
print(json.dumps(results))
"""


def _elsewhere_example() -> GeneratedPlugin:
    """The smallest plugin whose only caller is in a file importing nothing (``engine.impl.prefill(q)``):
    the property's explicit example, so that CI's few derandomized examples always hold one."""
    method = Method("prefill", ("query",), (False,), "positional", True, True)
    backend = ["import alloc", "from vllm.v1.attention.backend import AttentionImpl", "", ""]
    backend += ["class GenImpl(AttentionImpl):", *_method_text(method, 2)]
    callers = ["import types", "", "from plugin import engine", "from plugin.backend import GenImpl", "", ""]
    callers += ["def call_0():", "    return engine.warm_0(types.SimpleNamespace(impl=GenImpl()))"]
    engine = ["def warm_0(engine):", "    return engine.impl.prefill([1, 2, 3])"]
    files = {
        "plugin/__init__.py": "",
        "plugin/backend.py": "\n".join(backend) + "\n",
        "plugin/callers.py": "\n".join(callers) + "\n",
        "plugin/engine.py": "\n".join(engine) + "\n",
    }
    return GeneratedPlugin(files, ("call_0",))


ELSEWHERE_EXAMPLE = _elsewhere_example()


def _relay_example() -> GeneratedPlugin:
    """A ``forward``-like relay passing its own ``output=None`` on to a method that falls back when it is None, and a
    caller of the relay that passes no buffer: the fallback must stay (found by a sweep of public plugins)."""
    decode = Method("decode", ("query",), (False,), "positional", True, True)
    relay = Method("relay", ("query",), (False,), "positional", True, False, False, decode)
    backend = ["import alloc", "from vllm.v1.attention.backend import AttentionImpl", "", ""]
    backend += ["class GenImpl(AttentionImpl):", *_method_text(decode, 2), "", *_method_text(relay, 3)]
    callers = ["from plugin.backend import GenImpl", "", ""]
    callers += ["def call_0():", "    return GenImpl().relay([1, 2, 3])"]
    files = {
        "plugin/__init__.py": "",
        "plugin/backend.py": "\n".join(backend) + "\n",
        "plugin/callers.py": "\n".join(callers) + "\n",
    }
    return GeneratedPlugin(files, ("call_0",))


RELAY_EXAMPLE = _relay_example()


def write_tree(root: Path, files: dict[str, str]) -> None:
    """Write ``files`` (relative path -> text) under ``root``."""
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def probe(root: Path, callers: tuple[str, ...], script: str = PROBE) -> dict[str, list]:
    """Run ``script`` (:data:`PROBE`) on ``root/tree`` with ``root/stubs`` after it on ``sys.path``, in a fresh
    interpreter (without this checkout's PYTHONPATH: the code under test imports nothing of this package)."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    completed = subprocess.run(
        [sys.executable, "-c", script, str(root / "tree"), str(root / "stubs"), *callers],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def probe_around_migrate(root: Path, files: dict[str, str], stubs: dict[str, str], callers: tuple[str, ...]):
    """Write ``files`` and ``stubs`` under ``root``, :func:`probe` ``callers``, run ``migrate`` (safe fixes) over
    the tree, and probe again: ``(before, after)``. Both sides' sources go to hypothesis's notes."""
    write_tree(root / "stubs", stubs)
    write_tree(root / "tree", files)
    for relative, text in files.items():
        note(f"--- {relative} ---\n{text}")
    before = probe(root, callers)
    report = run_paths([str(root / "tree")], Options(jobs=1))
    assert report.errors == []
    for relative in files:
        note(f"--- {relative} after ---\n{(root / 'tree' / relative).read_text()}")
    return before, probe(root, callers)
