"""VAC010: report an override of a hook the target vLLM release no longer has or calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm_attn_compat.codemods.engine.rule import Example, Rule, class_source, interface_methods, short_release
from vllm_attn_compat.codemods.findings import FixSafety, Status

if TYPE_CHECKING:
    import libcst as cst

    from vllm_attn_compat.codemods.engine.rule import Questions
    from vllm_attn_compat.manifest import DeadHook

_BACKEND = """\
    from vllm.v1.attention.backend import AttentionBackend


    class MyBackend(AttentionBackend):
"""
_BUILDER = """\
    from vllm.v1.attention.backend import AttentionMetadataBuilder


    class MyBuilder(AttentionMetadataBuilder):
"""
# The hooks another rule handles: VAC004 reports `accept_output_buffer`, dead since vLLM 0.20.
_HANDLED_ELSEWHERE = frozenset({"accept_output_buffer"})


def describe(hook: DeadHook, name: str) -> str:
    """One short line: what vLLM did to the hook, and what took over where the manifest knows."""
    owner = f"{hook.owner.rpartition('.')[2]}.{name}"
    if hook.reason == "removed":
        said = f"`{name}` is dead: vLLM {short_release(hook.since)} removed `{owner}`"
    else:
        said = f"`{name}` is dead: vLLM calls `{owner}` no more since {short_release(hook.since)}"
    if hook.successor is not None and hook.successor.kind == "member":
        return f"{said}; override `{hook.successor.use}` instead"
    if hook.deprecated:
        return f"{said}; vLLM: {_first_sentence(hook.deprecated)}"
    return said


def _first_sentence(text: str) -> str:
    sentence = text.strip().split(". ", 1)[0].rstrip(".")
    return sentence if len(sentence) <= 90 else sentence[:87] + "..."


class DeadOverride(Rule):
    """vLLM's interface changes from release to release: a hook it once called on a backend, an impl, a metadata
    builder or a layer is removed, or kept but no longer called. An override of it is then dead code, and
    silently so: vLLM 0.29 stopped calling ``AttentionBackend.get_kv_cache_shape`` (it allocates the KV cache from
    the layouts ``supported_kv_cache_layouts`` declares), 0.34 ``AttentionMetadataBuilder.build_for_drafting``,
    so a plugin's layout or drafting logic there is ignored while everything seems to work.

    The rule reports each method, in a class deriving from vLLM's interface classes, that overrides a hook the
    target release (``--target-version``, the project's vLLM requirement or the newest release known) no longer
    has or no longer uses, at its ``def`` line, with the release that removed it (or stopped calling it) and what
    took over where vLLM's sources say so (``supported_kv_cache_layouts``), else vLLM's deprecation message.
    What vLLM's interface holds, release by release, is the manifest's (docs/attention-api.md). A class is
    checked where its provenance reaches one of vLLM's interface classes (``AttentionBackend``,
    ``AttentionImpl``, ``MLAAttentionImpl``, ``AttentionMetadataBuilder``, ``CommonAttentionMetadata``, the
    attention layers, ``MLACommonImpl``...) imported from vLLM, directly or through the project's own base
    classes in any file of the run, or where vLLM uses it as a backend by its shape (it defines ``get_name`` and
    ``get_impl_cls``); never a project's own ABC of the same name. A hook the class still inherits from another
    of its vLLM bases is not dead. Code of the project that calls the method itself still runs it: the finding
    says that vLLM does not.

    No fix: move the logic to what took over (``supported_kv_cache_layouts``, ``update_draft_decode_metadata``),
    or delete the method once nothing of the project calls it. ``# noqa: VAC010`` on the ``def`` line keeps a
    method the project calls itself.
    """

    code = "VAC010"
    name = "dead-override"
    summary = "Report a method overriding a hook the target vLLM release no longer has or calls."
    fix_safety = FixSafety.DISPLAY_ONLY
    scoped = interface = True
    # Every name some release removed or stopped calling (`manifest.interface.hook_names`; a test holds the copy to
    # the manifest), less the flag VAC004 handles.
    tokens = (
        b"ChunkedContextMetadata",
        b"_build_fi_prefill_wrappers",
        b"_compute_prefill_context",
        b"_concat_k_nope_k_pe",
        b"_context_parallel_compute_prefill_context",
        b"_flash_attn_varlen_diff_headdims",
        b"_init_turboquant_buffers",
        b"_num_computed_tokens_cpu",
        b"_run_prefill_context_chunk_cudnn",
        b"_run_prefill_context_chunk_fa",
        b"_run_prefill_context_chunk_fi",
        b"_run_prefill_context_chunk_trtllm_ragged",
        b"_run_prefill_new_tokens_cudnn",
        b"_run_prefill_new_tokens_fa",
        b"_run_prefill_new_tokens_fi",
        b"_run_prefill_new_tokens_trtllm_ragged",
        b"_seq_lens_cpu",
        b"bind_kv_cache",
        b"build_for_drafting",
        b"calc_kv_scales",
        b"clear_override",
        b"cudnn_workspace",
        b"dcp_local_seq_lens_cpu",
        b"decode_max_query_len",
        b"do_kv_cache_update",
        b"forward_mha",
        b"forward_mqa",
        b"fused_output_quant_supported",
        b"get_kv_cache_block_dim",
        b"get_kv_cache_shape",
        b"get_kv_cache_stride_order",
        b"get_required_kv_cache_layout",
        b"hisparse_cache",
        b"hisparse_supports_multi_token_decode",
        b"indexes_kv_by_block_stride",
        b"is_overridden",
        b"naive_query_lens",
        b"num_computed_tokens_cpu",
        b"prefill_chunks",
        b"prefill_main",
        b"query_seq_lens",
        b"replayssm_decode_base_cpu",
        b"seq_lens_cpu",
        b"set_kernel_block_size",
        b"supports_dcp",
        b"unpadded",
        b"use_cascade_attention",
        b"workspace_buffer",
    )
    # A file whose classes deriving from vLLM's interface override no hook the target release ignores needs no
    # parse.
    narrows = True

    @classmethod
    def acts_in(cls, facts: Any, run: Questions, path: str, release: str) -> bool:
        from vllm_attn_compat.manifest.interface import dead_overrides

        return any(
            set(names) & (dead_overrides(release, classes).keys() - _HANDLED_ELSEWHERE)
            for classes, names in interface_methods(run, path)
        )

    reads_statements = ()  # the `def` line alone
    examples = (
        Example(
            "a hook vLLM 0.29 removed, and what took over",
            class_source(
                _BACKEND,
                """
                @staticmethod
                def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
                    return (2, num_blocks, block_size, num_kv_heads, head_size)
                """,
            ),
            findings=(Status.MANUAL,),
            target="0.34",
        ),
        Example(
            "the same hook on a release that still calls it",
            class_source(
                _BACKEND,
                """
                @staticmethod
                def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
                    return (2, num_blocks, block_size, num_kv_heads, head_size)
                """,
            ),
            target="0.28",
        ),
        Example(
            "a builder's drafting hook, gone in 0.34, through the project's own base class",
            """
            from vllm.v1.attention.backend import AttentionMetadataBuilder


            class PluginBuilderBase(AttentionMetadataBuilder):
                pass


            class MyBuilder(PluginBuilderBase):
                def build_for_drafting(self, common_attn_metadata, draft_index):
                    return self.build(0, common_attn_metadata)

                def use_cascade_attention(self, *args, **kwargs):
                    return False
            """,
            findings=(Status.MANUAL, Status.MANUAL),
            target="0.34",
        ),
        Example(
            "still there in 0.27",
            class_source(
                _BUILDER,
                """
                def build_for_drafting(self, common_attn_metadata, draft_index):
                    return self.build(0, common_attn_metadata)
                """,
            ),
            target="0.27",
        ),
        Example(
            "a project's own ABC of the same name is no vLLM class",
            """
            import abc


            class AttentionBackend(abc.ABC):
                @abc.abstractmethod
                def get_kv_cache_shape(self): ...


            class MyBackend(AttentionBackend):
                def get_kv_cache_shape(self):
                    return (2, 16)
            """,
            target="0.34",
        ),
        Example(
            "a backend vLLM uses by its shape alone",
            """
            import vllm


            class MyBackend:
                @staticmethod
                def get_name():
                    return "CUSTOM"

                @staticmethod
                def get_impl_cls():
                    return object

                @staticmethod
                def get_kv_cache_stride_order(include_num_layers_dimension=False):
                    return (0, 1, 2, 3, 4)
            """,
            findings=(Status.MANUAL,),
            target="0.34",
        ),
    )

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        owner = self.ctx.method_owner()
        name = node.name.value
        if owner is None or name in _HANDLED_ELSEWHERE:
            return
        classes, _ = self.ctx.vllm_interface(owner)
        if not classes:
            return
        from vllm_attn_compat.manifest.interface import dead_overrides

        hook = dead_overrides(self.ctx.target.release, classes).get(name)
        if hook is not None:
            self.ctx.report(self, node.name, describe(hook, name), release=hook.since)
