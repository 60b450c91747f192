"""Reads of ``accept_output_buffer`` in one module (codemods/index/flags.py), and what the hierarchy makes of
them and of the classes declaring the flag (`ClassHierarchy.own_flag_base`, `flag_readers`)."""

from __future__ import annotations

import textwrap

import pytest

from vllm_attn_compat.codemods.index.flags import FlagRead
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module

READERS = """
import plugin.backends as backends
from plugin.backends import Backend, make_backend
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend


class Reader(Backend):
    def on_self(self):
        return self.accept_output_buffer

    @classmethod
    def on_cls(cls):
        return cls.accept_output_buffer, type(cls).accept_output_buffer, super().accept_output_buffer

    @staticmethod
    def static(backend):
        return backend.accept_output_buffer

    def nested(self):
        def inner(self):  # another `self`: a parameter of its own
            return self.accept_output_buffer

        return inner


def read(backend):
    return (
        Backend.accept_output_buffer,
        backends.Backend.accept_output_buffer,
        getattr(Backend, "accept_output_buffer", False),
        hasattr(Backend(), "accept_output_buffer"),
        make_backend().accept_output_buffer,
        FlashAttentionBackend.accept_output_buffer,
        backend.accept_output_buffer,
        vars(Backend)["accept_output_buffer"],
    )
"""


def _reads(text: str, path: str = "plugin/reader.py") -> list[tuple[int, str | None, str]]:
    index = index_module(textwrap.dedent(text).encode(), path)
    return [(read.line, read.target, read.kind) for read in index.flag_reads]


def test_every_read_records_what_its_receiver_can_be():
    assert _reads(READERS) == [
        (9, "reader.Reader", "subclass"),  # self
        (13, "reader.Reader", "subclass"),  # cls
        (13, "reader.Reader", "subclass"),  # type(cls)
        (13, "reader.Reader", "subclass"),  # super()
        (17, None, "any"),  # a parameter of a static method
        (21, None, "any"),  # a nested function's own parameter
        (28, "plugin.backends.Backend", "class"),
        (29, "plugin.backends.Backend", "class"),  # through the module
        (30, "plugin.backends.Backend", "class"),  # getattr with a default
        (31, "plugin.backends.Backend", "instance"),  # hasattr of an instance
        (32, "plugin.backends.make_backend", "instance"),  # a function's result: the hierarchy decides
        (33, "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend", "class"),
        (34, None, "any"),  # a parameter
    ]
    # The name as a string reads nothing by itself: `vars(Backend)` is the read, reflection on the class.
    [reflection] = index_module(textwrap.dedent(READERS).encode(), "plugin/reader.py").occurrences.reflection
    assert (reflection.line, reflection.kind, reflection.receiver, reflection.target) == (
        35,
        "dict",
        "class",
        "plugin.backends.Backend",
    )


def test_a_module_without_the_name_has_no_reads_and_assignments_are_no_reads():
    assert _reads("class B:\n    use_output = True\n") == []
    assert _reads("class B:\n    accept_output_buffer = True\n\n\nB.accept_output_buffer = False\n") == []


def test_a_read_is_plain_data_for_messages():
    (read,) = index_module(b"def f(x):\n    return x.accept_output_buffer\n", "m.py").flag_reads
    assert read == FlagRead(2, None, "any", "x.accept_output_buffer")


@pytest.fixture
def hierarchy_of(tmp_path, monkeypatch):
    """Builds the hierarchy of files written under a folder (packages have their ``__init__.py``, so module
    names are what Python would use)."""
    monkeypatch.chdir(tmp_path)

    def build(files: dict[str, str]) -> ClassHierarchy:
        for path, text in {"plugin/__init__.py": "", **files}.items():
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(textwrap.dedent(text))
        return ClassHierarchy.build(index_module((tmp_path / path).read_bytes(), path) for path in files)

    return build


OWN_BASE = """
from abc import ABC


class AttentionBackend(ABC):
    accept_output_buffer: bool = False
"""

OWN_BACKEND = """
from vllm.logger import init_logger

from plugin.abstract import AttentionBackend

logger = init_logger(__name__)


class SDPABackend(AttentionBackend):
    accept_output_buffer: bool = True

    @staticmethod
    def get_name():
        return "SDPA"

    @staticmethod
    def get_impl_cls():
        return None
"""


