"""What the pytest plugin's session install costs a test process, measured side by side in one run.

1. A process importing vLLM's ``AttentionBackend`` (what a test of a backend does first), plain, against the same
   with the session's import hook watching: the plugin is called once ``vllm`` is imported and installs each
   feature as vLLM imports the module it patches, so the session pays for no vLLM module the test does not import
   (issue 49's target: at most 1.10x the plain import, which is all a session paid before the shim existed).
   Then the same for a process importing the attention layers too (what an engine or a layer test imports).
2. A pytest session that never imports vLLM, with the plugin loaded against ``-p no:`` it: what the plugin costs a
   session that does not need vLLM (noisy: whole processes).
3. The hook's own cost to such a session, in one process: importing a few hundred fresh modules of another
   package with the hook in ``sys.meta_path`` against without it (the minimum over rounds).

Each measurement is a fresh process (an import happens once per process); the variants take turns, and the
median of the rounds is printed with the ratio. Needs vLLM >= 0.20 and the package installed (its entry point).
Run: ``python benchmarks/bench_session_shim.py [rounds]`` (about 2 minutes with the default 5 on 2 shared cores).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMPORT_BACKEND = "import vllm.v1.attention.backend"
IMPORT_LAYERS = (
    "import vllm.model_executor.layers.attention.attention, vllm.model_executor.layers.attention.mla_attention"
)
WATCHED = """\
from vllm_attn_compat import session_shim
shim = session_shim.watch()
{imports}
from vllm.v1.attention.backend import AttentionBackend
assert shim.fired and AttentionBackend.accept_output_buffer
"""


def _wall(command: list[str], cwd: str | None = None) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def _compare(title: str, variants: dict[str, list[str]], rounds: int, cwd: str | None = None) -> None:
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, command in variants.items():
            times[name].append(_wall(command, cwd))
    medians = {name: statistics.median(values) for name, values in times.items()}
    base_name, base = next(iter(medians.items()))
    print(title)
    for name, median in medians.items():
        print(f"  {name:42} {median:7.2f} s  ({median / base:.2f}x {base_name})")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    python = sys.executable
    _compare(
        "1a. a process importing vLLM's AttentionBackend (median wall time of fresh processes)",
        {
            "plain import": [python, "-c", IMPORT_BACKEND],
            "with the session install": [python, "-c", WATCHED.format(imports=IMPORT_BACKEND)],
        },
        rounds,
    )
    _compare(
        "1b. a process importing vLLM's attention layers (median wall time of fresh processes)",
        {
            "plain import": [python, "-c", IMPORT_LAYERS],
            "with the session install": [python, "-c", WATCHED.format(imports=IMPORT_LAYERS)],
        },
        rounds,
    )
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "test_plain.py").write_text("def test_plain():\n    assert True\n")
        session = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_plain.py"]
        _compare(
            "2. a pytest session that never imports vLLM",
            {
                "-p no:vllm_attn_compat.pytest_plugin": [*session, "-p", "no:vllm_attn_compat.pytest_plugin"],
                "the plugin loaded (hook watching)": [*session, "-p", "vllm_attn_compat.pytest_plugin"],
            },
            rounds,
            cwd=folder,
        )
    _import_cost(max(rounds, 5))


def _import_cost(rounds: int, modules: int = 300) -> None:
    import importlib

    from vllm_attn_compat.import_hook import ImportWatcher

    def fresh_imports(folder: Path, package: str) -> float:
        (folder / package).mkdir()
        for index in range(modules):
            (folder / package / f"m{index}.py").write_text(f"VALUE = {index}\n")
        importlib.invalidate_caches()
        start = time.perf_counter()
        for index in range(modules):
            importlib.import_module(f"{package}.m{index}")
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"without the hook": [], "with the hook watching": []}
    with tempfile.TemporaryDirectory() as folder:
        sys.path.insert(0, folder)
        for round_ in range(rounds):
            for variant, name in enumerate(times):
                hook = ImportWatcher("vllm", lambda: None)
                if variant:
                    hook.start()
                times[name].append(fresh_imports(Path(folder), f"bench_pkg_{round_}_{variant}"))
                hook.stop()
        sys.path.remove(folder)
    base = min(times["without the hook"])
    print(f"3. importing {modules} fresh modules of another package, in one process (minimum of {rounds} rounds)")
    for name, values in times.items():
        print(f"  {name:42} {min(values) * 1e3:7.1f} ms  ({min(values) / base:.2f}x without the hook)")


if __name__ == "__main__":
    main()
