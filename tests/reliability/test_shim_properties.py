"""The runtime shim never returns wrong numbers: the deprecated forwarders (function and op) give
bit-identical results to the direct with-output op on random shapes, empty batches and single tokens
included; warn-once bookkeeping holds under many threads calling at once."""

from __future__ import annotations

import itertools
import math
import threading
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from .profile import reliability_settings, scaled

compat = pytest.importorskip("vllm_attn_compat.compat", reason="compat (issue 5) is not in the tree yet")
from vllm_attn_compat.backends import Attention, AttentionMetadata, MLAAttention, set_forward_context  # noqa: E402
from vllm_attn_compat.compat import VllmAttnCompatDeprecationWarning, deprecation, forwarders  # noqa: E402

_names = itertools.count()


class _Layers(dict):
    """A private layer registry, the static forward context of the layers built in it."""

    def attention(self, num_heads: int, num_kv_heads: int, head_size: int, head_size_v: int) -> Attention:
        return Attention(
            num_heads, head_size, 1 / math.sqrt(head_size), num_kv_heads, prefix=f"reliability.attn.{next(_names)}",
            head_size_v=head_size_v, attn_backend="sdpa", static_forward_context=self,
        )  # fmt: skip


@pytest.fixture(autouse=True)
def _isolated_shim(monkeypatch):
    monkeypatch.setattr(deprecation, "_reported", {})
    monkeypatch.delenv(deprecation.ENV_WARNINGS, raising=False)
    previous = forwarders.set_route(forwarders.Route())
    yield
    forwarders.set_route(previous)


@st.composite
def _problems(draw):
    num_kv_heads = draw(st.sampled_from([1, 2]))
    num_heads = num_kv_heads * draw(st.sampled_from([1, 2, 3]))
    head_size = draw(st.sampled_from([4, 8, 16]))
    head_size_v = draw(st.sampled_from([head_size, 4, 6]))
    lengths = draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))
    if draw(st.booleans()):
        lengths = draw(st.sampled_from([[0], [1], [1, 0]]))  # empty batch, single token
    return num_heads, num_kv_heads, head_size, head_size_v, lengths, draw(st.integers(0, 2**31 - 1))


def _inputs(layer: Attention, tokens: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sizes = [
        (layer.num_heads, layer.head_size),
        (layer.num_kv_heads, layer.head_size),
        (layer.num_kv_heads, layer.head_size_v),
    ]
    return [torch.randn(tokens, h * d, generator=gen) for h, d in sizes]


@reliability_settings(ci=40, long=1500)
@given(problem=_problems(), three_d=st.booleans())
def test_forwarders_are_bit_identical_to_the_with_output_op(problem, three_d) -> None:
    num_heads, num_kv_heads, head_size, head_size_v, lengths, seed = problem
    layers = _Layers()
    layer = layers.attention(num_heads, num_kv_heads, head_size, head_size_v)
    tokens = sum(lengths)
    q, k, v = _inputs(layer, tokens, seed)
    q3, k3, v3 = (
        q.view(tokens, num_heads, head_size),
        k.view(tokens, num_kv_heads, head_size),
        v.view(tokens, num_kv_heads, head_size_v),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        with set_forward_context(AttentionMetadata.from_lengths(lengths), layers):
            direct = torch.full((tokens, num_heads, head_size_v), float("nan"))
            torch.ops.vllm_attn_compat.unified_attention_with_output(q3, k3, v3, direct, layer.layer_name)
            args = (q3, k3, v3) if three_d else (q, k, v)
            by_function = compat.unified_attention(*args, layer.layer_name)
            by_op = torch.ops.vllm_attn_compat.unified_attention(*args, layer.layer_name)
    assert not direct.isnan().any(), "the with-output op left part of the output unwritten"
    for name, result in (("function", by_function), ("op", by_op)):
        assert result.shape == (tokens, num_heads * head_size_v), f"{name}: shape {tuple(result.shape)}"
        assert torch.equal(result, direct.view(tokens, num_heads * head_size_v)), (
            f"{name} forwarder differs from the with-output op"
        )


@st.composite
def _mla_problems(draw):
    dims = dict(
        num_heads=draw(st.sampled_from([1, 2, 4])), qk_nope=draw(st.sampled_from([4, 8])),
        qk_rope=draw(st.sampled_from([2, 4])), v_head_dim=draw(st.sampled_from([3, 6, 8])),
        kv_lora_rank=draw(st.sampled_from([6, 12])),
    )  # fmt: skip
    lengths = (
        draw(st.sampled_from([[0], [1], [1, 0]]))
        if draw(st.booleans())
        else draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))
    )
    return dims, lengths, draw(st.integers(0, 2**31 - 1))


