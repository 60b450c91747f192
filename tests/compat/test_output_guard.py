"""The output guard through this package's own layers and backends (no vLLM): it names the impl, the layer and the
rows a step left unwritten, leaves a backend that writes everything alone, and is nothing at all when off."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from vllm_attn_compat.backends import Attention, AttentionBackend, AttentionImpl, MLAAttention
from vllm_attn_compat.backends.sdpa import SDPAImpl
from vllm_attn_compat.compat import (
    OutputNotCheckedWarning,
    OutputNotWrittenError,
    OutputNotWrittenWarning,
    adapt_legacy_impl,
    output_guard,
)

from compat_helpers import random_inputs


@pytest.fixture(autouse=True)
def guard_off_afterwards():
    yield
    output_guard.set_mode(None)
    for cls in (Attention, MLAAttention):
        output_guard.remove_from(cls)
    output_guard.reset_warnings()


def _guard(mode):
    output_guard.set_mode(mode)
    output_guard.install_on(Attention, mla=False)
    output_guard.install_on(MLAAttention, mla=True)


class _Writes(SDPAImpl):
    """SDPA, then ``spoil(output, n)`` puts the guard's NaN back into the rows it names (as if never written)."""

    spoil = None

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, **kwargs):
        super().forward(layer, query, key, value, kv_cache, attn_metadata, output, output_scale, **kwargs)
        if self.spoil is not None:
            rows = self.spoil(attn_metadata.num_actual_tokens)
            view, bits = output_guard.sentinel_view(output[rows])
            view.fill_(bits)
        return output


def _backend(impl_cls, **attributes):
    return type(
        "Backend",
        (AttentionBackend,),
        {
            "get_name": staticmethod(lambda: "guard-test"),
            "get_impl_cls": staticmethod(lambda: impl_cls),
            **attributes,
        },
    )


def _impl(spoil):
    return type("SpoilingImpl", (_Writes,), {"spoil": staticmethod(spoil), "__module__": __name__})


def _run(layers, layer, lengths, padding=0):
    q, k, v = random_inputs(layer, sum(lengths) + padding)
    output = torch.full((q.shape[0], layer.num_heads, layer.head_size_v), 7.0)
    with layers.context(lengths):
        layer(q, k, v, output=output)
    return output


@pytest.mark.parametrize(
    "spoil, unwritten, first",
    [
        (lambda n: slice(None, n), 5, 0),  # writes nothing
        (lambda n: slice(n - 1, n), 1, 4),  # leaves its last row
        (lambda n: slice(1, 3), 2, 1),  # rows in the middle
        (lambda n: (slice(2, 3), 1), 1, 2),  # one head of one row
    ],
    ids=["nothing", "last row", "middle rows", "one head"],
)
def test_error_mode_names_the_impl_the_layer_and_the_rows(layers, spoil, unwritten, first):
    _guard("error")
    layer = layers.attention(backend=_backend(_impl(spoil)))
    with pytest.raises(OutputNotWrittenError) as raised:
        _run(layers, layer, [2, 3])
    text = str(raised.value)
    assert f"attention impl `SpoilingImpl` (module `{__name__}`), layer {layer.layer_name!r}" in text
    assert f"left {unwritten} of the 5 rows of `output` this step must write unwritten (first: row {first})" in text
    assert "write the result of every token [:num_actual_tokens] into `output`" in text
    assert isinstance(raised.value, RuntimeError)


def test_warn_mode_warns_once_per_layer_and_keeps_going(layers):
    _guard("warn")
    first, second = (layers.attention(backend=_backend(_impl(lambda n: slice(n - 1, n)))) for _ in range(2))
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        for layer in (first, second, first, second):
            _run(layers, layer, [4])
    records = [w for w in log if w.category is OutputNotWrittenWarning]
    assert [first.layer_name in str(r.message) for r in records] == [True, False]
    assert second.layer_name in str(records[1].message) and issubclass(OutputNotWrittenWarning, RuntimeWarning)


def test_padding_rows_are_neither_filled_nor_checked(layers):
    _guard("error")
    layer = layers.attention(backend="sdpa")
    output = _run(layers, layer, [3, 2], padding=3)  # rows 5..7: CUDA-graph padding the backend leaves alone
    assert torch.equal(output[5:], torch.full_like(output[5:], 7.0))
    assert not output[:5].isnan().any()


