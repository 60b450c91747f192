"""The class-header scan: it spares a parse only where the exact index would show no attention class."""

from __future__ import annotations

import importlib.util
import os
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_attn_compat.codemods.cli import main
from vllm_attn_compat.codemods.index.calltext import may_use, uses_pattern
from vllm_attn_compat.codemods.index.classscan import ScannedIndex, quick_index
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module
from vllm_attn_compat.codemods.index.names import guess_module_name, may_define

from runner_trees import write_tree


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


def _vllm_tree(which: str) -> str:
    if which == "installed":
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("vLLM is not installed")
        return spec.submodule_search_locations[0]
    if not os.path.isdir(which):
        pytest.skip(f"{which} is absent (vLLM's sources, unzipped from its wheel)")
    return which


@pytest.mark.vllm
@pytest.mark.parametrize("which", ["installed", "/tmp/vllm-src/0.19.1/vllm"])
def test_on_vllms_own_sources_the_spared_files_change_nothing_the_run_decides(which):
    """vLLM itself (0.19.1: the old API, with real callers of the impls' methods): the exact index of
    every file, then the scan as the runner applies it, given the names and methods the exact pass found.
    A file spared in the first round and never sent to the parser later (no name of its class headers,
    patches or definitions is an attention class or patched code, and it uses none of the methods whose
    fix the call-site analysis decides) must leave
    the run's decisions as they are: the same attention classes and patched code, the same withheld
    fixes with the same callers, the same files with attention code. Most files with classes are spared."""
    sources = {}
    for path, source in _python_files(_vllm_tree(which)):
        if b"class" in source:
            try:
                sources[path] = (source, index_module(source, path))
            except SyntaxError:
                continue
    modules = [guess_module_name(path) for path in sources]
    built = ClassHierarchy.build((index for _, index in sources.values()), modules)
    names = built.attention_class_names()
    assert len(names) > 20  # vLLM's backends
    methods = frozenset(name for _, name in built.calls.methods)
    assert "forward" in methods
    uses = uses_pattern(methods)
    fast = {}
    for path, (source, exact) in sources.items():
        cold = quick_index(source, path, frozenset())
        spared = cold is not None and not cold.names_any(names) and not may_use(source, methods, uses)
        fast[path] = cold if spared else exact
    quick = ClassHierarchy.build(fast.values(), modules)
    while missing := quick.missing_classes():  # the files the run indexes to tell what they are (`rounds`)
        defining = [
            p for p, i in fast.items() if isinstance(i, ScannedIndex) and any(may_define(i.module, c) for c in missing)
        ]
        if not defining:
            break
        fast.update((path, sources[path][1]) for path in defining)
        quick = ClassHierarchy.build(fast.values(), modules)
    assert sum(isinstance(index, ScannedIndex) for index in fast.values()) > len(sources) / 3
    assert quick.attention_class_names() == names
    # The same fixes withheld (by the same uses where a fix is open; a fix withheld already may be named by fewer).
    decided = {key: set(codes) for key, codes in built.calls.withheld.items()}
    assert {key: set(codes) for key, codes in quick.calls.withheld.items()} == decided and decided
    assert quick.duck_typed == built.duck_typed
    for path in sources:
        assert quick.has_attention_classes(path) == built.has_attention_classes(path), path


def test_a_spared_candidate_with_a_syntax_error_is_reported_and_left_alone(tmp_path, capsys):
    broken = 'import vllm\n\n\nclass Layer(Module):\n    pass\n\n\nNAME = "unified_attention"\nx = (\n'
    write_tree(tmp_path, {"pkg/__init__.py": "", "pkg/layer.py": broken})
    assert quick_index(broken.encode(), str(tmp_path / "pkg/layer.py"), frozenset()) is not None
    assert main(["migrate", str(tmp_path)]) == 2
    assert f"{tmp_path / 'pkg/layer.py'}:9:" in capsys.readouterr().out
    assert (tmp_path / "pkg/layer.py").read_text() == broken


# --- the run with the scan against the run parsing every file --------------------------------------------

