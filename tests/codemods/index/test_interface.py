"""Which of vLLM's interface classes the run's classes derive from (`index.interface`), and the copies of the
manifest's names the rules and the class scan hold, checked against the manifest's data."""

from __future__ import annotations

import textwrap

import pytest

from vllm_attn_compat.codemods.index.classscan import quick_index
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module
from vllm_attn_compat.codemods.index.names import VLLM_INTERFACE_NAMES
from vllm_attn_compat.codemods.registry import select_rules
from vllm_attn_compat.manifest import data
from vllm_attn_compat.manifest import interface as manifest_interface

BACKEND = "vllm.v1.attention.backend.AttentionBackend"
BUILDER = "vllm.v1.attention.backend.AttentionMetadataBuilder"


def build(files: dict[str, str]) -> ClassHierarchy:
    """The hierarchy of ``files`` (its modules named as the run names them: `full`)."""
    return ClassHierarchy.build([index_module(textwrap.dedent(text).encode(), path) for path, text in files.items()])


def full(hierarchy: ClassHierarchy, path: str, name: str) -> str:
    """The full name of the class ``name`` of the file ``path`` (a module name guessed from the path depends on
    the folders holding an ``__init__.py``)."""
    return f"{hierarchy.module_name(path)}.{name}"


def test_the_class_scan_knows_every_interface_class_of_the_manifest():
    assert {name.rpartition(".")[2] for name in data.load()["classes"]} == VLLM_INTERFACE_NAMES


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("VAC010", manifest_interface.hook_names() - {"accept_output_buffer"}),
        (
            "VAC011",
            manifest_interface.removed_names() - {"accept_output_buffer", "unified_attention", "unified_mla_attention"}
            | manifest_interface.removed_module_tokens(),
        ),
        ("VAC012", manifest_interface.drifted_names()),
    ],
)
def test_the_rules_tokens_are_the_manifest_s_names(code, expected):
    """A rule holds a copy of its names (listing the rules reads no manifest data): regenerating the manifest with a
    release that removes or changes more must update it."""
    [rule] = select_rules([code])
    assert {token.decode().lstrip(".") for token in rule.tokens} == expected


def test_a_metadata_builder_through_the_project_s_own_base_in_another_file():
    hierarchy = build(
        {
            "plugin/base.py": """
                from vllm.v1.attention.backend import AttentionMetadataBuilder

                class PluginBuilderBase(AttentionMetadataBuilder):
                    def build(self, common_prefix_len, common_attn_metadata): ...
            """,
            "plugin/fast.py": """
                from plugin.base import PluginBuilderBase

                class FastBuilder(PluginBuilderBase):
                    def build_for_drafting(self, common_attn_metadata, draft_index): ...
            """,
        }
    )
    assert hierarchy.vllm_interface(full(hierarchy, "plugin/fast.py", "FastBuilder")) == BUILDER
    assert hierarchy.has_interface_classes("plugin/fast.py")
    assert not hierarchy.is_attention_class(
        full(hierarchy, "plugin/fast.py", "FastBuilder")
    )  # the 0.20 rules' scope is unchanged
    assert hierarchy.scope_class_names() >= {"PluginBuilderBase", "FastBuilder"}
    # The base is completed by its subclass; the subclass, a leaf, inherits `build` from it.
    assert hierarchy.concrete_members(full(hierarchy, "plugin/base.py", "PluginBuilderBase")) is None
    assert hierarchy.concrete_members(full(hierarchy, "plugin/fast.py", "FastBuilder")) == "build,build_for_drafting"


def test_a_project_s_own_abc_of_the_same_name_and_a_fork_s_own_classes_have_no_interface(tmp_path):
    own = build(
        {
            "plugin/abc.py": "import abc\nclass AttentionBackend(abc.ABC): ...\nclass Mine(AttentionBackend): ...\n",
        }
    )
    assert own.vllm_interface(full(own, "plugin/abc.py", "Mine")) is None
    tree = {
        "vllm/__init__.py": "",
        "vllm/v1/__init__.py": "",
        "vllm/v1/attention/__init__.py": "",
        "vllm/v1/attention/backend.py": "class AttentionBackend: ...\n",
        "vllm/v1/attention/flash.py": "from vllm.v1.attention.backend import AttentionBackend\n"
        "class FlashBackend(AttentionBackend): ...\n",
    }
    for relative, text in tree.items():  # on disk: a fork's modules are named by their packages
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    fork = build({str(tmp_path / relative): text for relative, text in tree.items()})
    assert fork.vllm_interface("vllm.v1.attention.flash.FlashBackend") is None
    assert fork.in_run("vllm.v1.attention.backend") and not fork.in_run("vllm.v1.attention.selector")


