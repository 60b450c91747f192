"""The backends on a CUDA device: the same contract as on the CPU (the caller's buffer written in place, rows
past ``num_actual_tokens`` untouched), plus what only a GPU exercises: FlexAttention's compiled Triton kernel,
CUDA-graph capture and replay of a layer's forward, and inductor's CUDA code around the op. Skipped without one.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from vllm_attn_compat.backends import AttentionMetadata, MLAAttention, set_forward_context

from backend_helpers import TOLERANCES, expected_prefill, random_qkv, reference_attention

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"
    ),
]

SENTINEL = 1234.5  # exactly representable in fp16 and bf16
OPS = torch.ops.vllm_attn_compat
# On a GPU flex compiles its kernel (Triton), as vLLM runs it.
BACKENDS = [pytest.param(("sdpa", {}), id="sdpa"), pytest.param(("flex", {}), id="flex-compiled")]
DTYPES = [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")]
# Half-precision kernels accumulate in fp32: fp16's 10 mantissa bits leave its error below bf16's.
TOLERANCE = {torch.float16: dict(atol=5e-3, rtol=5e-3), torch.bfloat16: TOLERANCES[torch.bfloat16]}


def _on_cuda(tensors):
    return [t.cuda() for t in tensors]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(4, 2, 32, 16), (8, 2, 64, 64)], ids=["gqa-dv<d", "gqa-64"])
def test_packed_prefill_writes_the_callers_buffer(make_layer, backend, dtype, heads):
    num_heads, num_kv_heads, head_size, head_size_v = heads
    name, options = backend
    layer = make_layer(num_heads, head_size, num_kv_heads, head_size_v, backend=name, **options)
    query_lens = [17, 3, 40, 1]
    q, k, v = random_qkv(layer, sum(query_lens) + 3, dtype)  # three CUDA-graph padding rows
    output = torch.full((len(q), num_heads, head_size_v), SENTINEL, dtype=dtype, device="cuda")
    md = layer.attn_backend.get_metadata_cls().from_lengths(query_lens, device="cuda")
    with set_forward_context({layer.layer_name: md}):
        result = layer(*_on_cuda([q, k, v]), output=output)
    assert result.data_ptr() == output.data_ptr()
    n = sum(query_lens)
    expected = expected_prefill(layer, q, k, v, query_lens, causal=True)
    torch.testing.assert_close(output[:n].double().cpu(), expected, **TOLERANCE[dtype])
    assert torch.all(output[n:] == SENTINEL), "rows beyond num_actual_tokens were written"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_reads_the_paged_cache(make_layer, backend, dtype):
    name, options = backend
    layer = make_layer(4, 32, 2, 16, backend=name, **options)
    block_size = 16
    layer.allocate_kv_cache(num_blocks=8, block_size=block_size, dtype=dtype, device="cuda")
    block_table = torch.tensor([[5, 0, 7], [2, 6, 1]], dtype=torch.int32, device="cuda")
    prompt_lens, steps = [20, 33], [[1, 1], [1, 2]]  # decode, then decode mixed with a 2-token chunk
    total = [p + sum(s[i] for s in steps) for i, p in enumerate(prompt_lens)]
    seqs = [random_qkv(layer, n, dtype, seed=10 + i) for i, n in enumerate(total)]
    done = [0, 0]
    for step_lens in [prompt_lens, *steps]:
        seq_lens = [d + n for d, n in zip(done, step_lens, strict=True)]
        md = layer.attn_backend.get_metadata_cls().from_lengths(
            step_lens, seq_lens, block_table=block_table, block_size=block_size, device="cuda"
        )
        q, k, v = (torch.cat([s[j][d:e] for s, d, e in zip(seqs, done, seq_lens, strict=True)]) for j in range(3))
        output = torch.full((len(q) + 1, 4, 16), SENTINEL, dtype=dtype, device="cuda")
        with set_forward_context({layer.layer_name: md}):
            layer(*_on_cuda(torch.cat([x, x[:1]]) for x in (q, k, v)), output=output)
        expected = torch.cat(
            [
                reference_attention(s[0][d:e], s[1][:e], s[2][:e], layer.scale, causal=True)
                for s, d, e in zip(seqs, done, seq_lens, strict=True)
            ]
        )
        torch.testing.assert_close(output[: len(q)].double().cpu(), expected, **TOLERANCE[dtype])
        assert torch.all(output[len(q) :] == SENTINEL)
        done = seq_lens


def test_compiled_flex_serves_more_shapes_than_dynamo_recompiles(make_layer):
    layer = make_layer(4, 64, 2, backend="flex")
    torch._dynamo.reset()
    # `config.patch`, not monkeypatch: newer pytest deletes on undo an attribute a module serves through
    # `__getattr__`, as torch's config does, and later compiles then fail for want of the key.
    try:
        with torch._dynamo.config.patch(recompile_limit=2):
            for query_lens in ([3], [2, 2], [5], [1, 6], [40, 9]):
                q, k, v = random_qkv(layer, sum(query_lens), torch.bfloat16)
                output = torch.full((len(q), 4, 64), SENTINEL, dtype=torch.bfloat16, device="cuda")
                md = layer.attn_backend.get_metadata_cls().from_lengths(query_lens, device="cuda")
                with set_forward_context({layer.layer_name: md}), warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # past the limit: the unfused kernel warns
                    layer(*_on_cuda([q, k, v]), output=output)
                expected = expected_prefill(layer, q, k, v, query_lens, causal=True)
                torch.testing.assert_close(output.double().cpu(), expected, **TOLERANCE[torch.bfloat16])
    finally:
        torch._dynamo.reset()


def test_compiled_flex_refuses_head_sizes_its_triton_kernel_cannot_take(make_layer):
    layer = make_layer(4, 16, 2, 8, backend="flex")
    q, k, v = _on_cuda(random_qkv(layer, 5, torch.bfloat16))
    output = torch.full((5, 4, 8), SENTINEL, dtype=torch.bfloat16, device="cuda")
    md = layer.attn_backend.get_metadata_cls().from_lengths([5], device="cuda")
    message = r"at least 16, got head_size=16, head_size_v=8; pass compile_kernel=False"
    with set_forward_context({layer.layer_name: md}), pytest.raises(ValueError, match=message):
        layer(q, k, v, output=output)
    assert torch.all(output == SENTINEL)
    eager = make_layer(4, 16, 2, 8, backend="flex", compile_kernel=False)
    with set_forward_context({eager.layer_name: md}), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the eager kernel warns that it is unfused
        eager(q, k, v, output=output)
    expected = expected_prefill(eager, *(x.cpu() for x in (q, k, v)), [5], causal=True)
    torch.testing.assert_close(output.double().cpu(), expected, **TOLERANCE[torch.bfloat16])


@pytest.mark.parametrize("dtype", DTYPES)
def test_mla_prefill_then_decode_from_latent_cache(layer_name, dtype):
    heads, nope, rope, head_v, lora = 4, 16, 8, 16, 32
    torch.manual_seed(0)
    layer = MLAAttention(heads, (nope + rope) ** -0.5, nope, rope, head_v, lora, prefix=layer_name("test.mla"))
    layer = layer.to(dtype=dtype, device="cuda").requires_grad_(False)
    layer.allocate_kv_cache(num_blocks=6, block_size=16, dtype=dtype, device="cuda")
    block_table = torch.tensor([[3, 1], [0, 5]], dtype=torch.int32, device="cuda")
    gen = torch.Generator().manual_seed(1)
    shapes = [(heads, nope + rope), (lora,), (1, rope)]
    seqs = [[torch.randn(n, *s, generator=gen).to(dtype) for s in shapes] for n in (20, 9)]
    weight = layer.kv_b_proj.weight.double().cpu()

    def reference(q, kv_c, k_pe):
        kv = (kv_c.double() @ weight.T).view(-1, heads, nope + head_v)
        key = torch.cat([kv[..., :nope], k_pe.double().expand(-1, heads, rope)], -1)
        return reference_attention(q, key, kv[..., nope:], layer.scale, causal=True)

    done = [0, 0]
    for step in ([19, 8], [1, 1]):
        seq_lens = [d + s for d, s in zip(done, step, strict=True)]
        md = AttentionMetadata.from_lengths(step, seq_lens, block_table=block_table, block_size=16, device="cuda")
        q, kv_c, k_pe = (torch.cat([s[j][d:e] for s, d, e in zip(seqs, done, seq_lens, strict=True)]) for j in range(3))
        output = torch.full((len(q) + 2, heads * head_v), SENTINEL, dtype=dtype, device="cuda")
        with set_forward_context({layer.layer_name: md}):
            result = layer(*_on_cuda(torch.cat([x, x[:2]]) for x in (q, kv_c, k_pe)), output=output)
        assert result.data_ptr() == output.data_ptr()
        expected = torch.cat(
            [reference(s[0][d:e], s[1][:e], s[2][:e]) for s, d, e in zip(seqs, done, seq_lens, strict=True)]
        ).flatten(1)
        torch.testing.assert_close(output[: len(q)].double().cpu(), expected, **TOLERANCE[dtype])
        assert torch.all(output[len(q) :] == SENTINEL)
        done = seq_lens


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_decode_step_captured_in_a_cuda_graph_replays_into_the_same_buffer(make_layer, backend):
    """vLLM captures decode steps in CUDA graphs: the forward must not synchronise with the host, and a replay
    over new inputs must write the captured buffer as an eager call would."""
    name, options = backend
    layer = make_layer(4, 32, 2, 16, backend=name, **options)
    layer.allocate_kv_cache(num_blocks=4, block_size=16, dtype=torch.bfloat16, device="cuda")
    block_table = torch.tensor([[1, 3], [2, 0]], dtype=torch.int32, device="cuda")
    md = layer.attn_backend.get_metadata_cls().from_lengths(
        [1, 1], [18, 5], block_table=block_table, block_size=16, device="cuda"
    )
    static = _on_cuda(random_qkv(layer, 2, torch.bfloat16, seed=3))
    output = torch.full((2, 4, 16), SENTINEL, dtype=torch.bfloat16, device="cuda")
    with set_forward_context({layer.layer_name: md}):
        layer(*static, output=output)  # warm-up outside the capture (kernel selection, compilation)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer(*static, output=output)
        fresh = _on_cuda(random_qkv(layer, 2, torch.bfloat16, seed=4))
        for slot, value in zip(static, fresh, strict=True):
            slot.copy_(value)
        output.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        eager = torch.full_like(output, SENTINEL)
        layer(*fresh, output=eager)
    torch.testing.assert_close(output, eager, rtol=0, atol=0)
    assert not torch.any(output == SENTINEL)


def test_compiled_layer_calls_the_op_once_and_copies_no_output(make_layer):
    layer = make_layer(8, 64, 2)
    q, k, v = (x.flatten(1) for x in _on_cuda(random_qkv(layer, 21, torch.bfloat16)))
    md = AttentionMetadata.from_lengths([9, 12], device="cuda")
    buffer = torch.zeros(32, 8 * 64, dtype=torch.bfloat16, device="cuda")[:21]  # a slice of a persistent buffer
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with set_forward_context({layer.layer_name: md}):
        eager = layer(q, k, v)
        compiled = torch.compile(lambda q, k, v, b: layer(q, k, v, output=b), fullgraph=True)
        result, (code,) = run_and_get_code(compiled, q, k, v, buffer)
    torch._dynamo.reset()
    assert result.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(result, eager)
    body = code[code.find("def call(self, args)") : code.find("runner = Runner")]
    assert body.count("torch.ops.vllm_attn_compat.unified_attention_with_output.default") == 1, body
    assert not re.search(r"copy_|clone|empty_strided", body), body


def test_opcheck_on_cuda_tensors(make_layer):
    layer = make_layer(4, 16, 2, 8)
    q, k, v = _on_cuda(random_qkv(layer, 6, torch.float16))
    output = torch.empty(12, 4, 8, dtype=torch.float16, device="cuda")[:6]
    with set_forward_context({layer.layer_name: AttentionMetadata.from_lengths([2, 4], device="cuda")}):
        args = (q, k, v, output, layer.layer_name)
        tests = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
        torch.library.opcheck(OPS.unified_attention_with_output.default, args, test_utils=tests)
