"""The hierarchy's rounds (`run/rounds.py`); how a run's rounds find files is tested on whole runs too
(`test_runner.py`, `test_cache.py`)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from vllm_attn_compat.codemods.run.rounds import _Stems

_PARTS = st.sampled_from(["a", "b", "x.b", "__init__", "x.__init__", "b.c", "ops", "layer.ops"])


@given(
    stems=st.lists(st.tuples(st.sampled_from(["", "pkg/", "pkg/sub/"]), _PARTS), max_size=12),
    lasts=st.sets(st.sampled_from(["a", "b", "c", "__init__", "ops", "layer"]), max_size=3),
)
def test_the_files_that_may_define_a_module_are_those_named_for_it_and_every_package(stems, lasts):
    """`rounds._Stems` finds the files a walk over all of them would (a file ``x.b.py`` is a module ``b``, as
    `guess_module_name` takes it), in the run's order."""
    scanned = [SimpleNamespace(path=f"{folder}{stem}.py") for folder, stem in stems]

    def named(path: str) -> bool:
        stem = os.path.basename(path).rsplit(".", 1)[0]
        return stem == "__init__" or stem.rpartition(".")[2] in lasts

    found = _Stems(scanned).named(lasts)  # type: ignore[arg-type]
    assert found == [s for s in scanned if named(s.path)]


# A method taking `output` in one file, its callers in others: one indexed by the first round (it imports vLLM's
# attention modules) before the method is known, one by a later round (it names the plugin's class), one read
# by the accounting (it names neither); and an override whose parameters vLLM changed, whose signature another
# file reads.
_CROSS_FILE = {
    "plugin/__init__.py": "",
    "plugin/impl.py": """\
import torch
from vllm.v1.attention.backend import AttentionImpl


class PluginImpl(AttentionImpl):
    def decode_step(self, query, output=None):
        if output is None:
            output = torch.empty_like(query)
        output.copy_(query)
        return output
""",
    "plugin/runner.py": '''\
"""One step, as vllm::unified_attention_with_output would run it (a text the class scan never spares)."""

from vllm.v1.attention.backend import AttentionMetadata

from plugin.impl import PluginImpl


def step(query):
    impl = PluginImpl()
    return impl.decode_step(query)
''',
    "plugin/wrapper.py": """\
from plugin.impl import PluginImpl


class Wrapper(PluginImpl):
    def run(self, query):
        return self.decode_step(query).view(-1)
""",
    "plugin/mla.py": """\
from vllm.v1.attention.backend import MLAAttentionImpl


class PluginMLAImpl(MLAAttentionImpl):
    def do_kv_cache_update(self, kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale):
        pass
""",
    "tools/hooks.py": """\
import inspect

from plugin.mla import PluginMLAImpl


def arity():
    return len(inspect.signature(PluginMLAImpl.do_kv_cache_update).parameters)
""",
    "tools/bench.py": """\
def time_it(impl, query):
    return impl.decode_step(query, None)
""",
}


def _tree(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _findings(root):
    from vllm_attn_compat.codemods.run.options import Options
    from vllm_attn_compat.codemods.run.runner import run_paths

    report = run_paths([str(root)], Options(mode="check", jobs=1))
    return sorted((path, f.line, f.column, f.code, f.message, f.status) for path, f in report.findings)


def test_a_run_recording_the_uses_it_reads_reports_what_one_recording_every_use_does(tmp_path, monkeypatch):
    """An index records the attribute uses of the names the analysis reads (`hierarchy.uses_read`), and a file using
    one found after it was indexed is indexed again: over a plugin whose callers the rounds find at each stage, the
    legacy plugin and the plugin shapes, the findings are those of a run recording every use."""
    import importlib.util

    from vllm_attn_compat.codemods.index import calls

    spec = importlib.util.spec_from_file_location("plugin_shapes", Path(__file__).parents[1] / "plugin_shapes.py")
    assert spec is not None and spec.loader is not None
    shapes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shapes)
    _tree(tmp_path / "cross", _CROSS_FILE)
    for name, files in shapes.PLUGINS.items():
        _tree(tmp_path / "shapes" / name.replace("-", "_"), files)
    legacy = Path(__file__).parents[3] / "examples" / "legacy_plugin"
    trees = [tmp_path / "cross", tmp_path / "shapes", legacy]
    recorded = [_findings(tree) for tree in trees]
    messages = [finding[4] for finding in recorded[0]]
    assert any("`impl.decode_step(...)` at " in message for message in messages)  # the callers withhold the fix
    assert any("reads its signature" in message for message in messages)  # and so does the signature's reader
    monkeypatch.setattr(calls._Collector, "_records", lambda self, name: self.attributes.add(name) or True)
    assert [_findings(tree) for tree in trees] == recorded


def test_the_first_round_indexes_a_file_while_the_prefilter_looks_at_the_others(tmp_path):
    """The prefilter keeps files as the first round asks for them (`reading.Kept`): the first kept is on its way to
    be indexed before the last is scanned, and the hierarchy is the one of all the files kept."""
    from vllm_attn_compat.codemods.run import files, reading
    from vllm_attn_compat.codemods.run.rounds import build_hierarchy
    from vllm_attn_compat.codemods.run.worker import index_file

    impl = "from vllm.v1.attention.backend import AttentionImpl\n\n\nclass Impl{n}(AttentionImpl):\n    pass\n"
    _tree(tmp_path, {f"plugin/impl{n}.py": impl.format(n=n) for n in range(4)})
    run_files = [reading.read(f, None, 0, False) for f in files.discover([str(tmp_path)]).files]
    events: list[tuple[str, str]] = []

    def scanned(f):
        events.append(("scanned", os.path.basename(f.path)))
        return b"vllm" in f.source

    def index(to_index, names):
        for f in to_index:
            events.append(("indexed", os.path.basename(f.path)))
            yield f.path, index_file(f.source, f.path, names)

    hierarchy, _ = build_hierarchy(run_files, reading.Kept(run_files, scanned), index)
    scans = [n for n, (what, _) in enumerate(events) if what == "scanned"]
    assert [name for what, name in events if what == "scanned"] == [f"impl{n}.py" for n in range(4)]
    assert events.index(("indexed", "impl0.py")) < scans[-1]
    assert sorted(name.rpartition(".")[2] for name in hierarchy.scope_class_names()) == [f"Impl{n}" for n in range(4)]
