"""The manifest's questions on the shipped data, with facts read in vLLM's released sources (each test says where:
vllm/v1/attention/backend.py unless named)."""

from __future__ import annotations

import pytest

from vllm_attn_compat import manifest

BACKEND = "vllm.v1.attention.backend"
AttentionBackend = f"{BACKEND}.AttentionBackend"
AttentionImpl = f"{BACKEND}.AttentionImpl"
Builder = f"{BACKEND}.AttentionMetadataBuilder"
Metadata = f"{BACKEND}.CommonAttentionMetadata"
Sparse = f"{BACKEND}.SparseMLAAttentionImpl"
LAYERS = "vllm.model_executor.layers.attention"
REGISTRY = "vllm.v1.attention.backends.registry.AttentionBackendEnum"


def test_get_kv_cache_shape_abstract_in_0_27_1_gone_by_0_34_0():
    # 0.27.1: `@staticmethod @abstractmethod def get_kv_cache_shape(`; 0.29.0 and later have no such def.
    assert "get_kv_cache_shape" in manifest.abstract_members("0.27.1", AttentionBackend)
    assert manifest.member("0.34.0", AttentionBackend, "get_kv_cache_shape") is None
    assert manifest.abstract_members("0.34.0", AttentionBackend) == {"get_name", "get_impl_cls", "get_builder_cls"}
    history = manifest.history(AttentionBackend, "get_kv_cache_shape")
    assert (history.added, history.removed) == ("0.19.0", "0.29.0")
    shape = history.states[0][1]
    assert shape is not None and shape.kind == "staticmethod" and shape.abstract
    assert shape.signature is not None
    assert shape.signature.names() == ("num_blocks", "block_size", "num_kv_heads", "head_size", "cache_dtype_str")
    assert shape.signature.parameters[-1] == manifest.Parameter(
        "cache_dtype_str", "POSITIONAL_OR_KEYWORD", "'auto'", "str"
    )


def test_sparse_mla_attention_impl_gone_since_0_26_0():
    # `class SparseMLAAttentionImpl(AttentionImplBase[T], Generic[T])` in 0.25.1, absent from 0.26.0 on.
    assert manifest.class_info("0.25.1", Sparse) is not None
    assert manifest.class_info("0.26.0", Sparse) is None
    assert manifest.class_info("0.27.1", Sparse) is None
    assert manifest.find_class("0.27.1", "SparseMLAAttentionImpl") is None
    removed = {r.name: r for r in manifest.removed_between("0.20.0", "0.27.1")}
    assert removed[Sparse] == manifest.Removal("class", Sparse, "0.26.0", None, None)
    assert not any(name.startswith(f"{Sparse}.") for name in removed)  # its members go with it


def test_seq_lens_cpu_deprecated_with_vllms_message_and_removed_in_0_30_0():
    # `@property @deprecated("... use `seq_lens.cpu()` instead. Will be removed in a future release ...")` from
    # 0.19.0 to 0.29.0.
    history = manifest.history(Metadata, "seq_lens_cpu")
    assert history.deprecated_since == "0.19.0"
    assert history.removed == "0.30.0"
    assert history.deprecated is not None and "use `seq_lens.cpu()` instead" in history.deprecated
    at_0_20 = manifest.member("0.20.0", Metadata, "seq_lens_cpu")
    assert at_0_20 is not None and at_0_20.kind == "property" and at_0_20.deprecated == history.deprecated
    assert manifest.member("0.34.0", Metadata, "seq_lens_cpu") is None
    assert history.successor == manifest.Successor("self.seq_lens.cpu()", "expression", history.successor.source)


def test_forwardable_members_of_the_metadata_on_0_34_0():
    forwardable = manifest.forwardable_members("0.34.0", Metadata)
    assert set(forwardable) == {"seq_lens_cpu", "num_computed_tokens_cpu"}
    derived = forwardable["num_computed_tokens_cpu"]
    assert derived.reason == "removed" and (derived.since, derived.last) == ("0.30.0", "0.29.0")
    assert derived.successor is not None
    assert derived.successor.use == (
        "self.seq_lens.cpu() - (self.query_start_loc_cpu[1:] - self.query_start_loc_cpu[:-1])"
    )
    assert manifest.forwardable_members("0.29.0", Metadata) == {}  # still there: nothing to forward


