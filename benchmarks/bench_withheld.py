"""How many safe fixes the accounting of issue #50 withholds, against the code before it, on real trees.

Before a safe fix, every use of what it changes must now be proven unaffected, or the fix is withheld (`[unsafe]`)
with the use that withheld it named. This benchmark runs `migrate --check --no-cache --format json` with this
checkout's code and with the code before (another checkout, ``--base``: e.g. ``git worktree add /tmp/base e8b4e6a``)
over the same trees, and prints, per tree, how many safe fixes each run offers and each fix the new accounting
withholds, with its reason. The default trees are vLLM 0.19.1's sources and three real plugins as the machine holds
them (each tree is named with a digest of its files' paths and sizes, so that a later run can tell it is the same).

Usage: ``python benchmarks/bench_withheld.py --base /tmp/base [TREE ...]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREES = (
    "/work/vllm-src/0.19.1",
    "/work/plugins/vllm-project+vllm-ascend",
    "/work/plugins/vllm-project+vllm-gaudi",
    "/work/plugins/ROCm+ATOM",
)
WITHHELD = "; withheld: "


def tree_digest(tree: str) -> tuple[int, str]:
    """The number of Python files under ``tree`` and a digest of their paths and sizes."""
    digest = hashlib.sha256()
    count = 0
    for folder, folders, names in sorted(os.walk(tree)):
        folders.sort()
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(f"{os.path.relpath(path, tree)}\0{os.path.getsize(path)}\n".encode())
                count += 1
    return count, digest.hexdigest()[:12]


def findings(code: str, tree: str) -> tuple[list[dict], float]:
    """The findings of `migrate --check` over ``tree`` with the package at ``code``, and the run's wall time."""
    environment = {**os.environ, "PYTHONPATH": code}
    command = [sys.executable, "-m", "vllm_attn_compat", "migrate", "--check", "--no-cache", "--format", "json", tree]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=tree, check=False)
    took = time.perf_counter() - started
    if completed.returncode not in (0, 1):
        print(f"  (exit {completed.returncode} with {code}: {completed.stderr.strip()[:300]})")
    return json.loads(completed.stdout)["findings"], took


def _key(finding: dict) -> tuple[str, int, str]:
    return finding["file"], finding["line"], finding["code"]


def compare(tree: str, base: str, new: str) -> tuple[int, int, int]:
    count, digest = tree_digest(tree)
    print(f"\n== {tree} ({count} Python files, digest {digest})")
    before, before_s = findings(base, tree)
    after, after_s = findings(new, tree)
    safe_before = {_key(f): f for f in before if f["status"] == "fixed"}
    by_key = {_key(f): f for f in after}
    safe_after = [f for f in after if f["status"] == "fixed"]
    print(f"  safe fixes: {len(safe_before)} before, {len(safe_after)} now  (runs: {before_s:.1f} s, {after_s:.1f} s)")
    print(f"  findings by status before: {dict(Counter(f['status'] for f in before))}")
    print(f"  findings by status now:    {dict(Counter(f['status'] for f in after))}")
    withheld = 0
    for key in sorted(safe_before):
        now = by_key.get(key)
        if now is not None and now["status"] == "fixed":
            continue
        withheld += 1
        path = os.path.relpath(key[0], tree)
        reason = now["message"].partition(WITHHELD)[2] or now["message"] if now is not None else "no finding now"
        print(f"  withheld: {path}:{key[1]} {key[2]}: {reason}")
    new_safe = [f for f in safe_after if _key(f) not in safe_before]
    for finding in new_safe:
        print(f"  safe now, not before: {os.path.relpath(finding['file'], tree)}:{finding['line']} {finding['code']}")
    return len(safe_before), len(safe_after), withheld


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="a checkout of the code before (e.g. e8b4e6a)")
    parser.add_argument("trees", nargs="*", default=list(TREES))
    args = parser.parse_args()
    totals = [0, 0, 0]
    for tree in args.trees:
        if not os.path.isdir(tree):
            print(f"\n== {tree}: not on this machine, skipped")
            continue
        for number, value in enumerate(compare(tree, os.path.abspath(args.base), REPO)):
            totals[number] += value
    print(f"\nin all: {totals[0]} safe fixes before, {totals[1]} now; {totals[2]} withheld by the accounting")
    return 0


if __name__ == "__main__":
    sys.exit(main())