def test_a_backend_by_its_shape_alone_and_its_subclasses():
    hierarchy = build(
        {
            "plugin/backend.py": """
                import vllm

                class ShapedBackend:
                    @staticmethod
                    def get_name(): ...
                    @staticmethod
                    def get_impl_cls(): ...

                class Sparse(ShapedBackend): ...
            """,
            "other/shaped.py": "class Shaped:\n    def get_name(self): ...\n    def get_impl_cls(self): ...\n",
        }
    )
    assert hierarchy.vllm_interface(full(hierarchy, "plugin/backend.py", "ShapedBackend")) == "~" + BACKEND
    assert hierarchy.vllm_interface(full(hierarchy, "plugin/backend.py", "Sparse")) == "~" + BACKEND
    assert (
        hierarchy.vllm_interface(full(hierarchy, "other/shaped.py", "Shaped")) is None
    )  # its module does not import vLLM
    assert (
        hierarchy.concrete_members(full(hierarchy, "plugin/backend.py", "Sparse")) is None
    )  # no subclass: Python asks nothing of it


def test_a_class_declaring_abstract_methods_is_no_concrete_class():
    hierarchy = build(
        {
            "plugin/impl.py": """
                import abc
                from vllm.v1.attention.backend import AttentionImpl

                class Impl(AttentionImpl):
                    @abc.abstractmethod
                    def prepare(self): ...
            """,
        }
    )
    assert (
        hierarchy.vllm_interface(full(hierarchy, "plugin/impl.py", "Impl")) == "vllm.v1.attention.backend.AttentionImpl"
    )
    assert hierarchy.concrete_members(full(hierarchy, "plugin/impl.py", "Impl")) is None


def test_the_project_s_own_definition_of_a_member_counts():
    hierarchy = build(
        {
            "plugin/backend.py": """
                from vllm.v1.attention.backend import AttentionBackend

                class PluginBackend(AttentionBackend):
                    @staticmethod
                    def get_kv_cache_shape(*args): ...
            """,
        }
    )
    assert hierarchy.run_defines(BACKEND, "get_kv_cache_shape")
    assert not hierarchy.run_defines(BACKEND, "get_kv_cache_stride_order")
    assert not hierarchy.run_defines(BUILDER, "get_kv_cache_shape")


def test_the_class_scan_parses_a_file_whose_classes_derive_from_an_interface_class_or_have_a_backend_s_shape():
    builder = (
        b"from vllm.v1.attention.backend import AttentionMetadataBuilder\nclass B(AttentionMetadataBuilder): ...\n"
    )
    assert quick_index(builder, "b.py", frozenset()) is None
    shaped = b"import vllm\nclass S:\n    def get_impl_cls(self): ...\n"
    assert quick_index(shaped, "s.py", frozenset()) is None
    unrelated = b"import vllm\nclass Config(dict): ...\n"
    assert quick_index(unrelated, "c.py", frozenset()) is not None


def test_a_signature_read_withholds_adding_parameters_and_the_rounds_look_for_the_method():
    files = {
        "plugin/backend.py": """
            from vllm.v1.attention.backend import AttentionBackend

            class PluginBackend(AttentionBackend):
                @classmethod
                def supports_combination(cls, head_size, dtype): ...
        """,
    }
    open_fix = build(files)
    owner = full(open_fix, "plugin/backend.py", "PluginBackend")
    assert open_fix.parameters_withheld(owner, "supports_combination", "x.py") is None
    assert "supports_combination" in open_fix.accounting_terms()
    files["plugin/check.py"] = """
        import inspect
        from plugin.backend import PluginBackend

        def arity():
            return len(inspect.signature(PluginBackend.supports_combination).parameters)
    """
    withheld = build(files)
    reason = withheld.parameters_withheld(owner, "supports_combination", "x.py")
    assert reason is not None and reason.startswith("withheld: ") and "plugin/check.py:6" in reason
    assert "supports_combination" not in withheld.accounting_terms()


def test_a_class_named_as_a_base_is_no_concrete_class_even_alone():
    # A run over some of a project's files (a commit's) may hold its base without the subclasses completing it.
    files = {
        "plugin/base.py": "from vllm.v1.attention.backend import AttentionImpl\n"
        "class PluginImplBase(AttentionImpl): ...\nclass AbstractImpl(AttentionImpl): ...\n"
        "class CacheMixin(AttentionImpl): ...\nclass Impl(AttentionImpl): ...\n",
    }
    hierarchy = build(files)
    assert [
        hierarchy.concrete_members(f"base.{name}") for name in ("PluginImplBase", "AbstractImpl", "CacheMixin")
    ] == [
        None,
        None,
        None,
    ]
    assert hierarchy.concrete_members(full(hierarchy, "plugin/base.py", "Impl")) == ""
