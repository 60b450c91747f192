"""Writes into ``output`` counted, not assumed: zero copies and zero allocations in the
with-output plumbing; per backend, zero copies where the last step can write into
``output`` (sdpa and MLA gather with ``index_select(out=)``, flash-attn takes ``out``) and
one ``copy_`` for flex, whose kernel has no ``out=`` argument."""

from __future__ import annotations

import collections
import warnings

import pytest
import torch
from test_flash import needs_flash
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from vllm_attn_compat.backends import AttentionBackend, AttentionImpl, MLAAttention, set_forward_context

from backend_helpers import random_qkv

NAMESPACE = "vllm_attn_compat"
_ALLOCATORS = {"empty", "empty_strided", "empty_like", "new_empty", "zeros", "zeros_like", "full", "clone"}


class WritesInto(TorchDispatchMode):
    """Counts ``writes['copy']`` (aten.copy_) and ``writes['direct']`` (any other op whose
    schema marks the argument as written) into ``target``'s storage, and allocations of a
    tensor of ``alloc_shape``. Our ops' kernels run with the mode still active, so the
    backend's own ops are seen too (the mode re-enters the CompositeExplicitAutograd
    kernel; a private API, tests only)."""

    def __init__(self, target: torch.Tensor | None, alloc_shape=None):
        super().__init__()
        self.storage = None if target is None else target.untyped_storage().data_ptr()
        self.alloc_shape = alloc_shape
        self.writes: collections.Counter = collections.Counter()
        self.allocations = 0

    def _in_target(self, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() == self.storage

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema_args = func._schema.arguments
        values = list(args) + [kwargs.get(a.name) for a in schema_args[len(args) :]]
        for arg, value in zip(schema_args, values, strict=True):
            writes = arg.alias_info is not None and arg.alias_info.is_write
            if writes and isinstance(value, torch.Tensor) and self._in_target(value):
                self.writes["copy" if func.overloadpacket is torch.ops.aten.copy_ else "direct"] += 1
        if func.namespace == NAMESPACE:
            with self:
                return func._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *args, **kwargs)
        result = func(*args, **kwargs)
        if func.overloadpacket.__name__ in _ALLOCATORS and isinstance(result, torch.Tensor):
            self.allocations += list(result.shape) == self.alloc_shape
        return result


class DirectWriteImpl(AttentionImpl):
    """A backend whose kernel takes ``out=``: output = 2 * value, written in place."""

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None
    ):
        n = attn_metadata.num_actual_tokens
        torch.mul(value[:n], 2, out=output[:n])
        return output


class DirectWriteBackend(AttentionBackend):
    @staticmethod
    def get_name():
        return "direct-write (test)"

    @staticmethod
    def get_impl_cls():
        return DirectWriteImpl


def _run(layer, md, inputs, output):
    with set_forward_context({layer.layer_name: md}), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # eager flex: "unfused implementation"
        return layer(*inputs, output=output)


@pytest.mark.parametrize("caller_buffer", [True, False], ids=["caller-buffer", "layer-allocates"])
def test_plumbing_adds_no_copies_and_allocates_once_at_most(make_layer, caller_buffer):
    layer = make_layer(2, 8, backend=DirectWriteBackend)
    md = layer.attn_backend.get_metadata_cls().from_lengths([2, 3])
    q, k, v = random_qkv(layer, 6)
    buffer = torch.zeros(6, 16) if caller_buffer else None
    with WritesInto(buffer, alloc_shape=[6, 2, 8]) as mode:
        result = _run(layer, md, (q, k, v), buffer)
    assert mode.allocations == (0 if caller_buffer else 1)  # allocate_output's torch.empty
    torch.testing.assert_close(result[:5], (2 * v[:5]).flatten(1))
    if caller_buffer:
        assert result.data_ptr() == buffer.data_ptr()
        # the op (Tensor(a3!) output) and the backend's mul(out=): no copy_ anywhere
        assert mode.writes == {"direct": 2}
        assert torch.all(buffer[5:] == 0)


# expected writes into output: our op itself (Tensor(a3!) output), then the backend's
BACKENDS = {
    "sdpa": (dict(backend="sdpa"), {"direct": 2}),  # index_select(out=output[:n])
    "flex-compiled": (dict(backend="flex"), {"direct": 1, "copy": 1}),
    "flex-epilogue": (dict(backend="flex", out_transform=lambda out, lse: out * 2), {"direct": 1, "copy": 1}),
}


@pytest.fixture
def flex_kernels_outside_the_mode(monkeypatch):
    """flex_attention refuses to run under a dispatch mode (it compiles even eagerly). Its
    kernels never receive ``output`` (they return new tensors), so they run with the mode
    suspended while everything the backend does with their result stays counted."""
    from vllm_attn_compat.backends import flex

    # Inside the op's kernel, dispatch runs below autograd; flex needs the top-level key set.
    top_level = (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())

    def suspended(kernel):
        def run(*args, **kwargs):
            with _disable_current_modes(), torch._C._ForceDispatchKeyGuard(*top_level):
                return kernel(*args, **kwargs)

        return run

    compiled = flex._compiled_flex
    monkeypatch.setattr(flex, "flex_attention", suspended(flex.flex_attention))
    monkeypatch.setattr(flex, "_compiled_flex", lambda on_cuda: suspended(compiled(on_cuda)))


@pytest.mark.parametrize("name", BACKENDS, ids=list(BACKENDS))
def test_writes_into_output_per_backend(make_layer, name, flex_kernels_outside_the_mode):
    options, expected_writes = BACKENDS[name]
    layer = make_layer(4, 16, 2, 8, **options)
    md = layer.attn_backend.get_metadata_cls().from_lengths([5, 11])
    q, k, v = random_qkv(layer, 18)
    buffer = torch.zeros(18, 4, 8)
    with WritesInto(buffer) as mode:
        _run(layer, md, (q, k, v), buffer)
    assert mode.writes == expected_writes
    assert torch.all(buffer[16:] == 0) and not torch.any(buffer[:16] == 0)


def test_reference_mla_writes_without_a_copy(layer_name):
    layer = MLAAttention(2, 0.3, 8, 4, 6, 10, prefix=layer_name("test.mla"))
    inputs = (torch.randn(4, 2, 12), torch.randn(4, 10), torch.randn(4, 1, 4))
    buffer = torch.zeros(4, 2, 6)
    with WritesInto(buffer) as mode:
        _run(layer, layer.attn_backend.get_metadata_cls().from_lengths([4]), inputs, buffer)
    assert mode.writes == {"direct": 2}  # the op, then index_select(out=output[:n])
    assert not torch.any(buffer == 0)


@pytest.mark.cuda
@needs_flash
def test_flash_writes_with_no_copy(make_layer):
    layer = make_layer(8, 64, 2, backend="flash")
    md = layer.attn_backend.get_metadata_cls().from_lengths([20, 7], device="cuda")
    q, k, v = (x.cuda() for x in random_qkv(layer, 27, torch.bfloat16))
    buffer = torch.zeros(27, 8, 64, dtype=torch.bfloat16, device="cuda")
    with WritesInto(buffer) as mode:
        _run(layer, md, (q, k, v), buffer)
    # the extension call is not a torch op, so the mode sees only our op; no copy_ at all
    assert mode.writes == {"direct": 1}
    assert not torch.any(buffer == 0)
