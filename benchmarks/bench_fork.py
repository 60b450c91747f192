"""How fast `vllm-attn-compat migrate` is on a whole vLLM fork and on torch, next to ruff and the tools a user
would pick for the same job, each at its defaults.

Trees: vLLM's own Python sources at the last release before the mandatory output buffer (0.19.1: about
1,550 files, 22 MB; a fork based on it must migrate exactly these), fetched once into a cache folder with
``pip download --no-deps vllm==0.19.1`` and unzipped (only the ``.py`` files); and torch's installed
``.py`` files (about 2,300 files, 46 MB, nothing to migrate). Measured side by side, in one run, the
commands taking turns (medians):

* **the runs users repeat** (pre-commit and CI: ``migrate --check`` over a tree that has not changed, or
  after an edit of one file), each tool at its defaults: ``ruff check --select UP`` with its default cache
  and ``migrate --check`` with its default cache (``.vllm-attn-compat-cache`` at the project's root), both
  warm (filled by an untimed first round); on vLLM's tree, on the same tree in a git work tree (as
  pre-commit and CI see it: ``migrate`` lists the files with ``git ls-files`` there), then after an edit of a backend
  (``flash_attn.py``), of a model (``deepseek_v2.py``, whose calls the call-site analysis reads) and of the
  KV-cache manager (``v1/core/kv_cache_manager.py``, which takes no part in the run: neither attention code,
  nor naming an attention class, nor calling one's methods), a line added at its top before each run, seen
  by both tools; on torch's tree;
* **cold runs**: ``ruff check --no-cache --select UP``, ``migrate --check --no-cache``, ``migrate --check``
  filling its default cache (removed before each run, untimed; on vLLM's tree and on torch's, which has
  nothing to migrate) and ruff filling its own (what a first run costs the field's leader), ``migrate
  --no-cache`` (write mode, on a fresh copy each time), ``migrate --check --no-cache`` without the preforked
  worker (a copy of the package whose ``prefork.worth_starting`` says no: index and migration go to
  ``run/parallel.py``'s pool alone), the two parsers alone on the input a cold ``--check`` hands them
  (``parsers_alone.py``, a floor under this design), ``grep -rlE`` of the rules' tokens, ``ast-grep run -p
  'assert output is not None'``;
* **one file** (``flash_attn.py``), as an editor or a hook given the changed files runs it: ``ruff check
  --no-cache --select UP`` and ``migrate --check --no-cache`` (which migrates it in its own process);
* **the floor under a rerun after a backend edit**: a fresh interpreter of the same environment importing libcst
  as a worker of ``migrate`` does (its dataclass code kept), and nothing else: the least any rerun pays that
  migrates the edited file again, whatever it knows of the rest of the tree;
* **what keeping libcst's dataclass code buys** (`run/dataclass_code.py`): ``migrate --check --no-cache``, the
  backend edit and the one file again from a copy of the package that does not keep it, next to the copy
  that does (as its first run leaves it wherever Python writes bytecode);
* **the field**, with ``--field`` (minutes; one run each): Fixit 2.2's ``fixit lint`` with one rule that
  drops ``assert output is not None`` in a function taking ``output`` (with its autofix), and libcst's own
  ``python -m libcst.tool codemod`` running the same rule, on vLLM's tree.

ruff is installed by the benchmark into a virtual environment of its own in the cache folder, and so are
``migrate``'s dependencies (`install_environment`): ``migrate`` runs from a compiled copy of this checkout
with that environment's Python, as a pre-commit hook or pipx runs it. Fixit and
ast-grep are not: install them apart from the project's environment (Fixit pins its own libcst), e.g.
``python -m venv /tmp/benchtools && /tmp/benchtools/bin/pip install fixit==2.2.1 ast-grep-cli``, and pass
``--tools /tmp/benchtools/bin``; a row whose tool is absent is skipped with a message.

Targets (issue #27): warm with nothing changed, both at their defaults, migrate <= 1x ruff on both trees;
warm after one backend edit <= 1.5x ruff; cold no worse than before (vLLM <= 4.5x ``ruff --no-cache``,
torch <= 1x); never slower with the cache than without (on torch too); peak memory < 500 MiB. Peak
memory is taken in a separate, untimed run of each migrate command, by polling ``/proc``: the sum of every
process's own peak (``VmHWM``), an upper bound of what the processes held at once.

Usage: ``python benchmarks/bench_fork.py [--cache-dir DIR] [--repeat N] [--jobs N] [--tools BIN] [--field]``.
With ``--cache-dir /tmp/vllm-src`` an already unzipped ``0.19.1/vllm`` there is used as is.
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
import textwrap
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_codemods import LIBCST_RULE, build_tree, install_copy, timed, timed_alternately

PARSERS_ALONE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parsers_alone.py")

# A fresh interpreter importing libcst as a worker of migrate does (its dataclass code kept), and nothing else: the
# least a rerun pays that migrates an edited file again, whatever it knows of the rest of the tree.
EDIT_FLOOR = "libcst's import alone (the floor under a rerun after an edit)"
IMPORT_LIBCST = "from vllm_attn_compat.codemods.run.dataclass_code import import_libcst; import_libcst()"

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


def install_environment(cache: str) -> str:
    """The Python of a virtual environment of its own in ``cache`` with this package's dependencies at the
    versions installed here, made on first use. ``migrate`` runs there from the copy on PYTHONPATH, started
    as pre-commit or pipx start it: without the start-up hooks of this interpreter's ``site-packages`` (an
    editable install's finder, this machine's certificate hook), which cost 0.04 s of every run here, more
    than half of what ruff's warm run takes, and which no hook environment has."""
    from importlib import metadata

    pins = [f"{name}=={metadata.version(name)}" for name in ("libcst", "typing-extensions", "tqdm")]
    venv = os.path.join(cache, "migrate-env-" + "-".join(pin.replace("==", "-") for pin in pins))
    python = os.path.join(venv, "bin", "python")
    complete = os.path.join(venv, ".complete")  # written last: an interrupted install is made again
    if not os.path.exists(complete):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *pins], check=True)
        with open(complete, "w"):
            pass
    return python


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


