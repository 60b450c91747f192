"""The class-hierarchy pass: bases resolved through imports, across files, by origin not name."""

from __future__ import annotations

import pickle
import textwrap

import pytest

from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module
from vllm_attn_compat.codemods.index.names import BASE_TOKENS, guess_module_name, is_vllm_base


def index(path: str, text: str):
    return index_module(textwrap.dedent(text).encode(), path)


def test_bases_resolve_through_imports_aliases_and_subscripts():
    module = index(
        "m.py",
        """
        import vllm.v1.attention.backend as vab
        from vllm.v1.attention.backend import AttentionImpl as Impl
        from vllm.model_executor.layers import attention


        class A(vab.AttentionBackend): ...
        class B(Impl["Meta"]): ...
        class C(attention.Attention): ...
        class D(B): ...
        """,
    )
    bases = {entry.qualname: entry.bases for entry in module.classes}
    assert bases == {
        "A": ("vllm.v1.attention.backend.AttentionBackend",),
        "B": ("vllm.v1.attention.backend.AttentionImpl",),
        "C": ("vllm.model_executor.layers.attention.Attention",),
        "D": ("m.B",),
    }
    hierarchy = ClassHierarchy.build([module])
    assert all(hierarchy.is_attention_class(f"m.{name}") for name in "ABCD")
    assert hierarchy.attention_class_names() == frozenset("ABCD")


def test_the_attention_class_names_follow_each_module_added():
    """The names are kept once asked (each round asks twice), and made again once another module joins."""
    base = index(
        "plugin/base.py", "from vllm.v1.attention.backend import AttentionImpl\nclass Base(AttentionImpl): ...\n"
    )
    hierarchy = ClassHierarchy.build([base])
    assert hierarchy.attention_class_names() == {"Base"}
    assert hierarchy.attention_class_names() is hierarchy.attention_class_names()
    hierarchy.add(index("plugin/impl.py", "from plugin.base import Base\nclass Impl(Base): ...\n"))
    assert hierarchy.attention_class_names() == {"Base", "Impl"}
    extended = hierarchy.extended(index("plugin/more.py", "from plugin.impl import Impl\nclass More(Impl): ...\n"))
    assert extended.attention_class_names() == {"Base", "Impl", "More"}
    assert hierarchy.attention_class_names() == {"Base", "Impl"}  # the copy's module did not join it
    again = pickle.loads(pickle.dumps(extended))  # as the workers get it
    assert again.attention_class_names() == {"Base", "Impl", "More"}


def test_an_extended_hierarchy_keeps_what_the_classes_of_the_others_define(tmp_path):
    base_path, impl_path = str(tmp_path / "base.py"), str(tmp_path / "impl.py")
    base = index(
        base_path,
        "from vllm.v1.attention.backend import AttentionImpl\nclass Base(AttentionImpl):\n"
        "    def forward(self, layer, q, k, v, kv, meta, output=None): ...\n",
    )
    hierarchy = ClassHierarchy.build([base])
    extended = hierarchy.extended(index(impl_path, "from base import Base\nclass Impl(Base): ...\n"))
    full = f"{base.module}.Base"
    assert extended.methods_of(full) == hierarchy.methods_of(full) == "forward"


def test_classes_nested_in_functions_use_qualnames():
    module = index(
        "m.py",
        """
        from vllm.v1.attention.backend import AttentionImpl


        def factory():
            class Base(AttentionImpl):
                class Inner:
                    pass

            class Impl(Base):
                pass

            return Impl
        """,
    )
    names = [entry.qualname for entry in module.classes]
    assert names == ["factory.<locals>.Base", "factory.<locals>.Base.Inner", "factory.<locals>.Impl"]
    hierarchy = ClassHierarchy.build([module])
    assert hierarchy.is_attention_class("m.factory.<locals>.Impl")
    assert not hierarchy.is_attention_class("m.factory.<locals>.Base.Inner")


