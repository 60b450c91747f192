"""What the compatibility layer costs, measured side by side in one run (about 20 s on 2 shared cores).

1. Per call: the deprecated forwarder (Python function and op) against a direct call of the with-output op
   (into a preallocated buffer) and against the layer's forward (allocation + with-output op, what a >= 0.20
   model calls), with a no-op backend (pure overhead) and with the SDPA backend (next to real attention).
2. The warning after the first call: warn-once per call site against ``warnings.warn`` on every call.
3. The legacy adapter: copies into ``output`` per call (counted by a storage-aware dispatch mode) for an impl
   that returns a new tensor and for one that writes into the buffer it is given, and the adapted call's time
   against the same impl called the pre-0.20 way. Then the adapter's own cost: the adapted call against a direct
   call of the legacy forward doing the same work (the same 2-D views made in the call, the same copy), on a
   no-op legacy impl, so that nothing else weighs in; and what the views alone cost.
4. SGLang's rule (what the vLLM plugin wraps around an out-of-tree impl's forward): a no-op impl that returns
   ``output``, wrapped against the same impl unwrapped, called as vLLM calls it.

Run: ``python benchmarks/bench_compat.py``. Times are the minimum over many short blocks (robust to other load).
"""

from __future__ import annotations

import math
import sys
import timeit
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "compat")]

from vllm_attn_compat import compat  # noqa: E402
from vllm_attn_compat.backends import (  # noqa: E402
    Attention,
    AttentionBackend,
    AttentionImpl,
    AttentionMetadata,
    set_forward_context,
)
from vllm_attn_compat.compat import VllmAttnCompatDeprecationWarning, adapt_legacy_impl  # noqa: E402
from vllm_attn_compat.compat.adopt import LEGACY_FORWARD, adopt_returned_result  # noqa: E402
from vllm_attn_compat.compat.deprecation import warn_once  # noqa: E402
from vllm_attn_compat.compat.forwarders import UNIFIED_ATTENTION_MESSAGE, forward_unified_attention  # noqa: E402

from compat_helpers import CopiesInto  # noqa: E402

T, HEADS, KV_HEADS, HEAD_SIZE = 8, 8, 8, 64


def bench_us(**fns):
    """Microseconds per call of each function: the minimum over 60 blocks of about 3 ms, the functions' blocks
    interleaved so that changing load on the shared machine hits all of them alike."""
    timers = {name: timeit.Timer(fn) for name, fn in fns.items()}
    numbers = {name: max(1, int(timer.autorange()[0] * 0.003 / 0.2)) for name, timer in timers.items()}
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(60):
        for name, timer in timers.items():
            best[name] = min(best[name], timer.timeit(numbers[name]) / numbers[name] * 1e6)
    return best


def _backend(name, impl_cls, **attrs):
    return type(
        name,
        (AttentionBackend,),
        {
            "get_name": staticmethod(lambda: name),
            "get_impl_cls": staticmethod(lambda: impl_cls),
            **attrs,
        },
    )


class NoOpImpl(AttentionImpl):
    """Writes nothing: isolates the cost of the call path from the attention kernel."""

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None
    ):
        return output


def _attention(impl, query, key, value):
    """SDPA on ``[T, H, D]`` views; returns ``[T, H, D]`` (a new tensor)."""
    q, k, v = (x.view(x.shape[0], -1, impl.head_size).transpose(0, 1) for x in (query, key, value))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1)


