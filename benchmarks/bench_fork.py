"""How fast `vllm-attn-compat migrate` is on a whole vLLM fork, next to ruff and grep on the same tree.

The tree is vLLM's own Python sources at the last release before the mandatory output buffer (0.19.1:
about 1,550 files, 25 MB; a fork based on it must migrate exactly these), fetched once into a cache
folder with ``pip download --no-deps vllm==0.19.1`` and unzipped (only the ``.py`` files). Measured side
by side, in one run, on this machine, the commands taking turns:

* ``ruff check --no-cache --select UP vllm`` (ruff parses and lints every file; installed by the
  benchmark into a virtual environment of its own, kept in the cache folder);
* ``grep -rlE`` of the rules' prefilter tokens;
* ``vllm-attn-compat migrate --check`` (cold: nothing kept from an earlier run) and ``migrate`` (write
  mode) on a fresh copy of the tree for each run (the copy is not timed);
* ``migrate --check --cache-dir`` with a warm cache (filled by the untimed first round): a rerun in
  pre-commit or CI with nothing changed; and the same after an edit of one file (a line added at its top
  before each run, so that all its lines move): a backend (``flash_attn.py``) and a model
  (``deepseek_v2.py``, whose calls the call-site analysis reads). Reported apart: the targets are for
  cold runs;
* the two parsers alone on the input a cold ``migrate --check`` hands them (``parsers_alone.py``): the
  ``ast`` parse of the files it indexes and libcst's import and parse of what it migrates, on two cores.
  A floor under this design: whatever else a run does comes on top.

Targets (issue #12): ``--check`` within 2x of ruff's wall time, write mode within 3x, and the peak memory
of the whole run, all processes together, under 500 MiB. Peak memory is taken in a separate, untimed run
of each command, by polling ``/proc``: the sum of every process's own peak (``VmHWM``), an upper bound
of what the processes held at once.

Usage: ``python benchmarks/bench_fork.py [--cache-dir DIR] [--repeat N] [--jobs N]``. With
``--cache-dir /tmp/vllm-src`` an already unzipped ``0.19.1/vllm`` there is used as is.
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
from bench_codemods import install_copy, timed_alternately

PARSERS_ALONE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parsers_alone.py")

VLLM_VERSION = "0.19.1"
RUFF = "ruff==0.17.6"  # pinned: ruff's speed changes between releases
MIB = 1 << 20


def fetch_sources(cache: str, version: str) -> str:
    """``cache/<version>/vllm``: vLLM's ``.py`` files, downloaded and unzipped on first use."""
    tree = os.path.join(cache, version, "vllm")
    if os.path.isdir(tree):
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
    os.rename(unpacking, os.path.join(cache, version))  # complete or absent, never half unzipped
    return tree


def install_ruff(cache: str) -> str:
    """The ruff executable of a virtual environment of its own in ``cache``, made on first use."""
    venv = os.path.join(cache, RUFF.replace("==", "-"))
    executable = os.path.join(venv, "bin", "ruff")
    if not os.path.exists(executable):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q", RUFF], check=True)
    return executable


def _ere(token: str) -> str:
    return "".join("\\" + c if c in ".[]()*+?{}|^$\\" else c for c in token)


