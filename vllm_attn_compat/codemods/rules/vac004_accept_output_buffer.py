"""VAC004: the ``accept_output_buffer`` class attribute of attention backends."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.engine.edits import RemoveStatement
from vllm_attn_compat.codemods.engine.rule import Example, Rule, class_source
from vllm_attn_compat.codemods.findings import FixSafety, Status

if TYPE_CHECKING:
    import libcst as cst

_HEADER = """\
    from vllm.v1.attention.backend import AttentionBackend


    class MyBackend(AttentionBackend):
"""

_READER = "\n\n    def test_backend_contract():\n        assert MyBackend.accept_output_buffer\n"

_RETURNS_NEW_TENSOR = (
    "`accept_output_buffer` is {what}: this backend returns a new tensor instead of writing into "
    "`output`, and vLLM >= 0.20 ignores the returned tensor (the result is lost). Write the result "
    "into `output` (e.g. `output.copy_(result)`), or decorate the impl class with "
    "`@vllm_attn_compat.compat.adapt_legacy_impl`; then delete the attribute "
    "(the unsafe fix deletes it: --unsafe-fixes)"
)
_BASE_DECLARATION = (
    "this is the declaration of `accept_output_buffer` that vLLM 0.20 removed (PR #39125), and its False "
    "default still means something here: every backend that does not set the flag returns a new tensor, "
    "which vLLM >= 0.20 ignores. Make those backends write into `output`, remove the reads of the flag "
    "(VAC005), then delete this declaration and the comment above it, as upstream did "
    "(the unsafe fix deletes them: --unsafe-fixes)"
)
_TRUE_IN_FORK = (
    "`accept_output_buffer = True` is dead once the flag is gone, but this run's own `AttentionBackend` still "
    "declares it False and code still reads it: deleting this line alone would send this backend down the "
    "no-output path. Delete it together with the base declaration and the reads (VAC005), as upstream did "
    "(the unsafe fix deletes it: --unsafe-fixes)"
)
_OWN_BASE = (
    "`accept_output_buffer` here overrides the flag of `{base}`, a base class of this project that is not "
    "vLLM's: the flag is the project's own. vLLM >= 0.20 no longer reads it, but deleting this line would make "
    "the class read `{base}`'s value instead. Decide with the base class's declaration and its readers, by hand"
)
_READ = (
    "`accept_output_buffer = True` is dead for vLLM >= 0.20, which no longer reads it, but this run does: "
    "{readers}. Deleting it would change what that read gives (vLLM >= 0.20's base class no longer declares "
    "the flag). Remove the read (VAC005), then this line (the unsafe fix deletes it: --unsafe-fixes)"
)


class AcceptOutputBuffer(Rule):
    """vLLM 0.20 removed ``AttentionBackend.accept_output_buffer`` (PR #39125): every backend now
    receives a preallocated ``output`` and must write into it. ``accept_output_buffer = True``
    (annotated or not) is dead and goes, together with the comment block directly above it and
    its own trailing comment, which only documented it. ``= False``, any other value, or a
    property means the backend returned a new tensor: under vLLM >= 0.20 that tensor is ignored
    and the layer returns an uninitialised buffer, so the rule reports it with what to do (write
    into ``output``, or use this package's ``adapt_legacy_impl``) and offers the removal only as
    an unsafe fix. In a fork of vLLM (the run holds vLLM's own ``AttentionBackend``, in either
    layout) the base class's ``accept_output_buffer: bool = False`` declaration is reported for what
    it is: its False default is what every backend that does not set the flag returns; upstream
    removed it together with the reads of the flag, and the unsafe fix removes it with the comment
    above it. While it is there, deleting a backend's ``= True`` alone would make that backend read
    False, so in such a run that removal is unsafe too.

    The safe fix changes nothing any code of the run reads: where the run reads the flag of the class, of
    a subclass or of an instance (``X.accept_output_buffer``, ``getattr``/``hasattr`` with the name,
    ``self.accept_output_buffer``, a receiver that cannot be resolved), or a base class of the run sets it
    to anything but True, the removal is unsafe, and the finding names the read. Where the flag overrides
    that of a base class of the project that is not vLLM's (its own ``AttentionBackend`` ABC, say), the flag
    is the project's own: the finding is a report, never a fix.
    """

    code = "VAC004"
    name = "accept-output-buffer-attribute"
    summary = "Remove `accept_output_buffer = True`; report backends that set it to False (they return new tensors)."
    fix_safety = FixSafety.SAFE
    since = fix_requires = "0.20.0"  # the release that made the output buffer mandatory
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
            "a flag the run reads is no safe fix: the read would raise AttributeError on vLLM >= 0.20",
            _HEADER + "        accept_output_buffer = True\n" + _READER,
            unsafe_after=_HEADER + "        pass\n" + _READER,
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "a flag overriding that of the project's own base class is the project's, not vLLM's",
            """\
            from abc import ABC

            from vllm.logger import init_logger

            logger = init_logger(__name__)


            class AttentionBackend(ABC):
                accept_output_buffer: bool = False


            class SDPABackend(AttentionBackend):
                accept_output_buffer: bool = True

                @staticmethod
                def get_name() -> str:
                    return "SDPA"

                @staticmethod
                def get_impl_cls():
                    return SDPAImpl
            """,
        ),
        Example(
            "a backend vLLM uses without deriving from its base (duck-typed), in a module importing vLLM",
            """\
            from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend


            @register_backend(AttentionBackendEnum.CUSTOM)
            class MyBackend:
                accept_output_buffer: bool = True

                @staticmethod
                def get_name() -> str:
                    return "CUSTOM"

                @staticmethod
                def get_impl_cls():
                    return MyImpl
            """,
            after="""\
            from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend


            @register_backend(AttentionBackendEnum.CUSTOM)
            class MyBackend:
                @staticmethod
                def get_name() -> str:
                    return "CUSTOM"

                @staticmethod
                def get_impl_cls():
                    return MyImpl
            """,
            findings=(Status.FIXED,),
        ),
        Example(
            "a methods class whose members are copied into a vLLM backend",
            """\
            from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend


            class MyBackendMethods:
                accept_output_buffer: bool = False

                @staticmethod
                def get_name() -> str:
                    return "MY_FLASH"


            for _name, _value in vars(MyBackendMethods).items():
                if not _name.startswith("__"):
                    setattr(FlashAttentionBackend, _name, _value)
            """,
            unsafe_after="""\
            from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend


            class MyBackendMethods:
                @staticmethod
                def get_name() -> str:
                    return "MY_FLASH"


            for _name, _value in vars(MyBackendMethods).items():
                if not _name.startswith("__"):
                    setattr(FlashAttentionBackend, _name, _value)
            """,
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "a methods class merged into a class that cannot be resolved is reported",
            """\
            import vllm.envs


            def merge_into(target):
                def merge(methods):
                    for name, value in vars(methods).items():
                        setattr(target, name, value)
                    return methods

                return merge


            @merge_into(load_backend_class())
            class MyBackendMethods:
                accept_output_buffer = True
            """,
            findings=(Status.MANUAL,),
        ),
        Example(
            "a methods class a decorator builds a vLLM backend of, with type(), is reported",
            """\
            from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend


            def tt_backend(cls):
                namespace = {k: v for k, v in vars(cls).items() if not k.startswith("__")}
                return type(cls.__name__, (FlashAttentionBackend,), namespace)


            @tt_backend
            class TTBackend:
                accept_output_buffer = False

                @staticmethod
                def get_name() -> str:
                    return "TT"
            """,
            findings=(Status.MANUAL,),
        ),
        Example(
            "a methods class a decorator factory builds a backend of, from the base it is given, is reported",
            """\
            from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend


            def backend_from(base):
                def build(cls):
                    return type(cls.__name__, (base,), dict(vars(cls)))

                return build


            @backend_from(FlashAttentionBackend)
            class TTBackend:
                accept_output_buffer = False
            """,
            findings=(Status.MANUAL,),
        ),
        Example(
            "the same duck-typed class in a project that does not import vLLM stays",
            """\
            class MyBackend:
                accept_output_buffer = True

                @staticmethod
                def get_name() -> str:
                    return "CUSTOM"

                @staticmethod
                def get_impl_cls():
                    return MyImpl
            """,
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

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        import libcst as cst

        from vllm_attn_compat.codemods.engine.patterns import is_name

        frame = self.ctx.attention_class()
        if frame is None or not self._in_class_body():
            return
        value: cst.BaseExpression | None
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
            hierarchy = self.ctx.hierarchy
            full_name = f"{self.ctx.module_name}.{frame.qualname}"
            if hierarchy.is_flag_base(full_name):
                self.ctx.report(self, small, _BASE_DECLARATION, edit, safety=FixSafety.UNSAFE)
                continue
            own_base = hierarchy.own_flag_base(full_name)
            if own_base is not None:
                self.ctx.report(self, small, _OWN_BASE.format(base=own_base.rpartition(".")[2]))
            elif is_name(value, "True") and hierarchy.declares_flag_in_base():
                self.ctx.report(self, small, _TRUE_IN_FORK, edit, safety=FixSafety.UNSAFE)
            elif is_name(value, "True"):
                readers = hierarchy.flag_readers(full_name)
                if readers is not None:
                    self.ctx.report(self, small, _READ.format(readers=readers), edit, safety=FixSafety.UNSAFE)
                    continue
                self.ctx.report(
                    self,
                    small,
                    "`accept_output_buffer = True` is dead: vLLM 0.20 removed the flag and always passes `output`",
                    edit,
                )
            else:
                what = "False" if is_name(value, "False") else "not True"
                self.ctx.report(self, small, _RETURNS_NEW_TENSOR.format(what=what), edit, safety=FixSafety.UNSAFE)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
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
