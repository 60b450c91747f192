"""Which arguments pass on a parameter of the calling function that may be None (codemods/index/forwarded.py)."""

from __future__ import annotations

import ast

import pytest

from vllm_attn_compat.codemods.index.forwarded import Parameters

from rule_testing import source


def _may_be_none(function_text: str) -> dict[str, bool]:
    """For each argument of the call ``run(...)`` in the function, whether it may be None there (by its text)."""
    function = ast.parse(source(function_text)).body[0]
    assert isinstance(function, ast.FunctionDef)
    call = next(node for node in ast.walk(function) if isinstance(node, ast.Call) and ast.unparse(node.func) == "run")
    parameters = Parameters(function)
    arguments = [*call.args, *(keyword.value for keyword in call.keywords)]
    return {ast.unparse(argument): parameters.may_be_none(argument, call.lineno) for argument in arguments}


def test_parameters_defaulting_to_none_may_be_none_others_are_what_the_caller_passes():
    found = _may_be_none(
        """
        def f(self, a, b=None, c=1, *args, d=None, e, **kwargs):
            run(a, b, c, d, e, args, kwargs, None, b.view(2), self)
        """
    )
    assert found == {
        "a": False,
        "b": True,
        "c": False,
        "d": True,
        "e": False,
        "args": False,
        "kwargs": False,
        "None": False,  # a literal: the call index records it as such
        "b.view(2)": False,
        "self": False,
    }


@pytest.mark.parametrize(
    "guard",
    [
        "assert output is not None",
        "if output is None:\n    output = torch.empty_like(query)",
        "if output is None:\n    log('no buffer')\n    output = alloc(query)",
        "if output is None:\n    raise ValueError('no buffer')",
    ],
)
def test_a_guard_at_the_top_of_the_body_before_the_call_makes_sure_it_is_not(guard):
    body = guard.replace("\n", "\n    ")
    text = f"def forward(self, query, output=None):\n    {body}\n    return run(query, output)\n"
    assert _may_be_none(text) == {"query": False, "output": False}
    after = f"def forward(self, query, output=None):\n    x = run(query, output)\n    {body}\n    return x\n"
    assert _may_be_none(after) == {"query": False, "output": True}


@pytest.mark.parametrize(
    "guard",
    [
        "if query is not None:\n        assert output is not None",  # not at the top: may not run
        "if output is None:\n        output = None",
        "if output is None:\n        output = alloc(query)\n    else:\n        output = None",
        "if output is None:\n        other = alloc(query)",
        "assert output is not None or query is None",
        "assert other is not None",
    ],
)
def test_what_does_not_make_sure_leaves_it_possibly_none(guard):
    text = f"def forward(self, query, other=None, output=None):\n    {guard}\n    return run(query, output)\n"
    assert _may_be_none(text)["output"] is True


def test_without_a_function_nothing_is_a_parameter():
    call = ast.parse("run(output)").body[0].value  # type: ignore[attr-defined]
    assert Parameters(None).may_be_none(call.args[0], 1) is False


@pytest.mark.parametrize(
    ("value", "buffer"),
    [
        ("torch.empty(3)", True),  # a fresh tensor
        ("query.new_empty(3)", True),
        ("[0, 0]", True),  # a literal
        ("out", True),  # a required parameter
        ("scaled", True),  # a parameter defaulting to a value
        ("out[:3].view(-1)", True),  # a slice and a view of one
        ("fresh", True),  # a local bound only to a fresh tensor
        ("fresh if out else torch.zeros(1)", True),
        ("None", False),
        ("maybe", False),  # a parameter defaulting to None, no guard
        ("self.buffer", False),  # an attribute, which may hold None
        ("pick()", False),  # what a call returns
        ("twice", False),  # a local bound twice, once to what may be None
        ("looped", False),  # a loop's target
        ("GLOBAL", False),  # a global
    ],
)
def test_a_value_is_a_buffer_only_where_it_cannot_be_none(value, buffer):
    text = (
        "def f(self, query, out, scaled=1, maybe=None):\n"
        "    fresh = torch.empty_like(query)\n"
        "    twice = torch.empty(1)\n"
        "    twice = self.cached\n"
        "    for looped in query:\n"
        "        pass\n"
        f"    return self.impl.forward(query, output={value})\n"
    )
    function = ast.parse(text).body[0]
    call = function.body[-1].value
    [output] = [keyword.value for keyword in call.keywords]
    assert Parameters(function, walrus=False).cannot_be_none(output, 7) is buffer
