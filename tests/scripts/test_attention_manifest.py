"""scripts/attention_manifest.py: what it reads from releases' sources (fake releases written here, each change
once), its ``--check``, its docs, and the shipped data regenerated from real vLLM sources."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from manifest_trees import SCRIPTS, load_script, write_releases

script = load_script()
from manifest_gen import docs, history, left_out, references, release, successors, wheels  # noqa: E402

ROOT = SCRIPTS.parent
SHIPPED = ROOT / "vllm_attn_compat" / "manifest" / "attention_api.json"
BACKEND = "vllm.v1.attention.backend"
LAYERS = "vllm.model_executor.layers.attention"
# Where the unpacked sources of vLLM releases are (DIR/<version>/vllm/, as /work/vllm-src holds them): the
# regeneration test reads every release there; without it, the installed vLLM's own release.
SOURCES_VARIABLE = "VLLM_ATTN_COMPAT_VLLM_SOURCES"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The manifest and docs the script writes for the three fake releases."""
    root = tmp_path_factory.mktemp("releases")
    write_releases(root / "src")
    output, page = root / "out" / "attention_api.json", root / "out" / "attention-api.md"
    args = ["--sources", str(root / "src"), "--output", str(output), "--docs", str(page), "--jobs", "1"]
    assert script.main(args) == 0
    return {"root": root, "args": args, "data": json.loads(output.read_text()), "docs": page.read_text(), "out": output}


def members(data, cls):
    return data["classes"][cls]["members"]


def test_reads_the_releases_of_the_folder_from_0_19_on(generated):
    assert generated["data"]["releases"] == ["0.40.0", "0.41.0", "0.42.0"]
    listing = (generated["out"].parent / "releases.txt").read_text()
    assert listing == "0.40.0\n0.41.0\n0.42.0\n"


def test_a_removed_member_has_its_last_state_then_null(generated):
    history_ = members(generated["data"], f"{BACKEND}.AttentionBackend")["get_kv_cache_shape"]
    assert [release for release, _ in history_] == ["0.40.0", "0.42.0"]
    state, gone = history_[0][1], history_[1][1]
    assert gone is None
    assert state["kind"] == "staticmethod"
    assert state["abstract"] is True
    assert state["params"] == [
        ["num_blocks", "pk", None, "int"],
        ["block_size", "pk", None, "int"],
        ["cache_dtype_str", "pk", "'auto'", "str"],
    ]
    assert state["returns"] == "tuple[int, ...]"
    assert "referenced" not in state  # vLLM's runner calls it


def test_a_changed_signature_is_a_new_state(generated):
    history_ = members(generated["data"], f"{BACKEND}.AttentionBackend")["validate_configuration"]
    assert [release for release, _ in history_] == ["0.40.0", "0.42.0"]
    assert [p[0] for p in history_[0][1]["params"]] == ["cls", "head_size", "dtype"]
    assert history_[1][1]["params"][-1] == ["use_mm_prefix", "pk", "False", "bool"]


def test_a_new_abstract_member(generated):
    history_ = members(generated["data"], f"{BACKEND}.AttentionBackend")["get_builder_cls"]
    assert history_ == [["0.42.0", {"kind": "staticmethod", "params": [], "abstract": True}]]