@pytest.mark.parametrize("head_size_v", [8, 16])
@pytest.mark.parametrize("lengths", [[1], [5], [2, 3, 1]])
def test_a_backend_that_writes_everything_gives_the_same_bits_with_the_guard(layers, head_size_v, lengths):
    layer = layers.attention(backend="sdpa", head_size_v=head_size_v)
    off = _run(layers, layer, lengths)
    _guard("error")
    guarded = layers.attention(backend="sdpa", head_size_v=head_size_v)
    guarded.load_state_dict(layer.state_dict())
    on = _run(layers, guarded, lengths)
    assert torch.equal(on.view(torch.int32), off.view(torch.int32))
    assert "forward" in vars(guarded.impl) and "forward" not in vars(layer.impl)  # the guard was there


class _ReturnsNew(AttentionImpl):
    """A legacy impl (accept_output_buffer = False): returns the result of SDPA, 2-D."""

    def __init__(self, *args, **kwargs):
        self.sdpa = SDPAImpl(*args, **kwargs)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata):
        n = query.shape[0]
        out = torch.empty(n, layer.num_heads, layer.head_size_v)
        self.sdpa.forward(
            layer,
            query.view(n, layer.num_heads, -1),
            key.view(n, layer.num_kv_heads, -1),
            value.view(n, layer.num_kv_heads, -1),
            kv_cache,
            attn_metadata,
            out,
        )
        return out.view(n, -1)


