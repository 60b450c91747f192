"""Runs the runtime half's tests that need no vLLM (tests/backends, tests/compat) with each torch release given.

Called by scripts/torch-matrix.sh (see its header for usage). Standard library only; the venvs, their reuse and the
way pytest's outcomes are counted are scripts/vllm_matrix.py's, without vLLM:
  1. the torch release, alone (whatever build pip finds: a CUDA build imports without a GPU);
  2. the package's own dependencies and `test` extra, that torch pinned again so that no requirement swaps it;
  3. the package itself, editable and without dependencies, from this tree, on every run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_matrix as matrix  # a sibling script, found through the line above

# Bumped whenever the way a venv is built changes, so cached venvs built the old way are rebuilt.
RECIPE = 1


def venv_name(torch: str) -> str:
    return f"torch-{torch}-py{sys.version_info[0]}.{sys.version_info[1]}"


def prepare(torch: str, root: Path, python: str, rebuild: bool) -> matrix.Result:
    """The venv of ``torch`` under ``root``, built unless a complete one is there, with this tree installed."""
    venv = root / venv_name(torch)
    result = matrix.Result("-", str(venv), torch)
    start = time.monotonic()
    marker = venv / matrix.MARKER
    cached = json.loads(marker.read_text()) if marker.is_file() else None
    try:
        if cached == {"recipe": RECIPE, "torch": torch} and not rebuild:
            result.reused = True
        else:
            print(f"torch-matrix: torch {torch}: building {venv}", file=sys.stderr, flush=True)
            if venv.exists():
                shutil.rmtree(venv)
            pinned = f"torch=={torch}"
            steps = [
                ("venv", lambda: matrix.run([python, "-m", "venv", str(venv)], env=matrix.clean_env())),
                ("torch", lambda: matrix.pip(venv, pinned)),
                ("test dependencies", lambda: matrix.pip(venv, pinned, *matrix.package_requirements())),
            ]
            matrix.run_steps(steps)
            marker.write_text(json.dumps({"recipe": RECIPE, "torch": torch}))
        matrix.install_tree(venv)
        result.install_ok = True
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        result.install_error = str(error)
    result.install_s = time.monotonic() - start
    return result


def summary_line(result: matrix.Result) -> str:
    install = "reused" if result.reused else f"built in {result.install_s:.0f}s"
    if not result.install_ok:
        return f"torch {result.torch}: install FAILED ({install}): {result.install_error}"
    text = f"torch {result.torch}: install ok ({install}); runtime tests: {result.tier_text()} in {result.tier_s:.0f}s"
    return text + "".join(f"\n    failed: {item}" for item in result.failures)


def main(argv: list[str] | None = None) -> int:
    default_dir = Path(os.environ.get("VLLM_MATRIX_DIR") or Path.home() / ".cache/vllm-attn-compat/matrix")
    parser = argparse.ArgumentParser(prog="torch-matrix.sh", description=__doc__.splitlines()[0])
    parser.add_argument("torches", nargs="+", metavar="VERSION", help="the torch releases to test")
    parser.add_argument("--dir", type=Path, default=default_dir, help=f"where the venvs live (default {default_dir})")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the venvs even when complete")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the venvs are made from")
    parser.epilog = "Arguments after `--` go to pytest."
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    reports = args.dir / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    results = []
    for torch in args.torches:
        result = prepare(torch, args.dir, args.python, args.rebuild)
        if result.install_ok:
            start = time.monotonic()
            matrix.run_pytest(result, reports / f"torch-{torch}-runtime", [*matrix.RUNTIME_TESTS, *extra])
            result.tier_s = time.monotonic() - start
        results.append(result)
        print(summary_line(result), flush=True)
    # Skips are allowed (each for want of a CUDA device, flash-attn or vLLM); failures and a run of nothing are not.
    return 0 if all(r.tier_ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
