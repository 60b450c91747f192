"""How fast `vllm-attn-compat migrate --check` is on a large tree, next to grep and libcst's own runner.

The tree is torch's installed Python sources (about 2,300 files, 46 MB), copied to a temporary folder
with the legacy plugin of ``examples/legacy_plugin`` dropped in, so the run has real work in a few
files among thousands that hold none. Measured side by side, in one run, on this machine:

* ``migrate --check --no-cache`` (all rules, default --jobs: a whole run) against ``grep -rlF`` of the rules'
  prefilter tokens over the same tree (target: within 3x of grep's wall time), and ``migrate --check`` at its
  defaults, whose cache, filled by the first round, replays the run (the rerun in pre-commit and CI);
* against ``python -m libcst.tool codemod`` running one equivalent rule (drop ``assert output is not
  None`` where ``output`` is a parameter) in diff mode (target: at least 20x faster). That run takes
  minutes on the whole tree; ``--quick`` runs it on a sample and extrapolates per file, and says so;
* per file, on the files that do match: our whole migration of the file against a bare
  ``libcst.parse_module(source).bytes`` of the same file.

Usage: ``python benchmarks/bench_codemods.py [--quick] [--repeat N] [--jobs N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

LIBCST_RULE = textwrap.dedent(
    """
    import libcst as cst
    import libcst.matchers as m
    from libcst.codemod import VisitorBasedCodemodCommand

    ASSERT_OUTPUT = m.Assert(
        test=m.Comparison(left=m.Name("output"), comparisons=[m.ComparisonTarget(m.IsNot(), m.Name("None"))])
    )


    class DropAssertOutput(VisitorBasedCodemodCommand):
        DESCRIPTION = "Remove `assert output is not None` in functions that take an `output` parameter."

        def __init__(self, context):
            super().__init__(context)
            self.parameters = []

        def visit_FunctionDef(self, node):
            params = node.params
            names = {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}
            self.parameters.append(names)

        def leave_FunctionDef(self, original_node, updated_node):
            self.parameters.pop()
            return updated_node

        def leave_SimpleStatementLine(self, original_node, updated_node):
            if self.parameters and "output" in self.parameters[-1] and len(updated_node.body) == 1:
                if m.matches(updated_node.body[0], ASSERT_OUTPUT):
                    return cst.RemoveFromParent()
            return updated_node
    """
)


def build_tree(destination: str, plugin: bool = True) -> tuple[int, int]:
    """Copy torch's ``*.py`` files and (with ``plugin``) the legacy plugin; returns (files, bytes)."""
    import torch

    torch_root = os.path.dirname(torch.__file__)
    count = size = 0
    for folder, _, names in os.walk(torch_root):
        for name in names:
            if name.endswith(".py"):
                source = os.path.join(folder, name)
                target = os.path.join(destination, "torch", os.path.relpath(source, torch_root))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(source, target)
                count += 1
                size += os.path.getsize(target)
    example = os.path.join(REPO, "examples", "legacy_plugin")
    if plugin and os.path.isdir(example):
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(example, os.path.join(destination, "legacy_plugin"), ignore=ignore)
    return count, size


def install_copy(destination: str) -> str:
    """Copy the package to ``destination`` with its bytecode compiled, as ``pip install`` leaves it, and
    return the folder to put on PYTHONPATH. Run from the checkout, each run would compile the package
    again wherever bytecode is not written (PYTHONDONTWRITEBYTECODE is set on some machines, this one
    included), a cost no installed copy pays."""
    import compileall

    site = os.path.join(destination, "site")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(os.path.join(REPO, "vllm_attn_compat"), os.path.join(site, "vllm_attn_compat"), ignore=ignore)
    compileall.compile_dir(site, quiet=1)
    return site


def timed(command: list[str], repeat: int, **kwargs) -> tuple[float, float, subprocess.CompletedProcess]:
    """Median wall seconds and median CPU seconds (user+sys of the children) over ``repeat`` runs."""
    return timed_alternately([(command, kwargs)], repeat)[0]