def _descendants(session: int) -> list[int]:
    """Processes of the session led by ``session`` (the command and everything it started)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    fields = handle.read().rpartition(b")")[2].split()
            except OSError:
                continue
            if int(fields[3]) == session:  # the session id, after state, ppid and pgrp
                found.append(int(name))
    return found


def _peak_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_memory(command: list[str], prepare=None, **kwargs) -> tuple[float, int]:
    """MiB: the sum of the peaks of every process the command ran (polled every 5 ms), and how many."""
    if prepare is not None:
        prepare()
    peaks: dict[int, int] = {}
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, **kwargs
    )
    while process.poll() is None:
        for pid in _descendants(process.pid):
            peak = _peak_kib(pid)
            if peak is not None:
                peaks[pid] = max(peak, peaks.get(pid, 0))
        time.sleep(0.005)
    return sum(peaks.values()) * 1024 / MIB, len(peaks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/vllm-attn-compat-bench"),
                        help="where vLLM's sources and ruff's environment are kept between runs")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=7, help="runs of each command (median reported)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="migrate's processes")
    args = parser.parse_args()

    from vllm_attn_compat.codemods.engine.migrate import prefilter_tokens
    from vllm_attn_compat.codemods.registry import select_rules

    os.makedirs(args.cache_dir, exist_ok=True)
    sources = fetch_sources(args.cache_dir, VLLM_VERSION)
    ruff = install_ruff(args.cache_dir)
    with tempfile.TemporaryDirectory(prefix="bench-fork-") as scratch:
        # Every command reads its own copy: nothing can write to the cache folder.
        read_only = os.path.join(scratch, "check")
        shutil.copytree(sources, os.path.join(read_only, "vllm"))
        written = os.path.join(scratch, "write")
        files = sum(len([n for n in ns if n.endswith(".py")]) for _, _, ns in os.walk(sources))
        size = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(sources) for n in ns)
        print(f"tree: vLLM {VLLM_VERSION}'s sources, {files} files ({size / 1e6:.1f} MB); jobs={args.jobs}")
        print("load average at start: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
        site = install_copy(scratch)
        inherited = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": site + (os.pathsep + inherited if inherited else "")}
        where = [sys.executable, "-c", "import vllm_attn_compat; print(vllm_attn_compat.__file__)"]
        imported = subprocess.run(where, capture_output=True, text=True, env=env, cwd=read_only, check=True).stdout
        if not imported.startswith(site):
            raise SystemExit(f"the benchmark would time {imported.strip()}, expected the copy in {site}")

        def fresh_copy() -> None:
            shutil.rmtree(written, ignore_errors=True)
            shutil.copytree(sources, os.path.join(written, "vllm"))

        def edited(relative: str) -> tuple[str, object]:
            """A copy of the tree of its own, and what edits its file ``relative`` anew before each run."""
            root = os.path.join(scratch, "edited-" + os.path.basename(relative))
            shutil.copytree(sources, os.path.join(root, "vllm"))
            path = os.path.join(root, "vllm", relative)
            with open(path, "rb") as handle:
                original = handle.read()
            edits = iter(range(1 << 30))

            def edit() -> None:
                with open(path, "wb") as handle:
                    handle.write(b"# edit %d\n" % next(edits) + original)

            return root, edit

        backend_tree, edit_backend = edited("v1/attention/backends/flash_attn.py")
        model_tree, edit_model = edited("model_executor/models/deepseek_v2.py")

        migrate = [sys.executable, "-m", "vllm_attn_compat", "migrate", "--format", "json", "--jobs", str(args.jobs)]
        inputs = os.path.join(scratch, "parser-inputs.pickle")
        recorded = [sys.executable, PARSERS_ALONE, "record", inputs, "vllm"]
        print("parser inputs of migrate --check:", subprocess.run(
            recorded, env=env, cwd=read_only, check=True, capture_output=True, text=True).stdout.strip())  # fmt: skip
        tokens = [token.decode() for token in prefilter_tokens(select_rules())]
        commands = {
            "ruff check --no-cache --select UP": (
                [ruff, "check", "--no-cache", "--select", "UP", "vllm"], {"cwd": read_only}),
            f"grep -rlE ({len(tokens)} tokens)": (
                ["grep", "-rlE", "--include=*.py", "-e", "|".join(map(_ere, tokens)), "vllm"], {"cwd": read_only}),
            "migrate --check": ([*migrate, "--check", "vllm"], {"env": env, "cwd": read_only}),
            "migrate (write)": ([*migrate, "vllm"], {"env": env, "cwd": written, "prepare": fresh_copy}),
            "migrate --check, warm --cache-dir": (
                [*migrate, "--check", "--cache-dir", os.path.join(scratch, "cache"), "vllm"],
                {"env": env, "cwd": read_only}),
            "  the same, a backend edited": (
                [*migrate, "--check", "--cache-dir", os.path.join(scratch, "cache-backend"), "vllm"],
                {"env": env, "cwd": backend_tree, "prepare": edit_backend}),
            "  the same, a model edited": (
                [*migrate, "--check", "--cache-dir", os.path.join(scratch, "cache-model"), "vllm"],
                {"env": env, "cwd": model_tree, "prepare": edit_model}),
            "ast + libcst parses alone (floor)": (
                [sys.executable, PARSERS_ALONE, "parse", inputs, "vllm"], {"env": env, "cwd": read_only}),
        }  # fmt: skip
        pairs = list(commands.values())
        timed_alternately(pairs, 1)  # warm the page cache (and fill the result cache)
        results = dict(zip(commands, timed_alternately(pairs, args.repeat), strict=True))
        floor_wall, floor_cpu, floor_done = results["ast + libcst parses alone (floor)"]
        if floor_done.returncode != 0:
            raise SystemExit(f"the parsers alone failed (exit {floor_done.returncode}):\n{floor_done.stderr.decode()}")
        peaks = {name: peak_memory(command, **kwargs) for name, (command, kwargs) in commands.items()}

        ruff_wall, ruff_cpu, _ = results["ruff check --no-cache --select UP"]
        print(f"medians of {args.repeat} runs of each, the commands taking turns; peak memory from one more run")
        print(f"{'command':<36} {'wall s':>7} {'CPU s':>7} {'/ruff':>6} {'peak MiB':>9}")
        for name, (wall, cpu, _) in results.items():
            memory, processes = peaks[name]
            print(f"{name:<36} {wall:7.3f} {cpu:7.3f} {wall / ruff_wall:5.1f}x {memory:6.0f} ({processes} processes)")
        warm = ("migrate --check, warm --cache-dir", "  the same, a backend edited", "  the same, a model edited")
        for name in ("migrate --check", "migrate (write)", *warm):
            done = results[name][2]
            summary = json.loads(done.stdout)["summary"]
            print(f"{name}: exit {done.returncode}; scanned {summary['files_scanned']}, parsed "
                  f"{summary['files_parsed']}, changed {summary['files_changed']}, failed {summary['files_failed']}, "
                  f"findings {summary['findings']}")  # fmt: skip
        print("load average at end: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
        check_wall = results["migrate --check"][0]
        write_wall = results["migrate (write)"][0]
        print("\nratios (wall time):")
        print(f"  migrate --check / ruff = {check_wall / ruff_wall:5.2f}x   (target <= 2x)")
        print(f"  migrate (write) / ruff = {write_wall / ruff_wall:5.2f}x   (target <= 3x)")
        for name in warm:
            print(f"  {name.strip()} / ruff = {results[name][0] / ruff_wall:5.2f}x   (no target: reruns)")
        floor = f"{floor_wall / ruff_wall:5.2f}x   (a floor: the rest of a run comes on top)"
        print(f"  ast + libcst parses alone / ruff = {floor}")
        print(f"  their CPU time on two cores, split perfectly / ruff = {floor_cpu / 2 / ruff_wall:5.2f}x")
        print("ratios (CPU time, less sensitive to other load):")
        print(f"  migrate --check / ruff = {results['migrate --check'][1] / ruff_cpu:5.2f}x")
        print(f"  migrate (write) / ruff = {results['migrate (write)'][1] / ruff_cpu:5.2f}x")
        print(f"  ast + libcst parses alone / ruff = {floor_cpu / ruff_cpu:5.2f}x")
        most = max(memory for memory, _ in peaks.values())
        print(f"peak memory, all processes of one command: at most {most:.0f} MiB   (target < 500 MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
