"""VAC010 beyond its examples: across files, several vLLM bases, noqa, one finding per override at its `def`."""

from __future__ import annotations

from vllm_attn_compat.codemods.findings import Status, TargetRelease

from rule_testing import run, source

AT_0_34 = TargetRelease("0.34.0", "0.34.0")

BASE = """
from vllm.v1.attention.backend import AttentionBackend, AttentionMetadataBuilder


class PluginBackendBase(AttentionBackend):
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (2, num_blocks, block_size, num_kv_heads, head_size)
"""
SUBCLASS = """
from plugin.base import PluginBackendBase


class FastBackend(PluginBackendBase):
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension=False):  # noqa: VAC010 - the runner calls it
        return (0, 1, 2, 3, 4)

    def helper(self):
        return self.get_kv_cache_shape(1, 16, 8, 128)
"""


def test_each_override_at_its_def_line_through_a_base_in_another_file():
    result = run(SUBCLASS, ["VAC010"], path="plugin/fast.py", others=[("plugin/base.py", BASE)], target=AT_0_34)
    assert [(f.line, f.column, f.status, f.release) for f in result.findings] == [
        (6, 9, Status.MANUAL, "0.29.0"),
        (10, 9, Status.SUPPRESSED, "0.29.0"),
    ]
    assert result.findings[0].message == (
        "`get_kv_cache_shape` is dead: vLLM 0.29 removed `AttentionBackend.get_kv_cache_shape`; override "
        "`supported_kv_cache_layouts` instead"
    )
    base = run(BASE, ["VAC010"], path="plugin/base.py", others=[("plugin/fast.py", SUBCLASS)], target=AT_0_34)
    assert [f.line for f in base.findings] == [6]  # the base's own override too


def test_a_release_that_still_calls_the_hook_reports_nothing():
    result = run(SUBCLASS, ["VAC010"], path="plugin/fast.py", others=[("plugin/base.py", BASE)],
                 target=TargetRelease("0.28.0", "0.28.0"))  # fmt: skip
    assert result.findings == []


def test_a_hook_vllm_keeps_but_no_longer_calls():
    text = source(
        """
        from vllm.v1.attention.backend import CommonAttentionMetadata


        class PluginMetadata(CommonAttentionMetadata):
            def unpadded(self, num_actual_tokens, num_actual_reqs):
                return self
        """
    )
    [finding] = run(text, ["VAC010"], target=AT_0_34).findings
    assert finding.message == "`unpadded` is dead: vLLM calls `CommonAttentionMetadata.unpadded` no more since 0.34"
    assert run(text, ["VAC010"], target=TargetRelease("0.33.0")).findings == []


def test_methods_of_nested_functions_and_classes_without_vllm_bases_are_left_alone():
    text = source(
        """
        from vllm.v1.attention.backend import AttentionBackend


        def get_kv_cache_shape():
            return ()


        class Helper:
            def get_kv_cache_shape(self):
                return ()


        class Backend(AttentionBackend):
            def make(self):
                def get_kv_cache_shape():
                    return ()

                return get_kv_cache_shape
        """
    )
    assert run(text, ["VAC010"], target=AT_0_34).findings == []


def test_the_default_target_is_the_newest_release():
    assert [f.release for f in run(BASE, ["VAC010"], path="plugin/base.py").findings] == ["0.29.0"]
