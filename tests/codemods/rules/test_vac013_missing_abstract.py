"""VAC013 beyond its examples: what the project's classes in other files implement counts, and only leaves."""

from __future__ import annotations

import copy

from vllm_attn_compat.codemods.findings import TargetRelease
from vllm_attn_compat.manifest import data

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


_COMPLETE_BUT_KV_CACHE_SHAPE = source(
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


def test_a_member_abstract_since_the_oldest_release_known_is_blamed_on_no_release():
    # `get_kv_cache_shape` was abstract from (at or before) 0.19.0, the manifest's first release, until 0.29.0.
    assert run(_COMPLETE_BUT_KV_CACHE_SHAPE, ["VAC013"], target=TargetRelease("0.34.0", "0.34.0")).findings == []
    [finding] = run(_COMPLETE_BUT_KV_CACHE_SHAPE, ["VAC013"], target=TargetRelease("0.28.0", "0.28.0")).findings
    assert "`AttentionBackend.get_kv_cache_shape`" in finding.message and finding.release is None


def test_a_release_that_made_a_member_abstract_is_named_for_the_summary(monkeypatch):
    # No member of the shipped manifest turned abstract after 0.19.0: a copy of it where one did at 0.25.0.
    loaded = copy.deepcopy(data.load())
    members = loaded["classes"]["vllm.v1.attention.backend.AttentionBackend"]["members"]
    [[_, state], removal] = members["get_kv_cache_shape"]
    members["get_kv_cache_shape"] = [["0.19.0", {**state, "abstract": False}], ["0.25.0", state], removal]
    monkeypatch.setitem(data._loaded, "data", loaded)
    target = TargetRelease("0.28.0", "0.28.0")
    [finding] = run(_COMPLETE_BUT_KV_CACHE_SHAPE, ["VAC013"], target=target).findings
    assert finding.release == "0.25.0"
    assert run(_COMPLETE_BUT_KV_CACHE_SHAPE, ["VAC013"], target=TargetRelease("0.24.0", "0.24.0")).findings == []
