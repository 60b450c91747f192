"""The plugin against the real vLLM package (>= 0.20): found through its entry point, installed, working.

Set up with ``scripts/install-vllm-tier.sh``; skipped where vLLM is not importable.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import re
import warnings
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm

pytest.importorskip("vllm", reason="the real vLLM package is not installed (run scripts/install-vllm-tier.sh)")
if not any(ep.name == "vllm_attn_compat" for ep in entry_points(group="vllm.general_plugins")):
    pytest.skip(
        "vllm-attn-compat is not pip-installed, so vLLM cannot find its entry point (pip install -e .)",
        allow_module_level=True,
    )

import vllm  # noqa: E402
import vllm.plugins  # noqa: E402
from vllm.config import CompilationConfig, DeviceConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers.attention.attention import Attention, unified_attention_with_output  # noqa: E402
from vllm.model_executor.layers.attention.mla_attention import MLAAttention  # noqa: E402
from vllm.utils.torch_utils import _encode_layer_name  # noqa: E402
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl, MLAAttentionImpl  # noqa: E402

from vllm_attn_compat import compat  # noqa: E402
from vllm_attn_compat.compat import VllmAttnCompatDeprecationWarning, plugin  # noqa: E402
from vllm_attn_compat.compat.legacy import is_adapted  # noqa: E402

from compat_helpers import CopiesInto, causal_attention  # noqa: E402
from vllm_backends import (  # noqa: E402
    MLA_HEADS,
    V_DIM,
    answer_mla_as_a_platform,
    backend_for,
    mla_backend_for,
    mla_inputs,
    mla_layer,
    plugin_log_lines,
)

if plugin.old_api_reason(AttentionBackend) is not None:
    pytest.skip("this tier needs vLLM >= 0.20; the installed vLLM has the old attention API", allow_module_level=True)

_names = itertools.count()


@pytest.fixture(scope="module")
def plugin_log(vllm_plugin_first_load):
    """vLLM's general plugins loaded once, restricted to ours, the way vLLM does at start-up; the plugin's log lines
    then, and those it logs during this module's tests."""
    with plugin_log_lines() as lines:
        lines[:0] = vllm_plugin_first_load
        yield lines


@pytest.fixture(autouse=True)
def package_route(plugin_log):
    """Overrides conftest's: here the forwarders go where the plugin sent them (vLLM), and back afterwards."""
    from vllm_attn_compat.compat import forwarders, vllm_install

    previous = forwarders.set_route(vllm_install.ROUTE)
    yield
    forwarders.set_route(previous)


@pytest.fixture(scope="module")
def vllm_config():
    return VllmConfig(device_config=DeviceConfig(device="cpu"))


def _reference(impl, query, key, value):
    T = query.shape[0]
    heads = (impl.num_heads, impl.num_kv_heads, impl.num_kv_heads)
    q, k, v = (x.reshape(T, h, -1) for x, h in zip((query, key, value), heads, strict=True))
    return causal_attention(q, k, v, impl.scale).reshape(T, -1)