@reliability_settings(ci=25, long=1000)
@given(problem=_mla_problems(), three_d=st.booleans())
def test_mla_forwarders_are_bit_identical_to_the_with_output_path(problem, three_d) -> None:
    dims, lengths, seed = problem
    _check_mla(dims, lengths, seed, three_d)


def _check_mla(dims: dict, lengths: list[int], seed: int, three_d: bool) -> None:
    layers = _Layers()
    layer = MLAAttention(
        dims["num_heads"], 0.3, dims["qk_nope"], dims["qk_rope"], dims["v_head_dim"], dims["kv_lora_rank"],
        prefix=f"reliability.mla.{next(_names)}", static_forward_context=layers,
    )  # fmt: skip
    tokens = sum(lengths)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, layer.num_heads, layer.qk_head_dim, generator=gen)
    kv_c = torch.randn(tokens, layer.kv_lora_rank, generator=gen)
    k_pe = torch.randn(tokens, 1, layer.qk_rope_head_dim, generator=gen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        with set_forward_context(AttentionMetadata.from_lengths(lengths), layers):
            expected = layer(q, kv_c, k_pe)  # the layer allocates and calls unified_mla_attention_with_output
            args = (
                (q, kv_c, k_pe)
                if three_d
                else (
                    q.reshape(tokens, layer.num_heads * layer.qk_head_dim),
                    kv_c,
                    k_pe.reshape(tokens, layer.qk_rope_head_dim),
                )
            )
            by_function = compat.unified_mla_attention(*args, layer.layer_name)
            by_op = torch.ops.vllm_attn_compat.unified_mla_attention(*args, layer.layer_name, kv_cache_dummy_dep=None)
    for name, result in (("function", by_function), ("op", by_op)):
        assert result.shape == (tokens, layer.num_heads * layer.v_head_dim), f"{name}: shape {tuple(result.shape)}"
        assert torch.equal(result, expected.reshape(result.shape)), (
            f"MLA {name} forwarder differs from the with-output path"
        )


def test_warn_once_under_many_threads() -> None:
    layers = _Layers()
    layer = layers.attention(2, 1, 8, 8)
    q, k, v = _inputs(layer, 3, 0)
    metadata = AttentionMetadata.from_lengths([3])
    with set_forward_context(metadata, layers), warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        expected = compat.unified_attention(q, k, v, layer.layer_name)
    deprecation._reported.clear()

    # Distinct call sites: each lambda is its own line of code.
    sites = [
        lambda: compat.unified_attention(q, k, v, layer.layer_name),
        lambda: compat.unified_attention(q, k, v, layer.layer_name),
        lambda: compat.unified_attention(q, k, v, layer.layer_name),
        lambda: compat.unified_attention(q, k, v, layer.layer_name),
    ]
    threads_count, calls = scaled(16, 64), scaled(25, 200)
    barrier = threading.Barrier(threads_count)
    results: list[torch.Tensor] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(index: int) -> None:
        try:  # the forward context is process-wide, as vLLM's is: the main thread holds it
            barrier.wait()
            for i in range(calls):
                out = sites[(index + i) % len(sites)]()
                with lock:
                    results.append(out)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    with warnings.catch_warnings(record=True) as caught, set_forward_context(metadata, layers):
        warnings.simplefilter("always")
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(threads_count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors
    assert len(results) == threads_count * calls, "results were lost"
    assert all(torch.equal(r, expected) for r in results), "a concurrent call returned a wrong result"
    ours = [w for w in caught if issubclass(w.category, VllmAttnCompatDeprecationWarning)]
    lines = sorted(w.lineno for w in ours)
    assert len(ours) == len(sites) and len(set(lines)) == len(sites), (
        f"expected one warning per call site, got lines {lines}"
    )
    assert all(w.filename == __file__ for w in ours), "a warning names another file than the caller's"


# -- the legacy adapter -----------------------------------------------------------------------------


class _Layer:
    def __init__(self, num_heads: int, num_kv_heads: int, head_size: int, head_size_v: int) -> None:
        self.num_heads, self.num_kv_heads, self.head_size, self.head_size_v = (
            num_heads,
            num_kv_heads,
            head_size,
            head_size_v,
        )


def _legacy_result(layer: _Layer, query: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """What the legacy impls compute from 2-D inputs: elementwise, so any correct path is bit-identical."""
    tokens = query.shape[0]
    q = query.view(tokens, layer.num_heads, layer.head_size)[..., : layer.head_size_v]
    v = value.view(tokens, layer.num_kv_heads, layer.head_size_v).repeat_interleave(
        layer.num_heads // layer.num_kv_heads, 1
    )
    return q * 2 + v


class _ReturnsNew:
    """accept_output_buffer = False, the common case: returns a new [T, H * Dv] tensor."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata):
        assert query.dim() == 2 and key.dim() == 2 and value.dim() == 2, "the legacy path delivered 2-D inputs"
        return _legacy_result(layer, query, value).reshape(query.shape[0], layer.num_heads * layer.head_size_v)


class _ReturnsTransposed:
    """Returns a correct result laid out non-contiguously (a transposed view)."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata):
        result = _legacy_result(layer, query, value).reshape(
            query.shape[0], -1 if query.shape[0] else layer.num_heads * layer.head_size_v
        )
        return result.t().contiguous().t()


class _WritesOutput:
    """Takes the 2-D output and writes into it, returning it (the adapter must not copy)."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        result = _legacy_result(layer, query, value)
        output.copy_(result.reshape(output.shape))
        return output


LEGACY_IMPLS = [_ReturnsNew, _ReturnsTransposed, _WritesOutput]


@reliability_settings(ci=40, long=1500)
@given(problem=_problems(), impl=st.sampled_from(LEGACY_IMPLS))
def test_legacy_adapter_is_bit_identical_to_the_legacy_result(problem, impl) -> None:
    num_heads, num_kv_heads, head_size, head_size_v, lengths, seed = problem
    _check_adapter(_Layer(num_heads, num_kv_heads, head_size, min(head_size_v, head_size)), sum(lengths), seed, impl)


def _check_adapter(layer: _Layer, tokens: int, seed: int, impl: type) -> None:
    num_heads, num_kv_heads, head_size, head_size_v = (
        layer.num_heads,
        layer.num_kv_heads,
        layer.head_size,
        layer.head_size_v,
    )
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, num_heads, head_size, generator=gen)
    k = torch.randn(tokens, num_kv_heads, head_size, generator=gen)
    v = torch.randn(tokens, num_kv_heads, head_size_v, generator=gen)
    expected = _legacy_result(
        layer, q.reshape(tokens, num_heads * head_size), v.reshape(tokens, num_kv_heads * head_size_v)
    )

    adapted = compat.adapt_legacy_impl(type(f"Adapted{impl.__name__}", (impl,), {}))
    output = torch.full((tokens, num_heads, head_size_v), float("nan"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        returned = adapted().forward(layer, q, k, v, None, None, output=output)
    assert returned is output or returned.data_ptr() == output.data_ptr(), "the adapter returned another tensor"
    assert torch.equal(output, expected), "the adapted legacy impl wrote other numbers than the legacy result"
