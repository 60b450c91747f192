"""SGLang's rule on a method that may return its result: copied into ``output`` only when it lies elsewhere."""

from __future__ import annotations

import warnings

import pytest
import torch

from vllm_attn_compat.compat import VllmAttnCompatDeprecationWarning
from vllm_attn_compat.compat.adopt import ADOPTS, ReturnValueIgnoredWarning, adopt_returned_result, outside

from compat_helpers import CopiesInto

H, D = 4, 8


class Impl:
    """forward(layer, query, key, value, kv_cache, attn_metadata, output, ...) returning whatever ``make`` gives."""

    def __init__(self, make):
        self.make = make

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None, output_block_scale=None
    ):
        return self.make(query, output)


def _fresh(base=Impl):
    cls = type("LegacyImpl", (base,), {})
    assert adopt_returned_result(cls, "forward", 6)
    return cls


def _call(cls, make, output, **kwargs):
    query = torch.arange(output.numel(), dtype=torch.float32).view(output.shape)
    with CopiesInto(output) as counter, warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        returned = cls(make).forward(None, query, None, None, None, None, output=output, **kwargs)
    return query, returned, counter.writes, [w for w in log if w.category is VllmAttnCompatDeprecationWarning]


def test_a_new_2d_result_is_copied_into_the_3d_output_and_warned_about_once_per_class():
    cls = _fresh()
    output = torch.full((5, H, D), float("nan"))
    query, returned, writes, log = _call(cls, lambda q, out: q.reshape(5, H * D) * 2, output)
    assert returned is output and writes["copies"] == 1
    torch.testing.assert_close(output, query * 2)
    (record,) = log
    message = str(record.message)
    assert "LegacyImpl.forward` returning its result instead of writing into `output`" not in message  # inherited
    assert "`Impl.forward` returning its result instead of writing into `output` was removed in vLLM 0.20" in message
    assert "write the result into the `output` tensor it is given" in message
    assert "change it by hand (rule VAC004)" in message
    assert record.filename == __file__  # where the class is (created here by type(): its module's file)
    _, _, _, again = _call(cls, lambda q, out: q.reshape(5, H * D) * 2, torch.empty(5, H, D))
    assert again == []


@pytest.mark.parametrize(
    "make",
    [
        lambda q, out: out,  # output itself
        lambda q, out: out.view(out.shape[0], -1),  # a 2-D view of it
        lambda q, out: out[1:],  # a view starting further in (still output's memory)
        lambda q, out: None,  # a >= 0.20 impl returning nothing
        lambda q, out: (out, None),  # not a tensor: vLLM never read it
    ],
    ids=["output", "2-D view", "offset view", "None", "tuple"],
)
def test_anything_in_outputs_memory_or_not_a_tensor_is_left_alone(make):
    cls = _fresh()
    output = torch.full((3, H, D), 7.0)
    _, returned, writes, log = _call(cls, make, output)
    assert writes["copies"] == 0 and log == []
    assert torch.equal(output, torch.full_like(output, 7.0))
    expected = make(None, output)  # passed through as returned
    assert type(returned) is type(expected)
    if isinstance(expected, torch.Tensor):
        assert (returned.data_ptr(), returned.shape) == (expected.data_ptr(), expected.shape)


def test_a_result_without_the_padding_rows_fills_the_first_rows():
    cls = _fresh()
    output = torch.full((6, H, D), 7.0)
    _, _, writes, _ = _call(cls, lambda q, out: torch.ones(4, H * D), output)
    assert writes["copies"] == 1
    assert torch.equal(output[:4], torch.ones(4, H, D)) and torch.equal(output[4:], torch.full((2, H, D), 7.0))