def test_an_adapted_legacy_result_counts_as_written(layers):
    _guard("error")
    layer = layers.attention(backend=_backend(adapt_legacy_impl(type("Legacy", (_ReturnsNew,), {}))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        output = _run(layers, layer, [2, 2])
    assert not output.isnan().any()


def test_mla_through_this_packages_layer(layers):
    _guard("error")
    layer = layers.mla()
    q, kv_c, k_pe = torch.randn(4, 4, 12), torch.randn(4, 12), torch.randn(4, 1, 4)
    with layers.context([4]):
        layer(q, kv_c, k_pe)  # the reference MLA backend writes everything
    impl_cls = type(layer.impl)

    class HalfMLAImpl(impl_cls):
        def forward(self, layer, q, kv_c_normed, k_pe, kv_cache, attn_metadata, output, *args):
            impl_cls.forward(self, layer, q, kv_c_normed, k_pe, kv_cache, attn_metadata, output, *args)
            view, bits = output_guard.sentinel_view(output[2:])
            view.fill_(bits)  # rows 2.. as if never written
            return output

    layer = layers.mla()
    layer.impl.__class__ = HalfMLAImpl
    with layers.context([4]), pytest.raises(OutputNotWrittenError, match=r"HalfMLAImpl` .* left 2 of the 4 rows"):
        layer(q, kv_c, k_pe)


def test_under_torch_compile_the_check_runs_inside_the_op(layers):
    _guard("error")
    layer = layers.attention(backend=_backend(_impl(lambda n: slice(n - 1, n))))
    q, k, v = random_inputs(layer, 5)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    with layers.context([5]), pytest.raises(OutputNotWrittenError, match=r"first: row 4"):
        compiled(q, k, v)
    good = layers.attention(backend="sdpa")
    with layers.context([5]):
        torch.testing.assert_close(torch.compile(good, fullgraph=True)(q, k, v), good(q, k, v), rtol=0, atol=0)


def _check(output, write, metadata=None):
    impl, layer = SimpleNamespace(), SimpleNamespace(layer_name="unit.layer")
    metadata = metadata or SimpleNamespace(num_actual_tokens=output.shape[0])
    return output_guard.check(lambda: write(output), output, metadata, impl, layer)


FLOAT_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64] + [
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_every_float_dtype_is_filled_with_its_own_nan_and_checked(dtype):
    output_guard.set_mode("error")
    seen = {}
    _check(
        torch.zeros(3, 2, 4, dtype=dtype), lambda out: (seen.setdefault("nan", out.isnan().all().item()), out.zero_())
    )
    assert seen == {"nan": True}  # the fill is a NaN of this dtype
    _check(torch.zeros(3, 2, 4, dtype=dtype), lambda out: out.zero_())
    with pytest.raises(OutputNotWrittenError, match=r"left 1 of the 3 rows .* row 1"):
        _check(torch.zeros(3, 2, 4, dtype=dtype), lambda out: (out[:1].zero_(), out[2:].zero_()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_a_nan_the_backend_computes_is_not_taken_for_an_unwritten_row(dtype):
    output_guard.set_mode("error")
    _check(torch.zeros(2, 4, dtype=dtype), lambda out: out.copy_(torch.zeros_like(out) / 0))  # 0/0: NaN, written


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.bool, torch.uint8])
def test_a_dtype_without_nan_is_said_once_never_guessed(dtype):
    output_guard.set_mode("error")
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        for _ in range(2):
            _check(torch.zeros(3, 4, dtype=dtype), lambda out: None)  # writes nothing: not checkable, not raised
    (record,) = [w for w in log if w.category is OutputNotCheckedWarning]
    assert f"`output` of dtype {dtype} has no NaN to fill it with, so the guard cannot check it" in str(record.message)


def test_warm_up_steps_without_metadata_are_not_checked():
    output_guard.set_mode("error")
    output = torch.zeros(3, 4)
    output_guard.check(lambda: None, output, None, SimpleNamespace(), SimpleNamespace())
    assert torch.equal(output, torch.zeros(3, 4))


def test_metadata_without_num_actual_tokens_checks_every_row():
    output_guard.set_mode("error")
    with pytest.raises(OutputNotWrittenError, match=r"left 1 of the 4 rows .* row 3"):
        _check(torch.zeros(4, 2), lambda out: out[:3].zero_(), metadata=SimpleNamespace())


def test_off_installs_nothing_and_leaves_the_forward_path_as_it_is(layers):
    init, mla_init, forward = Attention.__init__, MLAAttention.__init__, SDPAImpl.__dict__["forward"]
    assert not hasattr(init, output_guard.GUARDS) and output_guard.current_mode() is None
    layer = layers.attention(backend="sdpa")
    assert "forward" not in vars(layer.impl) and type(layer.impl).forward is forward
    _guard("warn")
    assert Attention.__init__ is not init and "forward" in vars(layers.attention(backend="sdpa").impl)
    output_guard.set_mode(None)
    for cls in (Attention, MLAAttention):
        assert output_guard.remove_from(cls)
    assert Attention.__init__ is init and MLAAttention.__init__ is mla_init  # the very same function objects
    assert "forward" not in vars(layers.attention(backend="sdpa").impl)


@pytest.mark.parametrize(
    "value, mode",
    [
        ("error", "error"),
        ("warn", "warn"),
        (" WARN ", "warn"),
        ("1", "error"),
        ("0", None),
        ("", None),
        (None, None),
        ("off", None),
    ],
)
def test_the_switch(value, mode):
    assert output_guard.parse_mode(value) == mode


def test_a_switch_it_cannot_read_says_what_it_expected():
    with pytest.raises(
        ValueError,
        match=r"VLLM_ATTN_COMPAT_CHECK_OUTPUT: expected error, warn, 1 \(= error\), or "
        r"0 / unset \(off\); found 'yes'",
    ):
        output_guard.parse_mode("yes")


@pytest.mark.parametrize(
    "mode, error, match",
    [
        (3, TypeError, r"check_output\(mode\): expected 'error', 'warn', True, False or None; found 3"),
        (
            "loud",
            ValueError,
            r"check_output\(mode\): expected error, warn, 1 \(= error\), or 0 / unset \(off\); found 'loud'",
        ),
    ],
)
def test_check_output_says_what_it_expected(mode, error, match):
    from vllm_attn_compat.compat import check_output

    with pytest.raises(error, match=match):
        check_output(mode)
    assert output_guard.current_mode() is None and not hasattr(Attention.__init__, output_guard.GUARDS)


def test_a_deep_copy_of_a_guarded_layer_guards_its_own_impl(layers):
    import copy

    _guard("error")
    layer = layers.attention(backend=_backend(_impl(lambda n: slice(n - 1, n))))
    clone = copy.deepcopy(layer)
    guarded = vars(clone.impl)["forward"]
    assert guarded.owner is clone.impl and guarded.layer is clone and guarded.impl is clone.impl
    layers[clone.layer_name] = clone  # the copy answers to the layer's name now
    with pytest.raises(OutputNotWrittenError, match=r"first: row 3"):
        _run(layers, clone, [4])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_on_cuda_it_checks_and_steps_aside_while_a_graph_is_captured(dtype):
    output_guard.set_mode("error")
    output = torch.zeros(4, 2, 8, dtype=dtype, device="cuda")
    with pytest.raises(OutputNotWrittenError, match=r"left 1 of the 4 rows .* row 3"):
        _check(output, lambda out: out[:3].zero_())
    graph, static = torch.cuda.CUDAGraph(), torch.zeros(4, 2, 8, dtype=dtype, device="cuda")
    with torch.cuda.graph(graph):
        _check(static, lambda out: None)  # captured: no fill, no scan, nothing raised (replay runs no Python)
    torch.cuda.synchronize()
