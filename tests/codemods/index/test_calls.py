"""What the index records of a method taking no ``output`` (codemods/index/calls.py `Signature`): whether a call
binds to it argument for parameter, held to Python's own calls over generated signatures and calls."""

from __future__ import annotations

import ast
import inspect

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_attn_compat.codemods.index import calls
from vllm_attn_compat.codemods.index.hierarchy import index_module

NAMES = ["a", "b", "c", "d", "e"]
KINDS = [
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.KEYWORD_ONLY,
]


@st.composite
def signatures(draw):
    """A method's parameters after ``self`` (kinds in a valid order, defaults where Python allows them), with or
    without ``*args`` and ``**kwargs``."""
    names = draw(st.permutations(NAMES))[: draw(st.integers(0, len(NAMES)))]
    kinds = sorted(draw(st.lists(st.sampled_from(KINDS), min_size=len(names), max_size=len(names))))
    parameters, defaulted = [], False
    for name, kind in zip(names, kinds, strict=True):
        has_default = draw(st.booleans()) or (defaulted and kind != inspect.Parameter.KEYWORD_ONLY)
        defaulted |= has_default and kind != inspect.Parameter.KEYWORD_ONLY
        parameters.append(inspect.Parameter(name, kind, default=0 if has_default else inspect.Parameter.empty))
    varargs, varkw = draw(st.booleans()), draw(st.booleans())
    if varargs:
        at = next((i for i, p in enumerate(parameters) if p.kind == inspect.Parameter.KEYWORD_ONLY), len(parameters))
        parameters.insert(at, inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL))
    if varkw:
        parameters.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(parameters)


def _definition(signature: inspect.Signature, kind: str) -> str:
    text = str(signature)[1:-1]  # as a `def` lists them
    if kind != "static":
        text = f"self, {text}" if text else "self"
    return f"def m({text}):\n    return locals()\n"


def _recorded(signature: inspect.Signature, kind: str) -> calls.Signature:
    decorator = "@staticmethod\n" if kind == "static" else ""
    source = "class C:\n" + "".join(f"    {line}\n" for line in (decorator + _definition(signature, kind)).splitlines())
    return calls._signature("C", ast.parse(source).body[0].body[0], kind)


@settings(max_examples=400, deadline=None)
@given(signatures(), st.integers(0, 6), st.sets(st.sampled_from([*NAMES, "x"])), st.sampled_from(["method", "static"]))
def test_a_call_is_taken_where_python_binds_each_argument_to_a_parameter_of_its_own(
    signature, positional, keywords, kind
):
    """The oracle is a call of the method defined (`inspect.Signature.bind` differs from calls across Python
    releases: 3.13.0's binds a positional-only parameter given by keyword)."""
    namespace: dict[str, object] = {}
    exec(_definition(signature, kind), namespace)  # the test's own generated definition
    implicit = [] if kind == "static" else [None]
    try:
        bound = namespace["m"](*implicit, *range(positional), **dict.fromkeys(keywords, 0))
    except TypeError:
        expected = False
    else:  # what `*args` or `**kwargs` took tells nothing of what the call is for
        expected = not (bound.get("args") or bound.get("kwargs"))
    assert _recorded(signature, kind).takes(positional, frozenset(keywords)) is expected, (str(signature), kind)


def test_a_class_records_its_methods_without_output_and_not_those_with_it():
    source = (
        "class Layer:\n"
        "    def forward(self, query, key, value, output_shape=None): ...\n"
        "    def forward_impl(self, query, output): ...\n"
        "    @staticmethod\n"
        "    def make(size, /, *, device=None): ...\n"
    )
    index = index_module(source.encode(), "layer.py").calls
    assert index.signatures == (
        calls.Signature("Layer", "forward", "query, key, value, output_shape="),
        calls.Signature("Layer", "make", "size, /, *, device="),
    )
    assert [method.name for method in index.methods] == ["forward_impl"]
