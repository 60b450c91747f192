"""VAC011 beyond its examples: imports of removed names in their shapes, a fork's own modules, and the unsafe fix
executed."""

from __future__ import annotations

from vllm_attn_compat.codemods.findings import Status, TargetRelease

from rule_testing import run, source

AT_0_34 = TargetRelease("0.34.0", "0.34.0")


def test_several_names_one_removed_each_at_its_alias():
    text = source(
        """
        from vllm.v1.attention.backend import (
            AttentionBackend,
            SparseMLAAttentionImpl as SparseBase,
        )
        from vllm.model_executor.layers.attention.pcp import maybe_gather_indexer_k
        """
    )
    result = run(text, ["VAC011"], target=AT_0_34)
    # The module 0.29 removed is reported once, at its name, not each name it no longer holds.
    assert [(f.line, f.column, f.release) for f in result.findings] == [(3, 5, "0.26.0"), (5, 6, "0.29.0")]
    assert result.findings[1].message == "`vllm.model_executor.layers.attention.pcp` is gone: vLLM 0.29 removed it"
    at_0_28 = run(text, ["VAC011"], target=TargetRelease("0.28.0", "0.28.0"))
    assert [(f.line, f.column, f.release) for f in at_0_28.findings] == [(3, 5, "0.26.0")]


def test_an_import_of_a_module_a_release_no_longer_has_fails_as_the_finding_says(tmp_path):
    """Each finding is an import that raises ModuleNotFoundError on the target's module tree (the manifest's
    `module_files`, laid out on disk without code), and each import left alone finds its module there."""
    import subprocess
    import sys

    from vllm_attn_compat.manifest import data

    release = "0.34.0"
    tree = tmp_path / "vllm"
    files = {name for name, changes in data.load()["module_files"].items() if data.state_at(changes, release)}
    for name in {*files, "vllm", "vllm.v1", "vllm.model_executor", "vllm.model_executor.layers"}:
        path = tmp_path.joinpath(*name.split("."))
        is_package = name in {"vllm", "vllm.v1", "vllm.model_executor", "vllm.model_executor.layers"} or any(
            other.startswith(name + ".") for other in files
        )
        if is_package:
            path.mkdir(parents=True, exist_ok=True)
            (path / "__init__.py").touch()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_suffix(".py").touch()
    assert tree.is_dir()
    modules = [
        "vllm.attention.backends.abstract",
        "vllm.attention",
        "vllm.v1.attention.backends.tree_attn",
        "vllm.v1.attention.ops.dcp_alltoall",
        "vllm.model_executor.layers.attention.pcp",
        "vllm.v1.attention.backend",
        "vllm.v1.attention.backends.flash_attn",
        "vllm.model_executor.layers.attention.mla_attention",
    ]
    text = "".join(f"import {module}\n" for module in modules)
    findings = run(text, ["VAC011"], target=AT_0_34).findings
    reported = {f.line for f in findings}
    # The release that removed each, where the manifest saw it go; none for the old layout, gone before its first.
    assert [f.release for f in findings] == [None, None, "0.21.0", "0.29.0", "0.29.0"]
    probe = (
        "import importlib, sys\nfor m in sys.argv[1:]:\n    try:\n        importlib.import_module(m)\n"
        "    except ModuleNotFoundError:\n        print(m)\n"
    )
    failing = subprocess.run(
        [sys.executable, "-c", probe, *modules], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split()
    assert {modules.index(m) + 1 for m in failing} == reported
    assert len(reported) == 5


def test_guarded_relative_and_other_projects_imports_are_left_alone():
    text = source(
        """
        try:
            from vllm.v1.attention.backend import SparseMLAAttentionImpl
        except (AttributeError, ModuleNotFoundError):
            pass
        from .backend import SparseMLAAttentionImpl
        from plugin.backend import SparseMLAAttentionImpl
        """
    )
    assert run(text, ["VAC011"], target=AT_0_34).findings == []


def test_a_fork_s_own_module_is_no_removal(tmp_path):
    for folder in ("vllm", "vllm/v1", "vllm/v1/attention"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "vllm/v1/attention/backend.py").write_text("class SparseMLAAttentionImpl: ...\n")
    user = str(tmp_path / "vllm/v1/attention/user.py")
    text = "from vllm.v1.attention.backend import SparseMLAAttentionImpl\n"
    others = [(str(tmp_path / "vllm/v1/attention/backend.py"), "class SparseMLAAttentionImpl: ...\n")]
    assert run(text, ["VAC011"], path=user, others=others, target=AT_0_34).findings == []


def test_a_member_the_project_s_own_subclass_defines_is_not_provably_gone():
    text = source(
        """
        from vllm.v1.attention.backend import AttentionBackend


        class PluginBackend(AttentionBackend):
            @staticmethod
            def get_kv_cache_shape(*args):
                return args


        def shape(backend: AttentionBackend):
            return backend.get_kv_cache_shape(1, 16, 8, 128)
        """
    )
    assert run(text, ["VAC011"], target=AT_0_34).findings == []
    assert len(run(text.replace("get_kv_cache_shape(*args)", "other(*args)"), ["VAC011"], target=AT_0_34).findings) == 1


def test_a_write_is_no_read_and_a_string_annotation_counts():
    text = source(
        """
        from vllm.v1.attention.backend import CommonAttentionMetadata


        def prepare(md: "CommonAttentionMetadata"):
            md.seq_lens_cpu = None
            return md.seq_lens_cpu
        """
    )
    assert [f.line for f in run(text, ["VAC011"], target=AT_0_34).findings] == [6]


def test_the_unsafe_fix_computes_what_the_removed_members_computed():
    """Executed: the removed properties' bodies (0.29.0's) on a stand-in object, against the rewritten reads."""
    text = source(
        """
        from vllm.v1.attention.backend import CommonAttentionMetadata


        def lengths(md: CommonAttentionMetadata):
            return md.seq_lens_cpu, md.num_computed_tokens_cpu, md.num_computed_tokens_cpu[1]
        """
    )
    result = run(text, ["VAC011"], unsafe=True, target=AT_0_34)
    assert [f.status for f in result.findings] == [Status.FIXED, Status.FIXED, Status.FIXED]
    fixed = result.source.decode().replace("from vllm.v1.attention.backend import CommonAttentionMetadata", "")

    class Tensor(list):
        def cpu(self):
            return Tensor(self)

        def __getitem__(self, item):
            got = super().__getitem__(item)
            return Tensor(got) if isinstance(item, slice) else got

        def __sub__(self, other):
            return Tensor(a - b for a, b in zip(self, other, strict=True))

    class Metadata:
        seq_lens = Tensor([5, 7])
        query_start_loc_cpu = Tensor([0, 2, 5])

        @property
        def seq_lens_cpu(self):  # vllm/v1/attention/backend.py, 0.29.0
            return self.seq_lens.cpu()

        @property
        def num_computed_tokens_cpu(self):
            return self.seq_lens_cpu - (self.query_start_loc_cpu[1:] - self.query_start_loc_cpu[:-1])

    namespace: dict[str, object] = {"CommonAttentionMetadata": Metadata}
    exec(compile(fixed, "fixed.py", "exec"), namespace)
    metadata = Metadata()
    expected = (metadata.seq_lens_cpu, metadata.num_computed_tokens_cpu, metadata.num_computed_tokens_cpu[1])
    assert namespace["lengths"](metadata) == expected
