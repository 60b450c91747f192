"""VAC012 beyond its examples: the fix executed (vLLM's call taken afterwards, every call binding before binding
the same), keyword-only parameters, and what withholds it."""

from __future__ import annotations

import inspect

import pytest

from vllm_attn_compat import manifest
from vllm_attn_compat.codemods.findings import Status, TargetRelease

from rule_testing import run, source

AT_0_34 = TargetRelease("0.34.0", "0.34.0")
IMPORT = "from vllm.v1.attention.backend import AttentionBackend"
BACKEND = source(
    f"""
    {IMPORT}


    class PluginBackend(AttentionBackend):
        @classmethod
        def validate_configuration(
            cls,
            head_size,
            dtype,
            kv_cache_dtype,
            block_size,
            use_mla,
            has_sink,
            use_sparse,
            use_mm_prefix,
            use_per_head_quant_scales,
            device_capability,
            attn_type,
            has_sliding_window=False,
            use_non_causal=False,
            use_batch_invariant=False,
            use_kv_connector=False,
            use_pcp=False,
        ):
            return [name for name, value in sorted(locals().items()) if value is True]

        @staticmethod
        def get_supported_kernel_block_sizes():
            return [16, 32]
    """
)


def _load(text: str) -> type:
    namespace: dict[str, object] = {}
    stand_in = "class AttentionBackend:\n    pass\n"  # vLLM's base adds nothing these methods use
    exec(compile(text.replace(IMPORT, stand_in), "backend.py", "exec"), namespace)
    return namespace["PluginBackend"]  # type: ignore[return-value]


def _vllm_s_call() -> dict[str, object]:
    """The keywords vLLM 0.34's CUDA platform passes (`backend_class.validate_configuration(device_capability=...,
    **attn_selector_config._asdict())`): every parameter of the manifest's signature, by name."""
    signature = manifest.signature("0.34.0", "vllm.v1.attention.backend.AttentionBackend", "validate_configuration")
    assert signature is not None
    return {parameter.name: True for parameter in signature.parameters[1:]}


def test_the_fix_takes_vllm_s_call_and_every_call_that_bound_before_binds_the_same():
    result = run(BACKEND, ["VAC012"], target=AT_0_34)
    assert [f.status for f in result.findings] == [Status.FIXED, Status.FIXED]
    before, after = _load(BACKEND), _load(result.source.decode())
    with pytest.raises(TypeError):
        before.validate_configuration(**_vllm_s_call())
    assert after.validate_configuration(**_vllm_s_call()) == sorted(_vllm_s_call())  # each flag it was given
    old = [True] * 11
    assert after.validate_configuration(*old) == before.validate_configuration(*old)
    assert after.validate_configuration(*old, use_pcp=True) == before.validate_configuration(*old, use_pcp=True)
    assert after.get_supported_kernel_block_sizes() == before.get_supported_kernel_block_sizes() == [16, 32]
    assert after.get_supported_kernel_block_sizes(None) == [16, 32]  # 0.31's `kv_cache_spec`
    added = list(inspect.signature(after.validate_configuration).parameters)[-3:]
    assert added == ["use_adaptive_verification", "use_dcp", "use_rswa"]
    assert "    use_pcp=False,\n        use_adaptive_verification=False,\n" in result.source.decode()


def test_a_use_reading_the_signature_withholds_the_fix_naming_it():
    reader = (
        "import inspect\nfrom plugin.backend import PluginBackend\n\n"
        "ARITY = inspect.signature(PluginBackend.validate_configuration)\n"
    )
    result = run(BACKEND, ["VAC012"], path="plugin/backend.py", others=[("plugin/probe.py", reader)], target=AT_0_34)
    validate = result.findings[0]
    assert validate.status is Status.UNSAFE_FIX_AVAILABLE
    assert validate.message.endswith(
        "withheld: `PluginBackend.validate_configuration` at plugin/probe.py:4 reads its signature"
    )
    assert result.findings[1].status is Status.FIXED  # another method: its own uses decide