def test_deprecations_in_each_form_vllm_writes_them(generated):
    metadata = members(generated["data"], f"{BACKEND}.CommonAttentionMetadata")
    decorated = metadata["seq_lens_cpu"][0][1]
    assert decorated["kind"] == "property"
    assert decorated["deprecated"] == (
        "Prefer using device seq_lens directly. If a CPU copy is needed, use `seq_lens.cpu()` instead."
    )
    warned = metadata["num_computed_tokens_cpu"][0][1]
    assert warned["deprecated"] == "num_computed_tokens_cpu is deprecated; derive it from query_start_loc_cpu"
    # A comment above a run of fields deprecates the run, up to the blank line.
    comment = "WARNING: Deprecated fields. Will be removed in a future release"
    assert metadata["_seq_lens_cpu"][0][1]["deprecated"] == comment
    assert metadata["_old_cache"][0][1]["deprecated"] == comment
    assert "deprecated" not in metadata["num_reqs"][0][1]
    assert metadata["num_reqs"][0][1]["kind"] == "field"
    # A docstring's Args line deprecates that parameter alone.
    build = members(generated["data"], f"{BACKEND}.AttentionMetadataBuilder")["build"]
    assert "deprecated_params" not in build[0][1]
    assert build[1][0] == "0.42.0"
    assert build[1][1]["deprecated_params"] == {
        "common_prefix_len": "Deprecated and always 0. Kept for out-of-tree builders."
    }
    assert "deprecated" not in build[1][1]


def test_a_removed_class(generated):
    entry = generated["data"]["classes"][f"{BACKEND}.SparseMLAAttentionImpl"]
    assert entry["history"] == [["0.40.0", {"bases": ["abc.ABC"], "kind": "class"}], ["0.42.0", None]]
    assert entry["members"]["forward_mqa"][0][1]["abstract"] is True
    assert entry["members"]["forward_mqa"][-1] == ["0.42.0", None]


def test_an_op_registered_then_removed(generated):
    ops = generated["data"]["ops"]
    assert ops["vllm::unified_attention"][-1] == ["0.42.0", None]
    registered = ops["vllm::unified_attention_with_output"]
    assert len(registered) == 1
    state = registered[0][1]
    assert state["module"] == f"{LAYERS}.attention"
    assert state["function"] == "unified_attention_with_output"
    assert state["mutates_args"] == ["output"]
    assert [p[0] for p in state["params"]] == ["query", "key", "value", "output", "layer_name", "output_scale"]
    assert state["returns"] == "None"
    function = generated["data"]["functions"][f"{LAYERS}.attention.unified_attention"]
    assert function[-1] == ["0.42.0", None]


def test_a_registry_enum_member_added(generated):
    enum = generated["data"]["classes"][f"{BACKEND}s.registry.AttentionBackendEnum"]
    assert enum["history"][0][1]["kind"] == "enum"
    assert enum["members"]["TREE_ATTN"] == [
        [
            "0.41.0",
            {
                "kind": "enum_member",
                "value": "'vllm.v1.attention.backends.tree_attn.TreeAttentionBackend'",
                "referenced": False,
            },
        ]
    ]
    assert enum["members"]["CUSTOM"][0][1]["value"] == "None"
    assert f"{BACKEND}s.registry.register_backend" in generated["data"]["functions"]


def test_a_hook_vllm_no_longer_calls(generated):
    drafting = members(generated["data"], f"{BACKEND}.AttentionMetadataBuilder")["build_for_drafting"]
    # 0.40.0's runner calls it; 0.42.0 only has an override calling super(), which is no use by vLLM.
    assert [(release, (state or {}).get("referenced", True)) for release, state in drafting] == [
        ("0.40.0", True),
        ("0.42.0", False),
    ]
    # A string naming it (getattr) is a use.
    layout = members(generated["data"], f"{BACKEND}.AttentionBackend")["get_required_kv_cache_layout"]
    assert "referenced" not in layout[0][1]
    # Never used anywhere: an attribute nothing reads.
    assert members(generated["data"], f"{BACKEND}.CommonAttentionMetadata")["_old_cache"][0][1]["referenced"] is False


def test_modules_re_exports_and_bases(generated):
    names = generated["data"]["modules"][LAYERS]
    assert names["Attention"] == [["0.40.0", f"import {LAYERS}.attention.Attention"]]
    mla = generated["data"]["classes"][f"{LAYERS}.attention.MLAAttention"]
    assert mla["history"][0][1]["bases"] == [f"{LAYERS}.attention.Attention"]
    attention = generated["data"]["modules"][f"{LAYERS}.attention"]
    assert "AttentionBackend" not in attention  # imported for its own use, not re-exported


