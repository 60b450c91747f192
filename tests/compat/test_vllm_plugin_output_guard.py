"""The output guard through vLLM's real ``Attention`` and ``MLAAttention``, turned on the way a vLLM process gets it:
``VLLM_ATTN_COMPAT_CHECK_OUTPUT`` read by the plugin when vLLM's loader registers it (after vLLM's attention modules
were imported, before the layers are built).

Named to run after ``test_vllm_plugin.py``, whose first test reads the log line of the plugin's first install in the
process; this module's loader call would otherwise be that first install.
"""

from __future__ import annotations

import itertools
import warnings
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.vllm

pytest.importorskip("vllm", reason="the real vLLM package is not installed (run scripts/install-vllm-tier.sh)")

import vllm.plugins  # noqa: E402
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers.attention.attention import Attention  # noqa: E402
from vllm.model_executor.layers.attention.mla_attention import MLAAttention  # noqa: E402
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl, MLAAttentionImpl  # noqa: E402

from vllm_attn_compat import compat  # noqa: E402
from vllm_attn_compat.compat import OutputNotWrittenError, OutputNotWrittenWarning, output_guard, plugin  # noqa: E402

from vllm_backends import (  # noqa: E402
    MLA_HEADS,
    V_DIM,
    answer_mla_as_a_platform,
    backend_for,
    mla_backend_for,
    mla_inputs,
    plugin_log_lines,
)
from vllm_backends import mla_layer as vllm_mla_layer  # noqa: E402

if plugin.old_api_reason(AttentionBackend) is not None:
    pytest.skip("this tier needs vLLM >= 0.20; the installed vLLM has the old attention API", allow_module_level=True)

_names = itertools.count()
HEADS, KV_HEADS, SIZE, T = 4, 2, 16, 6


@pytest.fixture(scope="module", autouse=True)
def guard_from_the_environment(vllm_plugin_first_load):
    """``VLLM_ATTN_COMPAT_CHECK_OUTPUT=error``, then vLLM's own loader, restricted to this package's plugin; the
    plugin may have registered earlier in this process (another test module): it reads the variable again."""
    with plugin_log_lines() as lines, pytest.MonkeyPatch.context() as patch:
        patch.setenv(output_guard.ENV_CHECK_OUTPUT, "error")
        patch.setenv("VLLM_PLUGINS", "vllm_attn_compat")
        patch.setattr(vllm.plugins, "plugins_loaded", False)
        vllm.plugins.load_general_plugins()
        yield lines
        compat.check_output(None)


@pytest.fixture(autouse=True)
def error_mode():
    output_guard.set_mode("error")
    output_guard.reset_warnings()
    yield
    output_guard.set_mode("error")


@pytest.fixture(scope="module")
def vllm_config():
    return VllmConfig(device_config=DeviceConfig(device="cpu"))


def _result(impl, query, key, value):
    """What every test impl computes: a function of q, k and v, ``[T, heads, size]``."""
    n = query.shape[0]
    q, k, v = query.reshape(n, HEADS, SIZE), key.reshape(n, KV_HEADS, SIZE), value.reshape(n, KV_HEADS, SIZE)
    return q * 2 + k.repeat_interleave(2, 1) - v.repeat_interleave(2, 1)


class Writes(AttentionImpl):
    """A >= 0.20 impl writing rows ``[:num_actual_tokens]``; ``skip(n)`` names rows it leaves alone."""

    skip = None

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, *args, **kwargs):
        pass

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None
    ):
        n = attn_metadata.num_actual_tokens
        output[:n].copy_(_result(self, query[:n], key[:n], value[:n]))
        if self.skip is not None:
            # As if these rows were never written: they keep what the guard filled them with.
            view, bits = output_guard.sentinel_view(output[self.skip(n)])
            view.fill_(bits)
        return output


class WritesNothing(Writes):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        return output


class LeavesLastRow(Writes):
    skip = staticmethod(lambda n: slice(n - 1, n))


class Legacy(AttentionImpl):
    """Declared accept_output_buffer = False (vLLM <= 0.19): returns a new 2-D tensor."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, *args, **kwargs):
        pass

    def forward(self, layer, query, key, value, kv_cache, attn_metadata):
        return _result(self, query, key, value).reshape(query.shape[0], -1)


class DefaultFlagLegacy(Legacy):
    """Never declared the flag: takes `output`, ignores it, returns its result (the plugin's result copy)."""

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None, output_block_scale=None
    ):
        return _result(self, query, key, value).reshape(query.shape[0], -1)


def _fresh(impl_cls):
    return type(impl_cls.__name__, (impl_cls,), {"__module__": __name__})


def _run(vllm_config, impl_cls, actual=T, **flag):
    name = f"model.layers.{next(_names)}.self_attn.attn"
    with set_current_vllm_config(vllm_config):
        layer = Attention(
            HEADS, SIZE, SIZE**-0.5, num_kv_heads=KV_HEADS, prefix=name, attn_backend=backend_for(impl_cls, **flag)
        )
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(T, HEADS * SIZE, generator=gen), *torch.randn(2, T, KV_HEADS * SIZE, generator=gen)
    metadata = {name: SimpleNamespace(num_actual_tokens=actual)}
    with set_forward_context(metadata, vllm_config, slot_mapping={}), warnings.catch_warnings():
        warnings.simplefilter("ignore", compat.VllmAttnCompatDeprecationWarning)
        out = layer(q, k, v)
    return name, out, _result(None, q, k, v).reshape(T, -1)


