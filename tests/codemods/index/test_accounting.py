"""The accounting: every occurrence of what a safe fix changes is proven unaffected, or withholds the fix, named
(issue #50). Each shape the issue names, then what is proven unaffected (so that safe mode keeps its clearly safe
fixes), then reflection's receivers one by one."""

from __future__ import annotations

import textwrap

import pytest

from vllm_attn_compat.codemods.index import accounting
from vllm_attn_compat.codemods.index.classgraph import ClassGraph
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module, unparsed_index
from vllm_attn_compat.codemods.index.names import RunModules
from vllm_attn_compat.codemods.index.occurrences import Reflection

IMPL = """
import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl


class MyBackend(AttentionBackend):
    accept_output_buffer = True


class MyImpl(AttentionImpl):
    def prefill(self, query, output=None):
        if output is None:
            output = torch.empty_like(query)
        return output
"""


def _hierarchy(*files: tuple[str, str]) -> ClassHierarchy:
    indexes = []
    for path, text in files:
        source = textwrap.dedent(text).encode()
        try:
            indexes.append(index_module(source, path))
        except SyntaxError:
            indexes.append(unparsed_index(source, path))
    return ClassHierarchy.build(indexes)


def _prefill(*others: tuple[str, str]) -> str | None:
    return _hierarchy(("plugin_mod.py", IMPL), *others).calls.reason("plugin_mod.MyImpl", "prefill", "VAC002", "x.py")


def _flag(*others: tuple[str, str]) -> str | None:
    return _hierarchy(("plugin_mod.py", IMPL), *others).flag_readers("plugin_mod.MyBackend")


@pytest.mark.parametrize(
    ("addition", "named"),
    [
        # The issue's shapes, each in one of its forms.
        ("\n    run = prefill\n", "`prefill` is read in the class body at plugin_mod.py:16"),
        ('\n    TABLE = {"p": prefill}\n', "`prefill` is read in the class body"),
        ("\n\nMyImpl.warm = MyImpl.prefill\n", "`MyImpl.prefill` at plugin_mod.py:17 hands it on as a value"),
        ("\n\ndef use(impl, name):\n    return getattr(impl, name)\n", "`getattr(impl, name)` at plugin_mod.py:18 may"),
        ("\n\ndef use(impl):\n    return vars(type(impl))\n", "`vars(type(impl))` at plugin_mod.py:18 may reach"),
        ("\n\ndef use(impl):\n    return impl.prefill([1], output=impl.buffer)\n", "passes an `output` that may"),
    ],
)
def test_an_occurrence_that_may_use_the_method_withholds_its_fix_naming_it(addition, named):
    text = IMPL + addition
    reason = _hierarchy(("plugin_mod.py", text)).calls.reason("plugin_mod.MyImpl", "prefill", "VAC003", "x.py")
    assert reason is not None and named in reason, reason


def test_a_registering_decorator_withholds_the_fix_of_what_it_decorates():
    text = IMPL.replace("    def prefill(", "    @registry.register\n    def prefill(")
    reason = _hierarchy(("plugin_mod.py", text)).calls.reason("plugin_mod.MyImpl", "prefill", "VAC002", "x.py")
    assert reason == "withheld: its decorator `@registry.register` at plugin_mod.py:12 may hand it on"
    passing = IMPL.replace("    def prefill(", "    @torch.no_grad()\n    def prefill(")
    assert _hierarchy(("plugin_mod.py", passing)).calls.reason("plugin_mod.MyImpl", "prefill", "VAC002", "x") is None


@pytest.mark.parametrize(
    ("caller", "named"),
    [
        ("def f(impl):\n    return impl.prefill([1])  # a comment naming prefill\n", True),
        ('"""Usage.\n\n>>> MyImpl().prefill([1])\n"""\n', True),  # a doctest is code
        ("import operator\n\nGET = operator.attrgetter('prefill')\n", True),  # a name looked up from a string
        ("from unittest import mock\n\nPATCH = mock.patch.object(object, 'prefill')\n", True),
        ("def f(impl:\n    return impl.prefill([1])\n", True),  # a file that does not parse: its text counts
        ("LOG = 'prefill is done'\n", False),  # a string: only reflection makes a member of it
        ("def prefill(query):\n    return query\n", False),  # another function of the name
        ("def f(prefill=None, **kwargs):\n    return dict(prefill=prefill)\n", False),  # parameters, keywords
        ("import torch\n\ndef f(impl):\n    return impl.prefill([1], output=torch.empty(1))\n", False),  # a buffer
        ("def f(impl, out):\n    return impl.prefill([1], output=out[:1])\n", False),  # a required parameter's slice
        ("class Other:\n    def prefill(self):\n        return self.prefill\n", False),  # an unrelated class's self
        ("import math\n\ndef f(name):\n    return getattr(math, name)\n", False),  # a module
        ("def f(name):\n    return getattr('text', name)\n", False),  # a literal
        ("def f(impl):\n    return vars(impl)\n", True),  # an instance of what? any class: may be a class
        ("class Other:\n    def f(self):\n        return vars(self)\n", False),  # an instance's own namespace
        ("def f(impl):\n    for name in ('ready', 'scale'):\n        getattr(impl, name)\n", False),  # other names
        ("import importlib\n\ndef f(m, name):\n    return getattr(importlib.import_module(m), name)\n", False),
        ("class Other:\n    pass\n\ndef f():\n    return vars(Other())\n", False),  # a new instance's namespace
        ("from plugin_mod import MyImpl\n\ndef f(name):\n    return getattr(MyImpl(), name)\n", True),
        ("def f(make, name):\n    return getattr(make(), name)\n", True),  # what an unknown callee returns
        ("import os\n\ndef f(dir):\n    return os.path.join(dir, 'x')\n", False),  # a variable named `dir`
        ("def f(paths):\n    return sorted(paths, key=dir)\n", True),  # the builtin handed on
    ],
)
def test_each_occurrence_in_another_file_is_proven_unaffected_or_withholds(caller, named):
    reason = _prefill(("caller.py", caller))
    assert (reason is not None and "caller.py:" in reason) is named, reason