def adopt_orphans() -> bool:
    """Make this process the reaper of whatever its commands leave running (Linux's child subreaper): a
    process that outlives the command that started it (a pool's worker still exiting) is then reaped
    here, so that its CPU time counts among this process's children's. False where that is not possible."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def reap_orphans() -> None:
    """Wait for the processes a command left running (adopted by `adopt_orphans`), which are ending."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def timed_alternately(
    commands: list[tuple[list[str], dict]], repeat: int
) -> list[tuple[float, float, subprocess.CompletedProcess]]:
    """:func:`timed` for several commands, run in turn (A B A B ...) rather than one after the other, so
    that the load of a shared machine, which drifts over seconds, weighs on each of them alike. A
    ``prepare`` callable among a command's keyword arguments runs, untimed, before each of its runs. CPU
    time counts every process a command ran, those that outlived their parent too (`adopt_orphans`)."""
    if not adopt_orphans():
        print("note: CPU times leave out processes that outlive their parent (no child subreaper here)")
    walls: list[list[float]] = [[] for _ in commands]
    cpus: list[list[float]] = [[] for _ in commands]
    completed: list[subprocess.CompletedProcess] = []
    for _ in range(repeat):
        completed = []
        for index, (command, kwargs) in enumerate(commands):
            kwargs = dict(kwargs)
            prepare = kwargs.pop("prepare", None)
            if prepare is not None:
                prepare()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            completed.append(subprocess.run(command, capture_output=True, **kwargs))
            walls[index].append(time.perf_counter() - start)
            reap_orphans()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus[index].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    # Not strict: ``completed`` (the last round's) is empty when ``repeat`` is 0.
    rounds = zip(walls, cpus, completed, strict=False)
    return [(statistics.median(w), statistics.median(c), done) for w, c, done in rounds]