def test_every_module_of_the_attention_packages_with_the_release_that_removed_it(generated):
    files = generated["data"]["module_files"]
    assert files["vllm.v1.attention.ops.dcp_alltoall"] == [["0.40.0", "module"], ["0.42.0", None]]
    assert files["vllm.v1.attention.ops.old_ops"] == [["0.40.0", "package"], ["0.42.0", None]]
    assert files["vllm.v1.attention.backend"] == [["0.40.0", "module"]]
    assert not any(name.startswith("vllm.v1.worker") for name in files)  # outside the attention packages
    # The docs name the module and the package gone, not each module of the package.
    page = generated["docs"]
    assert "| removed | `vllm.v1.attention.ops.dcp_alltoall` | module | VAC011 |" in page
    assert "| removed | `vllm.v1.attention.ops.old_ops` | package | VAC011 |" in page
    assert "old_ops.kernels" not in page


def test_successors_from_messages_and_the_curated_table(generated):
    found = generated["data"]["successors"]
    assert found[f"{BACKEND}.CommonAttentionMetadata.seq_lens_cpu"]["use"] == "self.seq_lens.cpu()"
    assert found[f"{BACKEND}.CommonAttentionMetadata.seq_lens_cpu"]["kind"] == "expression"
    assert found[f"{BACKEND}.AttentionBackend.get_required_kv_cache_layout"]["use"] == "supported_kv_cache_layouts"
    # Curated entries whose members these releases lack are left out.
    assert f"{BACKEND}.AttentionBackend.get_kv_cache_stride_order" not in found


def test_a_snapshot_comes_back_from_the_histories(generated):
    source = generated["root"] / "src" / "0.41.0"
    assert history.snapshot_at(generated["data"], "0.41.0") == release.snapshot(release.FolderSources(source))


def test_the_docs_name_each_change_and_its_rule(generated):
    page = generated["docs"]
    section = page[page.index("## 0.42.0") : page.index("## 0.41.0")]
    rows = [
        "| removed | `AttentionBackend.get_kv_cache_shape` | staticmethod; successor: `supported_kv_cache_layouts` | "
        "VAC010, VAC011 |",
        "| signature changed | `AttentionBackend.validate_configuration` | new parameter `use_mm_prefix` "
        "(default `False`) | VAC012 |",
        "| abstract | `AttentionBackend.get_builder_cls` | a new abstract member | VAC013 |",
        "| no longer called | `AttentionMetadataBuilder.build_for_drafting` | vLLM no longer uses the name outside "
        "its own definitions | VAC010 |",
        "| removed | `SparseMLAAttentionImpl` | class | VAC011 |",
        "| removed | `vllm::unified_attention` | op | VAC011 |",
        "| removed | `CommonAttentionMetadata.seq_lens_cpu` | property; deprecated: Prefer using device seq_lens "
        "directly. If a CPU copy is needed, use `seq_lens.cpu()` instead.; successor: `self.seq_lens.cpu()` | "
        "VAC010, VAC011 |",
    ]
    for row in rows:
        assert row in section
    assert "| added | `AttentionBackendEnum.TREE_ATTN` | enum_member; not called by vLLM | — |" in page
    assert "## 0.40.0\n\nThe first release the manifest describes." in page


def test_check_passes_on_what_it_wrote_and_names_what_differs(generated, capsys):
    assert script.main([*generated["args"], "--check"]) == 0
    data = generated["data"]
    stale = json.loads(json.dumps(data))
    del stale["classes"][f"{BACKEND}.AttentionBackend"]["members"]["get_required_kv_cache_layout"]
    generated["out"].write_text(history.dumps(stale))
    try:
        capsys.readouterr()
        assert script.main([*generated["args"], "--check"]) == 1
        err = capsys.readouterr().err
        assert f"release 0.40.0: class {BACKEND}.AttentionBackend differs" in err
        assert "regenerate with: python scripts/attention_manifest.py" in err
    finally:
        generated["out"].write_text(history.dumps(data))
    assert script.main([*generated["args"], "--check"]) == 0


