"""How fast `vllm-attn-compat migrate --check` is on a whole vLLM fork and on torch, next to ruff, each tool at its
defaults: the ratios of issue #53, measured side by side in one run.

Trees: vLLM's own Python sources at the last release before the mandatory output buffer (0.19.1: about 1,550
files, 22 MB; a fork based on it must migrate exactly these), from ``--vllm-src`` (a folder holding ``vllm/``) or
else fetched once into the cache folder with ``pip download --no-deps vllm==0.19.1`` and unzipped (its ``.py``
files only); and torch's installed ``.py`` files (about 2,300 files, 46 MB, nothing to migrate).

Each command runs on a copy of its own, the commands taking turns (A B A B ...: the load of a shared machine
drifts over seconds and weighs on each alike); medians of ``--repeat`` runs. ``migrate`` runs as a hook
environment runs it: from a compiled copy of this checkout, with the Python of a virtual environment holding its
dependencies (`install_environment`), without this interpreter's start-up hooks. ruff (pinned) runs from a
virtual environment of its own, ``ruff check --select UP``. The ratios, each against its target:

* **warm at defaults**: both tools' default caches filled by an untimed round, nothing changed (<= 1x ruff);
* **after one backend edit**: a line added at the top of ``v1/attention/backends/flash_attn.py`` before each run,
  seen by both tools (<= 5x ruff);
* **cold**: ``--no-cache`` for both (<= 5x ruff);
* **a first run with the cache**: ``migrate --check`` with its cache folder removed before each run, against
  ``migrate --check --no-cache`` (<= 1.15x);
* **peak memory** of each migrate command, from one more untimed run polling ``/proc``: the sum of every process's
  own peak (``VmHWM``), an upper bound of what they held at once (< 500 MiB).

Usage: ``python benchmarks/bench_fork.py [--vllm-src DIR] [--cache-dir DIR] [--repeat N] [--jobs N]``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_codemods import build_tree, install_copy, timed_alternately

VLLM_VERSION = "0.19.1"
RUFF = "ruff==0.17.6"  # pinned: ruff's speed changes between releases
BACKEND = "v1/attention/backends/flash_attn.py"
MIB = 1 << 20


def fetch_sources(cache: str, version: str) -> str:
    """``cache/<version>``, holding ``vllm/``: vLLM's ``.py`` files, downloaded and unzipped on first use."""
    tree = os.path.join(cache, version)
    if os.path.isdir(os.path.join(tree, "vllm")):
        return tree
    wheels = glob.glob(os.path.join(cache, f"vllm-{version}-*.whl"))
    if not wheels:
        print(f"downloading vllm=={version} into {cache} (about 430 MB, once)")
        command = [sys.executable, "-m", "pip", "download", "--no-deps", f"vllm=={version}", "-d", cache]
        subprocess.run(command, check=True)
        wheels = glob.glob(os.path.join(cache, f"vllm-{version}-*.whl"))
    if not wheels:
        raise SystemExit(f"pip download left no vllm-{version}-*.whl in {cache}")
    unpacking = tempfile.mkdtemp(prefix=f".{version}-", dir=cache)
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(unpacking, [n for n in wheel.namelist() if n.startswith("vllm/") and n.endswith(".py")])
    os.rename(unpacking, tree)  # complete or absent, never half unzipped
    return tree


def _venv(cache: str, name: str, requirements: list[str]) -> str:
    """The Python of a virtual environment ``name`` in ``cache`` holding ``requirements``, made on first use."""
    venv = os.path.join(cache, name)
    python = os.path.join(venv, "bin", "python")
    complete = os.path.join(venv, ".complete")  # written last: an interrupted install is made again
    if not os.path.exists(complete):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *requirements], check=True)
        with open(complete, "w"):
            pass
    return python


def install_environment(cache: str) -> str:
    """The Python of an environment with this package's dependencies at the versions installed here: ``migrate``
    runs there from the copy on PYTHONPATH, as pre-commit or pipx start it, without the start-up hooks of this
    interpreter's ``site-packages`` (an editable install's finder), which no hook environment has."""
    from importlib import metadata

    pins = [f"{name}=={metadata.version(name)}" for name in ("libcst", "typing-extensions", "tqdm")]
    return _venv(cache, "migrate-env-" + "-".join(pin.replace("==", "-") for pin in pins), pins)


