"""The local names a function binds exactly once, to a call (codemods/index/constructed.py)."""

from __future__ import annotations

import ast
import textwrap

import pytest

from vllm_attn_compat.codemods.index.constructed import constructed


def _constructed(body: str, parameters: str = "") -> dict[str, str]:
    text = f"def f({parameters}):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    function = ast.parse(text).body[0]
    assert isinstance(function, ast.FunctionDef)
    return {name: ast.unparse(callee) for name, callee in constructed(function).items()}


def test_a_name_bound_once_to_a_call_holds_what_the_call_made():
    found = _constructed(
        """
        impl = MyImpl(1, 2)
        typed: Impl = plugin.Impl()
        made = factory()(3)
        value = 3
        impl.forward(None)
        """
    )
    assert found == {"impl": "MyImpl", "typed": "plugin.Impl", "made": "factory()"}


@pytest.mark.parametrize(
    "body",
    [
        "impl = MyImpl()\nimpl = OtherImpl()\n",
        "impl = MyImpl()\nfor impl in impls:\n    pass\n",
        "impl = MyImpl()\nwith open(p) as impl:\n    pass\n",
        "impl = MyImpl()\ndel impl\n",
        "impl = MyImpl()\nimpl += 1\n",
        "impl = MyImpl()\nif (impl := other()):\n    pass\n",
        "impl = MyImpl()\n[impl for impl in impls]\n",  # (its own scope in Python 3: counted all the same)
        "global impl\nimpl = MyImpl()\n",
        "impl = MyImpl()\nimport impl\n",
        "impl = MyImpl()\ntry:\n    pass\nexcept E as impl:\n    pass\n",
        "impl = MyImpl()\nmatch x:\n    case [*impl]:\n        pass\n",
        "impl = MyImpl()\nmatch x:\n    case {**impl}:\n        pass\n",
        "impl = MyImpl()\nmatch x:\n    case Point() as impl:\n        pass\n",
        "impl = MyImpl()\ndef g():\n    nonlocal impl\n    impl = other\n",
        "impl = MyImpl()\ndef impl():\n    pass\n",
        "impl = MyImpl()\nclass impl:\n    pass\n",
        "impl, other = MyImpl(), Other()\n",
        "impl = other = MyImpl()\n",
        "impl[0] = MyImpl()\n",
    ],
)
def test_any_other_binding_of_the_name_makes_it_unknown(body):
    assert "impl" not in _constructed(body)


def test_a_parameter_is_unknown_and_nested_scopes_bind_nothing_of_their_own():
    assert _constructed("impl = MyImpl()\n", "impl") == {}
    nested = _constructed("impl = MyImpl()\ndef g():\n    impl = Other()\n    inner = Inner()\nlambda impl: impl\n")
    assert nested == {"impl": "MyImpl"}
    assert _constructed("impl = MyImpl()\ndef g(x=(impl := 2)):\n    pass\n") == {}  # a default runs here
