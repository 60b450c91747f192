"""VAC004 beyond its examples: comment blocks, properties, forks of vLLM, other projects."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.findings import Status

from rule_testing import run, source, statuses


def test_comment_block_directly_above_goes_other_comments_stay():
    text = source(
        """
        from vllm.v1.attention.backend import AttentionBackend


        class Backend(AttentionBackend):
            # Section: capabilities

            # We write into the preallocated output.
            accept_output_buffer: bool = True  # see PR 1234
            supports_fp8 = True
        """
    )
    result = run(text, ["VAC004"])
    assert result.source.decode() == source(
        """
        from vllm.v1.attention.backend import AttentionBackend


        class Backend(AttentionBackend):
            # Section: capabilities

            supports_fp8 = True
        """
    )
    assert result.removed_comments == ("# We write into the preallocated output.", "# see PR 1234")


def test_only_attribute_becomes_pass():
    text = source(
        """
        from vllm.v1.attention.backend import AttentionBackend


        class Backend(AttentionBackend):
            accept_output_buffer = True
        """
    )
    assert run(text, ["VAC004"]).source.decode() == text.replace("accept_output_buffer = True", "pass")


def test_property_is_an_unsafe_removal_made_with_the_adapter_alone():
    """#50: deleting a flag that says the impl returns a new tensor, and nothing else, leaves code vLLM >= 0.20 reads
    an uninitialised buffer from, and `--check` green: the deletion comes with the adapter, or not at all."""
    text = source(
        """
        from vllm.v1.attention.backend import AttentionBackend


        class Backend(AttentionBackend):
            @property
            def accept_output_buffer(self) -> bool:
                return self.fused

            def get_name(self):
                return "B"

            @staticmethod
            def get_impl_cls():
                return impls.Impl
        """
    )
    safe = run(text, ["VAC004"])
    assert safe.source.decode() == text and statuses(safe) == [Status.UNSAFE_FIX_AVAILABLE]
    assert "adapt_legacy_impl" in safe.findings[0].message
    unsafe = run(text, ["VAC004"], unsafe=True).source.decode()
    assert "accept_output_buffer" not in unsafe and "def get_name" in unsafe
    assert "\nimport vllm_attn_compat.compat\n" in unsafe
    assert "return vllm_attn_compat.compat.adapt_legacy_impl(impls.Impl)" in unsafe
    plain = text.replace("return impls.Impl", "return impls.pick(self)")  # no plain class to adapt: reported only
    assert statuses(run(plain, ["VAC004"])) == [Status.MANUAL]
    assert run(plain, ["VAC004"], unsafe=True).source.decode() == plain


def test_fork_base_class_declaration_and_its_comment_block(tmp_path):
    text = source(
        """
        from abc import ABC


        class AttentionBackend(ABC):
            \"\"\"Abstract class for attention backends.\"\"\"

            # For some attention backends, we allocate an output tensor before
            # calling the custom op. When piecewise cudagraph is enabled, this
            # makes sure the output tensor is allocated inside the cudagraph.
            accept_output_buffer: bool = False
            supported_dtypes = []
        """
    )
    package = tmp_path / "vllm" / "v1" / "attention"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    path = str(package / "backend.py")
    result = run(text, ["VAC004"], path=path, unsafe=True)
    assert result.source.decode() == source(
        """
        from abc import ABC


        class AttentionBackend(ABC):
            \"\"\"Abstract class for attention backends.\"\"\"

            supported_dtypes = []
        """
    )
    assert len(result.removed_comments) == 3


def test_unrelated_attention_backend_with_false_stays():
    text = source(
        """
        from flashinfer.attention import AttentionBackend


        class MyBackend(AttentionBackend):
            accept_output_buffer = False
        """
    )
    result = run(text, ["VAC004"], unsafe=True)
    assert result.findings == [] and result.source.decode() == text


def test_attribute_inside_a_method_or_nested_class_is_not_the_class_attribute():
    text = source(
        """
        from vllm.v1.attention.backend import AttentionBackend


        class Backend(AttentionBackend):
            def setup(self):
                accept_output_buffer = True
                return accept_output_buffer

            class Options:
                accept_output_buffer = True
        """
    )
    result = run(text, ["VAC004"])
    assert result.findings == [] and result.source.decode() == text


def test_crlf_removal():
    text = source(
        """
        from vllm.v1.attention.backend import AttentionBackend


        class Backend(AttentionBackend):
            accept_output_buffer = True

            x = 1
        """
    ).replace("\n", "\r\n")
    result = run(text.encode(), ["VAC004"])
    assert result.source == text.replace("    accept_output_buffer = True\r\n\r\n", "").encode()


_FORK_BASE = '''\
from abc import ABC


class AttentionBackend(ABC):
    """Abstract class for attention backends."""

    # For some attention backends, we allocate an output tensor before
    # calling the custom op. When piecewise cudagraph is enabled, this
    # makes sure the output tensor is allocated inside the cudagraph.
    accept_output_buffer: bool = False

    @staticmethod
    def get_name() -> str:
        raise NotImplementedError

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError
'''

_FORK_LAYOUTS = {
    "old": ("vllm/attention/backends/abstract.py", "vllm.attention.backends.abstract"),
    "new": ("vllm/v1/attention/backend.py", "vllm.v1.attention.backend"),
}


@pytest.mark.parametrize("layout", list(_FORK_LAYOUTS))
def test_a_fork_reports_its_base_declaration_and_keeps_true_until_it_goes(tmp_path, capsys, layout):
    from vllm_attn_compat.codemods.cli import main

    base_path, base_module = _FORK_LAYOUTS[layout]
    files = {
        base_path: _FORK_BASE,
        "vllm/v1/attention/backends/flash_attn.py": (
            f"from {base_module} import AttentionBackend\n\n\n"
            "class FlashAttentionBackend(AttentionBackend):\n    accept_output_buffer: bool = True\n"
        ),
    }
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for folder in path.parents:
            if folder == tmp_path:
                break
            (folder / "__init__.py").touch()
    assert main(["migrate", str(tmp_path / "vllm")]) == 1  # nothing safe to do: the fork keeps working
    out = capsys.readouterr().out
    assert all((tmp_path / relative).read_text() == text for relative, text in files.items())
    assert "the declaration vLLM 0.20 removed" in out
    assert "but this fork's `AttentionBackend` still declares it" in out
    assert out.count("VAC004 [unsafe]") == 2
    assert main(["migrate", "--unsafe-fixes", str(tmp_path / "vllm")]) == 0
    assert "accept_output_buffer" not in (tmp_path / base_path).read_text()
    assert "cudagraph" not in (tmp_path / base_path).read_text()  # the comment documenting it goes too
    assert "accept_output_buffer" not in (tmp_path / "vllm/v1/attention/backends/flash_attn.py").read_text()


# --- issue #25: the safe fix changes nothing the run reads, and leaves a project's own flag alone ----------

INDEXER = """
from vllm.v1.attention.backend import AttentionBackend