class ReturnsNewImpl(AttentionImpl):
    """A legacy impl (accept_output_buffer = False): returns a new 2-D tensor."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata):
        return _attention(self, query, key, value).reshape(query.shape[0], -1)


class WritesGivenOutputImpl(AttentionImpl):
    """A legacy impl with the optional-output fallback: writes into the buffer when given one."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        T = query.shape[0]
        if output is None:
            output = torch.empty(T, self.num_heads * self.head_size_v)
        q, k, v = (x.view(T, -1, self.head_size).transpose(0, 1) for x in (query, key, value))
        scores = (q @ k.transpose(1, 2)).mul_(self.scale)
        scores.masked_fill_(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        torch.matmul(scores.softmax(-1), v, out=output.view(T, -1, self.head_size).transpose(0, 1))
        return output


class NoOpLegacyImpl(AttentionImpl):
    """A legacy impl with the optional-output fallback that computes nothing: isolates the adapter's cost."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        return output


def _diff(a, b):
    return f"{a:6.2f} vs {b:6.2f} us ({a / b:.2f}x, {a - b:+.2f} us)"


def main():
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
    compat.install_into_backends()  # the legacy adapter for accept_output_buffer = False backends (section 3)
    registry = {}
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(T, HEADS * HEAD_SIZE, generator=gen)
    k, v = (torch.randn(T, KV_HEADS * HEAD_SIZE, generator=gen) for _ in range(2))
    metadata = AttentionMetadata.from_lengths([T])

    def layer(name, backend):
        return Attention(
            HEADS,
            HEAD_SIZE,
            1 / math.sqrt(HEAD_SIZE),
            KV_HEADS,
            prefix=name,
            attn_backend=backend,
            static_forward_context=registry,
        )

    layers = {"no-op backend": layer("noop", _backend("noop", NoOpImpl)), "sdpa backend": layer("sdpa", "sdpa")}
    q3, k3, v3 = q.view(T, HEADS, HEAD_SIZE), k.view(T, KV_HEADS, HEAD_SIZE), v.view(T, KV_HEADS, HEAD_SIZE)
    with_output = torch.ops.vllm_attn_compat.unified_attention_with_output
    forwarder_op = torch.ops.vllm_attn_compat.unified_attention

    with set_forward_context(metadata, registry):
        print(f"1. per call, {T} tokens x {HEADS} heads x {HEAD_SIZE}, 1 thread (us; ratio to the layer's forward)")

        # A function per layer: the lambdas it times close over that layer's variables, not the loop's.
        def per_call(label, attn):
            name = attn.layer_name
            out = attn.allocate_output(q3)
            us = bench_us(
                direct=lambda: with_output(q3, k3, v3, out, name),
                layer_forward=lambda: attn(q, k, v),
                function=lambda: compat.unified_attention(q, k, v, name),
                op=lambda: forwarder_op(q, k, v, name),
            )
            direct, layer_forward, function, op = us["direct"], us["layer_forward"], us["function"], us["op"]
            print(
                f"   {label:14s} with-output op, preallocated {direct:7.2f} ({direct / layer_forward:.2f}x) | "
                f"layer forward {layer_forward:7.2f} (1.00x) | forwarder function {function:7.2f} "
                f"({function / layer_forward:.2f}x) | forwarder op {op:7.2f} ({op / layer_forward:.2f}x)"
            )

        for label, attn in layers.items():
            per_call(label, attn)

        # The warning alone, in functions that do nothing else (the forwarder body's cost would drown it), under
        # the filters a user gets by default: the package's "default" filter, output discarded.
        def warns_once():
            warn_once(UNIFIED_ATTENTION_MESSAGE)

        def warns_every_call():
            warnings.warn(UNIFIED_ATTENTION_MESSAGE, VllmAttnCompatDeprecationWarning, stacklevel=2)

        with warnings.catch_warnings():
            warnings.filterwarnings("default", category=VllmAttnCompatDeprecationWarning)
            warnings.showwarning = lambda *args, **kwargs: None
            warns_once(), warns_every_call()  # the first calls warn; the timings below are the calls after them
            us = bench_us(nothing=lambda: None, warn_once=warns_once, warn_every_call=warns_every_call)
        nothing, once, every = us["nothing"], us["warn_once"], us["warn_every_call"]
        name = layers["no-op backend"].layer_name
        body = bench_us(body=lambda: forward_unified_attention(q, k, v, name))["body"]
        print("2. the warning after the first call (us per call, on top of a call that does nothing)")
        print(
            f"   warn once per call site +{once - nothing:.2f} | warnings.warn every call +{every - nothing:.2f} "
            f"({(every - nothing) / (once - nothing):.1f}x) | the forwarder's body, for scale, {body:.2f}"
        )

        print(
            "3. legacy adapter: copies into output per call; the impl called as vLLM >= 0.20 calls it (through the "
            "adapter) vs called the pre-0.20 way (us)"
        )
        reference = layers["sdpa backend"](q, k, v)
        legacy_impls = (("returns a new tensor", ReturnsNewImpl), ("writes the given output", WritesGivenOutputImpl))

        # A function per impl, as in 1.: the lambdas close over its layer and buffer, not the loop's.
        def legacy_adapter(label, impl_cls):
            attn = layer(impl_cls.__name__, _backend(impl_cls.__name__, impl_cls, accept_output_buffer=False))
            torch.testing.assert_close(attn(q, k, v), reference, atol=1e-5, rtol=1e-5)
            out = attn.allocate_output(q3)
            with CopiesInto(out) as counter:
                attn.impl.forward(attn, q3, k3, v3, attn.kv_cache, metadata, out)
            us = bench_us(
                adapted=lambda: attn.impl.forward(attn, q3, k3, v3, attn.kv_cache, metadata, out),
                old_way=lambda: attn.impl.forward(attn, q, k, v, attn.kv_cache, metadata),
            )
            adapted, old_way = us["adapted"], us["old_way"]
            print(
                f"   {label:24s} copies {counter.writes['copies']} | adapted call (3-D, output) {adapted:7.2f} | "
                f"old call (2-D, no output) {old_way:7.2f} ({adapted / old_way:.2f}x)"
            )

        for label, impl_cls in legacy_impls:
            legacy_adapter(label, impl_cls)

        impl = NoOpLegacyImpl(HEADS, HEAD_SIZE, 1 / math.sqrt(HEAD_SIZE), KV_HEADS, HEAD_SIZE)
        adapt_legacy_impl(NoOpLegacyImpl)
        legacy = getattr(NoOpLegacyImpl.forward, LEGACY_FORWARD)
        out = torch.empty(T, HEADS, HEAD_SIZE)
        kv_cache, flat = torch.empty(0), [x.flatten(1) for x in (q3, k3, v3, out)]
        us = bench_us(
            adapted=lambda: impl.forward(
                None, q3, k3, v3, kv_cache, metadata, output=out, output_scale=None, output_block_scale=None
            ),
            direct=lambda: legacy(
                impl, None, q3.flatten(1), k3.flatten(1), v3.flatten(1), kv_cache, metadata, output=out.flatten(1)
            ),
            direct_2d=lambda: legacy(impl, None, *flat[:3], kv_cache, metadata, output=flat[3]),
        )
        print(
            f"   the adapter's own cost, no-op legacy impl: adapted / direct call doing the same work (2-D views "
            f"made in the call) {_diff(us['adapted'], us['direct'])} | the four 2-D views themselves: direct / "
            f"direct on ready 2-D tensors {_diff(us['direct'], us['direct_2d'])}"
        )

        plain = type("NoOpImpl", (NoOpImpl,), {})
        adopted = type("NoOpImpl", (NoOpImpl,), {})
        adopt_returned_result(adopted, "forward", 6)
        plain_impl, adopted_impl = (
            cls(HEADS, HEAD_SIZE, 1 / math.sqrt(HEAD_SIZE), KV_HEADS, HEAD_SIZE) for cls in (plain, adopted)
        )
        with CopiesInto(out) as counter:
            adopted_impl.forward(
                None, q3, k3, v3, kv_cache, metadata, output=out, output_scale=None, output_block_scale=None
            )
        us = bench_us(
            adopted=lambda: adopted_impl.forward(
                None, q3, k3, v3, kv_cache, metadata, output=out, output_scale=None, output_block_scale=None
            ),
            plain=lambda: plain_impl.forward(
                None, q3, k3, v3, kv_cache, metadata, output=out, output_scale=None, output_block_scale=None
            ),
        )
        print("4. SGLang's rule around an out-of-tree impl's forward (the vLLM plugin), no-op impl returning output")
        print(f"   copies {counter.writes['copies']} | wrapped / unwrapped {_diff(us['adopted'], us['plain'])}")


if __name__ == "__main__":
    main()
