"""VAC012: report an override that cannot take the arguments the target vLLM release passes; add the missing
parameters where vLLM gives them a default."""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Any

from vllm_attn_compat.codemods.engine.rule import Example, Rule, class_source, interface_methods, short_release
from vllm_attn_compat.codemods.findings import FixSafety, Status
from vllm_attn_compat.manifest.types import EVERY

if TYPE_CHECKING:
    import libcst as cst

    from vllm_attn_compat.codemods.engine.edits import CommentSink
    from vllm_attn_compat.codemods.engine.rule import Questions
    from vllm_attn_compat.codemods.engine.signatures import Misfit
    from vllm_attn_compat.manifest.types import Parameter

_BACKEND = """\
    from vllm.v1.attention.backend import AttentionBackend


    class MyBackend(AttentionBackend):
"""
_MLA = """\
    from vllm.v1.attention.backend import MLAAttentionImpl


    class MyImpl(MLAAttentionImpl):
"""
_LAYER = """\
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention


    class MyAttention(MLAAttention):
"""
_VALIDATE = """\
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
    use_pcp=False,{added}
):
    return []
"""
_ADDED = "\n    use_adaptive_verification=False,\n    use_dcp=False,\n    use_rswa=False,"


class SignatureDrift(Rule):
    """vLLM changes the parameters of the hooks it calls: 0.24 gave ``MLAAttentionImpl.forward_mha`` an
    ``output_scale``, 0.28 to 0.30 ``AttentionBackend.validate_configuration`` ``use_adaptive_verification``,
    ``use_dcp`` and ``use_rswa``, 0.33 ``MLAAttentionImpl.do_kv_cache_update`` a ``skip_scale``. An override
    written for an older release then cannot take the call vLLM makes: it raises TypeError, at start-up or on the
    first batch that takes that path.

    The rule compares each method, in a class deriving from vLLM's interface classes (as VAC010 finds them), with
    the signature of the member it overrides at the target release, as vLLM calls its hooks: the required
    parameters by position (an override may call ``query`` ``q``), those with a default by name
    (``output_scale=output_scale``), and the required ones its call sites name by name too (every argument of
    ``validate_configuration`` and of the MLA builder's ``_build_decode``, an impl's ``output``: ``PASSED_BY_NAME``).
    A base parameter the override cannot take that way, or a parameter of the override without default that vLLM
    never passes, is a finding at the ``def``, naming the parameters and the release that last changed the base's.
    Where vLLM's positional arguments do not fit (the override takes fewer, or they fill a parameter vLLM then
    names), the finding says how many vLLM passes and which of its parameters the override lacks.

    Where each missing parameter has a literal default in vLLM's signature, the fix appends them with those
    defaults: the override then takes the call, and, as it takes neither ``*args`` nor ``**kwargs``, every call
    that binds today binds the same. A
    parameter whose name the method's body already uses (a global or an enclosing variable it would hide) is left
    to a person, and so are code reading the method's signature (``inspect.signature``), reflection that may reach
    it, a doctest naming it: such a use withholds the fix (unsafe), the finding naming it. Otherwise the finding is
    reported without a fix (so is a parameter list holding a comment, a ``# noqa`` among them, which appending
    could move to another line): pass the new parameters through ``**kwargs``, or write them out. Constructors are left
    out: vLLM makes its objects in ways of their own (the MLA layer passes an impl's dimensions by name, a builder is
    made positionally), which the signature alone does not tell. So is a layer's ``forward`` (``Attention``,
    ``MLAAttention``) that takes the arguments of no release: model code calls a layer, and such a ``forward`` is a
    method of another shape that the project's own model calls (vLLM 0.30's ``DeepseekV32Attention.forward(positions,
    hidden_states)``), not one written for an older release.
    """

    code = "VAC012"
    name = "signature-drift"
    summary = "Add the parameters the target vLLM release passes an override; report those it cannot add."
    fix_safety = FixSafety.SAFE
    scoped = interface = True
    # Every member whose parameters some release changed (`manifest.interface.drifted_names`; a test holds the copy
    # to the manifest).
    tokens = (
        b"_build_decode",
        b"_context_parallel_compute_prefill_context",
        b"do_kv_cache_update",
        b"forward",
        b"forward_impl",
        b"forward_mha",
        b"get_supported_kernel_block_sizes",
        b"maybe_recompute_cu_seqlens",
        b"process_weights_after_loading",
        b"supports_combination",
        b"validate_configuration",
    )
    # A file whose classes deriving from vLLM's interface override no member whose parameters some release changed
    # needs no parse.
    narrows = True

    @classmethod
    def acts_in(cls, facts: Any, run: Questions, path: str, release: str) -> bool:
        from vllm_attn_compat.manifest.interface import base_member

        return any(
            name.encode() in _TOKENS and base_member(release, classes, name) is not None
            for classes, names in interface_methods(run, path)
            for name in names
        )

    # Of a method holding a token: every statement (a name the new parameter would hide).
    reads_statements = None
    examples = (
        Example(
            "parameters 0.28 to 0.30 added, with defaults: appended",
            class_source(_BACKEND, _VALIDATE.format(added="")),
            after=class_source(_BACKEND, _VALIDATE.format(added=_ADDED)),
            findings=(Status.FIXED,),
            target="0.34",
        ),
        Example(
            "the same override on the release it was written for",
            class_source(_BACKEND, _VALIDATE.format(added="")),
            target="0.27",
        ),
        Example(
            "a parameter vLLM adds with a default, in the layout of the others",
            class_source(
                _MLA,
                """
                def do_kv_cache_update(self, kv_c_normed, k_pe, kv_cache, slot_mapping,
                                       kv_cache_dtype, k_scale):
                    pass
                """,
            ),
            after=class_source(
                _MLA,
                """
                def do_kv_cache_update(self, kv_c_normed, k_pe, kv_cache, slot_mapping,
                                       kv_cache_dtype, k_scale, skip_scale=False):
                    pass
                """,
            ),
            findings=(Status.FIXED,),
            target="0.34",
        ),
        Example(
            "a name the body already reads would be hidden: reported",
            class_source(
                "    skip_scale = True\n" + _MLA,
                """
                def do_kv_cache_update(self, kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale):
                    return skip_scale
                """,
            ),
            findings=(Status.MANUAL,),
            target="0.34",
        ),
        Example(
            "a required parameter vLLM never passes: reported",
            class_source(
                _MLA,
                """
                def forward_mha(self, q, kv_c_normed, k_pe, kv_c_and_k_pe_cache, attn_metadata, k_scale, output,
                                output_scale=None, *, layer_index):
                    pass
                """,
            ),
            findings=(Status.MANUAL,),
            target="0.34",
        ),
        Example(
            "vLLM passes these positionally: a parameter 0.24 added before the last shifts them",
            class_source(
                _BACKEND,
                """
                @classmethod
                def supports_combination(cls, head_size, dtype, kv_cache_dtype, block_size, use_mla, has_sink,
                                         use_sparse, device_capability, **kwargs):
                    return None
                """,
            ),
            findings=(Status.MANUAL,),
            target="0.34",
        ),
        Example(
            "a layer's `forward` written for a release before 0.27 gets the parameter 0.27 added",
            class_source(
                _LAYER,
                """
                def forward(self, q, kv_c_normed, k_pe, output_shape=None):
                    return super().forward(q, kv_c_normed, k_pe, output_shape)
                """,
            ),
            after=class_source(
                _LAYER,
                """
                def forward(self, q, kv_c_normed, k_pe, output_shape=None, q_dcp_replicated=None):
                    return super().forward(q, kv_c_normed, k_pe, output_shape)
                """,
            ),
            findings=(Status.FIXED,),
            target="0.27",
        ),
        Example(
            "a layer's `forward` of another shape, which the project's model calls: no release's arguments",
            class_source(
                _LAYER,
                """
                def forward(self, positions, hidden_states):
                    return hidden_states
                """,
            ),
            target="0.34",
        ),
        Example(
            "an override taking `*args, **kwargs` takes whatever vLLM passes",
            class_source(
                _BACKEND,
                """
                @classmethod
                def supports_combination(cls, *args, **kwargs):
                    return super().supports_combination(*args, **kwargs)
                """,
            ),
            target="0.34",
        ),
    )

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        from vllm_attn_compat.codemods.engine import signatures
        from vllm_attn_compat.manifest.interface import base_member, last_change

        owner = self.ctx.method_owner()
        name = node.name.value
        if owner is None or name.encode() not in _TOKENS:
            return
        classes, _ = self.ctx.vllm_interface(owner)
        base = base_member(self.ctx.target.release, classes, name) if classes else None
        kind = signatures.kind_of(node)
        if base is None or base.signature is None or kind == "property" or base.kind == "property":
            return
        if (kind == "method") != (base.kind == "method"):
            return  # a class-level hook overridden by an instance method, or the reverse: not a question of arguments
        expected = signatures.bound(base.signature, base.kind)
        found = signatures.bound(signatures.signature_of(node), kind)
        named = PASSED_BY_NAME.get(name, frozenset())
        drift = signatures.drift(expected, found, named)
        if drift.compatible or (name == "forward" and _layer(base.owner) and not _ever_takes(classes, found)):
            return
        changed = last_change(base.owner, name, self.ctx.target.release)
        where = f"`{base.owner.rpartition('.')[2]}.{name}`"
        when = f" (changed in vLLM {short_release(changed)})" if changed else ""
        if drift.extra_required:
            extra = _listed(drift.extra_required)
            them = "them" if len(drift.extra_required) > 1 else "it"
            message = f"vLLM never passes {extra} (no default): {where}{when} does not take {them}"
            self.ctx.report(self, node.name, message, release=changed)
            return
        misfit = signatures.misfit(expected, found, named)
        if misfit is not None:  # (never fixed: where vLLM's positional arguments go is the override's to say)
            self.ctx.report(self, node.name, f"{where}{when} {_misfit_text(misfit)}", release=changed)
            return
        missing = _listed(drift.missing)
        message = f"{where}{when} is called with {missing}, which this override cannot take"
        why_not = signatures.appended(drift.missing, found) or self._hidden(node, drift.missing)
        if why_not is None and signatures.holds_comments(node.params):
            why_not = "a comment among the parameters would move"
        if why_not is not None:
            self.ctx.report(self, node.name, f"{message} (no fix: {why_not})", release=changed)
            return

        def build(updated: cst.Parameters, sink: CommentSink) -> cst.Parameters:
            return signatures.add_parameters(updated, drift.missing, sink)

        from vllm_attn_compat.codemods.engine.edits import Replace

        edit = Replace(node.params, build)
        withheld = self.ctx.parameters_withheld(owner, name)
        if withheld is None:
            self.ctx.report(self, node.name, message, edit, release=changed)
        else:
            self.ctx.report(self, node.name, f"{message}; {withheld}", edit, safety=FixSafety.UNSAFE, release=changed)

    def _hidden(self, node: cst.FunctionDef, missing: tuple[Parameter, ...]) -> str | None:
        """Why a new parameter would change what the body reads: it names the parameter's name already."""
        import libcst as cst

        wanted = {parameter.name for parameter in missing}
        found: list[str] = []

        class _Names(cst.CSTVisitor):
            def visit_Name(self, name: cst.Name) -> None:
                if name.value in wanted:
                    found.append(name.value)

        node.body.visit(_Names())
        return f"the body already reads a `{found[0]}` the parameter would hide" if found else None


