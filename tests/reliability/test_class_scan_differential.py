"""The class scan (`index/classscan.py`) spares the `ast` index of files that can add nothing the run decides:
generated plugins, their callers and a file of patches and uses beside them give the same report, finding
for finding, with the scan and with every file indexed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from vllm_attn_compat.codemods.index import classscan
from vllm_attn_compat.codemods.run.runner import Options, run_paths

from .legacy_callers import GeneratedPlugin, plugins_with_callers
from .profile import reliability_settings

# A file of the run that imports the impl and defines a class of its own (so the scan may spare it), with
# what the run must see in it anyway: patches of the impl's methods, members copies, uses of its methods.
HIDDEN = """\
import functools

from plugin.backend import GenImpl
from vllm.v1.attention.backend import AttentionImpl


class Holder(object):
    pass


def _forward(self, query, output=None):
    assert output is not None
    return output


class Methods:
    def decode(self, query, output=None):
        assert output is not None
        return output

"""
SNIPPETS = [
    "GenImpl.prefill = _forward\n",
    'setattr(GenImpl, "prefill", _forward)\n',
    "patch_method(get_layer_class(), _forward)\n",
    "def install(cls):\n    for name, value in vars(Methods).items():\n        setattr(cls, name, value)\n",
    "for name, value in Methods.__dict__.items():\n    setattr(GenImpl, name, value)\n",
    "@merge_into(GenImpl)\nclass Mixin:\n    def run_chunk(self, query, output=None):\n        return output\n",
    "def go(impl, q):\n    return impl.prefill(q)\n",
    "def go_later(impl, q):\n    return (impl.  # warm-up\n        decode)(q)\n",
    "def hand_on(impl):\n    return functools.partial(impl.forward_decode)\n",
    'def look_up(impl):\n    return getattr(impl, "run_chunk")\n',
    "class Sub(GenImpl):\n    def prefill(self, query, output=None):\n        return output\n",
]


def _report(root: Path, spare: bool) -> tuple[list, list]:
    scan = classscan.quick_index
    if not spare:
        classscan.quick_index = lambda *args: None  # type: ignore[assignment]  # not a fixture: see below
    try:
        report = run_paths([str(root)], Options(mode="check", jobs=1))
    finally:
        classscan.quick_index = scan
    findings = sorted((os.path.relpath(path, root), finding) for path, finding in report.findings)
    return findings, sorted(os.path.relpath(path, root) for path in report.changed)


@reliability_settings(ci=15, long=600)
@given(
    plugin=plugins_with_callers(),
    holder=st.booleans(),
    snippets=st.lists(st.sampled_from(SNIPPETS), max_size=4, unique=True),
)
def test_the_class_scan_changes_nothing_the_run_reports(
    plugin: GeneratedPlugin, holder: bool, snippets: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    files = dict(plugin.files)
    if holder:  # a class beside the callers: the scan may spare their file, unless it sees the uses
        files["plugin/callers.py"] += "\n\nclass Holder(object):\n    pass\n"
    files["plugin/hidden.py"] = HIDDEN + "\n\n".join(snippets)
    root = tmp_path_factory.mktemp("scan")
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
        note(f"--- {relative} ---\n{text}")
    assert _report(root, spare=True) == _report(root, spare=False)
    if not snippets:  # the comparison is not vacuous: the scan spares the file of patches when it holds none
        hidden = files["plugin/hidden.py"].encode()
        assert classscan.quick_index(hidden, str(root / "plugin/hidden.py"), frozenset({"GenImpl"})) is not None
