"""The package where torch is absent, faked with ``sys.modules["torch"] = None`` in a subprocess: the runtime half
refuses to import with what to install, the rest imports, the vLLM entry point logs instead of raising.

tests/test_light_install.py checks the same in a real environment without torch (a fresh venv); this one runs
offline, everywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]

# Imports each module given on the command line in a fresh interpreter where `import torch` fails as it does
# without torch (None in sys.modules: find_spec answers None, import raises ModuleNotFoundError); prints, per
# module, null or [exception type, its .name, its message], then whether torch got imported by anything.
_IMPORT_WITHOUT_TORCH = """
import importlib, json, sys
sys.modules["torch"] = None
results = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        results[name] = None
    except ImportError as error:
        results[name] = [type(error).__name__, error.name, str(error)]
print(json.dumps(results))
"""

RUNTIME = {
    "vllm_attn_compat.compat": "vllm_attn_compat.compat",
    "vllm_attn_compat.compat.plugin": "vllm_attn_compat.compat",
    "vllm_attn_compat.compat.op_names": "vllm_attn_compat.compat",  # needs no torch itself; its package does
    "vllm_attn_compat.backends": "vllm_attn_compat.backends",
    "vllm_attn_compat.backends.sdpa": "vllm_attn_compat.backends",
}
LIGHT = [
    "vllm_attn_compat",
    "vllm_attn_compat.codemods.cli",
    "vllm_attn_compat.codemods.registry",  # every rule's module
    "vllm_attn_compat.pytest_plugin",
    "vllm_attn_compat.deprecated_uses",
    "vllm_attn_compat.vllm_entry_point",
]


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )


@pytest.fixture(scope="module")
def imported() -> dict[str, list[str] | None]:
    out = _python(_IMPORT_WITHOUT_TORCH, *RUNTIME, *LIGHT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("module", RUNTIME)
def test_the_runtime_half_names_torch_and_the_install_command(imported, module):
    assert imported[module] is not None, f"{module} imported without torch"
    kind, name, message = imported[module]
    assert (kind, name) == ("ModuleNotFoundError", "torch")
    assert message.startswith(f"{RUNTIME[module]} needs torch, which is not installed")
    assert "pip install 'vllm-attn-compat[torch]'" in message


@pytest.mark.parametrize("module", LIGHT)
def test_the_codemod_the_pytest_plugin_and_the_entry_point_import_without_torch(imported, module):
    assert imported[module] is None


def test_with_torch_the_runtime_half_imports():
    """The other side of the differential: the same subprocess, torch left alone."""
    pytest.importorskip("torch", reason="the runtime half needs torch")
    out = _python(_IMPORT_WITHOUT_TORCH.replace('sys.modules["torch"] = None', ""), *RUNTIME)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == dict.fromkeys(RUNTIME)


_REGISTER_WITHOUT_TORCH = """
import logging, sys
sys.modules["torch"] = None
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s", stream=sys.stdout)
from importlib.metadata import EntryPoint
EntryPoint(name="vllm_attn_compat", value=sys.argv[1], group="vllm.general_plugins").load()()
print("returned")
"""


def test_the_vllm_entry_point_logs_and_returns_without_torch():
    """What vLLM's loader does with the entry point pyproject.toml declares: load it, call it. It must not raise."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"]
    out = _python(_REGISTER_WITHOUT_TORCH, target["vllm.general_plugins"]["vllm_attn_compat"])
    assert out.returncode == 0, out.stderr
    (line, returned) = out.stdout.splitlines()
    assert returned == "returned"
    assert line.startswith("WARNING vllm.plugins.vllm_attn_compat vllm-attn-compat: nothing installed (")
    assert "needs torch" in line and "pip install 'vllm-attn-compat[torch]'" in line
