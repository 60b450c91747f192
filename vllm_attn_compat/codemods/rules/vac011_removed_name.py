"""VAC011: report an import of a name, or a read of a member, that the target vLLM release removed."""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING, Any

from vllm_attn_compat.codemods.engine.rule import Example, Rule, class_source, short_release
from vllm_attn_compat.codemods.engine.scan import IDENTIFIER_PATTERN, NOT_BEFORE_IDENTIFIER, starting_word
from vllm_attn_compat.codemods.findings import FixSafety, Status

if TYPE_CHECKING:
    import libcst as cst

    from vllm_attn_compat.codemods.engine.rule import Questions

_METADATA = """\
    from vllm.v1.attention.backend import CommonAttentionMetadata


    def {name}({receiver}: CommonAttentionMetadata):
"""
# VAC007 reports the imports and calls of the ops vLLM 0.20 deleted, VAC004 and VAC005 the flag 0.20 removed.
_HANDLED_ELSEWHERE = frozenset({"unified_attention", "unified_mla_attention", "accept_output_buffer"})
# What an `except` catching an ImportError names: an import it guards is the project's way to support releases.
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


class RemovedName(Rule):
    """A name a vLLM release removed breaks the code naming it, loudly at import or later at the read:
    ``from vllm.v1.attention.backend import SparseMLAAttentionImpl`` raises ImportError on vLLM 0.26 and later, and
    ``common_attn_metadata.seq_lens_cpu`` raises AttributeError from 0.30 on (0.19 had deprecated it: "Prefer
    using device seq_lens directly to avoid implicit H<>D sync").

    The rule reports, for the target release, each ``from <vLLM module> import <name>`` of a name the release no
    longer has in that module, each import of a module of vLLM's attention packages the release no longer has (one
    finding at the module's name: ``vllm.v1.attention.backends.tree_attn``, gone in 0.21, and every module of the
    old layout's ``vllm.attention``, which no release from 0.19 has; `manifest.interface.missing_module`), and each
    ``torch.ops.vllm.<op>`` of a custom op it no longer registers (``maybe_calc_kv_scales``, gone in 0.28), at the
    import or the op (an import guarded by ``try: ... except ImportError:`` is the project's own fallback, and is
    left alone; so is a fork's import of its own modules), and each read of a
    removed member of one of vLLM's interface classes on a receiver that is provably an instance of it: a
    parameter annotated with the class (imported from vLLM), not assigned before the read, or the class itself
    imported from vLLM; unless a class of the run deriving from it defines the member (the instance may be one
    of the project's: ``backend.get_kv_cache_shape(...)`` on the plugin's own backend still runs, and VAC010
    reports that override). Which names each release removed is the manifest's (docs/attention-api.md).

    A fix is offered only where vLLM's own message names a mechanical equivalent: ``seq_lens_cpu`` becomes
    ``seq_lens.cpu()``, ``num_computed_tokens_cpu`` its expression over ``seq_lens`` and ``query_start_loc_cpu``.
    Both are unsafe: they copy from the device (the synchronisation vLLM's message warns of), where the removed
    member may have returned a tensor kept on the host, so the result is the same value at another cost, and
    belongs where a person decides it. A removed class or function has no such equivalent: the finding says which
    release removed it.
    """

    code = "VAC011"
    name = "removed-name"
    summary = "Report an import or read of a name the target vLLM release removed; unsafe fix where vLLM names one."
    fix_safety = FixSafety.UNSAFE
    scoped = False
    requires = (b"vllm",)  # an import of vLLM, `torch.ops.vllm`
    # Every module-level name and class member some release removed (`manifest.interface.removed_names`; a test
    # holds the copy to the manifest), less the ops VAC007 handles.
    tokens = (
        b"CUDNN_WORKSPACE_SIZE",
        b"ChunkedContextMetadata",
        b"CudnnPrefillMetadata",
        b"FlashInferPrefillMetadata",
        b"MAMBA_TYPE_TO_BACKEND_MAP",
        b"SparseMLAAttentionImpl",
        b".TREE_ATTN",  # an enum member: read on its class (and a token of ten bytes, as the prefilter's are)
        b"_DSV32_MASKED_MHA_THRESHOLDS",
        b"_DSV32_SEQ_LEN_BUCKETS",
        b"_build_fi_prefill_wrappers",
        b"_compute_prefill_context",
        b"_concat_k_nope_k_pe",
        b"_context_parallel_compute_prefill_context",
        b"_flash_attn_varlen_diff_headdims",
        b"_flat_int32",
        b"_gather_prefill_cache_inputs",
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
        b"build_for_drafting",
        b"calc_kv_scales",
        b"cudnn_workspace",
        b"dcp_local_seq_lens_cpu",
        b"do_kv_cache_update",
        b"finalize_mla_pcp_decode",
        b"flash_attn_varlen_func",
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
        b"is_deepseek_r1_mla_compatible",
        b"is_quantized_kv_cache",
        b"is_vllm_fa",
        b"maybe_calc_kv_scales",
        b"maybe_calc_kv_scales_fake",
        b"maybe_gather_indexer_k",
        b"maybe_gather_mla_latent_cache_inputs",
        b"maybe_populate_sink_fake",
        b"naive_query_lens",
        b"num_computed_tokens_cpu",
        b"prefill_chunks",
        b"prefill_main",
        b"query_seq_lens",
        b"replayssm_decode_base_cpu",
        b"seq_lens_cpu",
        b"set_kernel_block_size",
        b"unified_attention_fake",
        b"unified_attention_with_output_fake",
        b"unified_mla_attention_fake",
        b"unified_mla_attention_with_output_fake",
        b"use_cascade_attention",
        b"use_cudnn_prefill",
        b"use_flashinfer_prefill",
        b"use_trtllm_ragged_deepseek_prefill",
        b"workspace_buffer",
        # The modules some release removed (`manifest.interface.removed_module_tokens`).
        b"attention.pcp",
        b"backends.tree_attn",
        b"dcp_alltoall",
        b"deepseek_v4_ops",
        b"ops.dcp_utils",
        b"tq_decode_gqa6",
        b"triton_fp8_mqa_logits",
        b"vllm.attention",
    )
    # Of a function holding a read: every statement (an assignment to the receiver before the read).
    reads_statements = None
    # Each finding but an op's needs an import statement of a vLLM module outside the run, binding a removed name or
    # a path to a manifest class: in a fork's own tree, where every such import is of the fork's modules, and in a
    # file importing only vLLM's other modules (``vllm._C``), the member names are ordinary words.
    narrows = True

    @classmethod
    def facts(cls, source: bytes) -> list[Any]:
        """[whether ``source`` names an op some release removed, what its import statements bind of vLLM]."""
        return [any(op in source for op in _OP_TOKENS), sorted(imported_vllm_names(source))]

    @classmethod
    def acts_in(cls, facts: Any, run: Questions, path: str, release: str) -> bool:
        names_op, imported = facts
        return bool(names_op) or _imports_report(imported, run, release)

    @classmethod
    def span_tokens(cls, facts: Any, run: Questions, path: str, release: str) -> tuple[bytes, ...]:
        # Where no import can lead to a finding (a fork's own tree), the rule reports an op alone: libcst is handed
        # the statements naming one, not every function reading `seq_lens_cpu` or holding `prefill_`.
        _, imported = facts
        return cls.tokens if _imports_report(imported, run, release) else _OP_TOKENS

    examples = (
        Example(
            "an import of the class vLLM 0.26 removed",
            """
            from vllm.v1.attention.backend import AttentionBackend, SparseMLAAttentionImpl


            class MySparseImpl(SparseMLAAttentionImpl):
                pass
            """,
            findings=(Status.MANUAL,),
            target="0.34",
        ),
        Example(
            "guarded by `except ImportError`: the project's own fallback",
            """
            try:
                from vllm.v1.attention.backend import SparseMLAAttentionImpl
            except ImportError:
                SparseMLAAttentionImpl = None
            """,
            target="0.34",
        ),
        Example(
            "an import from the old layout's `vllm.attention`, which no release from 0.19 has",
            """
            from vllm.attention.backends.abstract import AttentionBackend, AttentionImpl
            import vllm.attention.layer
            """,
            findings=(Status.MANUAL, Status.MANUAL),
            target="0.20",
        ),
        Example(
            "a module vLLM 0.21 removed, imported; there in 0.20",
            """
            from vllm.v1.attention.backends.tree_attn import TreeAttentionMetadata
            """,
            findings=(Status.MANUAL,),
            target="0.34",
        ),
        Example(
            "a module vLLM 0.21 removed, at 0.20",
            """
            from vllm.v1.attention.backends.tree_attn import TreeAttentionMetadata
            """,
            target="0.20",
        ),
        Example(
            "still there in 0.25",
            """
            from vllm.v1.attention.backend import SparseMLAAttentionImpl
            """,
            target="0.25",
        ),
        Example(
            "a removed member read on an annotated parameter: unsafe, a device copy",
            class_source(
                _METADATA.format(name="decode_lengths", receiver="common_attn_metadata"),
                "return common_attn_metadata.seq_lens_cpu.tolist()\n",
            ),
            unsafe_after=class_source(
                _METADATA.format(name="decode_lengths", receiver="common_attn_metadata"),
                "return common_attn_metadata.seq_lens.cpu().tolist()\n",
            ),
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
            target="0.34",
        ),
        Example(
            "a receiver assigned before the read may be anything",
            class_source(
                _METADATA.format(name="decode_lengths", receiver="md"),
                """
                md = md.host_copy
                return md.seq_lens_cpu.tolist()
                """,
            ),
            target="0.34",
        ),
        Example(
            "a custom op vLLM 0.28 no longer registers",
            """
            import torch


            def scales(query, key, value, layer_name):
                torch.ops.vllm.maybe_calc_kv_scales(query, key, value, layer_name)
            """,
            findings=(Status.MANUAL,),
            target="0.34",
        ),
        Example(
            "a member of an enum, read on the class",
            """
            from vllm.v1.attention.backends.registry import AttentionBackendEnum

            TREE = AttentionBackendEnum.TREE_ATTN
            """,
            findings=(Status.MANUAL,),
            target="0.34",
        ),
        Example(
            "a removed member without an equivalent: reported",
            class_source(_METADATA.format(name="query_lengths", receiver="md"), "return md.naive_query_lens()\n"),
            findings=(Status.MANUAL,),
            target="0.34",
        ),
        Example(
            "a class named through a vLLM module outside its attention code is none of the manifest's",
            """
            from vllm import _custom_ops as ops


            def decode_lengths(md: ops.attention.CommonAttentionMetadata):
                return md.seq_lens_cpu.tolist()
            """,
            target="0.34",
        ),
        Example(
            "a class named through a package of vLLM's: reported",
            """
            from vllm import v1


            def decode_lengths(md: v1.attention.backend.CommonAttentionMetadata):
                return md.naive_query_lens()
            """,
            findings=(Status.MANUAL,),
            target="0.34",
        ),
    )

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        import libcst as cst

        from vllm_attn_compat.codemods.engine.scope import dotted_name
        from vllm_attn_compat.manifest.interface import removed_name

        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted_name(node.module) or ""
        if not module.startswith("vllm.") or self._guarded() or self.ctx.hierarchy.in_run(module):
            return
        if self._missing_module(node.module, module):
            return
        for alias in node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else ""
            if name in _HANDLED_ELSEWHERE:
                continue
            removal = removed_name(self.ctx.target.release, module, name)
            if removal is not None:
                message = f"`{name}` is gone: vLLM {short_release(removal.removed_in)} removed it from `{module}`"
                self.ctx.report(self, alias, message, release=removal.removed_in)

    def visit_Import(self, node: cst.Import) -> None:
        from vllm_attn_compat.codemods.engine.scope import dotted_name

        if self._guarded():
            return
        for alias in node.names:
            module = dotted_name(alias.name) or ""
            if module.startswith("vllm.") and not self.ctx.hierarchy.in_run(module):
                self._missing_module(alias.name, module)

    def _missing_module(self, node: cst.BaseExpression, module: str) -> bool:
        """Report the import of ``module`` (its name ``node``) where the target release lacks it; whether it did."""
        from vllm_attn_compat.manifest import releases
        from vllm_attn_compat.manifest.interface import missing_module

        missing = missing_module(self.ctx.target.release, module)
        if missing is None:
            return False
        gone = "it" if missing.gone == module else f"`{missing.gone}`"
        if missing.removed_in is None:  # (gone before the manifest's first release: which release did is not known)
            message = f"`{module}` is gone: no vLLM release from {short_release(releases()[0])} has {gone}"
            self.ctx.report(self, node, message)
        else:
            message = f"`{module}` is gone: vLLM {short_release(missing.removed_in)} removed {gone}"
            self.ctx.report(self, node, message, release=missing.removed_in)
        return True

    def _guarded(self) -> bool:
        """Whether the statement being visited is in the body of a ``try`` one of whose handlers catches an
        ImportError (or anything)."""
        import libcst as cst

        from vllm_attn_compat.codemods.engine.scope import dotted_name

        stack = self.ctx.stack
        for parent, child in itertools.pairwise(stack):
            if isinstance(parent, cst.Try) and child is parent.body:
                for handler in parent.handlers:
                    caught = handler.type
                    if caught is None:
                        return True
                    kinds = [e.value for e in caught.elements] if isinstance(caught, cst.Tuple) else [caught]
                    if any((dotted_name(kind) or "").rpartition(".")[2] in _IMPORT_ERRORS for kind in kinds):
                        return True
        return False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        import libcst as cst

        attribute = node.attr.value
        if attribute not in _MEMBERS or self._target_of_assignment(node):
            return
        if not isinstance(node.value, cst.Name):
            self._op(node, attribute)
            return
        receiver = node.value.value
        owner = self._receiver_class(receiver)
        if owner is None:
            return
        from vllm_attn_compat.manifest.interface import removed_member

        hook = removed_member(self.ctx.target.release, owner, attribute)
        if hook is None or self.ctx.hierarchy.run_defines(owner, attribute):
            return  # (an instance may be of a class of the project's defining it: its hook, VAC010's finding)
        where = f"`{owner.rpartition('.')[2]}.{attribute}` is gone: vLLM {short_release(hook.since)} removed it"
        successor = hook.successor
        if successor is None or successor.kind != "expression" or receiver in self.ctx.imports:
            self.ctx.report(self, node, where, release=hook.since)
            return
        replacement = re.sub(r"\bself\.", f"{receiver}.", successor.use)
        message = f"{where}; unsafe fix: `{replacement}`, a copy from the device"

        def build(updated: cst.Attribute, sink: object) -> cst.BaseExpression:
            parsed = cst.parse_expression(replacement)
            if updated.lpar or not isinstance(parsed, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
                # An operation where an attribute stood (`md.num_computed_tokens_cpu[0]`): in brackets, it binds
                # as the attribute did.
                return parsed.with_changes(
                    lpar=updated.lpar or [cst.LeftParen()], rpar=updated.rpar or [cst.RightParen()]
                )
            return parsed

        from vllm_attn_compat.codemods.engine.edits import Replace

        self.ctx.report(self, node, message, Replace(node, build), release=hook.since)

    def _op(self, node: cst.Attribute, name: str) -> None:
        """``torch.ops.vllm.<name>``: a custom op the target release no longer registers."""
        from vllm_attn_compat.codemods.engine.scope import dotted_name
        from vllm_attn_compat.manifest.interface import removed_op

        if name in _HANDLED_ELSEWHERE or dotted_name(node) != f"torch.ops.vllm.{name}":
            return
        removed_in = removed_op(self.ctx.target.release, f"vllm::{name}")
        if removed_in is not None:
            message = f"`torch.ops.vllm.{name}` is gone: vLLM {short_release(removed_in)} no longer registers the op"
            self.ctx.report(self, node, message, release=removed_in)

    def _receiver_class(self, receiver: str) -> str | None:
        """The manifest class of which ``receiver`` is provably the class or an instance: a parameter of the
        function being visited annotated with it, not assigned before; else, where no parameter has the name, a
        name the module imports it as."""
        from vllm_attn_compat.codemods.engine import patterns

        function = self.ctx.current_function()
        param = function.param(receiver) if function is not None else None
        if function is not None and param is not None:
            if param.annotation is None:
                return None
            stack = self.ctx.stack
            if patterns.rebinds_before(stack[stack.index(function.node) :], receiver):
                return None
            return self._annotated_class(param.annotation.annotation)
        if receiver not in self.ctx.imports:
            return None
        import libcst as cst

        return self._annotated_class(cst.Name(receiver))

    def _annotated_class(self, annotation: cst.BaseExpression) -> str | None:
        """The manifest class an annotation names through the module's imports from vLLM (a fork's own class
        aside), or None."""
        import libcst as cst

        from vllm_attn_compat.codemods.engine.scope import dotted_name
        from vllm_attn_compat.manifest.interface import reaches, resolve_class

        if isinstance(annotation, cst.SimpleString):
            text = annotation.evaluated_value
            try:
                annotation = cst.parse_expression(text) if isinstance(text, str) else annotation
            except cst.ParserSyntaxError:
                return None
        dotted = dotted_name(annotation)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        target = self.ctx.imports.get(head)
        if target is None or not target.startswith("vllm."):
            return None
        # The import's module (``from M import n``: M; ``import M as n``: M itself) is the fork's own: left alone.
        if self.ctx.hierarchy.in_run(target) or self.ctx.hierarchy.in_run(target.rpartition(".")[0]):
            return None
        if not reaches(target):
            return None
        full = f"{target}.{rest}" if rest else target
        if self.ctx.hierarchy.in_run(full.rpartition(".")[0]):
            return None
        return resolve_class(full)

    def _target_of_assignment(self, node: cst.Attribute) -> bool:
        import libcst as cst

        parent = self.ctx.parent()
        return isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)) and parent.target is node


