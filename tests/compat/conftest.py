"""Fixtures for the compat tests: isolated warn-once state and routing, layers of this package's backends."""

from __future__ import annotations

import itertools
import math

import pytest

from vllm_attn_compat import compat
from vllm_attn_compat.backends import Attention, AttentionMetadata, MLAAttention, set_forward_context
from vllm_attn_compat.compat import adopt, deprecation, forwarders

_names = itertools.count()


@pytest.fixture(autouse=True)
def fresh_warning_state(monkeypatch):
    """Each test starts with no call site reported yet and the default warning mode."""
    monkeypatch.setattr(deprecation, "_reported", {})
    monkeypatch.setattr(adopt, "_ignored_warned", set())
    monkeypatch.delenv(deprecation.ENV_WARNINGS, raising=False)


@pytest.fixture(autouse=True)
def package_flags():
    """The removed flags and the legacy adapter hook on this package's classes, for the test only: the backends'
    own tests check that the reference backends have no accept_output_buffer."""
    compat.install_into_backends()
    yield
    compat.remove_from_backends()


@pytest.fixture(autouse=True)
def package_route():
    """Forwarders go to this package's backends (a vLLM-tier test may have routed them to vLLM)."""
    previous = forwarders.set_route(forwarders.Route())
    yield
    forwarders.set_route(previous)


@pytest.fixture
def layers():
    """A private layer registry; ``make(...)`` builds an Attention in it, ``context(...)`` activates it."""

    class Layers(dict):
        def attention(self, num_heads=4, head_size=16, num_kv_heads=2, head_size_v=None, backend="sdpa"):
            return Attention(
                num_heads,
                head_size,
                1 / math.sqrt(head_size),
                num_kv_heads,
                prefix=f"compat.attn.{next(_names)}",
                head_size_v=head_size_v,
                attn_backend=backend,
                static_forward_context=self,
            )

        def mla(self, num_heads=4, qk_nope=8, qk_rope=4, v_head_dim=6, kv_lora_rank=12):
            return MLAAttention(
                num_heads,
                0.3,
                qk_nope,
                qk_rope,
                v_head_dim,
                kv_lora_rank,
                prefix=f"compat.mla.{next(_names)}",
                static_forward_context=self,
            )

        def context(self, query_lens):
            return set_forward_context(AttentionMetadata.from_lengths(query_lens), self)

    return Layers()


@pytest.fixture(scope="session")
def vllm_plugin_first_load():
    """vLLM's general plugins, restricted to this package's, loaded once per test process as vLLM loads them at
    start-up, every module the plugin patches imported first; the plugin's log lines of that load. The vLLM tier's
    modules that load the plugin ask for this first, so that the first load in a process is always this one."""
    import importlib

    import vllm.plugins

    from vllm_backends import plugin_log_lines

    for name in (
        "vllm.model_executor.layers.attention.attention", "vllm.model_executor.layers.attention.mla_attention",
        "vllm.config", "vllm.forward_context",
    ):  # fmt: skip
        importlib.import_module(name)
    with plugin_log_lines() as lines, pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_PLUGINS", "vllm_attn_compat")
        patch.delenv("VLLM_ATTN_COMPAT_CHECK_OUTPUT", raising=False)
        patch.setattr(vllm.plugins, "plugins_loaded", False)
        vllm.plugins.load_general_plugins()
    return lines