class LegacyImpl(AttentionImpl):
    """A plugin's impl for vLLM <= 0.19 (accept_output_buffer = False): returns a new 2-D tensor."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, *args, **kwargs):
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.seen = []

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None, output_block_scale=None
    ):
        assert output is None or output.dim() == 2, "the adapter passes the old 2-D layout"
        self.seen.append(query.dim())
        return _reference(self, query, key, value)


class WritesOutputImpl(LegacyImpl):
    """A >= 0.20 impl: writes into output."""

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None
    ):
        output.copy_(_reference(self, query, key, value).view(output.shape))
        return output


def _layer(vllm_config, backend, head_size=16, head_size_v=None):
    name = f"model.layers.{next(_names)}.attn"
    with set_current_vllm_config(vllm_config):
        return Attention(
            4, head_size, head_size**-0.5, num_kv_heads=2, prefix=name, attn_backend=backend, head_size_v=head_size_v
        )


def _inputs(layer, T=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(T, 4 * layer.head_size, generator=gen),
        torch.randn(T, 2 * layer.head_size, generator=gen),
        torch.randn(T, 2 * layer.head_size_v, generator=gen),
    )


def _context(vllm_config, layer):
    return set_forward_context({layer.layer_name: None}, vllm_config, slot_mapping={})


def test_plugin_is_found_and_run_by_load_general_plugins(plugin_log):
    (line,) = [line for line in plugin_log if line.startswith("vllm-attn-compat:")]
    for part in (
        "AttentionBackend.accept_output_buffer",
        "Attention.use_output",
        "torch.ops.vllm.unified_attention",
        "torch.ops.vllm.unified_mla_attention",
        "CompilationConfig.splitting_ops",
    ):
        assert part in line
    assert hasattr(torch.ops.vllm, "unified_attention") and hasattr(torch.ops.vllm, "unified_mla_attention")


def test_register_again_changes_nothing(plugin_log):
    from vllm_attn_compat.compat import vllm_install

    flag, init = AttentionBackend.__dict__["accept_output_buffer"], Attention.__init__
    lines = len(plugin_log)
    plugin.register()
    assert vllm_install.install() == []  # each part detects it is already there
    assert AttentionBackend.__dict__["accept_output_buffer"] is flag and Attention.__init__ is init
    assert len(plugin_log) == lines


def test_opt_out_environment_variable(monkeypatch, plugin_log):
    from vllm_attn_compat.compat import vllm_install

    monkeypatch.setenv(plugin.ENV_DISABLE, "1")
    monkeypatch.setattr(vllm_install, "install_features", lambda features: pytest.fail("installed despite the opt-out"))
    plugin.register()
    assert plugin_log[-1] == "vllm-attn-compat: plugin disabled by VLLM_ATTN_COMPAT_DISABLE_PLUGIN; nothing installed"


def test_an_older_vllm_is_left_alone():
    class OldAttentionBackend:  # vLLM <= 0.19 declared the flag on the base class
        accept_output_buffer = False

    assert "vLLM < 0.20" in plugin.old_api_reason(OldAttentionBackend)
    assert plugin.old_api_reason(AttentionBackend) is None


def test_deprecated_attribute_on_the_real_attention_backend():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        values = [AttentionBackend.accept_output_buffer, CPUAttentionBackend.accept_output_buffer]  # READ
    assert values == [True, True]
    assert len(log) == 1  # one call site
    (record,) = log
    assert record.category is VllmAttnCompatDeprecationWarning and "(rule VAC005)" in str(record.message)
    assert record.filename == __file__
    assert (
        "# READ"
        in inspect.getsource(test_deprecated_attribute_on_the_real_attention_backend).splitlines()[
            record.lineno - test_deprecated_attribute_on_the_real_attention_backend.__code__.co_firstlineno
        ]
    )


def _vllm_backends_with_a_stale_flag():
    """vLLM's own backend classes that still assign ``accept_output_buffer = True`` (0.20.0's TurboQuant backend
    does; later releases may drop or add such lines), found by reading the installed sources, then imported."""
    import vllm.v1.attention.backends as package

    stale = re.compile(r"^\s+accept_output_buffer\s*(:\s*bool\s*)?=\s*True\b", re.MULTILINE)
    found, skipped = [], []
    for path in sorted(Path(package.__file__).parent.rglob("*.py")):
        if not stale.search(path.read_text(encoding="utf-8")):
            continue
        module_name = ".".join(path.relative_to(Path(package.__file__).parent.parent).with_suffix("").parts)
        try:
            module = importlib.import_module(f"vllm.v1.attention.{module_name}")
        except Exception as error:  # noqa: BLE001 - GPU-only modules do not import on this machine
            skipped.append(f"{module_name}: {error!r}")
        else:
            found += [
                cls
                for cls in vars(module).values()
                if isinstance(cls, type)
                and cls.__dict__.get("accept_output_buffer") is True
                and cls.__module__ == module.__name__
            ]
    return found, skipped


def test_redundant_flag_reported_for_a_plugin_backend(vllm_config):
    backend = backend_for(WritesOutputImpl, accept_output_buffer=True)
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        _layer(vllm_config, backend)
    (record,) = [record for record in log if record.category is VllmAttnCompatDeprecationWarning]
    assert "Backend.accept_output_buffer = True` was removed in vLLM 0.20" in str(record.message)
    assert record.filename == inspect.getsourcefile(backend)  # the plugin's backend class, where the line to delete is


def test_redundant_flag_not_reported_for_vllms_own_backends():
    from vllm_attn_compat.compat.flags import check_backend_flag

    backends, not_importable = _vllm_backends_with_a_stale_flag()
    if not backends:
        pytest.skip(
            f"vLLM {vllm.__version__} has no CPU-importable backend left that assigns "
            "accept_output_buffer = True, so there is no stale line of vLLM's own to leave unreported"
            + (f" (not importable here: {'; '.join(not_importable)})" if not_importable else "")
        )
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        for backend in backends:
            check_backend_flag(backend)
    assert log == []


def test_use_output_reads_true_on_the_real_layer(vllm_config):
    layer = _layer(vllm_config, backend_for(WritesOutputImpl))
    with pytest.warns(VllmAttnCompatDeprecationWarning, match=r"`Attention.use_output` was removed in vLLM 0.20"):
        assert layer.use_output is True


def test_legacy_backend_through_vllms_unified_attention_with_output(vllm_config):
    layer = _layer(vllm_config, backend_for(LegacyImpl, accept_output_buffer=False), head_size_v=8)
    assert is_adapted(LegacyImpl)
    q, k, v = _inputs(layer)
    expected = _reference(layer.impl, q, k, v)
    views = (q.view(5, 4, 16), k.view(5, 2, 16), v.view(5, 2, 8))
    with _context(vllm_config, layer), warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        by_function = torch.full((5, 4, 8), float("nan"))
        unified_attention_with_output(*views, by_function, layer.layer_name)
        by_op = torch.full((5, 4, 8), float("nan"))
        torch.ops.vllm.unified_attention_with_output(*views, by_op, _encode_layer_name(layer.layer_name))
        by_layer = layer(q, k, v)  # vLLM's Attention.forward: allocates with torch.empty, calls the op
    for result in (by_function, by_op, by_layer):
        torch.testing.assert_close(result.reshape(5, -1), expected, atol=2e-5, rtol=2e-5)
    assert layer.impl.seen == [2, 2, 2]


@pytest.mark.parametrize("encoded", [False, True], ids=["str", "LayerName"])
def test_torch_ops_vllm_unified_attention_through_the_real_layer_lookup(vllm_config, encoded):
    layer = _layer(vllm_config, backend_for(WritesOutputImpl), head_size_v=8)
    q, k, v = _inputs(layer, seed=1)
    name = _encode_layer_name(layer.layer_name) if encoded else layer.layer_name
    with _context(vllm_config, layer):
        with pytest.warns(VllmAttnCompatDeprecationWarning, match=r"rule VAC007") as log:
            by_op = torch.ops.vllm.unified_attention(q, k, v, name)  # OP-CALL
        with pytest.warns(VllmAttnCompatDeprecationWarning, match=r"rule VAC007"):
            by_function = compat.unified_attention(q, k, v, layer.layer_name)
        by_layer = layer(q, k, v)
    (record,) = log
    assert (
        record.filename == __file__
        and "# OP-CALL" in inspect.getsource(inspect.getmodule(_layer)).splitlines()[record.lineno - 1]
    )
    assert by_op.shape == (5, 4 * 8)
    torch.testing.assert_close(by_op, by_layer, rtol=0, atol=0)
    torch.testing.assert_close(by_function, by_layer, rtol=0, atol=0)
    torch.testing.assert_close(by_layer, _reference(layer.impl, q, k, v), atol=2e-5, rtol=2e-5)


def test_unknown_layer_name_in_vllms_forward_context(vllm_config):
    layer = _layer(vllm_config, backend_for(WritesOutputImpl))
    q, k, v = _inputs(layer)
    with _context(vllm_config, layer), warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        with pytest.raises(KeyError, match=r"attention layer in vLLM's forward context .* found 'no.such.layer'"):
            compat.unified_attention(q, k, v, "no.such.layer")


def test_real_compilation_config_normalises_old_op_names():
    old_and_new = ["vllm::unified_attention", "vllm::other", "vllm::unified_attention_with_output"]
    expected = r"'vllm::unified_attention' named in splitting_ops"
    with pytest.warns(VllmAttnCompatDeprecationWarning, match=expected) as log:
        config = CompilationConfig(splitting_ops=old_and_new)
    assert config.splitting_ops == ["vllm::unified_attention_with_output", "vllm::other"]
    assert {record.filename for record in log if record.category is VllmAttnCompatDeprecationWarning} == {__file__}
    assert config.splitting_ops_contain_attention() is False  # MLA still missing: vLLM's own check sees the real list
    with pytest.warns(VllmAttnCompatDeprecationWarning) as log:
        full = CompilationConfig(
            splitting_ops=[
                "vllm::unified_attention",
                "vllm::unified_mla_attention",
                *(op for op in CompilationConfig._attention_ops if "unified_" not in op),
            ]
        )
    assert full.splitting_ops_contain_attention()
    assert ["'vllm::unified_attention' named" in str(r.message) for r in log] == [True, False]


# Backends that never declared accept_output_buffer (vLLM's base default was False until 0.19): the plugin adapts
# their impls by SGLang's rule, with no action from the user.
class DefaultFlagLegacyImpl(LegacyImpl):
    """Written for vLLM <= 0.19 without setting the flag: takes `output` in its signature, ignores it, returns."""

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None, output_block_scale=None
    ):
        T = query.shape[0]
        return _reference(self, query.reshape(T, -1), key.reshape(T, -1), value.reshape(T, -1))


class WritesWithOutImpl(LegacyImpl):
    """A >= 0.20 impl: computes straight into `output` (matmul out=) and returns it."""

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None
    ):
        group = self.num_heads // self.num_kv_heads
        q, k, v = query.transpose(0, 1), key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
        scores = (q @ k.permute(1, 2, 0)) * self.scale
        T = query.shape[0]
        scores.masked_fill_(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        torch.matmul(scores.softmax(-1), v.transpose(0, 1), out=output.transpose(0, 1))
        return output


@pytest.mark.parametrize(
    "impl_cls, copies, warns",
    [(DefaultFlagLegacyImpl, 1, True), (WritesWithOutImpl, 0, False)],
    ids=["default-flag legacy", "writes output"],
)
def test_backend_that_never_declared_the_flag_through_the_real_layer(vllm_config, impl_cls, copies, warns):
    from vllm_attn_compat.compat.adopt import ADOPTS
    from vllm_attn_compat.compat.flags import declared_accept_output_buffer

    impl_cls = type(impl_cls.__name__, (impl_cls,), {"__module__": __name__})  # fresh: adopted and warned here
    layers = [_layer(vllm_config, backend_for(impl_cls), head_size_v=8) for _ in range(2)]
    layer = layers[0]
    assert declared_accept_output_buffer(layer.attn_backend) is None  # never declared
    wrapped = impl_cls.__dict__["forward"]
    assert hasattr(wrapped, ADOPTS) and not hasattr(getattr(wrapped, ADOPTS), ADOPTS)  # once, for both layers
    q, k, v = _inputs(layer, seed=2)
    expected = _reference(layer.impl, q, k, v)
    buffer = torch.full((5, 4, 8), float("nan"))
    with _context(vllm_config, layer), warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        by_layer = layer(q, k, v)  # vLLM's Attention.forward: torch.empty, then unified_attention_with_output
        with CopiesInto(buffer) as counter:
            unified_attention_with_output(q.view(5, 4, 16), k.view(5, 2, 16), v.view(5, 2, 8), buffer, layer.layer_name)
    torch.testing.assert_close(by_layer, expected, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(buffer.reshape(5, -1), expected, atol=2e-5, rtol=2e-5)
    assert counter.writes["copies"] == copies
    ours = [w for w in log if w.category is VllmAttnCompatDeprecationWarning]
    if warns:
        (record,) = ours  # once per class, though called twice
        assert "returning its result instead of writing into `output`" in str(record.message)
        assert "change it by hand (rule VAC004)" in str(record.message) and record.filename == __file__
    else:
        assert ours == []


def test_vllms_own_impls_are_not_wrapped(vllm_config):
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    from vllm_attn_compat.compat import vllm_install
    from vllm_attn_compat.compat.adopt import ADOPTS

    inherits = type("PluginImplInheritingForward", (CPUAttentionBackendImpl,), {})
    for cls in (CPUAttentionBackendImpl, inherits):
        vllm_install._adopt_outside_vllm(cls, "forward")
        assert not hasattr(cls.forward, ADOPTS)  # vLLM's forward writes into output: nothing to adopt


# MLA: vLLM's MLAAttention asks the platform for its backend, which no CPU platform gives; the tests answer as an
# out-of-tree platform plugin does (`vllm_backends.answer_mla_as_a_platform`), then drive the real layer:
# MLAAttention.__init__, forward, forward_impl, the impl's forward_mha.


def _mla_result(q):
    """What the test impls compute for the prefill (MHA) tokens: a function of q, [T, heads * v_head_dim]."""
    return (q[..., :V_DIM] * 2 + 1).reshape(q.shape[0], -1)


class LegacyMLAImpl(MLAAttentionImpl):
    """An MLA impl whose forward_mha returns its result, as a pre-0.20 no-output MLA path did."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads, *args, **kwargs):
        self.num_heads, self.dcp_world_size = num_heads, 1

    def forward_mha(self, q, kv_c_normed, k_pe, kv_c_and_k_pe_cache, attn_metadata, k_scale, output, output_scale=None):
        return _mla_result(q)

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        raise AssertionError("prefill-only metadata: the decode path is not taken")


