"""The legacy adapter: pre-0.20 return-value impls give correct output, with one copy at most."""

from __future__ import annotations

import inspect
import warnings
from typing import ClassVar

import pytest
import torch

from vllm_attn_compat.backends import AttentionBackend, AttentionImpl
from vllm_attn_compat.compat import VllmAttnCompatDeprecationWarning, adapt_legacy_impl
from vllm_attn_compat.compat.adopt import ReturnValueIgnoredWarning
from vllm_attn_compat.compat.legacy import is_adapted

from compat_helpers import CopiesInto, causal_attention, random_inputs


def _attention_2d(impl, query, key, value):
    """Causal attention of one sequence on the old 2-D layout; returns ``[T, H * Dv]``, float32."""
    T = query.shape[0]
    q = query.view(T, impl.num_heads, -1)
    k, v = key.view(T, impl.num_kv_heads, -1), value.view(T, impl.num_kv_heads, -1)
    return causal_attention(q, k, v, impl.scale).reshape(T, -1)


class ReturnsNewImpl(AttentionImpl):
    """Written for vLLM <= 0.19 with accept_output_buffer = False: 2-D in, a new tensor out."""

    seen_shapes: ClassVar[list] = []  # shared by every instance: the test reads what any of them saw

    def forward(self, layer, query, key, value, kv_cache, attn_metadata):
        self.seen_shapes.append((tuple(query.shape), tuple(key.shape), tuple(value.shape)))
        return _attention_2d(self, query, key, value)


class ReturnsNewBackend(AttentionBackend):
    accept_output_buffer = False

    @staticmethod
    def get_name():
        return "legacy-returns-new"

    @staticmethod
    def get_impl_cls():
        return ReturnsNewImpl


