"""The classes a run hands vLLM by name: a backend's ``get_impl_cls`` returns, a platform's
``get_attn_backend_cls`` paths; and which of them the hierarchy makes attention code."""

from __future__ import annotations

import ast
import pickle
import textwrap

import pytest

from vllm_attn_compat.codemods.index.handed import dotted_paths, named_paths, returned_values
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module

from runner_trees import PLAIN_BACKEND, PLATFORM


@pytest.fixture
def index(tmp_path):
    """The index of a module of ``plugin/``, a package on disk, so that its modules are named ``plugin.x``
    (`names.guess_module_name`; each test's own folder, as the guesses are kept by path)."""
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "__init__.py").write_text("")

    def indexed(path: str, text: str):
        return index_module(textwrap.dedent(text).encode(), str(tmp_path / path))

    return indexed


def _function(text: str) -> ast.FunctionDef:
    node = ast.parse(textwrap.dedent(text)).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def test_the_values_returned_are_the_function_s_own():
    function = _function(
        """
        def get_impl_cls(flag):
            def inner():
                return Nested
            if flag:
                return First if flag > 1 else Third
            try:
                return Second
            finally:
                pass
            return
        """
    )
    assert sorted(ast.unparse(value) for value in returned_values(function)) == ["First", "Second", "Third"]


def test_only_string_literals_spelling_a_dotted_path_are_paths():
    function = _function(
        """
        def get_attn_backend_cls(cls, use_mla):
            if use_mla:
                return "plugin.mla.MLABackend"
            if cls.other:
                return f"plugin.{cls.name}.Backend"
            if cls.bare:
                return "Backend"
            if cls.spaced:
                return "plugin. attention.Backend"
            return "plugin.attention.Backend"
        """
    )
    assert dotted_paths(returned_values(function)) == ("plugin.attention.Backend", "plugin.mla.MLABackend")


def test_a_platform_s_paths_are_those_its_body_spells_however_it_returns_them():
    # vllm-ascend returns an entry of a table of paths, vllm-rbln a name bound to one; a nested function's are its own.
    function = _function(
        """
        def get_attn_backend_cls(cls, config):
            table = {
                (True, False): "plugin.mla.MLABackend",
                (False, False): "plugin.attention.Backend",
            }
            if config.old:
                chosen = (
                    "plugin.legacy."
                    "OldBackend"
                )
                logger.info("Using %s", chosen)
                return chosen

            def helper():
                return "plugin.elsewhere.NotNamedHere"

            return table[(config.use_mla, config.use_sparse)]
        """
    )
    assert named_paths(function) == ("plugin.attention.Backend", "plugin.legacy.OldBackend", "plugin.mla.MLABackend")


_BACKEND = """
    from vllm.v1.attention.backend import AttentionBackend


    class MyBackend(AttentionBackend):
        @staticmethod
        def get_name():
            return "MINE"

        @staticmethod
        def get_impl_cls():
            from plugin.impl import MyImpl
            return MyImpl
"""


def test_a_plain_class_a_vllm_backend_returns_from_get_impl_cls_is_attention_code(index):
    backend = index("plugin/backend.py", _BACKEND)
    assert backend.classes[0].impls == ("plugin.impl.MyImpl",)  # a local import resolves
    impl = index("plugin/impl.py", "class MyImpl:\n    def forward(self, layer, q, k, v, kv, meta, output=None): ...\n")
    hierarchy = ClassHierarchy.build([backend, impl])
    assert hierarchy.is_attention_class("plugin.impl.MyImpl")
    assert "MyImpl" in hierarchy.attention_class_names()
    again = pickle.loads(pickle.dumps(hierarchy))  # as the workers get it
    assert again.is_attention_class("plugin.impl.MyImpl")
    # Alone, the backend's file names the impl the run has not read: the runner reads the file that may define it.
    assert "plugin.impl.MyImpl" in ClassHierarchy.build([backend], ["plugin.impl"]).missing_classes()
    assert "plugin.impl.MyImpl" not in ClassHierarchy.build([backend]).missing_classes()  # no module of the run
    # A subclass of the impl is not what vLLM is handed.
    sub = index("plugin/sub.py", "from plugin.impl import MyImpl\nclass Sub(MyImpl): ...\n")
    assert not ClassHierarchy.build([backend, impl, sub]).is_attention_class("plugin.sub.Sub")


