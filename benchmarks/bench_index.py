"""How long `migrate --check`'s class-hierarchy pass takes on a tree, this checkout next to another revision.

The pass (`rounds.build_hierarchy`, `runner.index_hierarchy` in older revisions: the class-header scan, then
`hierarchy.index_module` on every file it cannot spare, the hierarchy and the call-site analysis, round after
round) is timed inside real ``migrate --check --no-cache --jobs 1`` runs, one process per run, the two revisions
taking turns (A B A B ...) so that the drifting load of a shared machine weighs on both alike. Prints the
medians (wall and CPU seconds) of the pass and of the whole run, and their ratios.

Usage: ``python benchmarks/bench_index.py [--tree DIR] [--baseline REV] [--repeat N]``; the baseline
revision's package is taken with ``git archive``. The default tree is vLLM 0.19.1's sources as
``bench_fork.py --cache-dir /tmp/vllm-src`` leaves them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run in a child process with the revision's package first on sys.path: one `migrate --check`, the pass timed.
_CHILD = """
import contextlib, io, json, sys, time
from vllm_attn_compat.codemods.cli import main
from vllm_attn_compat.codemods.run import rounds, runner
owner, name = (rounds, "build_hierarchy") if hasattr(rounds, "build_hierarchy") else (runner, "index_hierarchy")
index_pass = getattr(owner, name)
took = {}
def timed(*args, **kwargs):
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        return index_pass(*args, **kwargs)
    finally:
        took["pass_wall"], took["pass_cpu"] = time.perf_counter() - wall, time.process_time() - cpu
setattr(owner, name, timed)
wall, cpu = time.perf_counter(), time.process_time()
with contextlib.redirect_stdout(io.StringIO()):
    main(["migrate", "--check", "--no-cache", "--jobs", "1", sys.argv[1]])
took["run_wall"], took["run_cpu"] = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps(took))
"""


def baseline_package(revision: str, destination: str) -> str:
    archive = os.path.join(destination, "baseline.tar")
    with open(archive, "wb") as out:
        subprocess.run(["git", "-C", REPO, "archive", revision, "vllm_attn_compat"], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(destination, filter="data")
    return destination


def run_once(site: str, tree: str, cwd: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": site}
    done = subprocess.run([sys.executable, "-c", _CHILD, tree], capture_output=True, text=True, env=env, cwd=cwd)
    if not done.stdout.strip():
        raise SystemExit(f"the run under {site} printed nothing; its errors:\n{done.stderr}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", default="/tmp/vllm-src/0.19.1/vllm")
    parser.add_argument("--baseline", default="main", help="git revision to compare with (default: main)")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    if not os.path.isdir(args.tree):
        raise SystemExit(f"no tree at {args.tree}: run benchmarks/bench_fork.py --cache-dir /tmp/vllm-src once")
    with tempfile.TemporaryDirectory(prefix="bench-index-") as scratch:
        sites = {"baseline": baseline_package(args.baseline, scratch), "this checkout": REPO}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in sites}
        for turn in range(args.repeat):
            order = list(sites) if turn % 2 == 0 else list(reversed(sites))
            for name in order:
                runs[name].append(run_once(sites[name], args.tree, scratch))
    medians = {
        name: {key: statistics.median(r[key] for r in taken) for key in taken[0]} for name, taken in runs.items()
    }
    print(f"tree {args.tree}, {args.repeat} runs each, alternating; medians in seconds")
    print(f"{'':15} {'pass wall':>10} {'pass CPU':>10} {'run wall':>10} {'run CPU':>10}")
    for name, median in medians.items():
        print(
            f"{name:15} " + " ".join(f"{median[key]:10.3f}" for key in ("pass_wall", "pass_cpu", "run_wall", "run_cpu"))
        )
    base, new = medians["baseline"], medians["this checkout"]
    ratios = " ".join(f"{base[key] / new[key]:10.2f}" for key in ("pass_wall", "pass_cpu", "run_wall", "run_cpu"))
    print(f"{'ratio (x)':15} " + ratios)
    ranges = {
        name: (min(r["pass_cpu"] for r in taken), max(r["pass_cpu"] for r in taken)) for name, taken in runs.items()
    }
    print("pass CPU range: " + ", ".join(f"{name} {low:.3f}-{high:.3f}" for name, (low, high) in ranges.items()))


if __name__ == "__main__":
    main()
