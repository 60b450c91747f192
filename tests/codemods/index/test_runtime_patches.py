"""Code patched onto vLLM's classes at run time, and duck-typed backends: found by the class index,
and what the migrated code does when it runs (a stub ``vllm`` package on ``sys.path``)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from vllm_attn_compat.codemods.cli import main
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module
from vllm_attn_compat.codemods.index.runtime_patches import ATTRIBUTE, BUILDER, BUILT, MEMBERS


def _index(text: str, path: str = "plug.py"):
    return index_module(textwrap.dedent(text).encode(), path)


PLUGIN = """
    import inspect
    from unittest import mock

    import torch
    from vllm.model_executor.layers.attention import Attention, MLAAttention
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend


    def _assigned(self, q, output=None): ...
    def _set(self, q, output=None): ...
    def _helper(self, q, output=None): ...
    def _by_string(self, q, output=None): ...
    def _instance_attribute(self, q, output=None): ...
    def _onto_torch(self, q, output=None): ...


    class AssignedMethods:
        accept_output_buffer: bool = False


    class MergedMethods:
        accept_output_buffer: bool = False


    class TensorMethods:
        accept_output_buffer: bool = False


    @patch_methods(MLAAttention, "forward_impl")
    def _decorated(self, q, output=None): ...


    def install(layer_cls):
        def _local(self, q, output=None): ...

        setattr(layer_cls, "forward", _local)
        self_like = object()
        self_like.forward = _instance_attribute


    MLAAttention.forward = _assigned
    setattr(Attention, "forward_impl", _set)
    mock.patch.object(Attention, "forward", new=_helper).start()
    mock.patch("vllm.model_executor.layers.attention.MLAAttention.forward", _by_string).start()
    torch.Tensor.attend = _onto_torch
    for _name, _value in AssignedMethods.__dict__.items():
        setattr(FlashAttentionBackend, _name, _value)
    for _name, _value in inspect.getmembers(MergedMethods):
        setattr(FlashAttentionBackend, _name, _value)
    for _name, _value in vars(TensorMethods).items():
        setattr(torch.Tensor, _name, _value)
"""


def test_every_way_of_patching_is_found_with_its_target():
    hierarchy = ClassHierarchy.build([_index(PLUGIN)])
    scopes = {
        name: hierarchy.patch_scope(f"plug.{name}", ATTRIBUTE)
        for name in ("_assigned", "_set", "_helper", "_by_string", "_decorated", "install.<locals>._local")
    }
    assert scopes == {
        "_assigned": "attention",
        "_set": "attention",
        "_helper": "attention",
        "_by_string": "attention",
        "_decorated": "attention",
        "install.<locals>._local": "unresolved",
    }
    # Onto torch's class, or onto an instance, is no attention code.
    assert hierarchy.patch_scope("plug._onto_torch", ATTRIBUTE) is None
    assert hierarchy.patch_scope("plug._instance_attribute", ATTRIBUTE) is None
    assert hierarchy.is_attention_class("plug.AssignedMethods")
    assert hierarchy.is_attention_class("plug.MergedMethods")
    assert not hierarchy.is_attention_class("plug.TensorMethods")
    assert hierarchy.patch_scope("plug.TensorMethods", MEMBERS) is None
    assert hierarchy.has_attention_classes("plug.py")
    assert pickle.loads(pickle.dumps(hierarchy)).patch_scope("plug._set", ATTRIBUTE) == "attention"


def test_unresolved_targets_count_only_in_modules_that_use_vllm():
    text = """
        def _forward(self, q, output=None): ...

        def install(cls):
            setattr(cls, "forward", _forward)
    """
    assert _index(text).patches == ()
    with_vllm = _index("import vllm\n" + textwrap.dedent(text))
    assert [(p.source, p.targets) for p in with_vllm.patches] == [("plug._forward", ())]


def test_a_dispatcher_is_no_patch_helper_though_it_spells_patch():
    # vLLM's model runner calls `self.cudagraph_dispatcher.dispatch(...)` with imported names as values: read
    # as a patch helper with an unresolved target, it would report `_forward`'s code as patched onto a class.
    text = """
        import vllm
        from plugin.ops import _forward

        def run(cls, dispatcher, dispatch):
            dispatcher.dispatch(cls, _forward)
            dispatch(cls, _forward)
            dispatch.object(cls, _forward)
            DISPATCHER.Dispatch(cls, _forward)
    """
    assert _index(text).patches == ()
    for helper in ("dispatch_patch(cls, _forward)", "patched_dispatch(cls, _forward)", "patch.object(cls, _forward)"):
        found = _index(textwrap.dedent(text) + f"\n{helper}\n")
        assert [(p.source, p.targets) for p in found.patches] == [("plugin.ops._forward", ())], helper


def test_a_function_patched_from_another_module_is_found_through_the_import():
    patcher = _index(
        """
        from vllm.model_executor.layers.attention import MLAAttention
        from plugin.ops import mla_forward

        MLAAttention.forward = mla_forward
        """,
        "plugin/patches.py",
    )
    ops = _index("def mla_forward(self, q, output=None): ...\n", "plugin/ops.py")
    hierarchy = ClassHierarchy.build([patcher, ops])
    assert hierarchy.patch_scope("plugin.ops.mla_forward", ATTRIBUTE) == "attention"
    assert hierarchy.has_attention_classes("plugin/ops.py")
    assert "mla_forward" in hierarchy.attention_class_names()  # the runner's next round finds ops.py


def test_class_builders_are_found_with_the_bases_they_name():
    found = _index(
        """
        import types

        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

        def named(cls):
            return type(cls.__name__, (FlashAttentionBackend,), dict(vars(cls)))

        def with_new_class(cls):
            return types.new_class(cls.__name__, [FlashAttentionBackend])

        def factory(base):
            def build(cls):
                return type(cls.__name__, (base,), {})
            return build

        def not_a_builder(x):
            return type(x).__name__, type(x)
        """
    )
    builders = sorted((p.source, p.targets) for p in found.patches if p.kind == BUILDER)
    flash = ("vllm.v1.attention.backends.flash_attn.FlashAttentionBackend",)
    # The factory is found as itself (a decorator names it) and as the function it returns.
    assert builders == [
        ("plug.factory", ()),
        ("plug.factory.<locals>.build", ()),
        ("plug.named", flash),
        ("plug.with_new_class", flash),
    ]


_BUILDER = """
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend


    def tt_backend(cls):
        return type(cls.__name__, (FlashAttentionBackend,), dict(vars(cls)))