class WritesOutputMLAImpl(LegacyMLAImpl):
    def forward_mha(self, q, kv_c_normed, k_pe, kv_c_and_k_pe_cache, attn_metadata, k_scale, output, output_scale=None):
        torch.add(q[..., :V_DIM] * 2, 1, out=output.view(q.shape[0], MLA_HEADS, V_DIM))
        return output


class LegacyMLALayer(MLAAttention):
    """An out-of-tree MLA layer whose forward_impl returns a new tensor, as on the pre-0.20 no-output path."""

    def forward_impl(self, q, k_c_normed, k_pe, kv_cache, attn_metadata, output=None, **kwargs):
        return _mla_result(q)


@pytest.fixture
def mla_platform(monkeypatch):
    """Resolve MLA backends as an out-of-tree platform does; ``use(backend)`` picks the class it answers."""
    from vllm.v1.attention import selector

    yield answer_mla_as_a_platform(monkeypatch)
    selector._cached_get_attn_backend.cache_clear()


def _mla_layer(vllm_config, layer_cls=None):
    return mla_layer(vllm_config, f"model.layers.{next(_names)}.self_attn.mla", layer_cls)


def _run_mla(vllm_config, layer, T=5):
    q, kv_c, k_pe, prefill_only = mla_inputs(T)
    with (
        set_forward_context({layer.layer_name: prefill_only}, vllm_config, slot_mapping={}),
        warnings.catch_warnings(record=True) as log,
    ):
        warnings.simplefilter("always")
        out = layer(q, kv_c, k_pe, output_shape=torch.Size((T, MLA_HEADS * V_DIM)))
    return q, out, [w for w in log if w.category is VllmAttnCompatDeprecationWarning]