_IMPL = """\
import torch
from vllm.v1.attention.backend import AttentionImpl


class MyImpl(AttentionImpl):
    def prefill(self, query, key, value, output=None):
        if output is None:
            output = torch.empty_like(query)
        output.copy_(query + key + value)
        return output
"""

# Files that mention vLLM and define classes none of which can be an attention class by its bases: the
# scan of `class` headers alone would spare each. Each holds something the run must see.
_HIDDEN = {
    "a caller omitting output": "    def go(self, impl, q):\n        return impl.prefill(q, q, q)\n",
    "a caller through a comment": (
        "    def go(self, impl, q):\n        return (impl.  # warm-up\n            prefill)(q, q, q)\n"
    ),
    "a reference handed on": "    def go(self, impl):\n        return functools.partial(impl.prefill)\n",
    "a getattr": '    def go(self, impl):\n        return getattr(impl, "prefill")\n',
}
_PATCHES = {
    "an attribute assignment through an alias": "M.forward = _forward\n",
    "a members copy onto an unresolved class": (
        "class Methods:\n    def forward(self, q, output=None):\n        assert output is not None\n"
        "        return output\n\n\ndef install(cls):\n    for name, value in vars(Methods).items():\n"
        "        setattr(cls, name, value)\n"
    ),
    "setattr": 'setattr(M, "forward", _forward)\n',
    "a patch helper with an unresolved target": "patch_method(get_layer_class(), _forward)\n",
    "a decorator": "",
}
_PATCHED = """\
import functools

import torch
from vllm.model_executor.layers.attention import MLAAttention as M
from plugin.helpers import Helper


class Runner(Helper):
    pass


{decorator}def _forward(self, q, output=None):
    if output is None:
        output = torch.empty_like(q)
    assert output is not None
    return output


{patch}"""


def _tree(tmp_path, hidden: str) -> str:
    write_tree(
        tmp_path,
        {
            "vllm/__init__.py": "",
            "vllm/v1/__init__.py": "",
            "vllm/v1/attention/__init__.py": "",
            "vllm/v1/attention/backend.py": "class AttentionImpl:\n    pass\n",
            "plugin/__init__.py": "",
            "plugin/helpers.py": "class Helper:\n    pass\n",
            "plugin/backend.py": _IMPL,
            "plugin/hidden.py": hidden,
        },
    )
    return str(tmp_path / "plugin")


def _outcome(root: str, monkeypatch, spare: bool, mode: str):
    from vllm_attn_compat.codemods.index import classscan
    from vllm_attn_compat.codemods.run.runner import Options, run_paths

    with monkeypatch.context() as patched:
        if not spare:
            patched.setattr(classscan, "quick_index", lambda *args: None)
        report = run_paths([root], Options(mode=mode, jobs=1))
    findings = sorted(
        (os.path.relpath(path, root), f.line, f.column, f.code, f.status, f.message) for path, f in report.findings
    )
    return findings, report.errors


@pytest.mark.parametrize("case", sorted(_HIDDEN))
def test_a_file_holding_a_caller_is_indexed_so_the_fix_stays_withheld(tmp_path, monkeypatch, case):
    # It names the backend (an import), so the run indexes it in its second round, after MyImpl is found.
    hidden = (
        "import functools\n\nfrom plugin.backend import MyImpl\nfrom plugin.helpers import Helper\n\n\n"
        f"class Warm(Helper):\n    impl: MyImpl\n\n{_HIDDEN[case]}"
    )
    root = _tree(tmp_path, hidden)
    assert quick_index(hidden.encode(), str(tmp_path / "plugin/hidden.py"), frozenset()) is not None
    fast, errors = _outcome(root, monkeypatch, True, "check")
    assert fast == _outcome(root, monkeypatch, False, "check")[0] and not errors
    named = [f for f in fast if f[0] == "backend.py" and f[3] == "VAC002" and "/plugin/hidden.py:11 " in f[5]]
    assert named, fast  # the fix's finding names the caller
    _outcome(root, monkeypatch, True, "write")
    backend = (tmp_path / "plugin/backend.py").read_text()
    assert "output=None" in backend and "if output is None" in backend  # the fixes withheld