"""


@pytest.mark.parametrize(
    ("builder", "methods", "scope"),
    [
        # A bare decorator imported from the module that builds the backend.
        (_BUILDER, "import vllm.envs\nfrom plugin.build import tt_backend\n\n@tt_backend\n{cls}", "built"),
        # A factory given the base: its bases are a parameter, counted in a module using vLLM.
        (
            "import vllm\n\ndef backend_from(base):\n    def build(cls):\n"
            "        return type(cls.__name__, (base,), dict(vars(cls)))\n    return build\n",
            "from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend\n"
            "from plugin.build import backend_from\n\n@backend_from(FlashAttentionBackend)\n{cls}",
            "built",
        ),
        # The same factory in a project that does not use vLLM builds no vLLM backend.
        (
            "def backend_from(base):\n    def build(cls):\n"
            "        return type(cls.__name__, (base,), dict(vars(cls)))\n    return build\n",
            "import vllm.envs\nfrom plugin.build import backend_from\n\n@backend_from(object)\n{cls}",
            None,
        ),
        # A builder deriving from a class that is no attention class.
        (
            _BUILDER.replace("FlashAttentionBackend", "SamplerBase").replace("vllm.v1.attention.backends.", "mylib."),
            "import vllm.envs\nfrom plugin.build import tt_backend\n\n@tt_backend\n{cls}",
            None,
        ),
        # A decorator that builds nothing.
        (
            "import vllm\n\ndef tt_backend(cls):\n    return cls\n",
            "from plugin.build import tt_backend\n\n@tt_backend\n{cls}",
            None,
        ),
    ],
)
def test_a_methods_class_a_decorator_builds_a_backend_of_is_in_scope_to_be_reported_only(builder, methods, scope):
    cls = "class TTBackend:\n    accept_output_buffer = False\n"
    indexes = [_index(builder, "plugin/build.py"), _index(methods.format(cls=cls), "plugin/backend.py")]
    hierarchy = ClassHierarchy.build(indexes)
    assert hierarchy.patch_scope("plugin.backend.TTBackend", MEMBERS) == scope
    assert not hierarchy.is_attention_class("plugin.backend.TTBackend")  # never fixed as one
    # A class holding nothing a rule reads (no flag, no method taking `output`) records no entry.
    plain = _index(methods.format(cls="class TTBackend:\n    name = 'TT'\n"), "plugin/backend.py")
    assert [p for p in plain.patches if p.kind == BUILT] == []


def test_duck_typed_backends_only_in_modules_that_import_vllm():
    backend = """
        class Backend:
            accept_output_buffer = True

            @staticmethod
            def get_name():
                return "B"

            @staticmethod
            def get_impl_cls():
                return None


        class NoFlag:
            @staticmethod
            def get_name():
                return "C"

            @staticmethod
            def get_impl_cls():
                return None
    """
    plain = ClassHierarchy.build([_index(backend)])
    assert not plain.is_attention_class("plug.Backend")
    with_vllm = ClassHierarchy.build(
        [_index("from vllm.platforms import current_platform\n" + textwrap.dedent(backend))]
    )
    assert with_vllm.is_attention_class("plug.Backend")
    assert not with_vllm.is_attention_class("plug.NoFlag")


# --- running the code before and after migration --------------------------------------------------

_STUB_LAYER = """
class MLAAttention:
    def __init__(self, scale):
        self.scale = scale

    def forward(self, q, output=None):
        raise NotImplementedError