@pytest.mark.parametrize(
    "make",
    [
        lambda q, out: torch.zeros(3, 5),  # neither output's elements nor whole rows
        lambda q, out: torch.zeros(3, H),  # an LSE [T, heads]
        lambda q, out: torch.zeros(()),  # a scalar
    ],
    ids=["[3, 5]", "LSE", "scalar"],
)
def test_a_result_that_cannot_fill_output_is_ignored_as_vllm_ignores_it_with_one_warning_per_class(make):
    cls = _fresh()
    output = torch.full((3, H, D), 7.0)
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        for _ in range(2):
            returned = cls(lambda q, out: make(q, out)).forward(None, None, None, None, None, None, output=output)
    assert torch.equal(output, torch.full_like(output, 7.0))  # what the method wrote (here: nothing) is kept
    assert isinstance(returned, torch.Tensor) and returned.shape == make(None, None).shape  # passed through
    (record,) = [w for w in log if w.category is ReturnValueIgnoredWarning]
    message = str(record.message)
    assert f"`Impl.forward` was given `output` and returned a tensor of shape {tuple(returned.shape)}" in message
    assert "cannot fill `output` of shape (3, 4, 8) (96 elements, or whole rows of 32 elements each)" in message
    assert "write it into `output` instead" in message and "return `output` or None" in message
    assert record.filename == __file__
    assert not [w for w in log if w.category is VllmAttnCompatDeprecationWarning]


def test_a_result_returned_while_output_is_quantized_is_ignored_and_warned_about():
    cls = _fresh()
    output = torch.full((2, H, D), 7.0)
    _, returned, writes, _ = _call(cls, lambda q, out: torch.zeros(2, H * D), output, output_scale=torch.ones(1))
    assert writes["copies"] == 0 and torch.equal(output, torch.full_like(output, 7.0))
    assert returned.shape == (2, H * D)


def test_output_passed_by_position_and_called_without_output():
    cls = _fresh()
    output = torch.empty(2, H, D)
    query = torch.randn(2, H, D)
    impl = cls(lambda q, out: q.clone())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        assert impl.forward(None, query, None, None, None, None, output) is output
    assert torch.equal(output, query)
    old_way = impl.forward(None, query, None, None, None, None)  # the pre-0.20 call: the result is the answer
    assert torch.equal(old_way, query) and old_way is not output


def test_wrapped_once_per_class_never_twice():
    cls = _fresh()
    wrapped = cls.__dict__["forward"]
    assert getattr(wrapped, ADOPTS) is Impl.__dict__["forward"]
    assert not adopt_returned_result(cls, "forward", 6)
    sub = type("Sub", (cls,), {})
    assert not adopt_returned_result(sub, "forward", 6)  # inherits the wrapper
    assert "forward" not in sub.__dict__ and cls.__dict__["forward"] is wrapped
    assert not adopt_returned_result(type("NoForward", (), {}), "forward", 6)


def test_a_subclass_calling_an_adopted_base_copies_once():
    base = _fresh()

    class Sub(base):
        def forward(
            self,
            layer,
            query,
            key,
            value,
            kv_cache,
            attn_metadata,
            output=None,
            output_scale=None,
            output_block_scale=None,
        ):
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output)

    assert adopt_returned_result(Sub, "forward", 6)
    output = torch.full((2, H, D), float("nan"))
    query, _, writes, _ = _call(Sub, lambda q, out: q + 1, output)
    assert writes["copies"] == 1  # the base's wrapper copies and returns output; Sub's sees output itself
    torch.testing.assert_close(output, query + 1)


def test_outside_tells_a_package_from_a_prefix():
    assert not outside(torch.Tensor, "torch") and outside(Impl, "torch")
    assert outside(type("X", (), {"__module__": "torchvision.models"}), "torch")


class MLAImpl:
    def forward_mha(self, q, kv_c_normed, k_pe, kv_cache, attn_metadata, k_scale, output, output_scale=None):
        return q * 3


@pytest.mark.parametrize("by_keyword", [True, False], ids=["keyword", "positional"])
def test_any_other_signature_gets_the_general_wrapper(by_keyword):
    cls = type("LegacyMLAImpl", (MLAImpl,), {})
    assert adopt_returned_result(cls, "forward_mha", 6)
    q, output = torch.randn(3, H, D), torch.full((3, H * D), float("nan"))
    args = (q, None, None, None, None, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        returned = cls().forward_mha(*args, output=output) if by_keyword else cls().forward_mha(*args, output)
    assert returned is output
    torch.testing.assert_close(output, (q * 3).reshape(3, -1))
