"""What a release asks of a class deriving from its interface (`manifest.interface`), on the shipped data, with
facts read in vLLM's released sources (vllm/v1/attention/backend.py unless named)."""

from __future__ import annotations

import pytest

from vllm_attn_compat import manifest
from vllm_attn_compat.manifest import interface

BACKEND = "vllm.v1.attention.backend"
AttentionBackend = f"{BACKEND}.AttentionBackend"
Builder = f"{BACKEND}.AttentionMetadataBuilder"
Metadata = f"{BACKEND}.CommonAttentionMetadata"
MLAImpl = f"{BACKEND}.MLAAttentionImpl"
MLA = "vllm.model_executor.layers.attention.mla_attention"


@pytest.mark.parametrize(
    ("dotted", "expected"),
    [
        (AttentionBackend, AttentionBackend),  # as the manifest names it
        ("vllm.model_executor.layers.attention.Attention", "vllm.model_executor.layers.attention.attention.Attention"),
        ("vllm.attention.backends.abstract.AttentionBackend", AttentionBackend),  # the old layout, moved since
        ("vllm.v1.attention.backends.mla.common.MLACommonBackend", f"{MLA}.MLACommonBackend"),
        ("vllm.v1.attention.backends.flash_attn.FlashAttentionBackend", None),  # an in-tree backend: not the interface
        ("plugin.attention.AttentionBackend", None),  # a project's own class of the same name
        ("vllm.config.AttentionBackend", None),  # no attention module of vLLM's
    ],
)
def test_a_project_s_import_path_resolves_to_the_manifest_s_class(dotted, expected):
    assert interface.resolve_class(dotted) == expected


def test_dead_overrides_of_a_builder_release_by_release():
    # 0.32.0 removed `use_cascade_attention` and `set_kernel_block_size`, 0.34.0 `build_for_drafting`.
    assert interface.dead_overrides("0.27.1", [Builder]) == {}
    at_0_32 = interface.dead_overrides("0.32.0", [Builder])
    assert set(at_0_32) == {"use_cascade_attention", "set_kernel_block_size"}
    assert at_0_32["use_cascade_attention"].since == "0.32.0"
    at_0_34 = interface.dead_overrides("0.34.0", [Builder])
    assert at_0_34["build_for_drafting"].reason == "removed" and at_0_34["build_for_drafting"].since == "0.34.0"


def test_a_hook_another_vllm_base_still_has_is_alive():
    # MLACommonImpl's own `forward_mha` went in 0.26.0; MLAAttentionImpl, its base, still declares it.
    assert "forward_mha" not in interface.dead_overrides("0.34.0", [f"{MLA}.MLACommonImpl"])
    assert "forward_mha" not in interface.dead_overrides("0.34.0", [f"{MLA}.MLACommonImpl", MLAImpl])


def test_dead_kv_cache_hooks_name_what_took_over():
    dead = interface.dead_overrides("0.34.0", [AttentionBackend])
    assert dead["get_kv_cache_shape"].successor is not None
    assert dead["get_kv_cache_shape"].successor.use == "supported_kv_cache_layouts"
    assert "__init__" not in dead and "get_name" not in dead


def test_a_removed_name_and_one_a_later_release_added():
    removal = interface.removed_name("0.34.0", BACKEND, "SparseMLAAttentionImpl")
    assert removal == interface.RemovedName(BACKEND, "SparseMLAAttentionImpl", "class", "0.26.0")
    assert interface.removed_name("0.25.1", BACKEND, "SparseMLAAttentionImpl") is None
    assert interface.removed_name("0.34.0", BACKEND, "AttentionBackend") is None
    assert interface.removed_name("0.34.0", "vllm.not_in_the_manifest", "X") is None
    # pcp.py's functions arrived in 0.26.0 and went in 0.29.0: at 0.20.0 they are not yet, not gone.
    assert (
        interface.removed_name("0.20.0", "vllm.model_executor.layers.attention.pcp", "maybe_gather_indexer_k") is None
    )