def test_a_torch_module_handed_as_impl_is_a_layer_vllm_never_calls_with_the_buffer(index):
    """A Mamba mixer's or an indexer's backend hands its own layer (an ``nn.Module``); vLLM's attention layer is the
    module that calls an impl with the buffer."""
    backend = index("plugin/backend.py", _BACKEND)
    impl = index(
        "plugin/impl.py",
        """
        from torch import nn

        class Layer(nn.Module): ...

        class MyImpl(Layer):
            def forward(self, x): ...
        """,
    )
    assert not ClassHierarchy.build([backend, impl]).is_attention_class("plugin.impl.MyImpl")


def test_a_backend_by_shape_hands_its_impl_but_a_project_s_own_backend_abc_does_not(index):
    shaped = """
        import vllm
        {base_import}

        class MyBackend{bases}:
            @staticmethod
            def get_name():
                return "MINE"

            @staticmethod
            def get_impl_cls():
                return MyImpl


        class MyImpl:
            def forward(self, layer, q, k, v, kv, meta, output=None): ...
    """
    duck = index("plugin/attn.py", shaped.format(base_import="", bases=""))
    assert ClassHierarchy.build([duck]).is_attention_class("plugin.attn.MyImpl")
    own = index("plugin/attn.py", shaped.format(base_import="from plugin.abstract import Backend", bases="(Backend)"))
    abstract = index("plugin/abstract.py", "class Backend:\n    pass\n")
    assert not ClassHierarchy.build([own, abstract]).is_attention_class("plugin.attn.MyImpl")
    # Without vLLM imported, a class of that shape is nobody's backend ...
    alone = index("plugin/attn.py", shaped.replace("import vllm", "").format(base_import="", bases=""))
    assert not ClassHierarchy.build([alone]).is_attention_class("plugin.attn.MyImpl")


def test_a_backend_a_platform_names_is_one_whatever_its_module_imports(index):
    """... unless a platform of the run names it to vLLM by its dotted path (vllm-mlx's does)."""
    platform = index("plugin/platform.py", PLATFORM)
    assert platform.backends == ("plugin.attention.PlainBackend",)
    attention = index("plugin/attention.py", PLAIN_BACKEND)
    assert ClassHierarchy.build([platform], ["plugin.attention"]).missing_classes() >= {"plugin.attention.PlainBackend"}
    hierarchy = ClassHierarchy.build([platform, attention])
    assert hierarchy.is_attention_class("plugin.attention.PlainBackend")
    assert hierarchy.is_attention_class("plugin.attention.PlainImpl")
    assert hierarchy.vllm_interface("plugin.attention.PlainBackend") == "~vllm.v1.attention.backend.AttentionBackend"
    # The impl implements vLLM's impl interface by its shape (VAC010-VAC012 hold it to the calls vLLM makes).
    assert hierarchy.vllm_interface("plugin.attention.PlainImpl") == "~vllm.v1.attention.backend.AttentionImpl"
    assert not ClassHierarchy.build([attention]).is_attention_class("plugin.attention.PlainImpl")
    extended = ClassHierarchy.build([platform]).extended(attention)
    assert extended.is_attention_class("plugin.attention.PlainImpl")


def test_a_handed_impl_deriving_from_nothing_has_vllm_s_impl_interface_of_its_kind(index):
    """An impl defining ``forward_mqa`` is called by vLLM's MLA layer; one deriving from a class has that class's
    interface or none (vLLM's concrete impls are not the manifest's)."""
    backend = index("plugin/backend.py", _BACKEND)
    impls = {
        "plain": "class MyImpl:\n    def forward(self, layer, q, k, v, kv, meta, output): ...\n",
        "mla": "class MyImpl(object):\n    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer): ...\n",
        "derived": "from vllm.v1.attention.backends.flash_attn import FlashAttentionImpl\n\n\n"
        "class MyImpl(FlashAttentionImpl):\n    def forward(self, layer, q, k, v, kv, meta, output): ...\n",
    }
    found = {
        kind: ClassHierarchy.build([backend, index("plugin/impl.py", text)]).vllm_interface("plugin.impl.MyImpl")
        for kind, text in impls.items()
    }
    assert found == {
        "plain": "~vllm.v1.attention.backend.AttentionImpl",
        "mla": "~vllm.v1.attention.backend.MLAAttentionImpl",
        "derived": None,
    }


