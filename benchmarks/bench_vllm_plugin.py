"""What the vLLM plugin adds to an attention call through vLLM's real ``Attention``, measured side by side.

Two fresh processes take turns, one with vLLM's general plugins loaded (this package's: every feature, the
dead-override check and the removed members' forwarders included) and one without; each builds a layer over an
out-of-tree backend whose impl writes ``output`` and returns it (nothing for the plugin to copy or forward), and
times ``layer(q, k, v)`` inside a forward context: the minimum over blocks of calls, robust to other load. The
budget (issue 52): at most +1 us a call when nothing is forwarded.

Needs vLLM >= 0.20 and the package installed (its entry point). Run: ``python benchmarks/bench_vllm_plugin.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, os, sys, time, warnings
import torch
torch.set_num_threads(1)
sys.path[:0] = [{root!r}, {compat_tests!r}]
import vllm.plugins
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.attention.attention import Attention
from vllm.v1.attention.backend import AttentionImpl
from vllm_backends import backend_for

if {with_plugin}:
    os.environ["VLLM_PLUGINS"] = "vllm_attn_compat"
    vllm.plugins.load_general_plugins()


class WritesImpl(AttentionImpl):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, *args, **kwargs):
        pass

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None
    ):
        output.fill_(1.0)
        return output


config = VllmConfig(device_config=DeviceConfig(device="cpu"))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    with set_current_vllm_config(config):
        backend = backend_for(WritesImpl)
        layer = Attention(8, 64, 0.125, num_kv_heads=8, prefix="model.layers.0.attn", attn_backend=backend)
q, k, v = (torch.randn(8, 8 * 64) for _ in range(3))
best = float("inf")
with set_forward_context({{"model.layers.0.attn": None}}, config, slot_mapping={{}}):
    for _ in range(3000):
        layer(q, k, v)
    for _ in range({blocks}):
        start = time.perf_counter()
        for _ in range(200):
            layer(q, k, v)
        best = min(best, (time.perf_counter() - start) / 200)
print(json.dumps(best))
"""


def _time(with_plugin: bool, blocks: int) -> float:
    code = CHILD.format(
        root=str(ROOT), compat_tests=str(ROOT / "tests" / "compat"), with_plugin=with_plugin, blocks=blocks
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_ATTN_COMPAT_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    rounds, blocks = 3, 40
    times: dict[str, list[float]] = {"without the plugin": [], "with the plugin": []}
    for _ in range(rounds):  # the two take turns, so that load drifting over the run weighs on both
        times["without the plugin"].append(_time(False, blocks))
        times["with the plugin"].append(_time(True, blocks))
    base, plugin = min(times["without the plugin"]), min(times["with the plugin"])
    print("vLLM's Attention, 8 tokens x 8 heads x 64, an impl writing output (minimum over blocks and processes)")
    print(f"  without the plugin  {base * 1e6:8.2f} us a call")
    print(
        f"  with the plugin     {plugin * 1e6:8.2f} us a call  ({plugin / base:.3f}x, {(plugin - base) * 1e6:+.2f} us)"
    )


if __name__ == "__main__":
    main()