def test_dead_hooks_of_a_backend_and_its_builder_on_0_34_0():
    backend = manifest.dead_hooks("0.34.0", AttentionBackend)
    assert {"get_kv_cache_shape", "get_kv_cache_stride_order", "get_required_kv_cache_layout"} <= set(backend)
    layout = backend["get_required_kv_cache_layout"]
    assert (layout.reason, layout.since, layout.last) == ("removed", "0.29.0", "0.28.0")
    assert layout.successor is not None and layout.successor.use == "supported_kv_cache_layouts"
    assert "selector.py" in layout.successor.source
    builder = manifest.dead_hooks("0.34.0", Builder)
    assert builder["build_for_drafting"].since == "0.34.0"  # last def in 0.33.0
    assert builder["use_cascade_attention"].since == "0.32.0"  # last def in 0.31.0
    # On the newest release that still had them, none of these is dead.
    assert "build_for_drafting" not in manifest.dead_hooks("0.33.0", Builder)
    assert "get_kv_cache_shape" not in manifest.dead_hooks("0.28.0", AttentionBackend)


def test_a_hook_vllm_has_but_no_longer_uses():
    # 0.34.0 still defines CommonAttentionMetadata.unpadded, and nothing in vllm/ names it any more (0.33.0's
    # spec decode did).
    hook = manifest.dead_hooks("0.34.0", Metadata)["unpadded"]
    assert (hook.reason, hook.since, hook.last) == ("not called", "0.34.0", "0.33.0")
    assert manifest.member("0.34.0", Metadata, "unpadded") is not None
    assert manifest.history(Metadata, "unpadded").unreferenced_since == "0.34.0"


def test_the_0_20_output_buffer_changes():
    # 0.19.1: `output: torch.Tensor | None = None`; 0.20.0: `output: torch.Tensor`.
    before = manifest.signature("0.19.1", AttentionImpl, "forward")
    after = manifest.signature("0.20.0", AttentionImpl, "forward")
    assert before is not None and after is not None
    assert before.parameters[7] == manifest.Parameter("output", "POSITIONAL_OR_KEYWORD", "None", "torch.Tensor | None")
    assert after.parameters[7] == manifest.Parameter("output", "POSITIONAL_OR_KEYWORD", None, "torch.Tensor")
    assert "0.20.0" in manifest.history(AttentionImpl, "forward").changed
    hook = manifest.dead_hooks("0.20.0", AttentionBackend)["accept_output_buffer"]
    assert (hook.kind, hook.since, hook.last) == ("attribute", "0.20.0", "0.19.1")
    # attention.py: direct_register_custom_op(op_name="unified_attention", ...) in 0.19.1, gone in 0.20.0.
    assert "vllm::unified_attention" in manifest.ops("0.19.1")
    assert "vllm::unified_attention" not in manifest.ops("0.20.0")
    with_output = manifest.ops("0.20.0")["vllm::unified_attention_with_output"]
    assert with_output.mutates_args == ("output", "output_block_scale")
    assert with_output.module == f"{LAYERS}.attention"
    assert with_output.signature is not None and with_output.signature.names()[:5] == (
        "query",
        "key",
        "value",
        "output",
        "layer_name",
    )


def test_the_builders_deprecated_parameter():
    # 0.32.0 on: "common_prefix_len: Deprecated and always 0. Kept for compatibility with out-of-tree builders."
    assert manifest.member("0.31.0", Builder, "build").deprecated_parameters == {}
    build = manifest.member("0.32.0", Builder, "build")
    assert build is not None and build.abstract
    assert build.deprecated_parameters == {
        "common_prefix_len": "Deprecated and always 0. Kept for compatibility with out-of-tree builders."
    }