@pytest.mark.parametrize(
    "impl_cls, warns",
    [(LegacyMLAImpl, True), (WritesOutputMLAImpl, False)],
    ids=["returns a new tensor", "writes output"],
)
def test_mla_impl_through_the_real_mla_layer(vllm_config, mla_platform, impl_cls, warns):
    from vllm_attn_compat.compat.adopt import ADOPTS

    impl_cls = type(impl_cls.__name__, (impl_cls,), {"__module__": __name__})
    mla_platform(mla_backend_for(impl_cls))
    layer = _mla_layer(vllm_config)
    assert type(layer.impl) is impl_cls and hasattr(impl_cls.forward_mha, ADOPTS)
    assert not hasattr(MLAAttention.forward_impl, ADOPTS)  # vLLM's own layer writes into output
    q, out, log = _run_mla(vllm_config, layer)
    torch.testing.assert_close(out, _mla_result(q))  # without the plugin: whatever torch.empty held
    if warns:
        (record,) = log
        assert "LegacyMLAImpl.forward_mha` returning its result" in str(record.message)
    else:
        assert log == []


def test_out_of_tree_mla_layer_whose_forward_impl_returns(vllm_config, mla_platform):
    from vllm_attn_compat.compat.adopt import ADOPTS

    mla_platform(mla_backend_for(type("Impl", (WritesOutputMLAImpl,), {"__module__": __name__})))
    layer = _mla_layer(vllm_config, LegacyMLALayer)
    assert hasattr(LegacyMLALayer.forward_impl, ADOPTS)
    q, out, log = _run_mla(vllm_config, layer)
    torch.testing.assert_close(out, _mla_result(q))
    (record,) = log
    assert "LegacyMLALayer.forward_impl` returning its result" in str(record.message)