"""

_PATCH = """
import torch
from vllm.model_executor.layers.attention.mla_attention import MLAAttention


def _forward(self, q, output: torch.Tensor | None = None):
    assert output is not None, "Output tensor must be provided."
    n = q.shape[0]
    output = output[:n]
    torch.mul(q, self.scale, out=output)
    return output


def _forward_tail(self, q, output=None):
    for _ in range(2):
        assert output is not None
    output = output[: q.shape[0]]
    output.copy_(q)
    return output


MLAAttention.forward = _forward
setattr(MLAAttention, "forward_tail", _forward_tail)
"""


@pytest.fixture()
def stub_tree(tmp_path):
    package = tmp_path / "vllm" / "model_executor" / "layers" / "attention"
    package.mkdir(parents=True)
    for folder in (package, *package.parents):
        if folder == tmp_path:
            break
        (folder / "__init__.py").write_text("")
    (package / "mla_attention.py").write_text(_STUB_LAYER)
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "__init__.py").write_text("")
    (plugin / "patches.py").write_text(_PATCH)
    return tmp_path


# Runs in a fresh interpreter with the stub tree first on the path: the suite's own process may hold
# the real vLLM (other tests import it), whose modules must neither shadow the stub nor be dropped.
_CALL_PATCHED = """
import importlib, json, sys

import torch

q_rows = int(sys.argv[1])
importlib.import_module("plugin.patches")
layer_module = importlib.import_module("vllm.model_executor.layers.attention.mla_attention")
layer = layer_module.MLAAttention(scale=2.0)
q = torch.arange(q_rows * 3, dtype=torch.float32).view(q_rows, 3)
output = torch.zeros(q_rows + 2, 3)  # padded, as vLLM's CUDA-graph buffers are
first = layer.forward(q, output=output).clone()
second = layer.forward_tail(q, output=torch.zeros(q_rows + 1, 3)).clone()
print(json.dumps([first.tolist(), output.tolist(), second.tolist()]))
"""


def _call_patched(tree, q_rows: int):
    env = {**os.environ, "PYTHONPATH": str(tree)}
    run = subprocess.run(
        [sys.executable, "-c", _CALL_PATCHED, str(q_rows)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(run.stdout)


def test_patched_methods_migrate_and_compute_the_same(stub_tree, capsys):
    pytest.importorskip("torch")
    before = _call_patched(stub_tree, 4)
    # The run covers the plugin only; vLLM's class is imported, as in a real plugin.
    # Patched functions' callers cannot be traced to them, so their fixes are unsafe ones.
    assert main(["migrate", "--unsafe-fixes", str(stub_tree / "plugin")]) == 0
    migrated = (stub_tree / "plugin" / "patches.py").read_text()
    assert "output: torch.Tensor)" in migrated and "output: torch.Tensor | None" not in migrated
    # Both asserts go: the slices come after them (after the loop, for the second).
    assert "assert output is not None" not in migrated
    assert "def _forward_tail(self, q, output: torch.Tensor):" in migrated
    after = _call_patched(stub_tree, 4)
    assert after == before


def test_a_class_builder_makes_neither_its_module_attention_code_nor_waits_for_the_last_round():
    index = _index("import vllm\n\ndef build(base, cls):\n    return type(cls.__name__, (base,), {})\n", "plugin/b.py")
    assert [p.kind for p in index.patches] == [BUILDER]
    hierarchy = ClassHierarchy.build([index])
    assert not hierarchy.has_attention_classes("plugin/b.py")  # nothing there for the rules to act on
    assert hierarchy.patches_decided(index)
