"""Every release at run time (issue 52), against the real vLLM: a backend's overrides of hooks the running release
no longer has are named once per class and hook as its layers are built, and members vLLM removed after saying what
to use instead keep working as deprecated forwarders.

The facts each test expects were read from vLLM's released sources: ``AttentionBackend.get_kv_cache_shape`` is gone
from 0.29.0, ``AttentionMetadataBuilder.build_for_drafting`` from 0.34.0, ``CommonAttentionMetadata.seq_lens_cpu``
and ``num_computed_tokens_cpu`` from 0.30.0. CI runs this tier on 0.20.0, 0.30.0 and 0.34.0.
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
import subprocess
import sys
import warnings
from importlib.metadata import entry_points, version
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest_plugins = ["pytester"]
pytest.importorskip("vllm", reason="the real vLLM package is not installed (run scripts/install-vllm-tier.sh)")
if not any(ep.name == "vllm_attn_compat" for ep in entry_points(group="vllm.general_plugins")):
    pytest.skip("vllm-attn-compat is not pip-installed (pip install -e .)", allow_module_level=True)

from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers.attention.attention import Attention  # noqa: E402
from vllm.v1.attention.backend import (  # noqa: E402
    AttentionBackend,
    AttentionImpl,
    AttentionMetadata,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)

from vllm_attn_compat.compat import DeadOverrideWarning, VllmAttnCompatDeprecationWarning, plugin  # noqa: E402

if plugin.old_api_reason(AttentionBackend) is not None:
    pytest.skip("this tier needs vLLM >= 0.20", allow_module_level=True)

RELEASE = tuple(int(part) for part in version("vllm").split("+")[0].split(".")[:3])
ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def plugin_loaded(vllm_plugin_first_load):
    return vllm_plugin_first_load


def plugin_backend():
    """A fresh backend as an out-of-tree plugin wrote it for vLLM 0.2x (modeled on a real one: its own KV-cache
    shape, a metadata builder overriding the drafting hook)."""

    class PluginMetadata(AttentionMetadata):
        pass

    class PluginMetadataBuilder(AttentionMetadataBuilder[PluginMetadata]):
        def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
            return PluginMetadata()

        def build_for_drafting(self, common_attn_metadata, draft_index):
            return self.build(0, common_attn_metadata)

    class PluginImpl(AttentionImpl):
        def __init__(self, num_heads, head_size, scale, num_kv_heads=None, *args, **kwargs):
            self.num_heads, self.head_size = num_heads, head_size

        def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
            output.zero_()
            return output

    class PluginBackend(AttentionBackend):
        @staticmethod
        def get_name():
            return "CUSTOM"

        @staticmethod
        def get_impl_cls():
            return PluginImpl

        @staticmethod
        def get_builder_cls():
            return PluginMetadataBuilder

        @staticmethod
        def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
            return (2, num_blocks, block_size, num_kv_heads, head_size)

        @classmethod
        def supports_head_size(cls, head_size):
            return True

    return PluginBackend, PluginMetadataBuilder


def _layer(backend):
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        return Attention(4, 16, 0.25, num_kv_heads=2, prefix=f"model.layers.{next(_names)}.attn", attn_backend=backend)


def _dead(caught):
    return [warning for warning in caught if issubclass(warning.category, DeadOverrideWarning)]


def test_each_dead_override_is_named_once_per_class_and_hook():
    backend, builder = plugin_backend()
    expected = {}
    if RELEASE >= (0, 29, 0):
        expected["get_kv_cache_shape"] = (backend, "0.29.0")
    if RELEASE >= (0, 34, 0):
        expected["build_for_drafting"] = (builder, "0.34.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _layer(backend), _layer(backend)  # two layers with the same backend: one warning per class and hook
    dead = _dead(caught)
    assert len(dead) == len(expected), [str(w.message) for w in dead]
    for hook, (owner, removed_in) in expected.items():
        (warning,) = [w for w in dead if f"`{owner.__name__}.{hook}` overrides" in str(w.message)]
        assert f"removed in {removed_in}" in str(warning.message) and "VAC010" in str(warning.message)
        function = inspect.unwrap(vars(owner)[hook].__func__ if hook == "get_kv_cache_shape" else vars(owner)[hook])
        assert (warning.filename, warning.lineno) == (__file__, function.__code__.co_firstlineno)


def test_a_layer_of_a_backend_without_dead_overrides_warns_nothing():
    backend, _ = plugin_backend()
    del backend.get_kv_cache_shape  # what a backend migrated to >= 0.29 looks like (its builder left aside)
    backend.get_builder_cls = staticmethod(lambda: AttentionMetadataBuilder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _layer(backend)
    assert _dead(caught) == []


def _metadata():
    seq_lens = torch.tensor([5, 3])
    query_start_loc = torch.tensor([0, 2, 3])
    return CommonAttentionMetadata(
        query_start_loc=query_start_loc,
        query_start_loc_cpu=query_start_loc.clone(),
        seq_lens=seq_lens,
        num_reqs=2,
        num_actual_tokens=3,
        max_query_len=2,
        max_seq_len=5,
        block_table_tensor=torch.zeros(2, 4, dtype=torch.int32),
        slot_mapping=torch.arange(3),
    )


@pytest.mark.skipif(RELEASE < (0, 30, 0), reason="vLLM < 0.30 still has seq_lens_cpu itself")
def test_a_removed_member_with_a_stated_equivalent_reads_as_vllm_said_and_warns_once():
    metadata = _metadata()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            seq_lens_cpu = metadata.seq_lens_cpu
            computed = metadata.num_computed_tokens_cpu
    assert torch.equal(seq_lens_cpu, torch.tensor([5, 3])) and torch.equal(computed, torch.tensor([3, 2]))
    messages = [str(w.message) for w in caught if issubclass(w.category, VllmAttnCompatDeprecationWarning)]
    assert len(messages) == 2, messages  # once per call site, for each member
    assert "`CommonAttentionMetadata.seq_lens_cpu` was removed in vLLM 0.30.0" in messages[0]
    assert "seq_lens.cpu()" in messages[0] and "device to the host" in messages[0]


@pytest.mark.skipif(RELEASE >= (0, 30, 0), reason="vLLM >= 0.30 removed seq_lens_cpu")
def test_a_member_vllm_still_has_is_never_replaced():
    assert isinstance(vars(CommonAttentionMetadata)["seq_lens_cpu"], property)


@pytest.mark.skipif(RELEASE < (0, 30, 0), reason="vLLM < 0.30 still has seq_lens_cpu itself")
def test_without_the_plugin_the_removed_member_raises():
    code = f"""