def test_keyword_only_parameters_go_after_a_star():
    text = source(
        """
        from vllm.v1.attention.backend import MLAAttentionImpl


        class Impl(MLAAttentionImpl):
            def do_kv_cache_update(self, kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale, *, x=1):
                return x
        """
    )
    result = run(text, ["VAC012"], target=AT_0_34)
    assert "k_scale, skip_scale=False, *, x=1):" in result.source.decode()


def test_an_override_written_before_0_24_gets_the_parameter_0_24_added():
    text = source(
        """
        from vllm.v1.attention.backend import MLAAttentionImpl


        class Impl(MLAAttentionImpl):
            def forward_mha(self, q, kv_c_normed, k_pe, kv_c_and_k_pe_cache, attn_metadata, k_scale, output):
                return output
        """
    )
    [finding] = run(text, ["VAC012"], target=AT_0_34).findings
    assert finding.status is Status.FIXED and finding.release == "0.24.0"  # `output_scale=None` added
    assert run(text, ["VAC012"], target=TargetRelease("0.23.0", "0.23.0")).findings == []


def test_a_comment_among_the_parameters_keeps_them_as_they_are():
    # Found by generated modules: appending after `output=None` and its noqa comment for VAC002 moved the comment off
    # its line, and the next run fixed what it had suppressed. A parameter list holding a comment is reported, never
    # rewritten.
    text = source(
        """
        from vllm.v1.attention.backend import AttentionImpl


        class Impl(AttentionImpl):
            def forward(
                self,
                layer,
                query,
                key,
                value,
                kv_cache,
                attn_metadata,
                output=None  # noqa: VAC002
            ):
                return output
        """
    )
    result = run(text, ["VAC012"], target=AT_0_34)
    assert result.source.decode() == text
    [finding] = result.findings
    assert finding.status is Status.MANUAL and finding.message.endswith(
        "(no fix: a comment among the parameters would move)"
    )


def test_a_multi_line_list_without_a_trailing_comma_keeps_its_closing_line():
    text = source(
        """
        from vllm.v1.attention.backend import MLAAttentionImpl


        class Impl(MLAAttentionImpl):
            def do_kv_cache_update(
                self,
                kv_c_normed,
                k_pe,
                kv_cache,
                slot_mapping,
                kv_cache_dtype,
                k_scale
            ):
                pass
        """
    )
    fixed = run(text, ["VAC012"], target=AT_0_34).source.decode()
    assert fixed == text.replace("        k_scale\n", "        k_scale,\n        skip_scale=False\n")


# How vLLM calls the hooks the tests below override, as its call sites do (tests/manifest/test_vllm_call_sites.py).
def _validate_call(cls: type) -> object:
    return cls.validate_configuration(**_vllm_s_call())


def _combination_call(cls: type) -> object:
    return cls.supports_combination(*[True] * 9)  # nine positional arguments, `use_mm_prefix` eighth


def _forward_call(impl: object) -> object:
    layer = query = key = value = kv_cache = attn_metadata = output = object()
    return impl.forward(layer, query, key, value, kv_cache, attn_metadata, output=output)  # type: ignore[attr-defined]


def _backend(body: str) -> str:
    return source(f"{IMPORT}\n\n\nclass PluginBackend(AttentionBackend):\n{body}")


def test_validate_configuration_is_held_to_the_names_vllm_passes_whatever_their_order():
    # vLLM names every argument: an override in its own order takes the call; one taking parameters vLLM never
    # passes (vllm-mlx's `num_heads`, `num_kv_heads`, its **kwargs taking the rest) does not.
    parameters = ", ".join(reversed(list(_vllm_s_call())))
    in_any_order = _backend(
        f"    @classmethod\n    def validate_configuration(cls, {parameters}):\n        return []\n"
    )
    assert run(in_any_order, ["VAC012"], target=AT_0_34).findings == []
    assert _validate_call(_load(in_any_order)) == []
    its_own = _backend(
        "    @staticmethod\n"
        "    def validate_configuration(num_heads, head_size, num_kv_heads, dtype, block_size, **kwargs):\n"
        "        return []\n"
    )
    [finding] = run(its_own, ["VAC012"], target=AT_0_34).findings
    assert finding.status is Status.MANUAL
    assert finding.message.startswith("vLLM never passes `num_heads`, `num_kv_heads` (no default)")
    with pytest.raises(TypeError, match="num_heads"):
        _validate_call(_load(its_own))


