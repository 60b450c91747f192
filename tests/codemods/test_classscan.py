"""The class-header scan: it spares a parse only where the exact index would show no attention class."""

from __future__ import annotations

import importlib.util
import os
import textwrap

import pytest
from runner_trees import write_tree

from vllm_attn_compat.codemods.classscan import ScannedIndex, quick_index
from vllm_attn_compat.codemods.cli import main
from vllm_attn_compat.codemods.hierarchy import ClassHierarchy, index_module


def scan(text: str, known=frozenset(), path: str = "m.py"):
    return quick_index(textwrap.dedent(text).encode(), path, frozenset(known))


def test_classes_with_unrelated_bases_are_spared_and_their_base_names_kept():
    found = scan(
        """
        import torch.nn as nn
        from vllm.config import VllmConfig


        class LlamaMLP(nn.Module):
            pass


        class Config(
            VllmConfig,
            metaclass=type,
        ):
            '''class Fake(AttentionImpl): a docstring is no class, but only adds names'''
        """
    )
    assert isinstance(found, ScannedIndex) and found.classes == ()
    assert {"nn", "Module", "VllmConfig", "metaclass", "type"} <= found.base_words
    assert found.names_any({"VllmConfig"}) and not found.names_any({"Other"})


@pytest.mark.parametrize(
    "text",
    [
        "class Impl(AttentionImpl):\n    pass\n",  # a vLLM base name
        "class Mine(abstract.FlashAttentionBackend):\n    pass\n",  # an in-tree backend's suffix
        "class Attention(nn.Module):\n    pass\n",  # a fork defining vLLM's own bases
        "from vllm.attention import AttentionImpl as Base\nclass Mine(Base):\n    pass\n",  # through an alias
        "from vllm.attention import (\n    AttentionImpl\n    as\n    Base,\n)\nclass Mine(Base):\n    pass\n",
        "class Mine(Generic[T], AttentionImpl[M]):\n    pass\n",
        "def f():\n    class Inner(AttentionImpl):\n        pass\n",
        'class Mine(make(")")):\n    pass\n',  # a string among the bases
        "class Mine(Base,  # a comment\n    Other):\n    pass\n",
        "class Mine(a(b(c))):\n    pass\n",  # brackets nested deeper than the scan reads
        "class \\\n    Mine(Base):\n    pass\n",  # a line continuation
        "class Ünicode(Base):\n    pass\n",
        "x = 1\n",  # no class at all: parsing costs little and settles the file
    ],
)
def test_a_class_that_can_be_an_attention_class_or_cannot_be_read_sends_the_file_to_the_parser(text):
    assert scan(text) is None


def test_names_found_in_earlier_rounds_count():
    text = "from plugin.base import PluginBase as PB\nclass Mine(PB):\n    pass\n"
    assert scan(text, known={"PluginBase"}) is None
    spared = scan(text)
    assert spared is not None and spared.names_any({"PluginBase"})  # a later round has it parsed


def _python_files(root: str):
    for folder, _, names in os.walk(root):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as handle:
                    yield path, handle.read()


@pytest.mark.vllm
def test_on_vllms_own_sources_no_spared_file_holds_an_attention_class():
    """vLLM itself: the exact index of every file, then the scan given the names the exact pass found;
    a file the scan spares must hold no attention class, and most files with classes are spared."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    sources = {}
    for path, source in _python_files(spec.submodule_search_locations[0]):
        if b"class" in source:
            try:
                sources[path] = (source, index_module(source, path))
            except SyntaxError:
                continue
    built = ClassHierarchy.build(index for _, index in sources.values())
    names = built.attention_class_names()
    assert len(names) > 20  # the backends of vLLM 0.20
    spared = 0
    for path, (source, exact) in sources.items():
        cold = quick_index(source, path, frozenset())
        if cold is not None and not cold.names_any(names):  # spared in the first round and in all later ones
            assert not built.has_attention_classes(path), path
        if quick_index(source, path, names) is not None:
            assert not built.has_attention_classes(path), path
            spared += 1
    assert spared > len(sources) / 2


def test_a_spared_candidate_with_a_syntax_error_is_reported_and_left_alone(tmp_path, capsys):
    broken = 'import vllm\n\n\nclass Layer(Module):\n    pass\n\n\nNAME = "unified_attention"\nx = (\n'
    write_tree(tmp_path, {"pkg/__init__.py": "", "pkg/layer.py": broken})
    assert quick_index(broken.encode(), str(tmp_path / "pkg/layer.py"), frozenset()) is not None
    assert main(["migrate", str(tmp_path)]) == 2
    assert f"{tmp_path / 'pkg/layer.py'}:9:" in capsys.readouterr().out
    assert (tmp_path / "pkg/layer.py").read_text() == broken