FIXIT_RULE = textwrap.dedent(
    """
    import libcst as cst
    import libcst.matchers as m
    from fixit import Invalid, LintRule, Valid

    ASSERT_OUTPUT = m.Assert(
        test=m.Comparison(left=m.Name("output"), comparisons=[m.ComparisonTarget(m.IsNot(), m.Name("None"))])
    )


    class DropAssertOutput(LintRule):
        \"\"\"`assert output is not None` in a function taking `output`: always true on vLLM >= 0.20.\"\"\"

        VALID = [Valid("def f(output):\\n    assert output is None\\n")]
        INVALID = [Invalid("def f(output):\\n    assert output is not None\\n    return output\\n",
                           expected_replacement="def f(output):\\n    return output\\n")]

        def __init__(self):
            super().__init__()
            self.parameters = []

        def visit_FunctionDef(self, node):
            params = node.params
            self.parameters.append({p.name.value for p in (*params.posonly_params, *params.params,
                                                           *params.kwonly_params)})

        def leave_FunctionDef(self, original_node):
            self.parameters.pop()

        def visit_SimpleStatementLine(self, node):
            if self.parameters and "output" in self.parameters[-1] and len(node.body) == 1:
                if m.matches(node.body[0], ASSERT_OUTPUT):
                    self.report(node, "`assert output is not None` is always true",
                                replacement=cst.RemovalSentinel.REMOVE)
    """
)


def _tool(name: str, folder: str | None) -> str | None:
    """The executable ``name`` in ``folder`` (``--tools``), else on PATH; None (with a message) when absent."""
    found = shutil.which(name, path=folder) if folder else shutil.which(name)
    if found is None:
        where = folder or "PATH"
        print(f"skipped: {name} is not installed in {where} (see this script's docstring to install it)")
    return found