def test_bad_releases_are_refused(generated, capsys):
    with pytest.raises(SystemExit):
        script.main(["--sources", str(generated["root"] / "src"), "--releases", "0.40", "--check"])
    assert "expected final releases X.Y.Z from 0.19.0 on, found 0.40" in capsys.readouterr().err


def test_a_wheel_is_read_out_of_its_zip(tmp_path, generated):
    wheel = tmp_path / "vllm-0.42.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    source = generated["root"] / "src" / "0.42.0"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in sorted(source.rglob("*.py")):
            archive.write(path, path.relative_to(source).as_posix())
        archive.writestr("vllm/_C.abi3.so", b"\0")
        archive.writestr("vllm-0.42.0.dist-info/METADATA", "Name: vllm\n")
    sources = release.WheelSources(wheel)
    try:
        assert all(p.startswith("vllm/") and p.endswith(".py") for p in sources.paths())
        assert release.snapshot(sources) == release.snapshot(release.FolderSources(source))
    finally:
        sources.close()


def test_final_releases_from_0_19_oldest_first():
    versions = ["0.34.0", "0.20.0", "0.19.1", "0.18.1", "0.35.0rc1", "0.10.1.1", "0.8.5.post1", "0.19.0"]
    assert wheels.final_releases(versions) == ["0.19.0", "0.19.1", "0.20.0", "0.34.0"]


def test_uses_outside_own_definitions_count():
    source = (
        "class A:\n"
        "    def hook(self):\n"
        "        return super().hook() + self.hook_two()\n"
        "def call(x):\n"
        "    return getattr(x, 'other')\n"
        "# x.commented\n"
        "'''a docstring naming x.documented'''\n"
    )
    found = references.used_names([("m.py", source)], {"hook", "hook_two", "other", "commented", "documented"})
    assert found == {"hook_two", "other"}


def test_abstract_members_vllms_own_concrete_classes_leave_out():
    interface = {
        "vllm.backend.Backend": {
            "members": {
                "get_name": {"kind": "staticmethod", "abstract": True},
                "get_impl_cls": {"kind": "staticmethod", "abstract": True},
                "get_shape": {"kind": "staticmethod", "abstract": True},
            }
        },
        # An interface class declaring a member of its base abstract again: what a subclass lacks is its.
        "vllm.backend.SparseBackend": {"members": {"get_shape": {"kind": "staticmethod", "abstract": True}}},
    }
    modules = {
        "vllm.backend": "class Backend: ...\nclass SparseBackend(Backend): ...\n",
        "vllm.backends.sparse": (
            "from vllm.backend import SparseBackend\n"
            "class IndexerBackend(SparseBackend):\n"
            "    get_name = get_impl_cls = staticmethod(lambda: None)\n"
        ),
        # A package re-exporting the interface: the classes importing it from there derive from it too.
        "vllm.backends": "from vllm.backend import Backend\n",
        "vllm.backends.mamba": (
            "from vllm.backends import Backend\n"
            "class MambaBackend(Backend):\n"
            "    @staticmethod\n"
            "    def get_name(): return 'MAMBA'\n"
        ),
        # A mixin naming nothing of the interface, in a module of its own: found through the headers naming it.
        "vllm.mixins": "class ShapeMixin:\n    @staticmethod\n    def get_shape(): return ()\n",
        "vllm.backends.paged": (
            "import abc\n"
            "from vllm.backend import Backend as Base\n"
            "from vllm.mixins import ShapeMixin\n"
            "from vllm.elsewhere import Helper\n"
            "class PagedBackend(ShapeMixin, Base):\n"  # the mixin implements get_shape
            "    get_name = staticmethod(lambda: 'PAGED')\n"
            "class SharedBackend(Base):\n"  # derived from below: not concrete
            "    pass\n"
            "class SharedLeafBackend(SharedBackend):\n"
            "    def get_name(): ...\n"
            "    def get_impl_cls(): ...\n"
            "    def get_shape(): ...\n"
            "class PendingBackend(Base):\n"  # declares an abstract method: abstract
            "    @abc.abstractmethod\n"
            "    def more(self): ...\n"
            "class CommonBackendBase(Base):\n"  # named a base
            "    pass\n"
            "class HelpedBackend(Helper, Base):\n"  # a base of vLLM's the tree cannot show may implement them
            "    pass\n"
            "class Unresolved(somewhere.Backend):\n"  # not the interface as far as the tree shows
            "    pass\n"
        ),
        "vllm.broken": "class Broken(Backend:\n",  # does not parse: passed over
    }
    found = left_out.left_out([(name, name == "vllm.backends", text) for name, text in modules.items()], interface)
    lacking = ["vllm.backend.Backend.get_impl_cls", "vllm.backend.Backend.get_shape"]
    assert found == {
        "vllm.backends.mamba.MambaBackend": lacking,
        "vllm.backends.paged.PagedBackend": ["vllm.backend.Backend.get_impl_cls"],
        "vllm.backends.sparse.IndexerBackend": ["vllm.backend.SparseBackend.get_shape"],
    }