@pytest.mark.parametrize("case", sorted(_PATCHES))
def test_a_file_patching_code_onto_an_attention_class_is_indexed(tmp_path, monkeypatch, case):
    decorator = "@merge_into(M)\n" if case == "a decorator" else ""
    hidden = _PATCHED.format(decorator=decorator, patch=_PATCHES[case])
    root = _tree(tmp_path, hidden)
    fast, errors = _outcome(root, monkeypatch, True, "check")
    assert fast == _outcome(root, monkeypatch, False, "check")[0] and not errors
    assert [f for f in fast if f[0] == "hidden.py"], fast  # the patched function's findings


def test_a_duck_typed_backend_among_unrelated_classes_is_indexed(tmp_path, monkeypatch):
    hidden = (
        "import vllm\nfrom plugin.helpers import Helper\n\n\nclass Mine(Helper):\n    accept_output_buffer = False\n\n"
        "    @staticmethod\n    def get_name():\n        return 'MINE'\n\n"
        "    @staticmethod\n    def get_impl_cls():\n        return None\n"
    )
    root = _tree(tmp_path, hidden)
    fast, errors = _outcome(root, monkeypatch, True, "check")
    assert fast == _outcome(root, monkeypatch, False, "check")[0] and not errors
    assert [f for f in fast if f[0] == "hidden.py"], fast


@pytest.mark.parametrize(
    "patch",
    [
        "M.forward = _forward",
        "M . forward = _forward",
        "M \\\n    .forward = _forward",
        "(M).forward = _forward",
        "(M\n    .forward) = _forward",
        "(M  # the layer\n    .forward) = _forward",
        "(M.forward  # the layer\n) = _forward",
        "x = M.forward = _forward",
        'setattr(M, "forward", _forward)',
        "mock.patch.object(M, 'forward', _forward).start()",
        "@merge_into(Other)\nclass Mixin:\n    pass",  # a helper as decorator: an entry whatever its target
        "@register(M)\ndef _g(self):\n    pass",
    ],
)
def test_a_patch_that_can_reach_an_attention_class_sends_the_file_to_the_parser(patch):
    text = (
        "from vllm.model_executor.layers.attention import MLAAttention as M\nfrom plugin import Helper\n\n\n"
        "class Runner(Helper):\n    pass\n\n\ndef _forward(self, q, output=None):\n    return output\n\n\n"
    )
    assert scan(text + "x = 1\n") is not None  # spared without the patch
    assert scan(text + patch + "\n") is None


_HELPER_FILE = (
    "import torch\nfrom vllm.model_executor.layers.attention import MLAAttention as M\nfrom plugin import Helper\n\n\n"
    "class Runner(Helper):\n    pass\n\n\ndef _forward(self, q, output=None):\n    return output\n\n\n"
)


@pytest.mark.parametrize(
    "call",
    [
        "self.patch_embed(pixel_values)",  # one argument: the target, nothing to copy
        "merge_multimodal_embeddings(input_ids)",
        'setattr(self, "cache", 1)',  # the values are a string and a number
        "merge_into(M)",  # as a call, not a decorator: no value to copy
        "patch_size(x, (1, 2))",
        "self.cudagraph_dispatcher.dispatch(num_tokens, torch.int32)",  # "dispatch" spells "patch"
        "dispatch.object(M, _forward)",
    ],
)
def test_a_patch_helper_without_a_value_that_resolves_spares_the_file(call):
    text = _HELPER_FILE + call + "\n"
    assert index_module(text.encode(), "m.py").patches == ()  # the exact index makes no entry of it
    assert scan(text) is not None


@pytest.mark.parametrize(
    "call",
    [
        'setattr(M, "forward", _forward)',
        'setattr(get_layer(), "forward", _forward)',  # an unresolved target: reported
        'patch("vllm.model_executor.layers.attention.MLAAttention.forward", _forward)',
        "patch_method(M, new=_forward)",
        "inject(M, (_forward))",
        "merge_into(M,\n    # the method\n    _forward)",
        "setattr(self, name, torch.zeros(3))",  # `torch` is bound: the scan cannot tell
        "dispatch_patch(M, _forward)",
        "patched_dispatch(M, _forward)",
    ],
)
def test_a_patch_helper_with_a_value_that_may_resolve_sends_the_file_to_the_parser(call):
    assert scan(_HELPER_FILE + call + "\n") is None


