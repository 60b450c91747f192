"""``--vllm-attn-compat-check-output`` end to end: a downstream suite whose test drives vLLM's real ``Attention`` with a
backend that never writes ``output``, and never checks the values. It passes without the option (the garbage goes
unnoticed, as it does in production) and fails with it, naming the backend, serially and under xdist.

The option sets ``VLLM_ATTN_COMPAT_CHECK_OUTPUT=error`` for the session (``pytest_plugin.py``); the session shim
installs the vLLM plugin when the test imports vLLM's attention modules (``session_shim.py``), and the plugin reads
the variable (``compat/output_guard.py``). Each piece is tested alone beside its module; this is the chain.
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from vllm_attn_compat import session_shim

pytest_plugins = ["pytester"]

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="the real vLLM package is not installed"),
    pytest.mark.skipif(
        not any(ep.value == session_shim.TARGET for ep in entry_points(group=session_shim.GROUP)),
        reason="vllm-attn-compat is not pip-installed, so vLLM cannot find its entry point (pip install -e .)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ["-p", "vllm_attn_compat.pytest_plugin", "-p", "no:cacheprovider"]

# A smoke test as forks write them: build the layer, run a step, look at the shape only.
SMOKE_TEST = """\
from types import SimpleNamespace

import torch
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.attention.attention import Attention
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl


class ForgetfulImpl(AttentionImpl):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, *args, **kwargs):
        pass

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        return output  # computes nothing into it


class ForgetfulBackend(AttentionBackend):
    @staticmethod
    def get_name():
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return ForgetfulImpl

    @staticmethod
    def get_builder_cls():
        raise NotImplementedError

    @staticmethod
    def get_kv_cache_shape(*args, **kwargs):
        raise NotImplementedError

    @classmethod
    def supports_head_size(cls, head_size):
        return True


def test_one_step_has_the_right_shape():
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    name = "model.layers.0.self_attn.attn"
    with set_current_vllm_config(config):
        layer = Attention(4, 16, 0.25, num_kv_heads=2, prefix=name, attn_backend=ForgetfulBackend)
    q, k, v = torch.randn(6, 64), torch.randn(6, 32), torch.randn(6, 32)
    with set_forward_context({name: SimpleNamespace(num_actual_tokens=6)}, config, slot_mapping={}):
        out = layer(q, k, v)
    assert out.shape == (6, 64)
"""


@pytest.fixture(scope="module")
def new_vllm():
    from vllm.v1.attention.backend import AttentionBackend

    from vllm_attn_compat.compat import plugin

    if plugin.old_api_reason(AttentionBackend) is not None:
        pytest.skip("needs vLLM >= 0.20; the installed vLLM has the old attention API")


@pytest.fixture
def downstream(pytester, monkeypatch, new_vllm):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    for name in (
        "PYTEST_ADDOPTS", "VLLM_ATTN_COMPAT_CHECK_OUTPUT", "VLLM_ATTN_COMPAT_DISABLE_PLUGIN", "VLLM_PLUGINS",
        "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(test_smoke=SMOKE_TEST)
    return pytester


def test_without_the_option_the_unwritten_output_goes_unnoticed(downstream):
    result = downstream.runpytest_subprocess(*PLUGIN)
    result.assert_outcomes(passed=1)
    assert "OutputNotWrittenError" not in result.stdout.str()


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_with_the_option_the_test_fails_naming_the_backend(downstream, xdist):
    result = downstream.runpytest_subprocess(*PLUGIN, "--vllm-attn-compat-check-output", *xdist)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*OutputNotWrittenError: vllm-attn-compat output guard: attention impl `ForgetfulImpl` "
        "(module `test_smoke`), layer 'model.layers.0.self_attn.attn', left 6 of the 6 rows*",
    ])  # fmt: skip
