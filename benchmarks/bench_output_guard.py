"""What the output guard costs per call when it is on, measured side by side in one run (about 15 s).

Two layers of this package's ``Attention`` built alike, one before the guard is turned on (no guard: nothing is
installed on it) and one after (error mode), called in interleaved blocks under one forward context: with a
backend that writes ``output`` doing nothing else (``zero_``, so the guard's fill and scan are the whole
difference) and with the SDPA backend (real attention next to it), at a decode-sized and a prefill-sized step.
Off, the guard installs nothing (tests/compat/test_output_guard.py proves the very same function objects), so
"off" here is the layer as it is without the package's guard.

Run: ``python benchmarks/bench_output_guard.py``. Times are the minimum over many short blocks.
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vllm_attn_compat.backends import (  # noqa: E402
    Attention,
    AttentionBackend,
    AttentionImpl,
    AttentionMetadata,
    set_forward_context,
)
from vllm_attn_compat.compat import output_guard  # noqa: E402

HEADS, KV_HEADS, HEAD_SIZE = 8, 8, 64


def bench_us(**fns):
    """Microseconds per call of each function: the minimum over 40 interleaved blocks of about 3 ms."""
    timers = {name: timeit.Timer(fn) for name, fn in fns.items()}
    numbers = {name: max(1, int(timer.autorange()[0] * 0.003 / 0.2)) for name, timer in timers.items()}
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(40):
        for name, timer in timers.items():
            best[name] = min(best[name], timer.timeit(numbers[name]) / numbers[name] * 1e6)
    return best


class ZeroImpl(AttentionImpl):
    """Writes every row of ``output`` and computes nothing: the guard's own cost is the whole difference."""

    def __init__(self, *args, **kwargs):
        pass

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None
    ):
        return output.zero_()


def _backend(name, impl_cls):
    return type(
        name,
        (AttentionBackend,),
        {"get_name": staticmethod(lambda: name), "get_impl_cls": staticmethod(lambda: impl_cls)},
    )


def main():
    torch.set_num_threads(1)
    registry = {}
    backends = {"writes zeros": _backend("zeros", ZeroImpl), "sdpa": "sdpa"}

    def layer(backend, tag):
        return Attention(
            HEADS,
            HEAD_SIZE,
            HEAD_SIZE**-0.5,
            KV_HEADS,
            prefix=f"{tag}.{backend}",
            attn_backend=backends[backend],
            static_forward_context=registry,
        )

    off = {name: layer(name, "off") for name in backends}
    output_guard.set_mode("error")
    output_guard.install_on(Attention, mla=False)
    try:
        on = {name: layer(name, "on") for name in backends}
    finally:
        output_guard.remove_from(Attention)
    print(f"output guard, error mode, per call of Attention.forward ({HEADS} heads x {HEAD_SIZE}, float32, 1 thread)")
    print(f"{'backend':<14}{'tokens':>8}{'off (us)':>11}{'on (us)':>11}{'on / off':>10}{'added (us)':>12}")
    for tokens in (8, 512):
        q, k, v = (torch.randn(tokens, HEADS * HEAD_SIZE) for _ in range(3))
        with set_forward_context(AttentionMetadata.from_lengths([tokens]), registry):
            for name in backends:
                times = bench_us(
                    off=lambda name=name, q=q, k=k, v=v: off[name](q, k, v),
                    on=lambda name=name, q=q, k=k, v=v: on[name](q, k, v),
                )
                added = times["on"] - times["off"]
                print(
                    f"{name:<14}{tokens:>8}{times['off']:>11.1f}{times['on']:>11.1f}"
                    f"{times['on'] / times['off']:>9.2f}x{added:>12.1f}"
                )


if __name__ == "__main__":
    main()