def test_a_builder_a_backend_hands_vllm_has_vllm_s_builder_interface_when_it_derives_from_nothing(index):
    """vLLM makes the class a backend's ``get_builder_cls`` returns and calls its hooks (vLLM-Kunlun's and
    vllm-mindspore's builders derive from nothing and override ``build_for_drafting``, which 0.34 no longer calls);
    it takes no output buffer, so it is no attention code. A project's own backend ABC hands vLLM nothing."""
    backend = _BACKEND.replace(
        "        @staticmethod\n        def get_impl_cls():",
        "        @staticmethod\n        def get_builder_cls():\n            from plugin.builder import MyBuilder\n"
        "            return MyBuilder\n\n        @staticmethod\n        def get_impl_cls():",
    )
    builders = {
        "plain": "class MyBuilder:\n    def build_for_drafting(self, common_attn_metadata, draft_index): ...\n",
        "generic": "from typing import Generic, TypeVar\n\nM = TypeVar('M')\n\n\n"
        "class MyBuilder(Generic[M]):\n    pass\n",
        "derived": "class Base:\n    pass\n\n\nclass MyBuilder(Base):\n    pass\n",
    }
    found = {}
    for kind, text in builders.items():
        hierarchy = ClassHierarchy.build([index("plugin/backend.py", backend), index("plugin/builder.py", text)])
        found[kind] = (
            hierarchy.vllm_interface("plugin.builder.MyBuilder"),
            hierarchy.is_attention_class("plugin.builder.MyBuilder"),
        )
    builder = ("~vllm.v1.attention.backend.AttentionMetadataBuilder", False)
    assert found == {"plain": builder, "generic": builder, "derived": (None, False)}
    own_abc = "import abc\n\n\nclass MyBackend(abc.ABC):\n    @staticmethod\n    def get_builder_cls():\n"
    own_abc += "        from plugin.builder import MyBuilder\n        return MyBuilder\n"
    hierarchy = ClassHierarchy.build(
        [index("plugin/backend.py", own_abc), index("plugin/builder.py", builders["plain"])]
    )
    assert hierarchy.vllm_interface("plugin.builder.MyBuilder") is None
    # The runner reads the file that defines a builder a backend names (`missing_classes`).
    alone = ClassHierarchy.build([index("plugin/backend.py", backend)], ["plugin.builder"])
    assert "plugin.builder.MyBuilder" in alone.missing_classes()


_REGISTRY = "from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend\n\n"


def test_a_backend_vllm_s_register_backend_registers_is_one_whatever_its_bases(index):
    """As vLLM's own docs show it (``@register_backend(AttentionBackendEnum.CUSTOM)`` on a class of no base), or by
    its path (as tt-xla registers its backends); not a Mamba backend's, nor torch dynamo's ``register_backend``."""
    registrations = {
        "decorator": "@register_backend(AttentionBackendEnum.CUSTOM)",
        "path": 'register_backend(AttentionBackendEnum.CUSTOM, "plugin.attention.PlainBackend")',
        "keyword": 'register_backend(backend="CUSTOM", class_path="plugin.attention.PlainBackend", is_mamba=False)',
        "in-a-function": 'def register():\n    register_backend("CUSTOM", "plugin.attention.PlainBackend")',
        "mamba": "@register_backend(AttentionBackendEnum.CUSTOM, is_mamba=True)",
        "dynamo": 'from torch._dynamo import register_backend\n@register_backend(name="tt")',
        "computed": "register_backend(AttentionBackendEnum.CUSTOM, PATH)",
    }
    found = {}
    for kind, registration in registrations.items():
        text = _REGISTRY + registration + "\n" + PLAIN_BACKEND
        module = index("plugin/attention.py", text)
        hierarchy = ClassHierarchy.build([module])
        # (A backend by its shape, in a module importing vLLM, hands its impl anyway; it is attention code itself
        # only where vLLM is named it.)
        found[kind] = (module.backends, hierarchy.is_attention_class("plugin.attention.PlainBackend"))
    registered = (("plugin.attention.PlainBackend",), True)
    assert found == {
        "decorator": registered,
        "path": registered,
        "keyword": registered,
        "in-a-function": registered,
        "mamba": ((), False),
        "dynamo": ((), False),
        "computed": ((), False),
    }