def test_hierarchy_over_three_files_in_a_package(tmp_path):
    package = tmp_path / "plugin"
    (package / "attn").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "attn" / "__init__.py").write_text("")
    base = "from vllm.attention.backends.abstract import AttentionImpl\nclass PluginBase(AttentionImpl): ...\n"
    files = {
        package / "base.py": base,
        package / "attn" / "tiled.py": "from ..base import PluginBase\nclass Tiled(PluginBase): ...\n",
        package / "attn" / "fast.py": "from plugin.attn.tiled import Tiled\nclass Fast(Tiled): ...\n",
    }
    indexes = [index_module(text.encode(), str(path)) for path, text in files.items()]
    assert [i.module for i in indexes] == ["plugin.base", "plugin.attn.tiled", "plugin.attn.fast"]
    hierarchy = ClassHierarchy.build(indexes)
    assert hierarchy.is_attention_class("plugin.attn.fast.Fast")
    assert hierarchy.attention_class_names() == {"PluginBase", "Tiled", "Fast"}
    without_base = ClassHierarchy.build(indexes[1:])
    assert not without_base.is_attention_class("plugin.attn.fast.Fast")


def test_unrelated_projects_and_names_alone_do_not_count():
    module = index(
        "other.py",
        """
        from flashinfer import AttentionBackend
        from vllm.v1.attention.backend import AttentionMetadata


        class AttentionImpl: ...
        class Mine(AttentionBackend): ...
        class Meta(AttentionMetadata): ...
        class Local(AttentionImpl): ...
        """,
    )
    hierarchy = ClassHierarchy.build([module])
    assert hierarchy.attention_class_names() == frozenset()


def test_in_tree_backends_and_fork_bases_count():
    assert is_vllm_base("vllm.v1.attention.backends.flash_attn.FlashAttentionImpl")
    assert is_vllm_base("vllm.model_executor.layers.attention_layer_base.AttentionLayerBase")
    assert not is_vllm_base("vllm.v1.attention.backends.registry.AttentionBackendEnum")
    assert not is_vllm_base("vllm.attentionx.Attention")


def test_layers_are_vllm_s_attention_layers_and_what_derives_from_them_and_no_impl():
    vllm_tree = index(
        "vllm/model_executor/layers/attention/attention.py",
        """
        import torch
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase


        class Attention(torch.nn.Module, AttentionLayerBase): ...
        """,
    )
    plugin = index(
        "plugin.py",
        """
        import torch
        from vllm.model_executor.layers.attention.attention import Attention
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention
        from vllm.v1.attention.backend import AttentionImpl


        class Layer(Attention): ...
        class Deeper(Layer): ...
        class Mla(MLAAttention): ...
        class Impl(AttentionImpl): ...
        class ModuleImpl(AttentionImpl, torch.nn.Module): ...
        class Both(Layer, AttentionImpl): ...
        class Cycle(Cycle): ...
        """,
    )
    hierarchy = ClassHierarchy.build([vllm_tree, plugin])
    layers = {name for name in hierarchy.graph if hierarchy.is_layer_class(name)}
    # The fork's own layer goes by the module name its folders give it (no __init__.py here: `attention`).
    assert layers == {"plugin.Layer", "plugin.Deeper", "plugin.Mla", "attention.Attention"}
    # Of which vLLM calls a method with the buffer (`forward_impl`): the MLA layer's alone.
    assert {name for name in hierarchy.graph if hierarchy.is_mla_layer_class(name)} == {"plugin.Mla"}


def test_cycles_terminate():
    a = index("a.py", "from b import B\nclass A(B): ...\n")
    b = index("b.py", "from a import A\nclass B(A): ...\n")
    assert ClassHierarchy.build([a, b]).attention_class_names() == frozenset()


def test_results_pickle_and_syntax_errors_raise():
    module = index("m.py", "from vllm.attention import Attention\nclass L(Attention): ...\n")
    hierarchy = ClassHierarchy.build([module])
    assert pickle.loads(pickle.dumps(module)) == module
    assert pickle.loads(pickle.dumps(hierarchy)).is_attention_class("m.L")
    with pytest.raises(SyntaxError):
        index_module(b"class (:\n", "bad.py")


def test_module_name_guess(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    assert guess_module_name(str(tmp_path / "pkg" / "mod.py")) == "pkg.mod"
    assert guess_module_name(str(tmp_path / "pkg" / "__init__.py")) == "pkg"
    assert guess_module_name(str(tmp_path / "loose.py")) == "loose"


def test_base_tokens_are_found_in_every_way_of_importing_a_base():
    sources = [
        b"from vllm.v1.attention.backend import AttentionImpl",
        b"import vllm.attention.layer as layer",
        b"from vllm.model_executor.layers import attention",
        b"from vllm.model_executor.layers.attention.attention import Attention",
    ]
    for source in sources:
        assert any(token in source for token in BASE_TOKENS), source
