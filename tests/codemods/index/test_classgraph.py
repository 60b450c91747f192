"""The run's one class graph: names, ancestors, descendants, relations and where a class's vLLM interface comes from."""

from __future__ import annotations

import pickle

from vllm_attn_compat.codemods.index.classgraph import ClassGraph
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module

IMPL = "vllm.v1.attention.backend.AttentionImpl"


def _graph(classes: dict[str, tuple[str, ...]]) -> ClassGraph:
    graph = ClassGraph()
    for name, bases in classes.items():
        graph.add(name, bases)
    return graph


def test_a_base_names_the_classes_its_dotted_name_may_mean():
    graph = _graph({"plugin.base.Base": (IMPL,), "other.Base": (), "plugin.impl.Impl": ("plugin.base.Base",)})
    assert graph.named("plugin.base.Base") == ("plugin.base.Base",)
    assert graph.named("base.Base") == ("plugin.base.Base",)  # a module name guessed without its package
    assert graph.named("Nope") == ()
    # Loosely, by the last name: a package's re-export.
    assert set(graph.named_loosely("plugin.Base")) == {"plugin.base.Base", "other.Base"}


def test_ancestors_are_nearest_first_and_cycles_end():
    graph = _graph({"m.A": ("m.B", "m.C"), "m.B": ("m.D",), "m.C": ("m.D",), "m.D": ("m.A",)})
    assert graph.ancestors("m.A") == ("m.B", "m.C", "m.D")
    assert graph.lineage("m.B") == ("m.B", "m.D", "m.A", "m.C")
    assert graph.derives("m.B", "m.C") and graph.derives("m.A", "m.A")


def test_descendants_and_related_classes():
    graph = _graph({"m.K": (), "m.T": (IMPL,), "m.Both": ("m.K", "m.T"), "m.Apart": ()})
    assert graph.descendants("m.K") == {"m.K", "m.Both"}
    assert graph.descendants("m.Unknown") == {"m.Unknown"}
    assert graph.related("m.K", "m.T")  # an instance of Both is both
    assert not graph.related("m.Apart", "m.T")
    assert graph.outside_bases("m.Both") == (IMPL,)


def test_provenance_names_the_vllm_interface_and_the_chain_to_it():
    graph = _graph(
        {
            "plugin.base.PluginImpl": (IMPL, "abc.ABC"),
            "plugin.impl.MyImpl": ("plugin.base.PluginImpl",),
            "plugin.other.Plain": ("torch.nn.Module",),
        }
    )
    assert graph.provenance("plugin.impl.MyImpl") == {IMPL: ("plugin.impl.MyImpl", "plugin.base.PluginImpl")}
    assert graph.vllm_bases("plugin.impl.MyImpl") == {IMPL}
    assert graph.provenance("plugin.other.Plain") == {}
    # A fork's own copy of vLLM's base is its own provenance.
    fork = _graph({IMPL: ("abc.ABC",)})
    assert fork.provenance(IMPL) == {IMPL: (IMPL,)}


def test_answers_change_when_a_class_is_added_and_the_graph_pickles():
    graph = _graph({"m.Impl": ("m.Base",)})
    assert graph.ancestors("m.Impl") == () and graph.vllm_bases("m.Impl") == frozenset()
    graph.add("m.Base", (IMPL,))
    assert graph.ancestors("m.Impl") == ("m.Base",) and graph.vllm_bases("m.Impl") == {IMPL}
    copy = pickle.loads(pickle.dumps(graph))
    assert copy.provenance("m.Impl") == graph.provenance("m.Impl")
    other = graph.copy()
    other.add("m.Sub", ("m.Impl",))
    assert "m.Sub" not in graph and graph.descendants("m.Impl") == {"m.Impl"}
    assert other.descendants("m.Impl") == {"m.Impl", "m.Sub"}


def test_the_hierarchy_the_flag_owners_and_the_call_sites_ask_the_one_graph(tmp_path):
    base = tmp_path / "base.py"
    base.write_text(
        "from vllm.v1.attention.backend import AttentionBackend, AttentionImpl\n\n"
        "class PluginBackend(AttentionBackend):\n    accept_output_buffer = False\n\n"
        "class PluginImpl(AttentionImpl):\n    def prefill(self, q, output=None):\n        return output\n"
    )
    impl = tmp_path / "impl.py"
    impl.write_text(
        "from base import PluginBackend, PluginImpl\n\n"
        "class MyBackend(PluginBackend):\n    accept_output_buffer = True\n\n"
        "class MyImpl(PluginImpl):\n    def warm(self, q):\n        return self.prefill(q)\n"
    )
    indexes = [index_module(path.read_bytes(), str(path)) for path in (base, impl)]
    hierarchy = ClassHierarchy.build(indexes)
    assert hierarchy.flags.graph is hierarchy.graph
    assert hierarchy.is_attention_class("impl.MyImpl")
    assert hierarchy.graph.provenance("impl.MyImpl") == {IMPL: ("impl.MyImpl", "base.PluginImpl")}
    assert "`PluginBackend`, a base class of the run" in (hierarchy.flag_readers("impl.MyBackend") or "")
    assert hierarchy.calls.blockers("base.PluginImpl", "prefill", "VAC002")  # `self.prefill(q)` in the subclass