def _peak_mib(command: list[str], prepare=None, **kwargs) -> float:
    """MiB: the sum of the peaks of every process the command ran (polled every 5 ms)."""
    if prepare is not None:
        prepare()
    peaks: dict[int, int] = {}
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, **kwargs
    )
    while process.poll() is None:
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    if int(handle.read().rpartition(b")")[2].split()[3]) != process.pid:  # its session
                        continue
                with open(f"/proc/{name}/status", "rb") as handle:
                    for line in handle:
                        if line.startswith(b"VmHWM:"):
                            peaks[int(name)] = max(int(line.split()[1]), peaks.get(int(name), 0))
            except (OSError, ValueError):
                continue
        time.sleep(0.005)
    return sum(peaks.values()) * 1024 / MIB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-src", help=f"a folder holding vLLM {VLLM_VERSION}'s vllm/ (default: fetched)")
    parser.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/vllm-attn-compat-bench"),
                        help="where the fetched sources and the tools' environments are kept between runs")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=7, help="runs of each command (median reported)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="migrate's processes")
    args = parser.parse_args()

    os.makedirs(args.cache_dir, exist_ok=True)
    sources = os.path.join(args.vllm_src or fetch_sources(args.cache_dir, VLLM_VERSION), "vllm")
    ruff = os.path.join(os.path.dirname(_venv(args.cache_dir, RUFF.replace("==", "-"), [RUFF])), "ruff")
    python = install_environment(args.cache_dir)
    with tempfile.TemporaryDirectory(prefix="bench-fork-") as scratch:
        site = install_copy(scratch)
        env = {**os.environ, "PYTHONPATH": site}
        env.pop("VLLM_ATTN_COMPAT_NO_CACHE", None)  # at its defaults: the cache on

        def tree(name: str, origin: str = sources) -> str:
            """A copy of its own of ``origin`` as ``name/vllm`` (``name/torch``), for one command."""
            root = os.path.join(scratch, name)
            shutil.copytree(origin, os.path.join(root, os.path.basename(origin)))
            return root

        def removing(path: str):
            return lambda: shutil.rmtree(path, ignore_errors=True)

        def editing(root: str):
            """What adds a line at the top of the backend of ``root``'s tree, anew before each run."""
            path = os.path.join(root, "vllm", BACKEND)
            with open(path, "rb") as handle:
                original = handle.read()
            edits = iter(range(1 << 30))

            def edit() -> None:
                with open(path, "wb") as handle:
                    handle.write(b"# edit %d\n" % next(edits) + original)

            return edit

        torch_origin = os.path.join(scratch, "torch-origin")
        torch_files, torch_size = build_tree(torch_origin, plugin=False)
        torch_origin = os.path.join(torch_origin, "torch")
        check = [python, "-m", "vllm_attn_compat", "migrate", "--check", "--format", "json", "--jobs", str(args.jobs)]
        ruff_check = [ruff, "check", "--select", "UP"]
        commands: dict[str, tuple[list[str], dict[str, object]]] = {}
        for label, origin in (("vLLM", sources), ("torch", torch_origin)):
            top = os.path.basename(origin)
            warm, first, cold = (
                tree(f"{label}-warm", origin),
                tree(f"{label}-first", origin),
                tree(f"{label}-cold", origin),
            )
            commands |= {
                f"{label}: ruff, warm": ([*ruff_check, top], {"cwd": warm}),
                f"{label}: migrate, warm": ([*check, top], {"cwd": warm, "env": env}),
                f"{label}: ruff --no-cache": ([*ruff_check, "--no-cache", top], {"cwd": cold}),
                f"{label}: migrate --no-cache": ([*check, "--no-cache", top], {"cwd": cold, "env": env}),
                f"{label}: migrate, first run": (
                    [*check, top], {"cwd": first, "env": env, "prepare": removing(f"{first}/.vllm-attn-compat-cache")}
                ),
            }  # fmt: skip
        edited = tree("vLLM-edited")
        commands |= {
            "vLLM: ruff, a backend edited": ([*ruff_check, "vllm"], {"cwd": edited, "prepare": editing(edited)}),
            "vLLM: migrate, a backend edited": (
                [*check, "vllm"], {"cwd": edited, "env": env, "prepare": editing(edited)}),
        }  # fmt: skip
        files = sum(len([n for n in ns if n.endswith(".py")]) for _, _, ns in os.walk(sources))
        print(f"vLLM {VLLM_VERSION}: {files} files; torch: {torch_files} files ({torch_size / 1e6:.1f} MB); "
              f"jobs={args.jobs}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        pairs = list(commands.values())
        timed_alternately(pairs, 1)  # the page cache, and both tools' caches, filled
        results = dict(zip(commands, timed_alternately(pairs, args.repeat), strict=True))
        for name, (_, _, done) in results.items():
            if "migrate" in name and done.returncode not in (0, 1):
                raise SystemExit(f"{name} failed (exit {done.returncode}):\n{done.stderr.decode()}")
            if "migrate" in name and json.loads(done.stdout)["summary"]["files_failed"]:
                raise SystemExit(f"{name} reported files it could not process")
        peak = max(_peak_mib(command, **kwargs) for name, (command, kwargs) in commands.items() if "migrate" in name)

        def ratio(label: str, ours: str, theirs: str, target: str) -> None:
            value = results[ours][0] / results[theirs][0]
            print(f"{label:<44} {value:5.2f}x  ({results[ours][0]:.3f} s / {results[theirs][0]:.3f} s)  {target}")

        print(f"medians of {args.repeat} runs, wall time; load average at the end {os.getloadavg()[0]:.1f}")
        for label in ("vLLM", "torch"):
            ratio(f"{label}: warm at defaults / ruff", f"{label}: migrate, warm", f"{label}: ruff, warm", "<= 1x")
        ratio("vLLM: after one backend edit / ruff", "vLLM: migrate, a backend edited", "vLLM: ruff, a backend edited",
              "<= 5x")  # fmt: skip
        for label in ("vLLM", "torch"):
            ratio(f"{label}: cold / ruff --no-cache", f"{label}: migrate --no-cache", f"{label}: ruff --no-cache",
                  "<= 5x")  # fmt: skip
        for label in ("vLLM", "torch"):
            ratio(f"{label}: first run with the cache / without", f"{label}: migrate, first run",
                  f"{label}: migrate --no-cache", "<= 1.15x")  # fmt: skip
        print(f"{'peak memory, all processes of a migrate run':<44} {peak:5.0f} MiB  < 500 MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