def test_an_override_lacking_a_positional_parameter_is_told_which():
    # vLLM 0.24 added `use_mm_prefix` before `device_capability`: an override of 0.23's eight parameters takes
    # nine positional arguments nowhere (Sandermage's TurboQuant overlay, vLLM's own backends before 0.24).
    eight = "head_size, dtype, kv_cache_dtype, block_size, use_mla, has_sink, use_sparse, device_capability"
    text = _backend(f"    @classmethod\n    def supports_combination(cls, {eight}):\n        return None\n")
    [finding] = run(text, ["VAC012"], target=AT_0_34).findings
    assert finding.status is Status.MANUAL
    assert finding.message == (
        "`AttentionBackend.supports_combination` (changed in vLLM 0.24) is called with 9 positional arguments and "
        "this override takes 8: it lacks `use_mm_prefix`"
    )
    with pytest.raises(TypeError, match="positional arguments"):
        _combination_call(_load(text))


def test_an_impl_whose_positional_parameters_fill_output_is_told_what_it_lacks():
    # vllm-mlx's impl: no `layer`, so vLLM's six positional arguments reach its `output`, which vLLM names too.
    text = source(
        """
        from vllm.v1.attention.backend import AttentionImpl


        class PluginImpl(AttentionImpl):
            def forward(self, query, key, value, kv_cache=None, attn_metadata=None, output=None, **kwargs):
                return query
        """
    )
    [finding] = run(text, ["VAC012"], target=AT_0_34).findings
    assert finding.status is Status.MANUAL
    assert finding.message.endswith(
        "is called with 6 positional arguments, filling its `output`, which vLLM names too: it lacks `layer`"
    )
    namespace: dict[str, object] = {}
    stand_in = "class AttentionImpl:\n    pass\n"
    exec(
        compile(text.replace("from vllm.v1.attention.backend import AttentionImpl", stand_in), "impl.py", "exec"),
        namespace,
    )
    with pytest.raises(TypeError, match="multiple values for argument 'output'"):
        _forward_call(namespace["PluginImpl"]())  # type: ignore[operator]


def test_an_impl_without_output_gets_no_fix_that_leaves_vllm_s_call_failing():
    # vLLM-Kunlun's impl takes `k_scale=1.0, v_scale=1.0` where vLLM passes `output=`: appending `output_scale` and
    # `output_block_scale` alone (what the rule did when it took `output` for a positional argument) left the
    # TypeError on `output` in place.
    text = source(
        """
        from vllm.v1.attention.backend import AttentionImpl


        class PluginImpl(AttentionImpl):
            def forward(self, layer, query, key, value, kv_cache, attn_metadata, k_scale=1.0, v_scale=1.0):
                return query
        """
    )
    result = run(text, ["VAC012"], target=AT_0_34, unsafe=True)
    [finding] = result.findings
    assert finding.status is Status.MANUAL
    assert "is called with `output`, `output_scale`, `output_block_scale`" in finding.message
    assert result.source.decode() == text


def test_a_builder_s_decode_hook_is_held_to_the_keywords_of_the_target_release():
    # ROCm ATOM's `_build_decode` predates 0.31's `max_query_len=`, which vLLM passes by name: its positions match,
    # its names do not.
    text = source(
        """
        from vllm.v1.attention.backends.mla.common import MLACommonMetadataBuilder


        class Builder(MLACommonMetadataBuilder):
            def _build_decode(
                self,
                block_table_tensor,
                seq_lens_device,
                max_seq_len,
                query_start_loc_cpu,
                query_start_loc_device,
                num_decode_tokens,
                dcp_tot_seq_lens_device,
                causal=True,
            ):
                return causal
        """
    )
    [finding] = run(text, ["VAC012"], target=AT_0_34).findings
    assert finding.status is Status.MANUAL and finding.release == "0.31.0"
    assert "is called with `max_query_len`, which this override cannot take" in finding.message
    assert run(text, ["VAC012"], target=TargetRelease("0.30.0", "0.30.0")).findings == []