def _layer(owner: str) -> bool:
    """Whether the member's class is one of vLLM's layers, which model code calls (`SignatureDrift`)."""
    return owner.startswith("vllm.model_executor.layers.")


def _ever_takes(classes: tuple[str, ...], found: Any) -> bool:
    """Whether an override of ``forward`` of the signature ``found`` takes the arguments of some release's base."""
    from vllm_attn_compat.codemods.engine import signatures
    from vllm_attn_compat.manifest import releases
    from vllm_attn_compat.manifest.interface import base_member

    bases = (base_member(release, classes, "forward") for release in releases())
    return any(
        signatures.drift(signatures.bound(base.signature, base.kind), found, PASSED_BY_NAME["forward"]).compatible
        for base in bases
        if base is not None and base.signature is not None
    )


def _misfit_text(misfit: Misfit) -> str:
    """What a `signatures.Misfit` means for the override, one line."""
    if misfit.clashes and misfit.takes >= misfit.passed:
        clash = _listed(misfit.clashes)
        text = f"is called with {misfit.passed} positional arguments, filling its {clash}, which vLLM names too"
    else:
        text = f"is called with {misfit.passed} positional arguments and this override takes {misfit.takes}"
    return f"{text}: it lacks {_listed(misfit.lacked)}" if misfit.lacked else text


