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
