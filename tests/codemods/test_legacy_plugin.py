"""examples/legacy_plugin: every rule of the 0.20 migration fires on it; after migration nothing a safe fix could
remove is left, and the migrated backends compute attention inside the real vLLM 0.20 layer. It is migrated for
vLLM 0.20, the release it is run in (the rules of later releases' interface have trees of their own:
plugin_shapes)."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import pytest

from vllm_attn_compat.codemods.engine.migrate import migrate_source
from vllm_attn_compat.codemods.findings import Status, TargetRelease
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module
from vllm_attn_compat.codemods.registry import all_rules

PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "legacy_plugin"
AT_0_20 = TargetRelease("0.20.2", "0.20.2")


def _migrate_tree(root: Path, *, unsafe: bool = False, old_op_calls: str = "with-output") -> dict[str, list]:
    """Migrate every module under ``root`` in place, the way the runner does; findings by file."""
    files = sorted(root.rglob("*.py"))
    sources = {path: path.read_bytes() for path in files}
    hierarchy = ClassHierarchy.build(index_module(source, str(path)) for path, source in sources.items())
    findings = {}
    for path, source in sources.items():
        result = migrate_source(
            source, path=str(path), rules=all_rules(), hierarchy=hierarchy, unsafe_fixes=unsafe,
            old_op_calls=old_op_calls, target=AT_0_20,
        )  # fmt: skip
        compile(result.source, str(path), "exec")
        path.write_bytes(result.source)
        findings[path.name] = result.findings
    return findings


@pytest.fixture()
def migrated(tmp_path) -> Path:
    shutil.copytree(PLUGIN, tmp_path / "legacy_plugin")
    root = tmp_path / "legacy_plugin"
    _migrate_tree(root)
    return root


def test_the_plugin_exercises_every_rule(tmp_path):
    shutil.copytree(PLUGIN, tmp_path / "copy")
    findings = _migrate_tree(tmp_path / "copy")
    codes = {f.code for per_file in findings.values() for f in per_file}
    assert codes == {rule.code for rule in all_rules() if rule.code < "VAC010"}
    # The backend deriving only from the plugin's base (another file) is found through the hierarchy.
    assert {f.code for f in findings["sdpa_backend.py"]} == {"VAC001", "VAC002", "VAC003", "VAC004"}


def test_after_migrate_no_safe_fix_is_left(migrated):
    again = _migrate_tree(migrated)
    left = [(name, f.code, f.status) for name, per_file in again.items() for f in per_file]
    assert left and all(status is not Status.FIXED for _, _, status in left)
    assert sorted((name, code) for name, code, _ in left) == [
        ("adapted_backend.py", "VAC008"),  # the import of the adapter
        ("adapted_backend.py", "VAC008"),  # the decorator
        ("compilation.py", "VAC007"),
        ("layer.py", "VAC005"),
        ("returning_backend.py", "VAC004"),
        ("returning_backend.py", "VAC009"),  # its forward never writes into `output`
    ]
    text = (migrated / "legacy_attn_plugin" / "sdpa_backend.py").read_text()
    for old in ("accept_output_buffer", "assert output is not None", "output is None", "= None,\n        output_scale"):
        assert old not in text
    assert '"vllm::unified_attention",' not in (migrated / "legacy_attn_plugin" / "compilation.py").read_text()


def test_unsafe_fixes_leave_the_op_call_without_a_layer_shape_and_the_uses_of_this_package(tmp_path):
    shutil.copytree(PLUGIN, tmp_path / "copy")
    _migrate_tree(tmp_path / "copy", unsafe=True)
    again = _migrate_tree(tmp_path / "copy", unsafe=True)
    left = sorted((name, f.code, f.status) for name, per_file in again.items() for f in per_file)
    # The adapter (import and decorator): a person makes the impl write into `output`. The debug helper
    # gets a layer name only: nothing in scope gives the output's shape. The returning backend lost its
    # `accept_output_buffer = False` only with the adapter around its impl (#50), which VAC008 reports; its
    # forward still never writes into `output`.
    assert left == [
        ("adapted_backend.py", "VAC008", Status.MANUAL),
        ("adapted_backend.py", "VAC008", Status.MANUAL),
        ("compilation.py", "VAC007", Status.MANUAL),
        ("returning_backend.py", "VAC008", Status.MANUAL),
        ("returning_backend.py", "VAC009", Status.MANUAL),
    ]


def test_unsafe_fixes_with_the_forwarder_route_leave_only_the_uses_of_this_package(tmp_path):
    shutil.copytree(PLUGIN, tmp_path / "copy")
    _migrate_tree(tmp_path / "copy", unsafe=True, old_op_calls="forwarder")
    again = _migrate_tree(tmp_path / "copy", unsafe=True, old_op_calls="forwarder")
    left = sorted((name, f.code, f.status) for name, per_file in again.items() for f in per_file)
    # The forwarder VAC007 routed the op call to is this package's deprecated name: VAC008 reports it.
    assert left == [
        ("adapted_backend.py", "VAC008", Status.MANUAL),
        ("adapted_backend.py", "VAC008", Status.MANUAL),
        ("compilation.py", "VAC008", Status.MANUAL),
        ("returning_backend.py", "VAC008", Status.MANUAL),
        ("returning_backend.py", "VAC009", Status.MANUAL),
    ]


@pytest.fixture()
def migrated_package(migrated):
    sys.path.insert(0, str(migrated))
    try:
        yield importlib.import_module("legacy_attn_plugin")
    finally:
        sys.path.remove(str(migrated))
        for name in [n for n in sys.modules if n == "legacy_attn_plugin" or n.startswith("legacy_attn_plugin.")]:
            del sys.modules[name]


@pytest.mark.vllm
def test_migrated_backends_compute_attention_in_real_vllm(migrated_package):
    pytest.importorskip("vllm", reason="the real vLLM package is not installed (run scripts/install-vllm-tier.sh)")
    import torch
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.layers.attention.attention import Attention

    from vllm_attn_compat.compat import adapt_legacy_impl

    sdpa = importlib.import_module("legacy_attn_plugin.sdpa_backend")
    returning = importlib.import_module("legacy_attn_plugin.returning_backend")
    returning.ReturningImpl = adapt_legacy_impl(returning.ReturningImpl)  # what VAC004's report recommends

    vllm_config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    heads, kv_heads, head_size, tokens = 4, 2, 16, 7
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(tokens, heads * head_size, generator=gen)
    key = torch.randn(tokens, kv_heads * head_size, generator=gen)
    value = torch.randn(tokens, kv_heads * head_size, generator=gen)
    q, k, v = (x.view(tokens, -1, head_size).transpose(0, 1).double() for x in (query, key, value))
    k, v = k.repeat_interleave(2, 0), v.repeat_interleave(2, 0)
    scores = (q @ k.transpose(1, 2)) * head_size**-0.5
    scores = scores.masked_fill(torch.ones(tokens, tokens, dtype=torch.bool).triu(1), float("-inf"))
    expected = (scores.softmax(-1) @ v).transpose(0, 1).reshape(tokens, -1).float()

    for index, backend in enumerate((sdpa.SdpaBackend, returning.ReturningBackend)):
        name = f"legacy_plugin.layers.{index}.attn"
        with set_current_vllm_config(vllm_config):
            layer = Attention(
                heads, head_size, head_size**-0.5, num_kv_heads=kv_heads, prefix=name, attn_backend=backend
            )
        with set_forward_context({name: None}, vllm_config, slot_mapping={}):
            result = layer(query, key, value)
        torch.testing.assert_close(result, expected, rtol=1e-4, atol=1e-4, msg=f"{backend.__name__}")