_MEMBERS = frozenset(token.decode().lstrip(".") for token in RemovedName.tokens)
# The ops some release removed, of those VAC011 reports (`_op`): a test holds the copy to the manifest.
_OP_TOKENS = (b"maybe_calc_kv_scales",)

# Between the names of a dotted module in an import statement: blanks and line continuations, never a comment.
_GAP = rb"(?:[ \t\f]|\\\r?\n|\\\r)*"
_NAME = IDENTIFIER_PATTERN
_MODULE = rb"vllm(?:" + _GAP + rb"\." + _GAP + _NAME + rb")*"  # (``from vllm import v1`` binds ``vllm.v1``)
_VLLM_PATH = re.compile(rb"(?<![A-Za-z0-9_\x80-\xff.])" + _MODULE)
# What follows ``import`` in a ``from`` statement: a parenthesized list (which may span lines and hold comments, and
# holds no string) or the rest of its logical line.
_IMPORTED = rb"(\((?:[^)#]|#[^\r\n]*)*\)|(?:[^\r\n;#\\(]|\\\r?\n|\\\r|\\)*)"
_FROM = re.compile(starting_word(b"from") + _GAP + rb"(" + _MODULE + rb")" + _GAP + rb"import" + _GAP + _IMPORTED)
_COMMENT = re.compile(rb"#[^\r\n]*")
# What follows ``import`` up to the end of its logical line (an import statement holds no bracket or string).
_IMPORT = re.compile(starting_word(b"import") + NOT_BEFORE_IDENTIFIER + rb"((?:[^\r\n;#\\]|\\\r?\n|\\\r|\\)*)")
_BLANKS = re.compile(_GAP)
_IDENTIFIER = re.compile(_NAME)