def test_the_registry_enum():
    # registry.py: TURBOQUANT appears in 0.20.0; TREE_ATTN is last in 0.20.2.
    assert manifest.member("0.19.1", REGISTRY, "TURBOQUANT") is None
    turboquant = manifest.member("0.20.0", REGISTRY, "TURBOQUANT")
    assert turboquant is not None and turboquant.kind == "enum_member"
    assert turboquant.value == "'vllm.v1.attention.backends.turboquant_attn.TurboQuantAttentionBackend'"
    assert manifest.history(REGISTRY, "TREE_ATTN").removed == "0.21.0"
    assert manifest.class_info("0.34.0", REGISTRY).kind == "enum"
    assert "vllm.v1.attention.backends.registry.register_backend" in manifest.functions("0.34.0")


def test_classes_through_re_exports_and_their_mro():
    assert manifest.find_class("0.34.0", f"{LAYERS}.Attention") == f"{LAYERS}.attention.Attention"
    assert manifest.module_names("0.34.0", LAYERS)["Attention"] == f"import {LAYERS}.attention.Attention"
    assert manifest.find_class("0.34.0", "MLACommonImpl") == f"{LAYERS}.mla_attention.MLACommonImpl"
    assert manifest.find_class("0.34.0", "NoSuchClass") is None
    assert manifest.mro("0.34.0", f"{LAYERS}.mla_attention.MLACommonImpl") == (
        f"{LAYERS}.mla_attention.MLACommonImpl",
        f"{LAYERS}.mla_attention.MLACommonBaseImpl",
        f"{BACKEND}.MLAAttentionImpl",
        f"{BACKEND}.AttentionImplBase",
    )
    inherited = manifest.members("0.34.0", f"{LAYERS}.mla_attention.MLACommonImpl")
    assert inherited["process_weights_after_loading"].owner in (
        f"{LAYERS}.mla_attention.MLACommonImpl",
        f"{LAYERS}.mla_attention.MLACommonBaseImpl",
        f"{BACKEND}.AttentionImplBase",
    )
    assert set(manifest.own_members("0.34.0", f"{LAYERS}.mla_attention.MLACommonImpl")) < set(inherited)


def test_removed_between_0_27_1_and_0_34_0_names_the_issues_members():
    removed = {r.name: r for r in manifest.removed_between("0.27.1", "0.34.0") if r.what == "member"}
    expected = {
        f"{AttentionBackend}.get_kv_cache_shape": "0.29.0",
        f"{AttentionBackend}.get_kv_cache_block_dim": "0.29.0",
        f"{AttentionBackend}.get_kv_cache_stride_order": "0.29.0",
        f"{AttentionBackend}.indexes_kv_by_block_stride": "0.29.0",
        f"{AttentionBackend}.get_required_kv_cache_layout": "0.29.0",
        f"{Builder}.build_for_drafting": "0.34.0",
        f"{Builder}.use_cascade_attention": "0.32.0",
        f"{Metadata}.seq_lens_cpu": "0.30.0",
        f"{Metadata}.num_computed_tokens_cpu": "0.30.0",
        f"{Metadata}.naive_query_lens": "0.34.0",
    }
    assert {name: removed[name].removed_in for name in expected} == expected
    assert removed[f"{Metadata}.seq_lens_cpu"].deprecated is not None
    with pytest.raises(ValueError, match=r"0\.34\.0 is after 0\.27\.1"):
        manifest.removed_between("0.34.0", "0.27.1")


def test_modules_come_and_go():
    # vllm/model_executor/layers/attention/pcp.py: in 0.27.1 and 0.28.0, not in 0.29.0.
    pcp = f"{LAYERS}.pcp"
    assert pcp in manifest.modules("0.28.0") and pcp not in manifest.modules("0.29.0")
    assert f"{BACKEND}" in manifest.modules("0.19.0")
    assert {r.name for r in manifest.removed_between("0.28.0", "0.29.0") if r.what == "function"} >= {
        f"{pcp}.maybe_gather_indexer_k"
    }
    assert manifest.name_history(LAYERS, "Attention") == (("0.19.0", f"import {LAYERS}.attention.Attention"),)


def test_unknown_members_and_classes():
    with pytest.raises(KeyError, match="get_kv_cache_shape"):
        manifest.history(Builder, "get_kv_cache_shape")
    assert manifest.members("0.34.0", Sparse) == {}
    assert manifest.dead_hooks("0.34.0", Sparse) == {}
    assert manifest.class_info("0.34.0", "no.such.Class") is None
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        manifest.nothing  # noqa: B018