class AscendSFAIndexerBackend(AttentionBackend):
    accept_output_buffer: bool = True

    @staticmethod
    def get_name() -> str:
        return "ASCEND_SFA_INDEXER"


class AscendAttentionBackend(AttentionBackend):
    accept_output_buffer: bool = True
"""

INDEXER_TEST = """
from vllm_ascend.attention.indexer import AscendSFAIndexerBackend


def test_sfa_indexer_backend_contract():
    assert AscendSFAIndexerBackend.accept_output_buffer
"""


def test_a_flag_a_test_of_the_run_reads_is_no_safe_fix():
    """vllm-ascend: a unit test asserts the indexer backend's flag; deleting it would make that test raise
    AttributeError on vLLM >= 0.20. The backend nobody reads still loses its flag."""
    result = run(
        INDEXER, ["VAC004"], path="vllm_ascend/attention/indexer.py", others=[("ut/test_indexer.py", INDEXER_TEST)]
    )
    assert statuses(result) == [Status.UNSAFE_FIX_AVAILABLE, Status.FIXED]
    read = result.findings[0].message
    assert "`AscendSFAIndexerBackend.accept_output_buffer` at ut/test_indexer.py:5 reads it" in read, read
    assert result.source.decode().count("accept_output_buffer") == 1  # the read class keeps its flag
    unsafe = run(
        INDEXER,
        ["VAC004"],
        unsafe=True,
        path="vllm_ascend/attention/indexer.py",
        others=[("ut/test_indexer.py", INDEXER_TEST)],
    )
    assert "accept_output_buffer" not in unsafe.source.decode()


OWN_ABSTRACT = """
from abc import ABC, abstractmethod