def imported_vllm_names(source: bytes) -> set[str]:
    """What each import statement of ``source`` binds from vLLM (``vllm.x...``), as a dotted name, and perhaps more
    (text shaped like an import in strings and comments, an alias's own name): ``from M import a, b as c`` gives
    ``M.a``, ``M.b`` and ``M.c``; ``import M [as n], ...`` each ``M``."""
    found: set[bytes] = set()
    for match in _FROM.finditer(source):
        module = _BLANKS.sub(b"", match.group(1))
        found.update(module + b"." + name for name in _IDENTIFIER.findall(_COMMENT.sub(b"", match.group(2))))
    for match in _IMPORT.finditer(source):
        found.update(_BLANKS.sub(b"", path.group(0)) for path in _VLLM_PATH.finditer(match.group(1)))
    return {name.decode("utf-8", "surrogateescape") for name in found}


def _imports_report(imported: list[str], run: Questions, release: str) -> bool:
    """Whether one of the vLLM names the file's imports bind (`imported_vllm_names`) can lead to a finding."""
    return any(_may_report(dotted, run, release) for dotted in imported)


def _may_report(dotted: str, run: Questions, release: str) -> bool:
    """Whether an import binding the vLLM name ``dotted`` can lead to a finding: a name ``release`` removed, imported
    from a module outside the run (`RemovedName.visit_ImportFrom`), or a path to a manifest class outside the run
    (`RemovedName._annotated_class`)."""
    from vllm_attn_compat.manifest.interface import missing_module, reaches, removed_name

    module, _, name = dotted.rpartition(".")
    if not module or run.in_run(module):  # (``import vllm`` binds ``vllm``, which the rule reads nothing through)
        return False
    return (
        removed_name(release, module, name) is not None
        or missing_module(release, module) is not None
        or (not run.in_run(dotted) and (reaches(dotted) or missing_module(release, dotted) is not None))
    )