def test_the_plugin_installed_the_guard_from_the_environment():
    assert getattr(Attention.__init__, output_guard.GUARDS, False)
    assert getattr(MLAAttention.__init__, output_guard.GUARDS, False)
    assert output_guard.current_mode() == "error"


def test_a_backend_that_writes_nothing_is_named_in_error_mode(vllm_config):
    with pytest.raises(OutputNotWrittenError) as raised:
        _run(vllm_config, _fresh(WritesNothing))
    text = str(raised.value)
    assert f"attention impl `WritesNothing` (module `{__name__}`)" in text
    assert "left 6 of the 6 rows of `output` this step must write unwritten (first: row 0)" in text
    assert "model.layers." in text and ".self_attn.attn'" in text


def test_a_backend_that_writes_nothing_is_warned_about_once_per_layer_in_warn_mode(vllm_config):
    compat.check_output("warn")
    impl_cls = _fresh(WritesNothing)
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        name, _, _ = _run(vllm_config, impl_cls)
        _run(vllm_config, impl_cls)
    records = [w for w in log if w.category is OutputNotWrittenWarning]
    assert len(records) == 2  # two layers, one warning each
    assert f"layer '{name}'" in str(records[0].message) and "`WritesNothing`" in str(records[0].message)


def test_a_backend_that_leaves_its_last_row_is_named(vllm_config):
    with pytest.raises(OutputNotWrittenError, match=r"`LeavesLastRow` .* left 1 of the 5 rows .* \(first: row 4\)"):
        _run(vllm_config, _fresh(LeavesLastRow), actual=5)  # row 5 is padding: never checked


@pytest.mark.parametrize(
    "impl_cls, flag",
    [(Writes, {}), (Legacy, {"accept_output_buffer": False}), (DefaultFlagLegacy, {})],
    ids=["writes output", "adapted legacy", "result copied by the plugin"],
)
def test_backends_whose_output_is_written_are_left_alone(vllm_config, impl_cls, flag):
    _, out, expected = _run(vllm_config, _fresh(impl_cls), **flag)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


# MLA. As in test_vllm_plugin.py: vLLM's MLAAttention asks the platform for its backend, which no CPU platform gives;
# the test answers as an out-of-tree platform plugin does (`vllm_backends.answer_mla_as_a_platform`).


class WritesOutputMLA(MLAAttentionImpl):
    leave = 0  # rows at the end forward_mha leaves alone

    def __init__(self, num_heads, head_size, scale, num_kv_heads, *args, **kwargs):
        self.num_heads, self.dcp_world_size = num_heads, 1

    def forward_mha(self, q, kv_c_normed, k_pe, kv_c_and_k_pe_cache, attn_metadata, k_scale, output, output_scale=None):
        n = q.shape[0] - self.leave
        torch.add(q[:n, :, :V_DIM] * 2, 1, out=output[:n].view(n, MLA_HEADS, V_DIM))
        return output

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        raise AssertionError("prefill-only metadata: the decode path is not taken")


class LeavesLastRowMLA(WritesOutputMLA):
    leave = 1


@pytest.fixture
def mla_layer(monkeypatch, vllm_config):
    """``build(impl_cls)``: vLLM's MLAAttention with a backend for ``impl_cls``, as a platform would give it."""
    from vllm.v1.attention import selector

    use = answer_mla_as_a_platform(monkeypatch)

    def build(impl_cls):
        use(mla_backend_for(impl_cls))
        return vllm_mla_layer(vllm_config, f"model.layers.{next(_names)}.self_attn.mla")

    yield build
    selector._cached_get_attn_backend.cache_clear()


def _run_mla(vllm_config, layer, n=5):
    q, kv_c, k_pe, metadata = mla_inputs(n)
    with set_forward_context({layer.layer_name: metadata}, vllm_config, slot_mapping={}):
        return q, layer(q, kv_c, k_pe, output_shape=torch.Size((n, MLA_HEADS * V_DIM)))


def test_an_mla_backend_that_writes_everything_is_left_alone(vllm_config, mla_layer):
    q, out = _run_mla(vllm_config, mla_layer(_fresh(WritesOutputMLA)))
    torch.testing.assert_close(out, (q[..., :V_DIM] * 2 + 1).reshape(q.shape[0], -1), rtol=0, atol=0)


def test_an_mla_backend_that_leaves_its_last_row_is_named(vllm_config, mla_layer):
    layer = mla_layer(_fresh(LeavesLastRowMLA))
    with pytest.raises(OutputNotWrittenError, match=r"`LeavesLastRowMLA` .* left 1 of the 5 rows .* \(first: row 4\)"):
        _run_mla(vllm_config, layer)


def test_a_value_the_plugin_cannot_read_skips_the_guard_and_says_why(monkeypatch):
    from vllm_attn_compat.compat import vllm_install

    monkeypatch.setenv(output_guard.ENV_CHECK_OUTPUT, "yes")
    installed, skipped = vllm_install.install_features(vllm_install.GUARD_FEATURES)
    assert installed == []
    assert skipped == [
        f"{feature.name} (VLLM_ATTN_COMPAT_CHECK_OUTPUT: expected error, warn, 1 (= error), or 0 / unset (off); "
        "found 'yes')"
        for feature in vllm_install.GUARD_FEATURES
    ]


def test_a_later_register_reads_the_variable_again(monkeypatch, guard_from_the_environment):
    assert not plugin.pending()  # registered already, by vLLM's loader, and every feature installed
    monkeypatch.setenv(output_guard.ENV_CHECK_OUTPUT, "warn")
    plugin.register()
    assert output_guard.current_mode() == "warn"
