"""Runs the `vllm` test tier against each vLLM release, each in its own CPU venv; prints a Markdown table.

Called by scripts/vllm-matrix.sh (see its header for usage). Standard library only: it runs on the interpreter
the venvs are made from and drives each venv through subprocesses.

One venv per release (and torch, `--torch`), kept under the cache folder and reused once complete:
  1. torch first, alone: 2.13.0, the CPU build this machine has, unless `--torch` names another release (a bare
     torch requirement can pull a multi-GB CUDA build; a named one is what pip finds, a CUDA build included,
     which imports here without a GPU);
  2. `pip install --no-deps vllm==X` (its wheel pins a CUDA torch);
  3. vLLM's own requirements, read from `importlib.metadata.requires("vllm")` of that installed vLLM, at its pins,
     resolved together with that torch so pip cannot swap it; only the common part: what the CUDA build
     adds (its torch stack and GPU kernels) is left out by one rule (`split_cuda_part`), and so are extras,
     requirements whose markers are false here, and GPU-only dependencies of the common part (`install_resolved`).
     A requirement that cannot install here is recorded, not fatal;
  4. the package's own dependencies and `test` extra (pyproject.toml), torch pinned to that release again so that no
     requirement can swap it, then the package itself, editable and without dependencies, from this tree,
     reinstalled on every run so that a reused venv always tests the tree the script lives in.

With `--runtime`, the tier is followed, in the same venv, by the tests of the package's runtime half that need no
vLLM (tests/backends and tests/compat without the `vllm` marker): what a release's own torch does to the ops,
the layer and the shims shows there first.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The torch of the venvs unless `--torch` names another: the CPU build on this machine's disk.
DEFAULT_TORCH = "2.13.0"
# Bumped whenever the way a venv is built changes, so cached venvs built the old way are rebuilt.
RECIPE = 3
MARKER = ".vllm-matrix.json"
FIRST_MINOR = (0, 20)  # the first release with the mandatory output buffer: the package's floor

# vLLM's wheel metadata lists requirements/common.txt (what every platform needs) and then what
# requirements/cuda.txt adds for the CUDA build, starting with its pins of the torch stack: numba, torch,
# torchaudio, torchvision, xformers/flashinfer/tilelang/nvidia-* kernels. The matrix installs the common part and
# the torch it is given in place of the CUDA part.
TORCH_STACK = ("torch", "torchaudio", "torchvision")
# Where no torch-stack pin marks where the CUDA part starts, these names still mark GPU-only distributions.
GPU_ONLY_PREFIXES = ("nvidia-", "cuda-", "cupy", "triton", "xformers", "flashinfer", "flash-attn", "tilelang")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalize(re.split(r"[\s\[<>=!~;@(]", requirement.strip(), maxsplit=1)[0])


def split_cuda_part(requirements: list[str]) -> tuple[list[str], list[str]]:
    """vLLM's requirements (in metadata order, markers already evaluated): (common part, CUDA build's part).

    The CUDA part starts at the first torch-stack pin; just before it cuda.txt puts numba (N-gram speculative
    decoding, CUDA build only), which joins it. GPU-only names anywhere are moved to the CUDA part as well.
    """
    names = [requirement_name(r) for r in requirements]
    start = next((i for i, name in enumerate(names) if name in TORCH_STACK), len(names))
    if start > 0 and names[start - 1] == "numba":
        start -= 1
    common = [
        r for r, n in zip(requirements[:start], names[:start], strict=True) if not n.startswith(GPU_ONLY_PREFIXES)
    ]
    return common, [r for r in requirements if r not in common]


@dataclass
class Result:
    version: str
    venv: str
    torch: str = DEFAULT_TORCH
    reused: bool = False
    install_ok: bool = False
    install_error: str = ""
    left_out: list[str] = field(default_factory=list)  # the CUDA build's requirements (`split_cuda_part`)
    not_installable: dict[str, str] = field(default_factory=dict)  # requirement -> pip's last error line
    gpu_left_out: list[str] = field(default_factory=list)  # GPU-only dists the common part depends on, left out
    import_error: str = ""
    missing_names: list[str] = field(default_factory=list)  # the vLLM names the plugin relies on, absent here
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)
    install_s: float = 0.0
    tier_s: float = 0.0

    @property
    def tier_ok(self) -> bool:
        # Skips are allowed (each has its reason, shown in the table); a tier that passes nothing is not.
        return self.install_ok and not self.import_error and self.passed > 0 and not (self.failed or self.errors)

    def tier_text(self) -> str:
        if not self.install_ok:
            return "not run (install failed)"
        counts = [f"{self.passed} passed"]
        counts += [
            f"{n} {what}"
            for n, what in ((self.failed, "failed"), (self.errors, "errors"), (self.skipped, "skipped"))
            if n
        ]
        return ", ".join(counts)


def log(message: str) -> None:
    print(f"vllm-matrix: {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], *, timeout: float = 3600, cwd: Path | None = None, env: dict | None = None):
    return subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def last_error_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("ERROR", "error:")) or "Error" in line.split(":")[0]]
    return (errors or lines or ["(no output)"])[-1][:300]


def clean_env() -> dict[str, str]:
    """The caller's environment minus what would leak the system's packages or vLLM settings into a venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env = {k: v for k, v in env.items() if not k.startswith("VLLM_")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


# ---------------------------------------------------------------- versions


def published_versions(python: str) -> list[str]:
    out = run([python, "-m", "pip", "index", "versions", "vllm"], timeout=300, env=clean_env())
    versions = parse_index_versions(out.stdout) if out.returncode == 0 else []
    if not versions:
        raise SystemExit(
            f"vllm-matrix: cannot list vLLM releases (pip index versions vllm): "
            f"{last_error_line(out.stderr + out.stdout)}; name the versions instead"
        )
    return versions


def parse_index_versions(stdout: str) -> list[str]:
    """The versions in `pip index versions`' output ("Available versions: 0.33.0, 0.32.0, ..."), or []."""
    match = re.search(r"Available versions:\s*(.+)", stdout)
    return [v.strip() for v in match.group(1).split(",")] if match else []


def release_key(version: str) -> tuple[int, ...] | None:
    """(major, minor, patch...) of a final release, None for pre-releases, dev and post releases."""
    if not re.fullmatch(r"\d+(\.\d+)+", version):
        return None
    return tuple(int(part) for part in version.split("."))


def select(versions: list[str], all_patches: bool) -> list[str]:
    """Final releases since FIRST_MINOR, oldest first: every one, or the latest patch of each minor."""
    keyed = sorted((key, v) for v in versions if (key := release_key(v)) and key[:2] >= FIRST_MINOR)
    if all_patches:
        return [v for _, v in keyed]
    latest: dict[tuple[int, ...], str] = {}
    for key, version in keyed:
        latest[key[:2]] = version
    return list(latest.values())


# ---------------------------------------------------------------- venvs


def venv_python(venv: Path) -> str:
    return str(venv / "bin" / "python")


def pip(venv: Path, *args: str, timeout: float = 3600):
    # Wheels only where one exists: building an sdist on a small CPU machine can take longer than the whole run.
    # --no-compile: bytecode is written on first import instead, and only for the modules the tier imports.
    return run(
        [venv_python(venv), "-m", "pip", "install", "-q", "--prefer-binary", "--no-compile", *args],
        timeout=timeout,
        env=clean_env(),
    )


_REQUIRES = r"""
import json, sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
print(json.dumps([r for r in requires("vllm") or []
                  if Requirement(r).marker is None or Requirement(r).marker.evaluate({"extra": ""})]))
"""


def _requirements(venv: Path) -> list[str]:
    """vLLM's requirements, in metadata order, whose markers hold in the venv (no extras)."""
    out = run([venv_python(venv), "-c", _REQUIRES], env=clean_env())
    if out.returncode != 0:
        raise RuntimeError(f"reading vLLM's requirements: {last_error_line(out.stderr)}")
    return json.loads(out.stdout)


def install_resolved(venv: Path, requirements: list[str], result: Result) -> str | None:
    """Install what pip resolves for ``requirements`` next to the result's torch, except GPU-only distributions.

    A dependency of the common part can be GPU-only (xgrammar requires triton on x86-64 Linux): pip resolves in
    a dry run, and what it picked goes in with --no-deps, the GPU-only picks left out and recorded.
    Returns pip's error, or None.
    """
    report = venv / "vllm-matrix-resolution.json"
    out = pip(venv, "--dry-run", "--report", str(report), f"torch=={result.torch}", *requirements)
    if out.returncode != 0:
        return last_error_line(out.stderr + out.stdout)
    resolution = json.loads(report.read_text())["install"]
    picked = [(item["metadata"]["name"], item["metadata"]["version"]) for item in resolution]
    gpu_only = {normalize(name) for name, _ in picked if normalize(name).startswith(GPU_ONLY_PREFIXES)}
    result.gpu_left_out = sorted(gpu_only.union(result.gpu_left_out))
    keep = [f"{name}=={version}" for name, version in picked if normalize(name) not in gpu_only]
    out = pip(venv, "--no-deps", *keep) if keep else None
    return last_error_line(out.stderr + out.stdout) if out is not None and out.returncode != 0 else None


def package_requirements() -> list[str]:
    """This package's dependencies and its `test` extra, from pyproject.toml; torch left out (the venv has it).

    The plain dependencies hold no torch (it is the `torch` extra's); the `test` extra's is left out here.
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    listed = project["dependencies"] + project["optional-dependencies"]["test"]
    return [r for r in listed if requirement_name(r) != "torch"]


def build(version: str, venv: Path, python: str, result: Result) -> None:
    if venv.exists():
        shutil.rmtree(venv)
    torch = f"torch=={result.torch}"
    steps = [
        ("venv", lambda: run([python, "-m", "venv", str(venv)], env=clean_env())),
        ("torch", lambda: pip(venv, torch)),
        ("vllm", lambda: pip(venv, "--no-deps", f"vllm=={version}")),
    ]
    run_steps(steps)
    install, result.left_out = split_cuda_part(_requirements(venv))
    # Together first (one consistent resolution); one at a time only when that fails, to name the culprits.
    if install_resolved(venv, install, result) is not None:
        log(f"{version}: installing vLLM's requirements together failed; trying one at a time")
        for requirement in install:
            error = install_resolved(venv, [requirement], result)
            if error is not None:
                result.not_installable[requirement] = error
    out = pip(venv, torch, *package_requirements())
    if out.returncode != 0:
        raise RuntimeError(f"test dependencies: {last_error_line(out.stderr + out.stdout)}")
    record = {k: getattr(result, k) for k in ("left_out", "not_installable", "gpu_left_out")}
    entry = {"recipe": RECIPE, "vllm": version, "torch": result.torch, **record}
    (venv / MARKER).write_text(json.dumps(entry, indent=1))


def run_steps(steps: list[tuple[str, Callable[[], subprocess.CompletedProcess[str]]]]) -> None:
    """Each step in turn; RuntimeError naming the first that fails, with its last error line."""
    for what, step in steps:
        out = step()
        if out.returncode != 0:
            raise RuntimeError(f"{what}: {last_error_line(out.stderr + out.stdout)}")


def install_tree(venv: Path) -> None:
    """This tree, editable and without dependencies, every time: a reused venv must test the code next to the
    script."""
    run_steps([("this package", lambda: pip(venv, "--no-deps", "-e", str(REPO)))])


def venv_name(version: str, torch: str) -> str:
    """The venv's folder: the release, the torch where it is not the default (whose venvs keep their old names),
    the Python."""
    with_torch = "" if torch == DEFAULT_TORCH else f"-torch{torch}"
    return f"vllm-{version}{with_torch}-py{sys.version_info[0]}.{sys.version_info[1]}"


def prepare(version: str, root: Path, python: str, rebuild: bool, torch: str = DEFAULT_TORCH) -> Result:
    venv = root / venv_name(version, torch)
    result = Result(version, str(venv), torch)
    start = time.monotonic()
    marker = venv / MARKER
    cached = json.loads(marker.read_text()) if marker.is_file() else None
    try:
        # (A marker older than `--torch` names none: such a venv has the default.)
        if cached and cached.get("recipe") == RECIPE and cached.get("torch", DEFAULT_TORCH) == torch and not rebuild:
            result.reused = True
            for key in ("left_out", "not_installable", "gpu_left_out"):
                setattr(result, key, cached[key])
        else:
            log(f"{version}: building {venv}")
            build(version, venv, python, result)
        install_tree(venv)
        result.install_ok = True
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        result.install_error = str(error)
    result.install_s = time.monotonic() - start
    return result


# ---------------------------------------------------------------- the tier


_ATTENTION_MODULES = (
    "vllm.model_executor.layers.attention.attention (",
    "vllm.model_executor.layers.attention.mla_attention (",
)

# The vLLM names the plugin (vllm_attn_compat/compat/vllm_install.py) and the tier rely on; each is looked up in
# the venv on its own, so a release that lacks one is named exactly in the table.
_PROBE = r"""
import importlib, inspect, json
NAMES = {
    "vllm.utils.torch_utils": ["_encode_layer_name", "_resolve_layer_name", "LayerNameType"],
    "vllm.config": ["CompilationConfig", "VllmConfig", "DeviceConfig", "set_current_vllm_config"],
    "vllm.forward_context": ["get_forward_context", "set_forward_context"],
    "vllm.model_executor.layers.attention.attention": ["Attention", "unified_attention_with_output"],
    "vllm.model_executor.layers.attention.mla_attention": ["MLAAttention"],
    "vllm.v1.attention.backend": ["AttentionBackend", "AttentionImpl"],
    "vllm.v1.attention.backends.cpu_attn": ["CPUAttentionBackend"],
    "vllm.plugins": ["load_general_plugins"],
}
missing = []
found = {}
for module, names in NAMES.items():
    try:
        found[module] = importlib.import_module(module)
    except Exception as error:
        missing.append(f"{module} ({type(error).__name__}: {error})"[:200])
        continue
    missing += [f"{module}.{name}" for name in names if not hasattr(found[module], name)]
def check(what, ok):
    if not ok:
        missing.append(what)
config = found.get("vllm.config")
if config and hasattr(config, "CompilationConfig"):
    cc = config.CompilationConfig
    check("CompilationConfig.__post_init__", "__post_init__" in cc.__dict__)
    check("CompilationConfig.splitting_ops", "splitting_ops" in getattr(cc, "__dataclass_fields__", {}) or
          "splitting_ops" in getattr(cc, "model_fields", {}))
    check("CompilationConfig._attention_ops", hasattr(cc, "_attention_ops"))
backend = found.get("vllm.v1.attention.backend")
if backend and hasattr(backend, "AttentionBackend"):
    check("AttentionBackend without accept_output_buffer (the >= 0.20 API)",
          "accept_output_buffer" not in backend.AttentionBackend.__dict__)
attention = found.get("vllm.model_executor.layers.attention.attention")
if attention and hasattr(attention, "Attention"):
    params = inspect.signature(attention.Attention.__init__).parameters
    check("Attention(attn_backend=...)", "attn_backend" in params)
    check("Attention(head_size_v=...)", "head_size_v" in params)
forward = found.get("vllm.forward_context")
if forward and hasattr(forward, "set_forward_context"):
    check("set_forward_context(slot_mapping=...)",
          "slot_mapping" in inspect.signature(forward.set_forward_context).parameters)
    check("ForwardContext.no_compile_layers", "no_compile_layers" in getattr(forward.ForwardContext,
          "__dataclass_fields__", {}))
import torch
for op in ("unified_attention_with_output", "unified_mla_attention_with_output"):
    check(f"torch.ops.vllm.{op}", hasattr(torch.ops.vllm, op))
print(json.dumps(missing))
"""


# What `--runtime` adds to the tier: the runtime half's tests that need no vLLM (those that do are the tier's).
RUNTIME_TESTS = ["tests/backends", "tests/compat", "-m", "not vllm and not install"]


def run_tier(result: Result, reports: Path, pytest_args: list[str], runtime: bool = False) -> None:
    venv = Path(result.venv)
    env = clean_env()
    # One process imports vLLM's attention modules and looks up each name (vLLM takes a minute to import here).
    out = run([venv_python(venv), "-c", _PROBE], env=env, cwd=REPO, timeout=900)
    try:
        result.missing_names = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result.import_error = f"the probe failed: {last_error_line(out.stderr)}"
    result.import_error = result.import_error or "; ".join(
        name for name in result.missing_names if name.startswith(_ATTENTION_MODULES)
    )
    start = time.monotonic()
    name = f"vllm-{result.version}" + ("" if result.torch == DEFAULT_TORCH else f"-torch{result.torch}")
    run_pytest(result, reports / name, ["-m", "vllm", *pytest_args])
    if runtime:
        run_pytest(result, reports / f"{name}-runtime", [*RUNTIME_TESTS, *pytest_args])
    result.tier_s = time.monotonic() - start


def run_pytest(result: Result, report: Path, args: list[str]) -> None:
    """pytest in the result's venv with ``args``, its outcomes added to the result's counts; its junit XML and
    log at ``report`` (.xml, .log)."""
    # (Not `with_suffix`: the stem's last dot is the release's, "vllm-0.34.0".)
    xml, log = report.with_name(report.name + ".xml"), report.with_name(report.name + ".log")
    xml.unlink(missing_ok=True)  # a report left by an earlier run must not stand in for this one's
    cmd = [venv_python(Path(result.venv)), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs"]
    out = run([*cmd, f"--junitxml={xml}", *args], env=clean_env(), cwd=REPO, timeout=3600)
    log.write_text(out.stdout + out.stderr)
    if not xml.is_file():
        result.errors += 1
        result.failures.append(
            f"pytest produced no report (exit {out.returncode}): {last_error_line(out.stdout + out.stderr)}"
        )
        return
    failing = result.failed + result.errors
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            result.passed += 1
            continue
        message = (outcome.get("message") or "").splitlines()[0][:200] if outcome.get("message") else ""
        if outcome.tag == "skipped":
            result.skipped += 1
            result.skips.append(f"{name}: {message}")
        elif outcome.tag == "failure":
            result.failed += 1
            result.failures.append(f"{name}: {message}")
        else:
            result.errors += 1
            result.failures.append(f"{name}: {message}")
    # Failures (1) and nothing collected (5) show in the report; any other status (a usage error, an internal
    # error, an interrupted run) must count where the report holds no failure to show it.
    if out.returncode not in (0, 1, 5) and result.failed + result.errors == failing:
        result.errors += 1
        result.failures.append(f"pytest exited {out.returncode}: {last_error_line(out.stdout + out.stderr)}")


# ---------------------------------------------------------------- report


def summary_line(r: Result) -> str:
    install = "reused" if r.reused else f"built in {r.install_s:.0f}s"
    torch = "" if r.torch == DEFAULT_TORCH else f" with torch {r.torch}"
    pins = [item for item in r.left_out if requirement_name(item) == "torch"]  # what its CUDA build pins
    torch += f" (it pins {pins[0]})" if pins else ""
    text = f"vllm {r.version}{torch}: install {'ok' if r.install_ok else 'FAILED'} ({install}); tier: {r.tier_text()}"
    if r.install_ok:
        text += f" in {r.tier_s:.0f}s"
    for what, items in (
        ("install error", [r.install_error] if r.install_error else []),
        ("import error", [r.import_error] if r.import_error else []),
        ("vLLM name missing", r.missing_names),
        ("not installable", [f"{k}: {v}" for k, v in r.not_installable.items()]),
        ("failed", r.failures),
        ("skipped", r.skips),
    ):
        text += "".join(f"\n    {what}: {item}" for item in items)
    return text


def _cell(items: list[str]) -> str:
    return "<br>".join(item.replace("|", "\\|") for item in items) or "-"


def torch_text(results: list[Result]) -> str:
    """The torch of the venvs, as the table says it: the default is the CPU build."""
    return ", ".join(
        f"torch {torch}" + (" CPU" if torch == DEFAULT_TORCH else "")
        for torch in sorted({r.torch for r in results}, key=lambda torch: release_key(torch) or (0,))
    )


def markdown(results: list[Result], commit: str, date: str, runtime: bool = False) -> str:
    tier = "`vllm` tier" + (" and the runtime half's other tests" if runtime else "")
    rows = [
        (
            f"Measured {date} on commit `{commit}`: Python {sys.version.split()[0]}, {torch_text(results)}, "
            f"`scripts/vllm-matrix.sh`."
        ),
        "",
        (
            f"| vLLM | install | {tier} | vLLM names the plugin uses, missing | not installed (CPU machine) "
            "| failed or skipped |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: release_key(r.version) or (0,)):
        install = "ok" if r.install_ok else f"failed: {r.install_error}"
        if r.import_error:
            install += f"; attention import fails: {r.import_error}"
        not_installed = [f"`{k}`" for k in r.not_installable]
        rows.append(
            f"| {r.version} | {install} | {'ok: ' if r.tier_ok else ''}{r.tier_text()} | "
            f"{_cell(r.missing_names) if r.install_ok else '?'} | {_cell(not_installed)} | "
            f"{_cell(r.failures + r.skips)} |"
        )
    left_out = sorted({requirement_name(k) for r in results for k in r.left_out})
    pulled = sorted({n for r in results for n in r.gpu_left_out})
    names = ", ".join(f"`{n}`" for n in left_out) or "nothing"
    rows += [
        "",
        (
            f"Each venv has vLLM's common requirements at its pins and {torch_text(results)}; left out, as what "
            f"the CUDA build adds (in any release; unless a common requirement depends on it): {names}."
        ),
    ]
    if pulled:
        rows.append(
            f"Left out as well, GPU-only dependencies of the common requirements: "
            f"{', '.join(f'`{n}`' for n in pulled)}."
        )
    return "\n".join(rows)


def git_commit() -> str:
    out = run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"]).stdout.strip()
    return out.stdout.strip() + (" + uncommitted changes" if dirty else "") if out.returncode == 0 else "unknown"


def main(argv: list[str] | None = None) -> int:
    default_dir = Path(os.environ.get("VLLM_MATRIX_DIR") or Path.home() / ".cache/vllm-attn-compat/matrix")
    parser = argparse.ArgumentParser(prog="vllm-matrix.sh", description=__doc__.splitlines()[0])
    parser.add_argument(
        "versions",
        nargs="*",
        help="vLLM releases to test (default: the latest patch of each "
        "minor release from 0.20 to the newest published one)",
    )
    parser.add_argument("--oldest", action="store_true", help="only the oldest of the selected releases")
    parser.add_argument("--newest", action="store_true", help="only the newest (with --oldest: both)")
    parser.add_argument("--all-patches", action="store_true", help="every release, not one per minor")
    parser.add_argument(
        "--dir",
        type=Path,
        default=default_dir,
        help=f"where the venvs live (default $VLLM_MATRIX_DIR or {default_dir})",
    )
    parser.add_argument("--rebuild", action="store_true", help="rebuild the venvs even when complete")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the venvs are made from")
    parser.add_argument("--list", action="store_true", help="print the selected releases and stop")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument(
        "--torch",
        default=DEFAULT_TORCH,
        metavar="VERSION",
        help=f"the torch release of the venvs (default {DEFAULT_TORCH}, the CPU build; another is what pip finds, "
        "a CUDA build included, in a venv of its own)",
    )
    parser.add_argument(
        "--runtime",
        action="store_true",
        help="after the tier, also the runtime half's tests that need no vLLM (tests/backends, tests/compat)",
    )
    parser.epilog = "Arguments after `--` go to pytest (default: the whole tests/ folder, with -m vllm)."
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)

    versions = args.versions or select(published_versions(args.python), args.all_patches)
    if args.oldest or args.newest:
        ordered = sorted(versions, key=lambda v: release_key(v) or (0,))
        versions = list(dict.fromkeys(([ordered[0]] if args.oldest else []) + ([ordered[-1]] if args.newest else [])))
    if args.list:
        print(" ".join(versions))
        return 0
    args.dir.mkdir(parents=True, exist_ok=True)
    reports = args.dir / "reports"
    reports.mkdir(exist_ok=True)
    commit, date = git_commit(), datetime.date.today().isoformat()
    log(f"testing commit {commit} against vLLM {', '.join(versions)} with torch {args.torch}; venvs in {args.dir}")

    results = []
    for version in versions:
        result = prepare(version, args.dir, args.python, args.rebuild, args.torch)
        if result.install_ok:
            run_tier(result, reports, extra, args.runtime)
        results.append(result)
        print(summary_line(result), flush=True)
        # Written after each release, so an interrupted run still leaves the table of what it measured.
        (reports / "matrix.md").write_text(markdown(results, commit, date, args.runtime) + "\n")
        if args.json:
            args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    print()
    print(markdown(results, commit, date, args.runtime))
    return 0 if all(r.tier_ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
