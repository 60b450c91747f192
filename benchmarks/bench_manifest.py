"""What the manifest of vLLM's attention interface costs a fresh process (run: python benchmarks/bench_manifest.py).

Side by side, alternating, in fresh interpreters (``-E``-free, bytecode as installed): ``python -c pass``;
importing ``vllm_attn_compat.manifest`` and resolving one release (what the CLI does for ``--target-version``); the
same and one query that a rule or the runtime plugin makes (``dead_hooks`` of ``AttentionBackend`` at the newest
release). Prints the median and the minimum of each, and the added milliseconds over ``pass``; then the data's
size on disk.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "vllm_attn_compat" / "manifest" / "attention_api.json"

CASES = {
    "python -c pass": "pass",
    "import + resolve('0.34')": "from vllm_attn_compat import manifest; manifest.resolve('0.34')",
    "import + resolve + dead_hooks": (
        "from vllm_attn_compat import manifest; "
        "manifest.dead_hooks(manifest.resolve('0.34'), 'vllm.v1.attention.backend.AttentionBackend')"
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="fresh processes per case (default 30)")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT)
    for code in CASES.values():  # write the bytecode once, as an installation does
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.runs):
        for name, code in CASES.items():
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, env=env)
            times[name].append((time.perf_counter() - start) * 1000)
    base = statistics.median(times["python -c pass"])
    print(f"{'case':34} {'median ms':>10} {'min ms':>8} {'added (median)':>15}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:34} {median:10.1f} {min(values):8.1f} {median - base:+14.1f}")
    print(f"\ndata: {DATA.relative_to(ROOT)}, {DATA.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
