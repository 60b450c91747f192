"""VAC013: report a concrete class that does not implement an abstract member of the target vLLM release."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm_attn_compat.codemods.engine.rule import Example, Rule, interface_of, short_release
from vllm_attn_compat.codemods.findings import FixSafety, Status

if TYPE_CHECKING:
    import libcst as cst

    from vllm_attn_compat.codemods.engine.rule import Questions
    from vllm_attn_compat.manifest.interface import Abstract


class MissingAbstract(Rule):
    """vLLM's interface classes are ABCs: an impl or a metadata builder that leaves one of their abstract members
    unimplemented cannot be instantiated (TypeError: Can't instantiate abstract class), and a backend class, whose
    static methods vLLM calls without instantiating it, breaks when vLLM first calls the missing one
    (``get_builder_cls``). Releases add abstract members (and a plugin written against an older release lacks
    them) or move them between classes.

    The rule reports a concrete class deriving from vLLM's interface classes that implements none of the target
    release's abstract members it lacks: at the ``class`` line, naming them and the class declaring each abstract.
    What counts as implemented is what the class and its bases in the run define, in any file, and what its vLLM
    bases define concretely at the target release (``MLACommonImpl`` implements ``forward`` for its subclasses). A
    class is concrete where no class of the run derives from it (a base of the project's own is completed by its
    subclasses, which are checked), its name does not say it is a base (``PluginImplBase``, ``AbstractImpl``,
    ``...Mixin``: a run over some files may hold a base without its subclasses) and its own body declares no
    abstract method. A backend vLLM uses by its shape alone is no subclass: Python asks nothing of it. Nor is a
    backend reported that lacks exactly what one of vLLM's own backends at the target release lacks (vLLM 0.34's
    backends of no attention layer, Mamba's and the indexers', go without ``get_impl_cls``, which only an
    attention layer asks for; the manifest reads them from each release's sources): vLLM never instantiates a
    backend, so it needs a member only where it calls it. An impl or a builder, which vLLM instantiates, needs
    every one. No fix: implement the member.
    """

    code = "VAC013"
    name = "missing-abstract"
    summary = "Report a concrete subclass of vLLM's interface that lacks an abstract member of the target release."
    fix_safety = FixSafety.DISPLAY_ONLY
    scoped = interface = True
    tokens = (b"class ",)  # every class statement: what a class lacks is nowhere in its text
    reads_statements = ()  # the class statement; what the classes define comes from the run's index
    examples = (
        Example(
            "a backend without the builder vLLM asks it for",
            """
            from vllm.v1.attention.backend import AttentionBackend


            class MyBackend(AttentionBackend):
                @staticmethod
                def get_name():
                    return "MINE"

                @staticmethod
                def get_impl_cls():
                    return object
            """,
            findings=(Status.MANUAL,),
            target="0.34",
        ),
        Example(
            "a backend of no attention layer, lacking what vLLM's own (Mamba's, the indexers') lack",
            """
            from vllm.v1.attention.backend import AttentionBackend


            class ConvStateBackend(AttentionBackend):
                @staticmethod
                def get_name():
                    return "CONV_STATE"

                @staticmethod
                def get_builder_cls():
                    return object
            """,
            target="0.34",
        ),
        Example(
            "an attention backend lacking what none of vLLM's own lacks alone (up to 0.28)",
            """
            from vllm.v1.attention.backend import AttentionBackend


            class PagedBackend(AttentionBackend):
                @staticmethod
                def get_name():
                    return "PAGED"

                @staticmethod
                def get_impl_cls():
                    return object

                @staticmethod
                def get_builder_cls():
                    return object
            """,
            findings=(Status.MANUAL,),
            target="0.28",
        ),
        Example(
            "what the project's own base implements counts; the base itself is completed by its subclass",
            """
            from vllm.v1.attention.backend import AttentionBackend


            class PluginBackendBase(AttentionBackend):
                @staticmethod
                def get_builder_cls():
                    return object


            class MyBackend(PluginBackendBase):
                @staticmethod
                def get_name():
                    return "MINE"

                @staticmethod
                def get_impl_cls():
                    return object
            """,
            target="0.34",
        ),
        Example(
            "a class declaring abstract methods of its own is abstract",
            """
            import abc

            from vllm.v1.attention.backend import AttentionMetadataBuilder


            class PluginBuilder(AttentionMetadataBuilder):
                @abc.abstractmethod
                def prepare(self): ...
            """,
            target="0.34",
        ),
        Example(
            "an impl completing what vLLM's MLACommonImpl leaves abstract",
            """
            from vllm.model_executor.layers.attention.mla_attention import MLACommonImpl


            class MyMLAImpl(MLACommonImpl):
                def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
                    return q
            """,
            target="0.34",
        ),
    )

    # Every class statement is a token, and what decides a finding is the run's index: a file whose classes of
    # vLLM's interface all implement what the target requires needs no parse.
    narrows = True

    @classmethod
    def acts_in(cls, facts: Any, run: Questions, path: str, release: str) -> bool:
        return any(_missing(run, full, release) for full in filter(None, run.interface_classes(path).split(",")))

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        from vllm_attn_compat.codemods.engine.scope import ClassFrame

        frame = self.ctx.frames[-1] if self.ctx.frames else None
        if not isinstance(frame, ClassFrame) or frame.node is not node:
            return
        missing = _missing(self.ctx.hierarchy, f"{self.ctx.module_name}.{frame.qualname}", self.ctx.target.release)
        if not missing:
            return
        names = ", ".join(f"`{a.owner.rpartition('.')[2]}.{a.name}`" for a in missing.values())
        newest = max((a.since for a in missing.values()), key=_version)
        message = (
            f"`{node.name.value}` does not implement {names}, abstract in vLLM {short_release(self.ctx.target.release)}"
        )
        # Abstract since the oldest release the manifest knows: no release in its range caused it.
        self.ctx.report(self, node.name, message, release=None if newest == _oldest_release() else newest)


def _missing(run: Questions, full: str, release: str) -> dict[str, Abstract]:
    """The abstract members of ``release`` the class ``full`` lacks, where it is a concrete subclass of vLLM's
    interface (a backend by its shape alone is no subclass: Python asks nothing of it)."""
    from vllm_attn_compat.manifest.interface import missing_abstract

    classes, duck = interface_of(run.vllm_interface(full))
    if not classes or duck:
        return {}
    implemented = run.concrete_members(full)
    if implemented is None:
        return {}
    return missing_abstract(release, classes, implemented.split(","))


def _oldest_release() -> str:
    from vllm_attn_compat.manifest import releases

    return releases()[0]


def _version(release: str) -> tuple[object, ...]:
    from vllm_attn_compat.manifest import version_key

    return version_key(release)
