"""The forwarders for members vLLM removed after saying what to use instead, and the dead-override check, on
stand-ins for vLLM's classes (the real vLLM's: test_vllm_dead_overrides.py)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from vllm_attn_compat import manifest
from vllm_attn_compat.compat import DeadOverrideWarning, VllmAttnCompatDeprecationWarning
from vllm_attn_compat.compat.dead_overrides import DeadOverrides
from vllm_attn_compat.compat.removed_members import FORWARDERS, RemovedMember, install

BACKEND = "vllm.v1.attention.backend"


def test_every_member_the_manifest_says_how_to_forward_has_a_forwarder_computing_what_it_says():
    stated = {}
    for release in manifest.releases():
        for cls in manifest.classes(release):
            for name, hook in manifest.forwardable_members(release, cls).items():
                stated[(hook.owner, name)] = hook.successor.use
    assert stated, "the manifest states no equivalent for any removed member: the oracle is empty"
    assert {key: forwarder.expression for key, forwarder in FORWARDERS.items()} == stated


def _metadata_class(**members):
    """A stand-in for vLLM's CommonAttentionMetadata (same module and name), with ``members`` in its body."""

    @dataclasses.dataclass
    class CommonAttentionMetadata:
        query_start_loc_cpu: torch.Tensor
        seq_lens: torch.Tensor

    CommonAttentionMetadata.__module__ = BACKEND
    CommonAttentionMetadata.__qualname__ = "CommonAttentionMetadata"
    for name, value in members.items():
        setattr(CommonAttentionMetadata, name, value)
    return CommonAttentionMetadata


def test_forwarders_read_as_vllm_said_and_warn_once_per_call_site():
    cls = _metadata_class()
    assert sorted(install(cls, "0.34.0")) == [
        "CommonAttentionMetadata.num_computed_tokens_cpu",
        "CommonAttentionMetadata.seq_lens_cpu",
    ]
    assert install(cls, "0.34.0") == []  # installed once
    metadata = cls(query_start_loc_cpu=torch.tensor([0, 2, 3]), seq_lens=torch.tensor([5, 3]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert torch.equal(metadata.seq_lens_cpu, torch.tensor([5, 3]))
        assert torch.equal(metadata.num_computed_tokens_cpu, torch.tensor([3, 2]))
    messages = [str(w.message) for w in caught if w.category is VllmAttnCompatDeprecationWarning]
    assert len(messages) == 2
    assert messages[0].startswith("`CommonAttentionMetadata.seq_lens_cpu` was removed in vLLM 0.30.0; read ")
    assert "(rule VAC011)" in messages[0]


@pytest.mark.parametrize("release", ["0.29.0", "0.20.0"])
def test_nothing_is_forwarded_where_the_release_still_has_the_member(release):
    assert install(_metadata_class(), release) == []


def test_a_member_the_class_still_has_is_never_replaced():
    own = property(lambda self: "vLLM's own")
    cls = _metadata_class(seq_lens_cpu=own)
    assert install(cls, "0.34.0") == ["CommonAttentionMetadata.num_computed_tokens_cpu"]
    assert vars(cls)["seq_lens_cpu"] is own and isinstance(vars(cls)["num_computed_tokens_cpu"], RemovedMember)


def _backend_hierarchy():
    class AttentionBackend:  # a stand-in for vLLM's base, where the manifest finds it
        pass

    AttentionBackend.__module__, AttentionBackend.__qualname__ = BACKEND, "AttentionBackend"

    class PluginBackend(AttentionBackend):
        @staticmethod
        def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):
            return (2, num_blocks, block_size, num_kv_heads, head_size)

        def get_name(self):
            return "CUSTOM"

    return PluginBackend


def test_a_dead_override_is_named_at_its_def_once():
    plugin = _backend_hierarchy()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DeadOverrides("0.34.0").check_class(plugin)
        DeadOverrides("0.34.0").check_class(plugin)
    (warning,) = caught
    assert warning.category is DeadOverrideWarning
    assert str(warning.message).startswith(
        "`PluginBackend.get_kv_cache_shape` overrides a hook that is dead: vLLM 0.34.0 no longer has "
        "`AttentionBackend.get_kv_cache_shape` (removed in 0.29.0)"
    )
    assert "`supported_kv_cache_layouts`" in str(warning.message)
    assert warning.lineno == vars(plugin)["get_kv_cache_shape"].__func__.__code__.co_firstlineno


def test_an_override_of_a_hook_the_release_still_calls_is_not_named():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DeadOverrides("0.28.0").check_class(_backend_hierarchy())
    assert caught == []


def test_a_class_deriving_from_nothing_vllm_has_is_not_checked():
    class Unrelated:
        def get_kv_cache_shape(self):
            return ()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DeadOverrides("0.34.0").check_class(Unrelated)
    assert caught == []