# ---------------------------------------------------------------- the shipped data


def shipped():
    return json.loads(SHIPPED.read_text(encoding="utf-8"))


def test_the_shipped_docs_and_release_list_are_what_the_script_writes():
    data = shipped()
    assert (ROOT / "docs" / "attention-api.md").read_text(encoding="utf-8") == docs.render(data)
    assert (SHIPPED.parent / "releases.txt").read_text(encoding="utf-8") == "".join(f"{v}\n" for v in data["releases"])
    assert SHIPPED.read_text(encoding="utf-8") == history.dumps(data)


def test_every_curated_successor_names_members_the_shipped_data_has():
    data = shipped()
    for key, entry in successors.CURATED.items():
        qualified, _, member = key.rpartition(".")
        assert member in data["classes"][qualified]["members"], key
        if entry["kind"] == "member":
            assert entry["use"] in data["classes"][qualified]["members"], key
        assert data["successors"][key] == entry


def _installed_vllm() -> tuple[str, Path] | None:
    try:
        from importlib.metadata import PackageNotFoundError, distribution
    except ImportError:  # pragma: no cover
        return None
    try:
        dist = distribution("vllm")
    except PackageNotFoundError:
        return None
    return dist.version, Path(str(dist.locate_file("")))


def test_the_shipped_data_is_what_the_sources_at_hand_give():
    """Each release whose sources are at hand regenerates to the shipped entry: every release under
    $VLLM_ATTN_COMPAT_VLLM_SOURCES when set, else the installed vLLM's own release from its installed files."""
    data = shipped()
    folder = os.environ.get(SOURCES_VARIABLE)
    if folder:
        pairs = [(v, Path(folder) / v) for v in data["releases"] if (Path(folder) / v / "vllm").is_dir()]
        assert pairs, f"${SOURCES_VARIABLE}={folder} holds no release of the manifest"
    else:
        installed = _installed_vllm()
        if installed is None:
            pytest.skip(f"vLLM is not installed and ${SOURCES_VARIABLE} is not set: no release's sources at hand")
        version, site = installed
        if version not in data["releases"]:
            pytest.fail(f"the installed vLLM {version} is not in the manifest: regenerate it")
        pairs = [(version, site)]
    for version, root in pairs:
        regenerated = release.snapshot(release.FolderSources(root))
        assert regenerated == history.snapshot_at(data, version), f"{version} regenerates differently"


@pytest.mark.registry
def test_check_regenerates_the_shipped_data_from_the_registries():
    """The script's --check, downloading every release's wheel (a new vLLM release makes this fail until the data
    is regenerated: that is the point)."""
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(SCRIPTS / "attention_manifest.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    print(f"attention_manifest --check from the registries: {time.monotonic() - start:.0f}s")
    assert out.returncode == 0, out.stderr[-4000:]
