"""VAC004: the ``accept_output_buffer`` class attribute of attention backends."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.engine.edits import AddImport, CommentSink, RemoveStatement, Replace
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
    "`accept_output_buffer` is {what}: vLLM >= 0.20 ignores the new tensor the backend returns; write into `output`"
)
_ADAPTER = " (unsafe fix: delete it, wrapping the impl in `adapt_legacy_impl`)"
_NO_ADAPTER = " or wrap the impl in `adapt_legacy_impl`"
_BASE_DECLARATION = (
    "the declaration vLLM 0.20 removed: its False still sends every backend without the flag down the old path; "
    "make them write into `output`, then delete it (unsafe fix)"
)
_TRUE_IN_FORK = (
    "`accept_output_buffer = True` is dead once the flag is gone, but this fork's `AttentionBackend` still declares "
    "it: delete it with that declaration (unsafe fix)"
)
_OWN_BASE = (
    "`accept_output_buffer` overrides `{base}`'s, a base of the project's own, not vLLM's: the flag is the "
    "project's; decide by hand"
)
_READ = "`accept_output_buffer = True` is dead for vLLM >= 0.20; withheld: {readers}"
_DEAD = "`accept_output_buffer = True` is dead: vLLM 0.20 removed the flag and always passes `output`"


_COMPAT = "vllm_attn_compat.compat"


def _impl_returned(backend: cst.CSTNode) -> cst.BaseExpression | None:
    """The class a backend's ``get_impl_cls`` returns, where its body (past a docstring) is one plain ``return``
    of a name or dotted name (the adapter is applied to it there); None otherwise."""
    import libcst as cst

    from vllm_attn_compat.codemods.engine.patterns import is_docstring
    from vllm_attn_compat.codemods.engine.scope import dotted_name

    if not isinstance(backend, cst.ClassDef) or not isinstance(backend.body, cst.IndentedBlock):
        return None
    for statement in backend.body.body:
        if not (isinstance(statement, cst.FunctionDef) and statement.name.value == "get_impl_cls"):
            continue
        body = statement.body
        lines = [line for line in body.body if not is_docstring(line)] if isinstance(body, cst.IndentedBlock) else []
        if len(lines) != 1 or not isinstance(lines[0], cst.SimpleStatementLine) or len(lines[0].body) != 1:
            return None
        small = lines[0].body[0]
        if isinstance(small, cst.Return) and small.value is not None and dotted_name(small.value) is not None:
            return small.value
        return None
    return None


def _adapted(returned: cst.BaseExpression, sink: CommentSink) -> cst.BaseExpression:
    """``Impl`` -> ``vllm_attn_compat.compat.adapt_legacy_impl(Impl)``."""
    import libcst as cst

    adapter = cst.parse_expression(f"{_COMPAT}.adapt_legacy_impl")
    return cst.Call(func=adapter, args=[cst.Arg(value=returned)])


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
    # The class `get_impl_cls` returns: the unsafe deletion of a flag saying False wraps it in the adapter.
    reads_in_class = (b"get_impl_cls",)
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
            "a backend that returns a new tensor: the unsafe fix deletes the flag only with the adapter",
            class_source(
                "    import vllm_attn_compat.compat\n" + _HEADER,
                """
                accept_output_buffer = False
                forward_includes_kv_cache_update = True

                @staticmethod
                def get_impl_cls():
                    return MyImpl
                """,
            ),
            unsafe_after=class_source(
                "    import vllm_attn_compat.compat\n" + _HEADER,
                """
                forward_includes_kv_cache_update = True

                @staticmethod
                def get_impl_cls():
                    return vllm_attn_compat.compat.adapt_legacy_impl(MyImpl)
                """,
            ),
            findings=(Status.UNSAFE_FIX_AVAILABLE,),
        ),
        Example(
            "without a plain get_impl_cls to adapt, the flag saying False is reported only",
            class_source(
                _HEADER,
                """
                accept_output_buffer = False
                forward_includes_kv_cache_update = True
                """,
            ),
            findings=(Status.MANUAL,),
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
            findings=(Status.MANUAL,),
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
                self.ctx.report(self, small, _DEAD, edit)
            else:
                what = "False" if is_name(value, "False") else "not True"
                self._returns_a_new_tensor(small, what, edit, frame.node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value != "accept_output_buffer":
            return
        frames = self.ctx.frames
        owner = frames[-2] if len(frames) >= 2 else None
        if owner is None or owner is not self.ctx.attention_class() or self.ctx.parent(2) is not owner.node:
            return
        deletion = RemoveStatement(node, drop_comment_block=True)
        self._returns_a_new_tensor(node.name, "computed by a method", deletion, owner.node)

    def _returns_a_new_tensor(
        self, node: cst.CSTNode, what: str, deletion: RemoveStatement, backend: cst.CSTNode
    ) -> None:
        """The flag says the backend's impl returns a new tensor, which vLLM >= 0.20 ignores. Deleting the flag alone
        would leave that impl as it is, silently wrong (#50): the unsafe fix deletes it only together with wrapping
        the class ``get_impl_cls`` returns in the adapter, which copies the result into ``output``; where the body
        holds no such plain ``return``, the finding is only reported."""
        returned = _impl_returned(backend)
        if returned is None:
            self.ctx.report(self, node, _RETURNS_NEW_TENSOR.format(what=what) + _NO_ADAPTER)
            return
        adapted = Replace(returned, _adapted)
        imported = AddImport(_COMPAT)
        message = _RETURNS_NEW_TENSOR.format(what=what) + _ADAPTER
        self.ctx.report(self, node, message, deletion, adapted, imported, safety=FixSafety.UNSAFE)
