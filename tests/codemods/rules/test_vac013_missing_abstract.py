"""VAC013 beyond its examples: what the project's classes in other files implement counts, and only leaves."""

from __future__ import annotations

from vllm_attn_compat.codemods.findings import TargetRelease

from rule_testing import run, source

BASE = source(
    """
    from vllm.v1.attention.backend import AttentionImpl


    class PluginImplBase(AttentionImpl):
        def __init__(self, num_heads, head_size, scale):
            self.scale = scale
    """
)
LEAF = source(
    """
    from plugin.base import PluginImplBase


    class FastImpl(PluginImplBase):
        pass
    """
)


def test_the_base_in_another_file_implements_part_the_leaf_is_reported_for_the_rest():
    [finding] = run(LEAF, ["VAC013"], path="plugin/fast.py", others=[("plugin/base.py", BASE)]).findings
    assert (finding.line, finding.column) == (4, 7)
    assert finding.message == "`FastImpl` does not implement `AttentionImpl.forward`, abstract in vLLM 0.34"
    assert run(BASE, ["VAC013"], path="plugin/base.py", others=[("plugin/fast.py", LEAF)]).findings == []


def test_a_release_that_made_a_member_abstract_is_named_for_the_summary():
    # `get_kv_cache_shape` was abstract until 0.28.1; 0.29.0 removed it.
    text = source(
        """
        from vllm.v1.attention.backend import AttentionBackend


        class Backend(AttentionBackend):
            @staticmethod
            def get_name():
                return "B"

            @staticmethod
            def get_impl_cls():
                return object

            @staticmethod
            def get_builder_cls():
                return object
        """
    )
    assert run(text, ["VAC013"], target=TargetRelease("0.34.0", "0.34.0")).findings == []
    [finding] = run(text, ["VAC013"], target=TargetRelease("0.28.0", "0.28.0")).findings
    assert "`AttentionBackend.get_kv_cache_shape`" in finding.message and finding.release == "0.19.0"