def per_file_costs(paths: list[str], loops: int, ignored: list[str]) -> tuple[float, float]:
    """Mean seconds per file: our migration (all rules) and a bare libcst parse + render."""
    import libcst

    from vllm_attn_compat.codemods.engine.migrate import migrate_source
    from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module
    from vllm_attn_compat.codemods.registry import select_rules

    sources = {path: Path(path).read_bytes() for path in paths}
    hierarchy = ClassHierarchy.build(index_module(source, path) for path, source in sources.items())
    rules = select_rules(ignore=ignored)

    def ours() -> None:
        for path, source in sources.items():
            migrate_source(source, path=path, rules=rules, hierarchy=hierarchy, unsafe_fixes=False)

    def bare() -> None:
        for source in sources.values():
            libcst.parse_module(source).bytes  # noqa: B018 (the property renders the module: the work measured)

    results = []
    for work in (ours, bare):
        work()  # warm-up: imports, caches
        samples = []
        for _ in range(loops):
            start = time.perf_counter()
            work()
            samples.append(time.perf_counter() - start)
        results.append(min(samples) / len(sources))
    return results[0], results[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="run libcst's runner on a sample, extrapolate")
    parser.add_argument("--repeat", type=int, default=9, help="runs of the fast commands (median reported)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="processes, both runners")
    parser.add_argument("--sample", type=int, default=150, help="files in the --quick libcst sample")
    parser.add_argument("--ignore", default="", help="rule codes to leave out of migrate and grep (what-if runs)")
    args = parser.parse_args()

    from vllm_attn_compat.codemods.engine.migrate import prefilter_tokens
    from vllm_attn_compat.codemods.registry import select_rules

    ignored = [code for code in args.ignore.split(",") if code]

    with tempfile.TemporaryDirectory(prefix="bench-codemods-") as scratch:
        tree = os.path.join(scratch, "tree")
        files, size = build_tree(tree)
        print(f"tree: {files} torch files ({size / 1e6:.1f} MB) + examples/legacy_plugin, jobs={args.jobs}")
        # Other work on the machine slows the runs unevenly: the ratios are meaningful on a quiet one.
        print("load average at start: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
        if ignored:
            print(f"what-if run: rules {', '.join(ignored)} left out of both migrate and grep")
        site = install_copy(scratch)
        inherited = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": site + (os.pathsep + inherited if inherited else "")}
        print("the package runs from a copy with its bytecode compiled, as pip installs it")

        # The cache is on by default (in the scratch folder, the project's root here): the whole run is --no-cache.
        warm_cmd = [sys.executable, "-m", "vllm_attn_compat", "migrate", "--check", "--format", "json",
                    "--jobs", str(args.jobs), *(["--ignore", args.ignore] if ignored else []), tree]  # fmt: skip
        ours_cmd = [*warm_cmd[:-1], "--no-cache", tree]
        tokens = [token.decode() for token in prefilter_tokens(select_rules(ignore=ignored))]
        grep_cmd = ["grep", "-rlF", "--include=*.py", *[arg for t in tokens for arg in ("-e", t)], tree]
        # `python -m` puts the working folder first on sys.path: run from the checkout, it would import
        # the checkout's sources (recompiled on every run) instead of the copy.
        where = [sys.executable, "-c", "import vllm_attn_compat; print(vllm_attn_compat.__file__)"]
        imported = subprocess.run(where, capture_output=True, text=True, env=env, cwd=scratch, check=True).stdout
        if not imported.startswith(site):
            raise SystemExit(f"the benchmark would time {imported.strip()}, expected the copy in {site}")
        commands = [(ours_cmd, {"env": env, "cwd": scratch}), (warm_cmd, {"env": env, "cwd": scratch}), (grep_cmd, {})]
        timed_alternately(commands, 1)  # warm the page cache, and fill migrate's
        (ours_wall, ours_cpu, ours_run), (warm_wall, warm_cpu, warm_run), (grep_wall, grep_cpu, grep_run) = (
            timed_alternately(commands, args.repeat)
        )
        print(f"medians of {args.repeat} runs of each, the commands taking turns")
        for name, wall, cpu, done in (
            ("migrate --check --no-cache", ours_wall, ours_cpu, ours_run),
            ("migrate --check, warm (its default cache)", warm_wall, warm_cpu, warm_run),
        ):
            summary = json.loads(done.stdout)["summary"]
            print(
                f"{name}: {wall:.3f} s wall, {cpu:.3f} CPU-s; exit {done.returncode}; "
                f"scanned {summary['files_scanned']}, parsed {summary['files_parsed']}, "
                f"would change {summary['files_would_change']}, findings {summary['findings']}"
            )
        print(f"grep -rlF ({len(tokens)} tokens): {grep_wall:.3f} s wall, {grep_cpu:.3f} CPU-s; "
              f"{len(grep_run.stdout.splitlines())} files match")  # fmt: skip

        rule_dir = os.path.join(scratch, "rule")
        os.makedirs(rule_dir)
        with open(os.path.join(rule_dir, "bench_libcst_rule.py"), "w") as handle:
            handle.write(LIBCST_RULE)
        libcst_env = {**env, "PYTHONPATH": rule_dir + os.pathsep + env["PYTHONPATH"]}
        target, scale, label = tree, 1.0, "whole tree"
        if args.quick:
            all_py = sorted(os.path.join(d, n) for d, _, ns in os.walk(tree) for n in ns if n.endswith(".py"))
            sample = random.Random(0).sample(all_py, min(args.sample, len(all_py)))
            target = os.path.join(scratch, "sample")
            for index, path in enumerate(sample):
                os.makedirs(target, exist_ok=True)
                shutil.copyfile(path, os.path.join(target, f"f{index}.py"))
            scale = len(all_py) / len(sample)
            label = f"{len(sample)}-file sample, extrapolated per file x{scale:.1f}"
        # The command must come before the options, and --no-format is required (see the research notes).
        libcst_cmd = [sys.executable, "-m", "libcst.tool", "codemod", "-x", "bench_libcst_rule.DropAssertOutput",
                      target, "-j", str(args.jobs), "--no-format", "-u", "1", "--hide-progress"]  # fmt: skip
        libcst_wall, libcst_cpu, _ = timed(libcst_cmd, 1, env=libcst_env, cwd=scratch)
        libcst_wall, libcst_cpu = libcst_wall * scale, libcst_cpu * scale
        print(f"libcst.tool codemod, 1 rule ({label}): {libcst_wall:.1f} s wall, {libcst_cpu:.1f} CPU-s")

        report = json.loads(ours_run.stdout)
        matching = sorted({os.path.join(tree, f["file"]) if not os.path.isabs(f["file"]) else f["file"]
                           for f in report["findings"]})  # fmt: skip
        if matching:
            ours_file, bare_file = per_file_costs(matching, loops=5, ignored=ignored)
            print(f"per matching file ({len(matching)} files): migrate {ours_file * 1e3:.2f} ms, "
                  f"bare libcst parse+render {bare_file * 1e3:.2f} ms")  # fmt: skip

        print("load average at end: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
        print("\nratios (wall time):")
        print(f"  migrate --check --no-cache / grep -rlF = {ours_wall / grep_wall:6.2f}x   (target <= 3x)")
        print(f"  migrate --check, warm / grep -rlF      = {warm_wall / grep_wall:6.2f}x   (a rerun: no target)")
        print(f"  libcst.tool codemod / migrate --check --no-cache = {libcst_wall / ours_wall:6.1f}x   (target >= 20x)")
        print("ratios (CPU time, less sensitive to other load):")
        print(f"  migrate --check --no-cache / grep -rlF = {ours_cpu / grep_cpu:6.2f}x")
        print(f"  libcst.tool codemod / migrate --check --no-cache = {libcst_cpu / ours_cpu:6.1f}x")
        if matching:
            print(f"  per matching file: migrate / parse = {ours_file / bare_file:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