def test_a_removed_member_with_the_expression_vllm_names():
    hook = interface.removed_member("0.34.0", Metadata, "seq_lens_cpu")
    assert hook is not None and hook.since == "0.30.0"
    assert hook.successor is not None and hook.successor.use == "self.seq_lens.cpu()"
    assert interface.removed_member("0.29.0", Metadata, "seq_lens_cpu") is None
    assert interface.removed_member("0.34.0", Metadata, "seq_lens") is None


def test_the_base_member_and_the_release_that_last_changed_its_parameters():
    member = interface.base_member("0.34.0", [AttentionBackend], "validate_configuration")
    assert member is not None and member.owner == AttentionBackend and member.kind == "classmethod"
    assert interface.last_change(AttentionBackend, "validate_configuration", "0.34.0") == "0.30.0"  # `use_rswa`
    assert interface.last_change(AttentionBackend, "validate_configuration", "0.29.0") == "0.29.0"  # `use_dcp`
    assert interface.last_change(AttentionBackend, "get_name", "0.34.0") is None


def test_abstract_members_left_to_a_subclass():
    missing = interface.missing_abstract("0.34.0", [AttentionBackend], ["get_name", "get_impl_cls"])
    assert set(missing) == {"get_builder_cls"}
    assert missing["get_builder_cls"].owner == AttentionBackend
    # 0.27.1 still had the abstract `get_kv_cache_shape`.
    assert "get_kv_cache_shape" in interface.missing_abstract("0.27.1", [AttentionBackend], ["get_name"])
    # MLACommonImpl implements `forward` and `forward_mha` for its subclasses: `forward_mqa` is left.
    assert set(interface.missing_abstract("0.34.0", [f"{MLA}.MLACommonImpl"], ["__init__"])) == {"forward_mqa"}


def test_a_backend_shaped_as_one_of_vllms_own_lacks_nothing_vllm_asks_for():
    # vLLM 0.34's backends of no attention layer (Mamba's, the indexers') go without `get_impl_cls`: vLLM never
    # instantiates a backend, and only an attention layer asks for its impl.
    assert interface.missing_abstract("0.34.0", [AttentionBackend], ["get_name", "get_builder_cls"]) == {}
    shaped = interface.shaped_like_vllms_own("0.34.0", [interface.Abstract("get_impl_cls", AttentionBackend, "0.19.0")])
    assert shaped is not None and interface.left_out("0.34.0")[shaped] == {f"{AttentionBackend}.get_impl_cls"}
    # Up to 0.28 they lacked `get_kv_cache_shape` too; an attention backend lacking it alone is like none of them.
    assert interface.missing_abstract("0.27.1", [AttentionBackend], ["get_name", "get_builder_cls"]) == {}
    lacking_shape = interface.missing_abstract(
        "0.27.1", [AttentionBackend], ["get_name", "get_builder_cls", "get_impl_cls"]
    )
    assert set(lacking_shape) == {"get_kv_cache_shape"}
    # A class vLLM instantiates needs every abstract member, whatever vLLM's own classes lack: vLLM 0.22's DeepSeek V4
    # sparse impl goes without `__init__` (it is used through class methods), a plugin's impl would not construct.
    sparse = f"{BACKEND}.SparseMLAAttentionImpl"
    assert any(f"{sparse}.__init__" in lacking for lacking in interface.left_out("0.22.0").values())
    assert "__init__" in interface.missing_abstract("0.22.0", [sparse], ["forward_mqa"])


def test_the_names_the_rules_look_for():
    hooks, removed, drifted = interface.hook_names(), interface.removed_names(), interface.drifted_names()
    assert {"get_kv_cache_shape", "build_for_drafting", "use_cascade_attention", "unpadded"} <= hooks
    assert {"SparseMLAAttentionImpl", "seq_lens_cpu", "unified_attention"} <= removed
    assert {"validate_configuration", "supports_combination", "forward_mha"} <= drifted
    assert "__init__" not in hooks | drifted and "get_name" not in hooks | removed
    # Each name of each set is one some release's data shows so.
    releases = manifest.releases()
    assert all(
        any(
            name in interface.dead_overrides(release, [cls])
            for release in releases
            for cls in manifest.classes(release)
        )
        for name in {"get_kv_cache_shape", "unpadded"}
    )