def test_a_definition_named_like_a_patch_helper_is_no_call():
    text = _HELPER_FILE + "def get_patches_grid_size(image: M, size: Helper):\n    return size\n"
    assert index_module(text.encode(), "m.py").patches == ()
    assert scan(text) is not None
    assert scan(text + "get_patches_grid_size(M, _forward)\n") is None  # a call of it, with a value that resolves


def test_a_file_without_classes_is_spared_like_one_whose_classes_cannot_matter():
    found = scan("import vllm\n\n\ndef helper(x):\n    return x\n")
    assert found is not None and found.classes == () and found.base_words == {"helper"}
    patching = "from vllm.model_executor.layers.attention import MLAAttention as M\n\n\nM.forward = helper\n"
    assert scan(patching) is None


# The attribute-assignment pattern as first written, with backtracking everywhere: the reference the
# atomic one must match exactly (same matches at the same places).
_SEP = rb"[ \t\f\r\n\\]*(?:#[^\r\n]*[\r\n][ \t\f\r\n\\]*)*"
_IDENT = rb"[A-Za-z_\x80-\xff][A-Za-z0-9_\x80-\xff]*"
REFERENCE_ATTRIBUTE_ASSIGNMENT = rb"\." + _SEP + _IDENT + rb"(?:" + _SEP + rb"\))*" + _SEP + rb"=(?!=)"


def _spans(pattern, text: bytes):
    return [match.span() for match in pattern.finditer(text)]


@given(st.lists(st.sampled_from([b".", b" ", b"\t", b"\n", b"\r", b"\\", b"#", b")", b"=", b"x", b"_1", b"\xc3\xa9"])))
@settings(max_examples=1_000, deadline=None)
def test_the_atomic_attribute_assignment_pattern_matches_what_the_backtracking_one_does(pieces):
    import re

    from vllm_attn_compat.codemods.index.classscan import _ATTRIBUTE_ASSIGNMENT

    text = b"".join(pieces)
    assert _spans(_ATTRIBUTE_ASSIGNMENT, text) == _spans(re.compile(REFERENCE_ATTRIBUTE_ASSIGNMENT), text)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.19.1", "0.20.0"])
def test_the_atomic_attribute_assignment_pattern_matches_the_backtracking_one_on_vllm(version):
    import re

    from vllm_attn_compat.codemods.index.classscan import _ATTRIBUTE_ASSIGNMENT

    root = f"/tmp/vllm-src/{version}/vllm"
    if not os.path.isdir(root):
        pytest.skip(f"vLLM {version}'s sources are not unzipped at {root} (see benchmarks/bench_fork.py)")
    reference = re.compile(REFERENCE_ATTRIBUTE_ASSIGNMENT)
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as file:
                    text = file.read()
                assert _spans(_ATTRIBUTE_ASSIGNMENT, text) == _spans(reference, text), name


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("def build(cls):\n    return type(cls.__name__, (Base,), dict(vars(cls)))\n", True),
        ("def build(cls):\n    return type(\n        cls.__name__,  # the name\n        (Base,), {},\n    )\n", True),
        ("def build(cls):\n    return types.new_class(cls.__name__, (Base,))\n", True),
        ("def build(cls):\n    return type(cls.__name__ + ')', (Base,), {})\n", True),  # a bracket in a string
        ("def name(x):\n    return type(x).__name__, type(x)\n", False),  # the comma is outside the call
        ("def name(x):\n    return type(x[1, 2])\n", False),  # inside a bracket of the argument
        ("def name(x):\n    return x.type(1, 2), mytype(1, 2)\n", False),  # another function named type
    ],
)
def test_a_file_that_may_build_a_class_with_type_is_parsed(text, parsed):
    # The index records a class builder (`runtime_patches.builder_entry`) that a decorator may be.
    assert (quick_index(text.encode(), "build.py", frozenset()) is None) == parsed
    builders = [p for p in index_module(("import vllm\n" + text).encode(), "build.py").patches if p.kind == "builder"]
    assert bool(builders) == parsed  # the scan agrees with the exact index here