def test_a_projects_own_base_keeps_the_flag_its_own_and_its_subclasses_are_no_vllm_backends(hierarchy_of):
    """vllm-omni's diffusion backends: an own ABC declaring the flag; backends importing vLLM for its logger."""
    hierarchy = hierarchy_of({"plugin/abstract.py": OWN_BASE, "plugin/sdpa.py": OWN_BACKEND})
    assert hierarchy.own_flag_base("plugin.sdpa.SDPABackend") == "plugin.abstract.AttentionBackend"
    assert not hierarchy.is_attention_class("plugin.sdpa.SDPABackend")
    # Without the base's declaration, the same class is a backend vLLM uses without its base (duck-typed).
    bare = hierarchy_of(
        {"plugin/abstract.py": OWN_BASE.replace("accept_output_buffer", "other"), "plugin/sdpa.py": OWN_BACKEND}
    )
    assert bare.own_flag_base("plugin.sdpa.SDPABackend") is None
    assert bare.is_attention_class("plugin.sdpa.SDPABackend")


def test_a_duck_typed_backend_makes_no_vllm_backends_of_its_subclasses(hierarchy_of):
    duck = OWN_BACKEND.replace("from plugin.abstract import AttentionBackend\n", "").replace("(AttentionBackend)", "")
    hierarchy = hierarchy_of({"plugin/sdpa.py": duck + "\n\nclass Sub(SDPABackend):\n    pass\n"})
    assert hierarchy.is_attention_class("plugin.sdpa.SDPABackend")
    assert not hierarchy.from_vllm("plugin.sdpa.SDPABackend")
    assert not hierarchy.is_attention_class("plugin.sdpa.Sub")


def test_a_vllm_backend_of_the_run_declaring_the_flag_is_no_own_base(hierarchy_of):
    hierarchy = hierarchy_of(
        {
            "plugin/base.py": """
                from vllm.v1.attention.backend import AttentionBackend


                class PluginBase(AttentionBackend):
                    accept_output_buffer = True
            """,
            "plugin/leaf.py": """
                from plugin.base import PluginBase


                class Leaf(PluginBase):
                    accept_output_buffer = True
            """,
        }
    )
    assert hierarchy.own_flag_base("plugin.leaf.Leaf") is None
    assert hierarchy.flag_readers("plugin.leaf.Leaf") is None


BACKENDS = """
from vllm.v1.attention.backend import AttentionBackend


class Backend(AttentionBackend):
    accept_output_buffer = True


class Sub(Backend):
    accept_output_buffer = True


class Other(AttentionBackend):
    accept_output_buffer = True


def make_backend():
    return Backend()
"""


@pytest.mark.parametrize(
    ("reader", "blocked"),
    [
        ("from plugin.backends import Backend\nBackend.accept_output_buffer", {"Backend"}),
        ("from plugin.backends import Sub\nSub.accept_output_buffer", {"Backend", "Sub"}),  # a subclass reads both
        ("from plugin.backends import Sub\nSub().accept_output_buffer", {"Backend", "Sub"}),
        ('from plugin.backends import Other\ngetattr(Other, "accept_output_buffer")', {"Other"}),
        ("import plugin.backends as b\nb.Backend.accept_output_buffer", {"Backend"}),
        ("from plugin.backends import make_backend\nmake_backend().accept_output_buffer", {"Backend", "Sub", "Other"}),
        ("from plugin import backends\nx = backends.TABLE.accept_output_buffer", {"Backend", "Sub", "Other"}),
        ("def f(backend):\n    return backend.accept_output_buffer", {"Backend", "Sub", "Other"}),
        ("from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend as F\nF.accept_output_buffer", set()),
        (
            "from plugin.backends import Backend\n\n\nclass Mine(Backend):\n"
            "    def f(self):\n        return self.accept_output_buffer",
            {"Backend"},  # `self` in Mine: an instance of Mine or of a subclass
        ),
    ],
)
def test_a_read_withholds_the_fix_of_every_class_whose_flag_it_can_see(hierarchy_of, reader, blocked):
    hierarchy = hierarchy_of({"plugin/backends.py": BACKENDS, "tests/test_flag.py": reader})
    found = {name for name in ("Backend", "Sub", "Other") if hierarchy.flag_readers(f"plugin.backends.{name}")}
    assert found == blocked
    if blocked:
        reason = hierarchy.flag_readers(f"plugin.backends.{sorted(blocked)[0]}")
        assert reason is not None and "tests/test_flag.py:" in reason and "accept_output_buffer" in reason


def test_a_base_of_the_run_declaring_the_flag_otherwise_withholds_the_fix(hierarchy_of):
    hierarchy = hierarchy_of(
        {
            "plugin/backends.py": BACKENDS.replace(
                "accept_output_buffer = True\n\n\nclass Sub", "accept_output_buffer = False\n\n\nclass Sub", 1
            )
        }
    )
    reason = hierarchy.flag_readers("plugin.backends.Sub")
    assert reason is not None and "`Backend`" in reason