@pytest.mark.parametrize(
    ("addition", "named"),
    [
        ("\n    supports = accept_output_buffer\n", "`accept_output_buffer` is read in the class body"),
        (
            "\n\nclass Meta(type):\n    def flagged(cls):\n"
            "        return getattr(cls, 'accept_output_buffer', False)\n",
            "`getattr(cls, 'accept_output_buffer', False)` at plugin_mod.py:",
        ),
        (
            "\n\ndef use(backend):\n    return 'accept_output_buffer' in dir(backend)\n",
            "`dir(backend)` at plugin_mod.py:",
        ),
    ],
)
def test_a_read_of_the_flag_the_issue_named_withholds_its_deletion(addition, named):
    text = IMPL.replace("    accept_output_buffer = True\n", "    accept_output_buffer = True" + addition, 1)
    readers = _hierarchy(("plugin_mod.py", text)).flag_readers("plugin_mod.MyBackend")
    assert readers is not None and named in readers, readers


def test_a_flag_nothing_reads_is_deleted_and_strings_naming_it_read_nothing():
    assert (
        _flag(("doc.py", "NOTE = 'accept_output_buffer is gone in vLLM 0.20'\nKEY = 'accept_output_buffer'\n")) is None
    )
    assert _flag(("doc.py", "def f(x:\n    return x.accept_output_buffer\n")) is not None  # unparsed text counts


def test_an_op_list_is_renamed_only_while_no_other_string_names_the_op():
    ops = ("ops.py", 'splitting_ops = ["vllm::unified_attention"]\n')
    assert _hierarchy(ops).op_renaming_withheld("unified_attention", "ops.py") is None
    prose = ("doc.py", 'LOG = "splitting at vllm::unified_attention"\nop_name = "unified_attention"\n')
    assert _hierarchy(ops, prose).op_renaming_withheld("unified_attention", "ops.py") is None
    for other in ('REMOVED = ("vllm::unified_attention",)\n', 'OP = "vllm::" + name\n', "X = f'vllm.{op}'\n"):
        reason = _hierarchy(ops, ("other.py", other)).op_renaming_withheld("unified_attention", "ops.py")
        assert reason is not None and "other.py:1" in reason, (other, reason)


def _reflection(receiver: str, target: str | None, kind: str = "other") -> Reflection:
    return Reflection(1, 1, kind, receiver, target, (), "r")


def test_reflection_reaches_what_its_receiver_may_be():
    graph = ClassGraph()
    graph.add("p.T", ("vllm.v1.attention.backend.AttentionImpl",))
    graph.add("p.Sub", ("p.T",))
    graph.add("p.Other", ())
    graph.add("p.Meta", ("type",))
    modules = RunModules({"p", "q"})

    def reaches(reflection: Reflection) -> bool:
        return accounting.reaches(reflection, "p", "p.T", graph, modules, "prefill")

    assert reaches(_reflection("self", "Sub")) and reaches(_reflection("cls", "T"))
    assert not reaches(_reflection("self", "Other")) and not reaches(_reflection("self", "T", "dict"))
    assert reaches(_reflection("self", "Meta"))  # a metaclass's `self` is any class
    assert reaches(_reflection("class", "p.Sub")) and not reaches(_reflection("class", "p.Other"))
    assert not reaches(_reflection("class", "p.Sub", "dict"))  # a subclass's own namespace holds no inherited member
    assert reaches(_reflection("class", "p.T", "dict"))
    assert reaches(_reflection("class", "q.REGISTRY"))  # a global of a module of the run: any object
    assert not reaches(_reflection("class", "q")) and not reaches(_reflection("class", "torch.nn"))
    assert reaches(_reflection("instance", "p.T")) and not reaches(_reflection("instance", "p.T", "dict"))
    assert reaches(_reflection("instance", "q.make"))  # what a function returned: anything
    assert reaches(_reflection("namespace", "T")) and not reaches(_reflection("namespace", "Other"))
    assert not reaches(_reflection("none", None)) and reaches(_reflection("any", None))
    named = Reflection(1, 1, "other", "any", None, ("scale",), "r")
    assert not reaches(named)  # names known to be others


def test_reflection_on_an_object_from_outside_the_run_reaches_what_the_run_stored_there():
    """An object a module outside the run holds is none of the run's, unless code of the run set it (an impl put into
    vLLM's registry): then reflection on it may reach the class."""
    use = "import ext\n\ndef f(name):\n    return getattr(ext.registry, name)\n"
    assert _prefill(("use.py", use)) is None
    stored = ("store.py", "import ext\nfrom plugin_mod import MyImpl\n\next.registry = MyImpl()\n")
    reason = _prefill(("use.py", use), stored)
    assert reason is not None and "use.py:4" in reason
    by_setattr = ("store.py", "import ext\nfrom plugin_mod import MyImpl\n\nsetattr(ext, 'registry', MyImpl())\n")
    assert _prefill(("use.py", use), by_setattr) is not None