def _listed(parameters: tuple[Parameter, ...] | tuple[str, ...]) -> str:
    """The parameters' names, the first three of them and how many more: a message is one short line."""
    names = ", ".join(f"`{p if isinstance(p, str) else p.name}`" for p in parameters[:3])
    return names + (f" and {len(parameters) - 3} more" if len(parameters) > 3 else "")


_TOKENS = frozenset(SignatureDrift.tokens)

# The required parameters vLLM passes by name, as its call sites do in every release the manifest knows (the others go
# by position), by the hook's name: each has one caller, whichever class of vLLM's declares it. The platforms'
# ``backend_class.validate_configuration(device_capability=..., **attn_selector_config._asdict())`` and the MLA
# builder's ``self._build_decode(block_table_tensor=..., ...)`` name every one; the layers pass ``output=`` to an
# impl's ``forward`` and ``forward_mha`` and an MLA layer's ``forward_impl``, and the MLA impl its context's scales.
# tests/manifest/test_vllm_call_sites.py holds this to the installed vLLM's call sites.
PASSED_BY_NAME: dict[str, Container[str]] = {
    "validate_configuration": EVERY,
    "_build_decode": EVERY,
    "forward": frozenset({"output"}),
    "forward_mha": frozenset({"output"}),
    "forward_impl": frozenset({"output"}),
    "_context_parallel_compute_prefill_context": frozenset({"k_scale", "dcp_world_size"}),
}