import sys; sys.path.insert(0, {str(ROOT / "tests" / "compat")!r})
from dead_overrides_probe import read
print(read())
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == "AttributeError"


STRICT_SESSION = """\
import itertools
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.attention.attention import Attention
from test_vllm_dead_overrides import plugin_backend


def test_builds_a_layer():
    backend, _ = plugin_backend()
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        Attention(4, 16, 0.25, num_kv_heads=2, prefix="model.layers.0.attn", attn_backend=backend)
"""


def test_the_pytest_plugins_strict_mode_fails_a_session_that_built_one(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'compat'}")
    for name in ("PYTEST_ADDOPTS", "VLLM_ATTN_COMPAT_WARNINGS", "VLLM_ATTN_COMPAT_DISABLE_PLUGIN", "VLLM_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(test_strict=STRICT_SESSION)
    result = pytester.runpytest_subprocess(
        "-p", "vllm_attn_compat.pytest_plugin", "-p", "no:cacheprovider", "--vllm-attn-compat=error", timeout=600
    )
    result.assert_outcomes(passed=1)
    if RELEASE >= (0, 29, 0):
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(["VAC010 *test_vllm_dead_overrides.py:*: `PluginBackend.get_kv_cache_shape` (1 *"])
    else:
        assert result.ret == pytest.ExitCode.OK
