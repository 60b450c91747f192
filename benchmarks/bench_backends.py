"""Side-by-side timings for the mandatory-output path (run: python benchmarks/bench_backends.py).

Each table row is measured in this one run against its baseline, and the ratio is what
counts: absolute times vary between machines and with load. Timings are the minimum over
many short blocks, single-threaded, so that a busy machine disturbs them less. Finishes in
well under a minute (``--quick`` for a smoke run).

1. Dispatch cost of the op definition: `torch.library.Library.define` + ``impl`` (what
   ``ops.py`` uses) against the ``@torch.library.custom_op`` decorator, both with a no-op
   kernel and the same schema.
2. The with-output plumbing alone (layer, op, forward context and a backend whose kernel
   writes ``output`` once, like flash-attn's ``out``): writing into a caller's buffer,
   against letting the layer allocate, against the pre-0.20 allocate-then-copy pattern (the
   backend's result copied into a fresh buffer), for a decode-sized and a prefill-sized output.
3. The same three variants end to end with the sdpa backend, where the attention kernel
   dominates and the differences shrink to noise.
"""

from __future__ import annotations

import argparse
import math
import sys
import timeit
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_attn_compat.backends import (
    Attention,
    AttentionBackend,
    AttentionImpl,
    AttentionMetadata,
    set_forward_context,
)


class OutWritingImpl(AttentionImpl):
    """Stands in for a kernel with ``out=``: writes ``output[:n] = value`` in one pass."""

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None
    ):
        n = attn_metadata.num_actual_tokens
        torch.mul(value[:n], 1.0, out=output[:n])
        return output


class OutWritingBackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "out-writing (benchmark)"

    @staticmethod
    def get_impl_cls() -> type[OutWritingImpl]:
        return OutWritingImpl


def side_by_side(variants: dict[str, object], repeat: int, block_s: float = 0.004) -> list[tuple[str, float, float]]:
    """(name, us/call, ratio to the first variant) per variant. Blocks of the variants
    alternate, so that a change in machine load hits all of them alike; each keeps its
    fastest block."""
    timers = {name: timeit.Timer(fn) for name, fn in variants.items()}
    numbers = {}
    for name, timer in timers.items():
        number, elapsed = timer.autorange()  # also warms up
        numbers[name] = max(1, int(number * block_s / elapsed))
    best = dict.fromkeys(timers, float("inf"))
    for _ in range(repeat):
        for name, timer in timers.items():
            best[name] = min(best[name], timer.timeit(numbers[name]) / numbers[name] * 1e6)
    base = best[next(iter(best))]
    return [(name, us, us / base) for name, us in best.items()]


def dispatch_table(repeat: int) -> list[tuple[str, float, float]]:
    schema = "noop(Tensor q, Tensor k, Tensor v, Tensor(a3!) output, str layer_name) -> ()"
    lib = torch.library.Library("bench_backends_define", "DEF")
    lib.define(schema)
    lib.impl("noop", lambda q, k, v, output, layer_name: None, "CompositeExplicitAutograd")

    @torch.library.custom_op("bench_backends_custom::noop", mutates_args=("output",))
    def custom_noop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_name: str) -> None:
        return None

    q, k, v, out = (torch.randn(8, 8, 64) for _ in range(4))
    defined = torch.ops.bench_backends_define.noop
    return side_by_side(
        {
            "Library.define + impl (ours)": lambda: defined(q, k, v, out, "layer"),
            "@custom_op": lambda: custom_noop(q, k, v, out, "layer"),
        },
        repeat,
    )


def layer_table(
    query_lens: list[int],
    seq_lens: list[int],
    repeat: int,
    heads: int = 8,
    head_size: int = 64,
    backend: str | type[AttentionBackend] = "sdpa",
) -> list[tuple[str, float, float]]:
    block_size = 16
    num_tokens = sum(query_lens)
    layer = Attention(
        heads, head_size, 1 / math.sqrt(head_size), prefix=f"bench.attn.{len(_LAYERS)}", attn_backend=backend
    )
    _LAYERS.append(layer)
    blocks_per_seq = -(-max(seq_lens) // block_size)
    layer.allocate_kv_cache(len(seq_lens) * blocks_per_seq, block_size)
    block_table = torch.arange(len(seq_lens) * blocks_per_seq).view(len(seq_lens), blocks_per_seq)
    md = AttentionMetadata.from_lengths(query_lens, seq_lens, block_table=block_table, block_size=block_size)
    q, k, v = (torch.randn(num_tokens, heads * head_size) for _ in range(3))
    buffer = torch.empty(num_tokens, heads * head_size)

    def legacy_allocate_and_copy():
        # pre-0.20 shape of the work: the backend hands back its own result tensor, and the
        # caller copies it into a freshly allocated output buffer
        result = layer(q, k, v)
        torch.empty_like(result).copy_(result)

    with set_forward_context({layer.layer_name: md}), torch.inference_mode():
        return side_by_side(
            {
                "layer(..., output=caller_buffer)": lambda: layer(q, k, v, output=buffer),
                "layer(...) allocating its buffer": lambda: layer(q, k, v),
                "allocate + copy (pre-0.20 pattern)": legacy_allocate_and_copy,
            },
            repeat,
        )


_LAYERS: list[Attention] = []


def print_table(title: str, rows: list[tuple[str, float, float]]) -> None:
    print(f"\n{title}\n| variant | us/call | ratio to first row |\n|---|---|---|")
    for name, us, ratio in rows:
        print(f"| {name} | {us:.1f} | {ratio:.2f}x |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats: a smoke run, not a measurement")
    args = parser.parse_args(argv)
    repeat = 5 if args.quick else 60
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, fastest of {repeat} alternating blocks per variant")
    print_table("Op dispatch, no-op kernel", dispatch_table(repeat))
    print_table(
        "Plumbing, decode-sized output: 8 tokens x 32 heads x 128",
        layer_table([1] * 8, [1] * 8, repeat, 32, 128, backend=OutWritingBackend),
    )
    print_table(
        "Plumbing, prefill-sized output: 2048 tokens x 32 heads x 128 (32 MiB)",
        layer_table([1024, 1024], [1024, 1024], max(3, repeat // 6), 32, 128, backend=OutWritingBackend),
    )
    print_table(
        "sdpa layer, decode: 8 sequences x 1 new token after 127 cached, 8 heads x 64",
        layer_table([1] * 8, [128] * 8, max(3, repeat // 4)),
    )


if __name__ == "__main__":
    main()