def _copy(site: str, scratch: str, name: str) -> str:
    """Another compiled copy of the installed package in ``site``, without libcst's kept dataclass code."""
    import compileall

    copy = os.path.join(scratch, name)
    shutil.copytree(site, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    compileall.compile_dir(copy, quiet=1)
    return copy


def _without_prefork(site: str, scratch: str) -> str:
    """A copy of the installed package whose ``prefork.worth_starting`` always says no."""
    import compileall

    copy = _copy(site, scratch, "site-no-prefork")
    path = os.path.join(copy, "vllm_attn_compat", "codemods", "run", "prefork.py")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    patched = text.replace("    return jobs > 1 and forks_safely()\n", "    return False\n")
    if patched == text:
        raise SystemExit(f"{path}: worth_starting() no longer reads as this benchmark expects; update it")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(patched)
    compileall.compile_file(path, quiet=1, force=True)
    return copy


def _keep_dataclass_code(python: str, site: str, env: dict[str, str]) -> None:
    """Have the copy in ``site`` keep libcst's dataclass code (`run/dataclass_code.py`) as its first run leaves it
    wherever Python writes bytecode (pre-commit's and pipx's environments; not this machine, which sets
    PYTHONDONTWRITEBYTECODE)."""
    writing = {key: value for key, value in env.items() if key != "PYTHONDONTWRITEBYTECODE"}
    writing["PYTHONPATH"] = site
    code = "from vllm_attn_compat.codemods.run import dataclass_code as d; d.import_libcst(); print(d.store_path())"
    done = subprocess.run([python, "-c", code], env=writing, cwd=site, capture_output=True, text=True, check=True)
    kept = done.stdout.strip()
    if not kept.startswith(site) or not os.path.exists(kept):
        raise SystemExit(f"libcst's dataclass code was not kept in {site} (expected it at {kept})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/vllm-attn-compat-bench"),
                        help="where vLLM's sources and ruff's environment are kept between runs")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=7, help="runs of each command (median reported)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="migrate's processes")
    parser.add_argument("--tools", help="folder holding fixit and ast-grep (default: PATH)")
    parser.add_argument("--field", action="store_true", help="also time Fixit and libcst's codemod (minutes)")
    args = parser.parse_args()

    from vllm_attn_compat.codemods.engine.migrate import prefilter_tokens
    from vllm_attn_compat.codemods.registry import select_rules

    os.makedirs(args.cache_dir, exist_ok=True)
    sources = fetch_sources(args.cache_dir, VLLM_VERSION)
    ruff = install_ruff(args.cache_dir)
    python = install_environment(args.cache_dir)
    ast_grep = _tool("ast-grep", args.tools)
    with tempfile.TemporaryDirectory(prefix="bench-fork-") as scratch:
        # Every command reads its own copy: nothing can write to the cache folder. Each tool keeps its
        # default cache in the copy it runs on (ruff's .ruff_cache, migrate's .vllm-attn-compat-cache).
        read_only = os.path.join(scratch, "check")
        shutil.copytree(sources, os.path.join(read_only, "vllm"))
        # The same tree as a git work tree, as pre-commit and CI see a repository: `migrate` lists its files
        # with `git ls-files` there (ruff reads the ignore files itself).
        in_git = os.path.join(scratch, "git")
        shutil.copytree(sources, os.path.join(in_git, "vllm"))
        git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "-C", in_git]
        for step in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "vLLM's sources"]):
            subprocess.run([*git, *step], check=True)
        cold_copy = os.path.join(scratch, "cold")
        shutil.copytree(sources, os.path.join(cold_copy, "vllm"))
        written = os.path.join(scratch, "write")
        torch_tree = os.path.join(scratch, "torch-tree")
        torch_files, torch_size = build_tree(torch_tree, plugin=False)
        torch_cold = os.path.join(scratch, "torch-cold")  # its first run, filling the cache: a tree of its own
        shutil.copytree(torch_tree, torch_cold)
        files = sum(len([n for n in ns if n.endswith(".py")]) for _, _, ns in os.walk(sources))
        size = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(sources) for n in ns)
        print(f"trees: vLLM {VLLM_VERSION}'s sources, {files} files ({size / 1e6:.1f} MB); torch's, "
              f"{torch_files} files ({torch_size / 1e6:.1f} MB); jobs={args.jobs}")  # fmt: skip
        print("load average at start: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
        site = install_copy(scratch)
        inherited = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": site + (os.pathsep + inherited if inherited else "")}
        env.pop("VLLM_ATTN_COMPAT_NO_CACHE", None)  # at its defaults: the cache on
        where = [python, "-c", "import vllm_attn_compat; print(vllm_attn_compat.__file__)"]
        imported = subprocess.run(where, capture_output=True, text=True, env=env, cwd=read_only, check=True).stdout
        if not imported.startswith(site):
            raise SystemExit(f"the benchmark would time {imported.strip()}, expected the copy in {site}")
        elsewhere = env["PYTHONPATH"][len(site) :]
        without_prefork = _without_prefork(site, scratch)
        for copy in (site, without_prefork):
            _keep_dataclass_code(python, copy, env)
        no_prefork = {**env, "PYTHONPATH": without_prefork + elsewhere}
        # The same package, where libcst's dataclass code is not kept: compiled at each import, as before.
        not_kept = {**env, "PYTHONPATH": _copy(site, scratch, "site-not-kept") + elsewhere}
        not_kept["PYTHONDONTWRITEBYTECODE"] = "1"

        def fresh_copy() -> None:
            shutil.rmtree(written, ignore_errors=True)
            shutil.copytree(sources, os.path.join(written, "vllm"))

        def no_cache_in(root: str, name: str = ".vllm-attn-compat-cache"):
            def remove() -> None:
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)

            return remove

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
        manager_tree, edit_manager = edited("v1/core/kv_cache_manager.py")

        migrate = [python, "-m", "vllm_attn_compat", "migrate", "--format", "json", "--jobs", str(args.jobs)]
        inputs = os.path.join(scratch, "parser-inputs.pickle")
        recorded = [python, PARSERS_ALONE, "record", inputs, "vllm"]
        print("parser inputs of migrate --check:", subprocess.run(
            recorded, env=env, cwd=read_only, check=True, capture_output=True, text=True).stdout.strip())  # fmt: skip
        tokens = [token.decode() for token in prefilter_tokens(select_rules())]
        ruff_default = [ruff, "check", "--select", "UP"]
        ruff_cold = [ruff, "check", "--no-cache", "--select", "UP"]
        check = [*migrate, "--check"]
        one_backend = "vllm/v1/attention/backends/flash_attn.py"
        commands = {
            # The runs users repeat: each tool at its defaults, warm.
            "ruff, warm (its default cache)": (
                [*ruff_default, "vllm"], {"cwd": read_only}),
            "migrate --check, warm (its default cache)": ([*check, "vllm"], {"env": env, "cwd": read_only}),
            "ruff, warm, in a git work tree": ([*ruff_default, "vllm"], {"cwd": in_git}),
            "migrate --check, warm, in a git work tree": ([*check, "vllm"], {"env": env, "cwd": in_git}),
            "ruff, a backend edited": ([*ruff_default, "vllm"], {"cwd": backend_tree, "prepare": edit_backend}),
            "migrate --check, a backend edited": (
                [*check, "vllm"], {"env": env, "cwd": backend_tree, "prepare": edit_backend}),
            "migrate --check, a backend edited, dataclass code not kept": (
                [*check, "vllm"], {"env": not_kept, "cwd": backend_tree, "prepare": edit_backend}),
            "ruff, a model edited": ([*ruff_default, "vllm"], {"cwd": model_tree, "prepare": edit_model}),
            "migrate --check, a model edited": (
                [*check, "vllm"], {"env": env, "cwd": model_tree, "prepare": edit_model}),
            "ruff, the KV-cache manager edited": (
                [*ruff_default, "vllm"], {"cwd": manager_tree, "prepare": edit_manager}),
            "migrate --check, the KV-cache manager edited": (
                [*check, "vllm"], {"env": env, "cwd": manager_tree, "prepare": edit_manager}),
            "torch: ruff, warm (its default cache)": ([*ruff_default, "torch"], {"cwd": torch_tree}),
            "torch: migrate --check, warm (its default cache)": ([*check, "torch"], {"env": env, "cwd": torch_tree}),
            "torch: ruff --no-cache": ([*ruff_cold, "torch"], {"cwd": torch_tree}),
            "torch: migrate --check --no-cache": ([*check, "--no-cache", "torch"], {"env": env, "cwd": torch_tree}),
            "torch: migrate --check, filling its cache": (
                [*check, "torch"], {"env": env, "cwd": torch_cold, "prepare": no_cache_in(torch_cold)}),
            "torch: ruff, filling its cache": (
                [*ruff_default, "torch"], {"cwd": torch_cold, "prepare": no_cache_in(torch_cold, ".ruff_cache")}),
            # Cold runs on vLLM's tree.
            "ruff --no-cache": ([*ruff_cold, "vllm"], {"cwd": read_only}),
            "migrate --check --no-cache": ([*check, "--no-cache", "vllm"], {"env": env, "cwd": read_only}),
            "migrate --check, filling its cache": (
                [*check, "vllm"], {"env": env, "cwd": cold_copy, "prepare": no_cache_in(cold_copy)}),
            "ruff, filling its cache": (
                [*ruff_default, "vllm"], {"cwd": cold_copy, "prepare": no_cache_in(cold_copy, ".ruff_cache")}),
            "migrate --no-cache (write)": (
                [*migrate, "--no-cache", "vllm"], {"env": env, "cwd": written, "prepare": fresh_copy}),
            "migrate --check --no-cache, no prefork": (
                [*check, "--no-cache", "vllm"], {"env": no_prefork, "cwd": read_only}),
            "migrate --check --no-cache, dataclass code not kept": (
                [*check, "--no-cache", "vllm"], {"env": not_kept, "cwd": read_only}),
            # One file, as an editor or a hook given the changed files runs it: migrated in this process.
            "ruff --no-cache, one backend": ([*ruff_cold, one_backend], {"cwd": read_only}),
            "migrate --check --no-cache, one backend": (
                [*check, "--no-cache", one_backend], {"env": env, "cwd": read_only}),
            "migrate --check --no-cache, one backend, dataclass code not kept": (
                [*check, "--no-cache", one_backend], {"env": not_kept, "cwd": read_only}),
            "ast + libcst parses alone (floor)": (
                [python, PARSERS_ALONE, "parse", inputs, "vllm"], {"env": env, "cwd": read_only}),
            # What any rerun that migrates the edited backend again pays at least, in a process of its own.
            EDIT_FLOOR: ([python, "-c", IMPORT_LIBCST], {"env": env, "cwd": read_only}),
            f"grep -rlE ({len(tokens)} tokens)": (
                ["grep", "-rlE", "--include=*.py", "-e", "|".join(map(_ere, tokens)), "vllm"], {"cwd": read_only}),
        }  # fmt: skip
        if ast_grep:
            commands["ast-grep run -p 'assert output is not None'"] = (
                [ast_grep, "run", "-p", "assert output is not None", "-l", "python", "vllm"],
                {"cwd": read_only},
            )
        pairs = list(commands.values())
        timed_alternately(pairs, 1)  # warm the page cache (and fill the result caches)
        results = dict(zip(commands, timed_alternately(pairs, args.repeat), strict=True))
        for floor in ("ast + libcst parses alone (floor)", EDIT_FLOOR):
            floor_done = results[floor][2]
            if floor_done.returncode != 0:
                raise SystemExit(f"{floor} failed (exit {floor_done.returncode}):\n{floor_done.stderr.decode()}")
        measured = [name for name in commands if "migrate" in name]
        peaks = {name: peak_memory(commands[name][0], **commands[name][1]) for name in measured}

        print(f"medians of {args.repeat} runs of each, the commands taking turns; peak memory from one more run")
        print(f"{'command':<66} {'wall s':>7} {'CPU s':>7} {'peak MiB':>9}")
        for name, (wall, cpu, _) in results.items():
            memory = f"{peaks[name][0]:6.0f} ({peaks[name][1]} processes)" if name in peaks else ""
            print(f"{name:<66} {wall:7.3f} {cpu:7.3f} {memory}")
        for name in measured:
            done = results[name][2]
            summary = json.loads(done.stdout)["summary"]
            print(f"{name}: exit {done.returncode}; scanned {summary['files_scanned']}, parsed "
                  f"{summary['files_parsed']}, changed {summary['files_changed']}, failed {summary['files_failed']}, "
                  f"findings {summary['findings']}")  # fmt: skip
        print("load average at end: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))

        def ratio(ours: str, theirs: str, target: str, cpu: bool = False) -> None:
            index = 1 if cpu else 0
            value = results[ours][index] / results[theirs][index]
            print(f"  {ours} / {theirs} = {value:5.2f}x   {target}")

        print("\nratios, the runs users repeat (wall time):")
        ratio("migrate --check, warm (its default cache)", "ruff, warm (its default cache)", "(target <= 1x)")
        ratio("migrate --check, warm, in a git work tree", "ruff, warm, in a git work tree", "(target <= 1x)")
        ratio("torch: migrate --check, warm (its default cache)", "torch: ruff, warm (its default cache)",
              "(target <= 1x)")  # fmt: skip
        ratio("migrate --check, a backend edited", "ruff, a backend edited", "(target <= 1.5x)")
        ratio(EDIT_FLOOR, "ruff, a backend edited", "(a floor under any rerun that migrates the edited file again)")
        ratio("migrate --check, a model edited", "ruff, a model edited", "(no target)")
        ratio("migrate --check, the KV-cache manager edited", "ruff, the KV-cache manager edited", "(no target)")
        ratio("migrate --check, a backend edited", "migrate --check, a backend edited, dataclass code not kept",
              "(what keeping libcst's dataclass code buys)")  # fmt: skip
        print("the cache against none (wall time; never slower):")
        ratio("migrate --check, warm (its default cache)", "migrate --check --no-cache", "(target <= 1x)")
        ratio("torch: migrate --check, warm (its default cache)", "torch: migrate --check --no-cache",
              "(target <= 1x)")  # fmt: skip
        ratio("migrate --check, filling its cache", "migrate --check --no-cache", "(the first run's cost)")
        ratio("torch: migrate --check, filling its cache", "torch: migrate --check --no-cache",
              "(the first run's cost)")  # fmt: skip
        ratio("ruff, filling its cache", "ruff --no-cache", "(ruff's first run's cost)")
        ratio("torch: ruff, filling its cache", "torch: ruff --no-cache", "(ruff's first run's cost)")
        print("cold (wall time):")
        ratio("migrate --check --no-cache", "ruff --no-cache", "(target <= 4.5x)")
        ratio("torch: migrate --check --no-cache", "torch: ruff --no-cache", "(target <= 1x)")
        ratio("migrate --no-cache (write)", "ruff --no-cache", "(no target)")
        ratio(
            "migrate --check --no-cache", "migrate --check --no-cache, no prefork", "(what the preforked worker buys)"
        )
        ratio("migrate --check --no-cache", "migrate --check --no-cache, dataclass code not kept",
              "(what keeping libcst's dataclass code buys)")  # fmt: skip
        ratio("migrate --check --no-cache, one backend", "ruff --no-cache, one backend", "(no target)")
        one = "migrate --check --no-cache, one backend"
        ratio(one, f"{one}, dataclass code not kept", "(what keeping libcst's dataclass code buys)")
        ratio("ast + libcst parses alone (floor)", "ruff --no-cache", "(a floor: the rest of a run comes on top)")
        print("cold (CPU time, less sensitive to other load):")
        ratio("migrate --check --no-cache", "ruff --no-cache", "", cpu=True)
        ratio("migrate --check --no-cache", "migrate --check --no-cache, no prefork", "", cpu=True)
        most = max(memory for memory, _ in peaks.values())
        print(f"peak memory, all processes of one migrate command: at most {most:.0f} MiB   (target < 500 MiB)")
        if args.field:
            _field(args, scratch, read_only, env, results["migrate --check --no-cache"][0])
    return 0


def _field(args: argparse.Namespace, scratch: str, tree: str, env: dict[str, str], migrate_wall: float) -> None:
    """Fixit and libcst's codemod runner with one rule on the same tree, one run each (minutes)."""
    rules = os.path.join(scratch, "field-rules")
    os.makedirs(rules)
    with open(os.path.join(rules, "bench_fixit_rule.py"), "w") as handle:
        handle.write(FIXIT_RULE)
    with open(os.path.join(rules, "bench_libcst_rule.py"), "w") as handle:
        handle.write(LIBCST_RULE)
    print("\nthe field, one run each, on vLLM's tree (wall s, and / migrate --check --no-cache):")
    fixit = _tool("fixit", args.tools)
    if fixit:
        command = [fixit, "--rules", "bench_fixit_rule:DropAssertOutput", "lint", "vllm"]
        wall, cpu, done = timed(command, 1, cwd=tree, env={**os.environ, "PYTHONPATH": rules})
        print(f"  fixit lint, 1 rule: {wall:.1f} s ({cpu:.1f} CPU-s), exit {done.returncode}: "
              f"{wall / migrate_wall:.0f}x")  # fmt: skip
    # libcst from the project's environment (the one migrate uses), its codemod runner as documented.
    command = [sys.executable, "-m", "libcst.tool", "codemod", "-x", "bench_libcst_rule.DropAssertOutput", "vllm",
               "-j", str(args.jobs), "--no-format", "-u", "1", "--hide-progress"]  # fmt: skip
    copy = os.path.join(scratch, "field-libcst")
    shutil.copytree(os.path.join(tree, "vllm"), os.path.join(copy, "vllm"))  # it writes: a copy of its own
    wall, cpu, done = timed(command, 1, cwd=copy, env={**env, "PYTHONPATH": rules + os.pathsep + env["PYTHONPATH"]})
    print(f"  libcst.tool codemod, 1 rule: {wall:.1f} s ({cpu:.1f} CPU-s), exit {done.returncode}: "
          f"{wall / migrate_wall:.0f}x")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
