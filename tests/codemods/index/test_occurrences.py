"""What a module's index records for the accounting (`occurrences`): each kind of occurrence, from the parse, and
from the text of a file that does not parse."""

from __future__ import annotations

import ast
import textwrap

from vllm_attn_compat.codemods.index import occurrences
from vllm_attn_compat.codemods.index.hierarchy import index_module


def _found(text: str) -> occurrences.Occurrences:
    return index_module(textwrap.dedent(text).encode(), "/plugin/mod.py").occurrences


def test_names_read_in_a_class_body_where_the_body_binds_them():
    found = _found(
        """
        class Impl:
            def forward(self, q, output=None):
                return output

            run = forward
            TABLE = {"f": forward, "g": print}

            @staticmethod
            def helper(x=forward):
                return forward  # a function's body: not the class's scope
        """
    )
    assert [(use.owner, use.name, use.line) for use in found.class_names] == [
        ("Impl", "forward", 6),
        ("Impl", "forward", 7),
        ("Impl", "forward", 10),  # a default, evaluated in the class's scope
    ]


def test_reflection_with_its_receiver_and_its_names():
    found = _found(
        """
        import math
        from plugin.impl import Impl


        class K:
            def f(self, name):
                getattr(self, name)
                vars(self)
                type(self).__dict__

            @classmethod
            def g(cls, name):
                return hasattr(cls, name)


        def h(impl, name):
            made = Impl()
            for attribute in ("scale", "shift"):
                getattr(made, attribute)
            return getattr(math, name), dir(), getattr(impl, name), setattr(impl, name, 1), vars(Impl)
        """
    )
    shown = [(r.line, r.kind, r.receiver, r.target, r.names) for r in found.reflection]
    assert shown == [
        (8, "other", "self", "K", ()),
        (9, "dict", "self", "K", ()),
        (10, "dict", "cls", "K", ()),
        (14, "other", "cls", "K", ()),
        (20, "other", "instance", "plugin.impl.Impl", ("scale", "shift")),
        (21, "other", "class", "math", ()),
        (21, "other", "none", None, ()),
        (21, "other", "any", None, ()),
        (21, "other", "any", None, ()),
        (21, "dict", "class", "plugin.impl.Impl", ()),
    ]


def test_reflection_on_a_module_that_importlib_returns_reaches_no_class():
    found = _found(
        """
        import importlib
        from importlib import import_module, reload


        def resolve(module_name, class_name):
            module = importlib.import_module(module_name)
            again = reload(module)
            return getattr(module, class_name), getattr(import_module(module_name), class_name), dir(again)


        def unknown(make, name):
            made = make(name)
            return getattr(made, name), getattr(importlib.util.find_spec(name), name)
        """
    )
    shown = [(r.line, r.receiver, r.target) for r in found.reflection]
    assert shown == [
        (9, "none", None),
        (9, "none", None),
        (9, "none", None),
        (14, "any", None),
        (14, "instance", "importlib.util.find_spec"),  # what a function returns: anything
    ]


def test_a_reflection_builtins_name_a_function_binds_is_its_variable():
    found = _found(
        """
        import os


        def find(dir, getattr=None):
            return os.path.join(dir, "x"), getattr(dir, "y"), map(vars, [dir])


        def elsewhere(path):
            return sorted(path, key=dir)
        """
    )
    assert [(r.line, r.text) for r in found.reflection] == [(6, "map(vars, [dir])"), (10, "sorted(path, key=dir)")]


def test_reflection_on_what_a_call_returns_is_on_what_the_callee_makes():
    found = _found(
        """
        from plugin.config import PassConfig, make


        def f(factory, name):
            return vars(PassConfig()), getattr(make(), name), vars(factory()), getattr(PassConfig().inner, name)


        class K:
            def f(self, name):
                return getattr(super(), name)
        """
    )
    shown = [(r.line, r.kind, r.receiver, r.target) for r in found.reflection]
    assert shown == [
        (6, "dict", "instance", "plugin.config.PassConfig"),
        (6, "other", "instance", "plugin.config.make"),
        (6, "dict", "any", None),
        (6, "other", "any", None),
        (11, "other", "self", "K"),  # `super()` is the instance's
    ]


def test_names_strings_look_up_doctests_and_unknown_syntax():
    found = _found(
        '''
        """Usage.

        >>> Impl().prefill(q)
        """
        import operator
        from unittest import mock

        GET = operator.attrgetter("impl.forward")
        PATCHED = mock.patch("plugin.impl.Impl.decode")
        '''
    )
    assert [(use.name, use.kind, use.line) for use in found.named] == [
        ("Impl", "doctest", 4),
        ("prefill", "doctest", 4),
        ("q", "doctest", 4),
        ("impl", "lookup", 9),
        ("forward", "lookup", 9),
        ("plugin", "lookup", 10),
        ("impl", "lookup", 10),
        ("Impl", "lookup", 10),
        ("decode", "lookup", 10),
    ]
    unknown = occurrences.unknown_syntax(ast.parse("x.forward").body[0])
    assert {use.name for use in unknown} == {"x", "forward"} and {use.kind for use in unknown} == {"syntax"}


def test_old_op_names_in_strings_with_their_place():
    found = _found(
        """
        splitting_ops = ["vllm::unified_attention", "vllm.unified_mla_attention"]
        config = CompilationConfig(splitting_ops=["vllm::unified_attention"])
        PAIRS = [("vllm::unified_attention", "vllm::unified_attention_with_output")]
        direct_register_custom_op(op_name="vllm::unified_attention")
        LOG = "split at vllm::unified_attention"
        OP = "vllm::" + name
        """
    )
    shown = [(s.line, s.op, s.place) for s in found.op_strings]
    assert shown == [
        (2, "unified_attention", "list"),
        (2, "unified_mla_attention", "list"),
        (3, "unified_attention", "list"),
        (4, "unified_attention", "other"),
        (5, "unified_attention", "registration"),
        (6, "unified_attention", "prose"),
        (7, "", "prefix"),
    ]


def test_the_text_of_a_file_that_does_not_parse():
    found = occurrences.unparsed_occurrences(b"def f(:\n  x.forward(1)\r\n  getattr(x, n)  'vllm::unified_attention'\n")
    assert {(use.name, use.line, use.column) for use in found.named} >= {("forward", 2, 5), ("getattr", 3, 3)}
    assert [(r.line, r.receiver) for r in found.reflection] == [(3, "any")]
    assert [(s.line, s.op, s.place) for s in found.op_strings] == [(3, "unified_attention", "unparsed")]