class WritesInPlaceImpl(AttentionImpl):
    """A legacy impl with the optional-output fallback: it writes into ``output`` when given one."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        if output is None:
            output = torch.empty(query.shape[0], self.num_heads * self.head_size_v)
        T = query.shape[0]
        q = query.view(T, self.num_heads, -1).transpose(0, 1)
        k = key.view(T, self.num_kv_heads, -1).repeat_interleave(self.num_heads // self.num_kv_heads, 1)
        v = value.view(T, self.num_kv_heads, -1).repeat_interleave(self.num_heads // self.num_kv_heads, 1)
        scores = (q @ k.permute(1, 2, 0)) * self.scale
        scores.masked_fill_(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        torch.matmul(scores.softmax(-1), v.transpose(0, 1), out=output.view(T, self.num_heads, -1).transpose(0, 1))
        return output


class RedundantFlagBackend(AttentionBackend):
    accept_output_buffer = True

    @staticmethod
    def get_name():
        return "redundant-flag"

    @staticmethod
    def get_impl_cls():
        from vllm_attn_compat.backends.sdpa import SDPAImpl

        return SDPAImpl


def _fresh_impl_class(base):
    """A new subclass per test, so that adapting it and warning about it start from scratch."""
    return type(base.__name__, (base,), {"seen_shapes": []})


def _impl(cls, num_heads=4, head_size=8, num_kv_heads=2, head_size_v=8):
    return cls(num_heads, head_size, head_size**-0.5, num_kv_heads, head_size_v)


def _qkv_3d(impl, T, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(T, impl.num_heads, impl.head_size, generator=gen),
        torch.randn(T, impl.num_kv_heads, impl.head_size, generator=gen),
        torch.randn(T, impl.num_kv_heads, impl.head_size_v, generator=gen),
    )


def test_legacy_backend_through_the_layer_gives_attention(layers):
    ReturnsNewImpl.seen_shapes = []
    layer = layers.attention(num_heads=4, head_size=16, num_kv_heads=2, head_size_v=8, backend=ReturnsNewBackend)
    assert is_adapted(ReturnsNewImpl)
    q, k, v = random_inputs(layer, 5)
    with warnings.catch_warnings(record=True) as log, layers.context([5]):
        warnings.simplefilter("always")
        results = [layer(q, k, v) for _ in range(3)]
    expected = _attention_2d(layer.impl, q, k, v)
    for result in results:
        torch.testing.assert_close(result, expected, atol=2e-5, rtol=2e-5)
    # The impl got the old 2-D layout although the layer passes 3-D views.
    assert ReturnsNewImpl.seen_shapes == [((5, 64), (5, 32), (5, 16))] * 3
    (record,) = [w for w in log if w.category is VllmAttnCompatDeprecationWarning]
    message = str(record.message)
    assert "ReturnsNewImpl.forward` returning its result" in message and "(rule VAC004)" in message
    assert (record.filename, record.lineno) == (__file__, inspect.getsourcelines(ReturnsNewImpl)[1])


@pytest.mark.parametrize("impl_cls, copies", [(ReturnsNewImpl, 1), (WritesInPlaceImpl, 0)])
def test_copies_only_when_the_impl_did_not_write_into_output(impl_cls, copies):
    impl = _impl(adapt_legacy_impl(_fresh_impl_class(impl_cls)))
    q, k, v = _qkv_3d(impl, 6)
    buffer = torch.full((8, impl.num_heads, impl.head_size_v), 7.0)
    output = buffer[:6]  # a slice of a persistent buffer, as with CUDA-graph padding
    with CopiesInto(output) as counter, warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        returned = impl.forward(None, q, k, v, torch.empty(0), None, output)
    assert counter.writes["copies"] == copies
    assert returned is output
    torch.testing.assert_close(output, causal_attention(q, k, v, impl.scale), atol=2e-5, rtol=2e-5)
    assert torch.equal(buffer[6:], torch.full_like(buffer[6:], 7.0))  # rows after the slice untouched


@pytest.mark.parametrize("argument", ["output_scale", "output_block_scale"])
def test_output_quantization_is_rejected_before_anything_is_written(argument):
    impl = _impl(adapt_legacy_impl(_fresh_impl_class(ReturnsNewImpl)))
    q, k, v = _qkv_3d(impl, 3)
    output = torch.full((3, impl.num_heads, impl.head_size_v), 7.0)
    with pytest.raises(ValueError, match=rf"must be None; found .*{argument}=Tensor\(1,\)"):
        impl.forward(None, q, k, v, torch.empty(0), None, output, **{argument: torch.ones(1)})
    assert torch.equal(output, torch.full_like(output, 7.0))
    assert type(impl).seen_shapes == []  # the legacy forward never ran


def test_a_result_of_the_wrong_size_is_an_error_and_output_is_untouched():
    class WrongSize(_fresh_impl_class(ReturnsNewImpl)):
        def forward(self, layer, query, key, value, kv_cache, attn_metadata):
            return torch.zeros(query.shape[0], 5)

    impl = _impl(adapt_legacy_impl(WrongSize))
    q, k, v = _qkv_3d(impl, 3)
    output = torch.full((3, impl.num_heads, impl.head_size_v), 7.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        expected = (
            r"WrongSize.forward returned a tensor of shape \(3, 5\) that cannot fill `output` of shape \(3, 4, 8\)"
        )
        with pytest.raises(ValueError, match=expected):
            impl.forward(None, q, k, v, torch.empty(0), None, output)
    assert torch.equal(output, torch.full_like(output, 7.0))


def test_an_impl_given_output_that_writes_it_and_returns_its_lse_keeps_what_it_wrote():
    class WritesReturnsLse(_fresh_impl_class(ReturnsNewImpl)):
        def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
            output.copy_(torch.ones_like(output))  # 2-D rows of the buffer, as the adapter passes them
            return torch.zeros(query.shape[0], self.num_heads)  # its LSE: not the result

    impl = _impl(adapt_legacy_impl(WritesReturnsLse))
    q, k, v = _qkv_3d(impl, 3)
    output = torch.full((3, impl.num_heads, impl.head_size_v), 7.0)
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        returned = impl.forward(None, q, k, v, torch.empty(0), None, output)
    assert returned is output and torch.equal(output, torch.ones_like(output))
    (record,) = [w for w in log if w.category is ReturnValueIgnoredWarning]
    assert "WritesReturnsLse.forward` was given `output` and returned a tensor of shape (3, 4)" in str(record.message)


def test_returning_nothing_without_an_output_parameter_is_an_error():
    class ReturnsNothing(_fresh_impl_class(ReturnsNewImpl)):
        def forward(self, layer, query, key, value, kv_cache, attn_metadata):
            return None

    impl = _impl(adapt_legacy_impl(ReturnsNothing))
    q, k, v = _qkv_3d(impl, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        with pytest.raises(TypeError, match=r"must return the attention result tensor .* it returned NoneType"):
            impl.forward(None, q, k, v, torch.empty(0), None, torch.empty(2, 4, 8))


def test_called_the_old_way_it_behaves_as_before():
    impl = _impl(adapt_legacy_impl(_fresh_impl_class(ReturnsNewImpl)))
    q, k, v = (x.reshape(x.shape[0], -1) for x in _qkv_3d(impl, 3))
    result = impl.forward(None, q, k, v, torch.empty(0), None)
    torch.testing.assert_close(result, _attention_2d(impl, q, k, v), atol=2e-5, rtol=2e-5)


def test_decorator_is_idempotent_and_checks_its_argument():
    cls = _fresh_impl_class(ReturnsNewImpl)
    adapted_forward = adapt_legacy_impl(cls).forward
    assert adapt_legacy_impl(cls).forward is adapted_forward
    with pytest.raises(TypeError, match=r"decorates an AttentionImpl class; found 3"):
        adapt_legacy_impl(3)
    with pytest.raises(TypeError, match=r"needs a class with a forward\(layer, query, .*\) method; NoForward has none"):
        adapt_legacy_impl(type("NoForward", (), {}))


def test_redundant_true_flag_is_reported_once_and_keeps_working(layers):
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        first = layers.attention(backend=RedundantFlagBackend)
        layers.attention(backend=RedundantFlagBackend)
    messages = [str(w.message) for w in log if w.category is VllmAttnCompatDeprecationWarning]
    assert len(messages) == 1 and "RedundantFlagBackend.accept_output_buffer = True" in messages[0]
    assert "redundant" in messages[0] and "(rule VAC004)" in messages[0]
    assert not is_adapted(first.impl.__class__)
    q, k, v = random_inputs(first, 4)
    with layers.context([4]):
        result = first(q, k, v)
    expected = causal_attention(q.view(4, 4, 16), k.view(4, 2, 16), v.view(4, 2, 16), first.scale)
    torch.testing.assert_close(result.view(4, 4, 16), expected, atol=2e-5, rtol=2e-5)
