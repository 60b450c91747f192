"""VAC004: the ``accept_output_buffer`` class attribute of attention backends."""

from __future__ import annotations

from vllm_attn_compat.codemods.edits import RemoveStatement
from vllm_attn_compat.codemods.findings import FixSafety, Status
from vllm_attn_compat.codemods.rule import Example, Rule, class_source

_HEADER = """\
    from vllm.v1.attention.backend import AttentionBackend


    class MyBackend(AttentionBackend):
"""

_RETURNS_NEW_TENSOR = (
    "`accept_output_buffer` is {what}: this backend returns a new tensor instead of writing into "
    "`output`, and vLLM >= 0.20 ignores the returned tensor (the result is lost). Write the result "
    "into `output` (e.g. `output.copy_(result)`), or decorate the impl class with "
    "`@vllm_attn_compat.compat.adapt_legacy_impl`; then delete the attribute "
    "(the unsafe fix deletes it: --unsafe-fixes)"
)


class AcceptOutputBuffer(Rule):
    """vLLM 0.20 removed ``AttentionBackend.accept_output_buffer`` (PR #39125): every backend now
    receives a preallocated ``output`` and must write into it. ``accept_output_buffer = True``
    (annotated or not) is dead and goes, together with the comment block directly above it and
    its own trailing comment, which only documented it. ``= False``, any other value, or a
    property means the backend returned a new tensor: under vLLM >= 0.20 that tensor is ignored
    and the layer returns an uninitialised buffer, so the rule reports it with what to do (write
    into ``output``, or use this package's ``adapt_legacy_impl``) and offers the removal only as
    an unsafe fix. In a fork of vLLM, the base class's own ``accept_output_buffer: bool = False``
    declaration is treated the same way, as upstream removed it.
    """

    code = "VAC004"
    name = "accept-output-buffer-attribute"
    summary = "Remove `accept_output_buffer = True`; report backends that set it to False (they return new tensors)."
    fix_safety = FixSafety.SAFE
    tokens = (b"accept_output_buffer",)
    examples = (
        Example(
            "a backend that writes into output",
            class_source(
                _HEADER,
                """
                # Always allocate the output before calling the op,
                # so it lives inside the CUDA graph.
                accept_output_buffer: bool = True

                @staticmethod
                def get_name() -> str:
                    return "MY_BACKEND"
                """,
            ),
            after=class_source(
                _HEADER,
                """
                @staticmethod
                def get_name() -> str:
                    return "MY_BACKEND"
                """,
            ),
            findings=(Status.FIXED,),
        ),
        Example(
            "a backend that returns a new tensor",
            class_source(
                _HEADER,
                """
                accept_output_buffer = False
                forward_includes_kv_cache_update = True
                """,
            ),
            unsafe_after=class_source(
                _HEADER,
                """
                forward_includes_kv_cache_update = True
                """,
            ),
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "another project's AttentionBackend stays",
            """\
            from mylib.attention import AttentionBackend


            class MyBackend(AttentionBackend):
                accept_output_buffer = True
            """,
        ),
    )

    def _in_class_body(self) -> bool:
        import libcst as cst

        frame = self.ctx.attention_class()
        return (
            frame is not None
            and self.ctx.frames[-1] is frame
            and isinstance(self.ctx.parent(), cst.IndentedBlock)
            and self.ctx.parent(2) is frame.node
        )

    def visit_SimpleStatementLine(self, node) -> None:
        import libcst as cst

        from vllm_attn_compat.codemods.patterns import is_name

        if not self._in_class_body():
            return
        for small in node.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                target, value = small.targets[0].target, small.value
            elif isinstance(small, cst.AnnAssign):
                target, value = small.target, small.value
            else:
                continue
            if not is_name(target, "accept_output_buffer"):
                continue
            edit = RemoveStatement(small, drop_comment_block=True)
            if is_name(value, "True"):
                self.ctx.report(
                    self,
                    small,
                    "`accept_output_buffer = True` is dead: vLLM 0.20 removed the flag and always passes `output`",
                    edit,
                )
            else:
                what = "False" if is_name(value, "False") else "not True"
                self.ctx.report(
                    self, small, _RETURNS_NEW_TENSOR.format(what=what), edit, safety=FixSafety.UNSAFE
                )

    def visit_FunctionDef(self, node) -> None:
        if node.name.value != "accept_output_buffer":
            return
        frames = self.ctx.frames
        owner = frames[-2] if len(frames) >= 2 else None
        if owner is None or owner is not self.ctx.attention_class() or self.ctx.parent(2) is not owner.node:
            return
        self.ctx.report(
            self,
            node.name,
            _RETURNS_NEW_TENSOR.format(what="computed by a method"),
            RemoveStatement(node, drop_comment_block=True),
            safety=FixSafety.UNSAFE,
        )