class AttentionBackend(ABC):
    \"\"\"Abstract class for diffusion attention backends.\"\"\"

    accept_output_buffer: bool = False

    @staticmethod
    @abstractmethod
    def get_name() -> str:
        raise NotImplementedError
"""

OWN_BACKEND = """
from vllm.logger import init_logger

from vllm_omni.diffusion.attention.backends.abstract import AttentionBackend

logger = init_logger(__name__)


class SDPABackend(AttentionBackend):
    accept_output_buffer: bool = True

    @staticmethod
    def get_name() -> str:
        return "SDPA"

    @staticmethod
    def get_impl_cls():
        return SDPAImpl
"""


@pytest.mark.parametrize("declaration", ["accept_output_buffer: bool = False", "accept_output_buffer = True"])
def test_a_flag_overriding_the_projects_own_base_stays_and_is_not_reported(declaration):
    """vllm-omni: the diffusion backends derive from the project's own ABC, which declares the flag and
    imports nothing of vLLM; the backends import vLLM for its logger only. The flag is the project's."""
    abstract = (
        "vllm_omni/diffusion/attention/backends/abstract.py",
        OWN_ABSTRACT.replace("accept_output_buffer: bool = False", declaration),
    )
    result = run(OWN_BACKEND, ["VAC004"], path="vllm_omni/diffusion/attention/backends/sdpa.py", others=[abstract])
    assert result.findings == [] and result.source.decode() == source(OWN_BACKEND)


def test_a_vllm_backend_overriding_the_projects_own_flag_is_reported_never_fixed():
    """A class deriving from both vLLM's base and the project's own base declaring the flag: vLLM may use it,
    so the flag is reported, with why deleting it is no fix; neither mode deletes it."""
    backend = (
        OWN_BACKEND.replace(
            "from vllm.logger import init_logger",
            "from vllm.v1.attention.backend import AttentionBackend as VllmBackend",
        )
        .replace("logger = init_logger(__name__)", "")
        .replace("(AttentionBackend)", "(AttentionBackend, VllmBackend)")
    )
    others = [("vllm_omni/diffusion/attention/backends/abstract.py", OWN_ABSTRACT)]
    for unsafe in (False, True):
        result = run(
            backend, ["VAC004"], unsafe=unsafe, path="vllm_omni/diffusion/attention/backends/sdpa.py", others=others
        )
        assert statuses(result) == [Status.MANUAL]
        assert "overrides `AttentionBackend`'s, a base of the project's own" in result.findings[0].message
        assert result.source.decode() == source(backend)


@pytest.mark.parametrize(
    "decorate",
    ["@tt_backend", "@merge_into(load_backend_class())"],
    ids=["built by a decorator", "patched onto an unresolved class"],
)
def test_a_reported_only_flag_offers_no_unsafe_fix(decorate):
    text = source(
        f"""
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend


        def tt_backend(cls):
            return type(cls.__name__, (FlashAttentionBackend,), dict(vars(cls)))


        def merge_into(target):
            def merge(methods):
                for name, value in vars(methods).items():
                    setattr(target, name, value)
                return methods

            return merge


        {decorate}
        class TTBackend:
            accept_output_buffer = False
        """
    )
    for unsafe in (False, True):
        result = run(text, ["VAC004"], unsafe=unsafe)
        assert result.source.decode() == text and statuses(result) == [Status.MANUAL]
        message = result.findings[0].message
        assert "unsafe fix" not in message and message.endswith(": by hand)")
