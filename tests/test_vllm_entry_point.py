"""The ``vllm.general_plugins`` entry point that pyproject.toml declares, found and run by the real vLLM's loader.

In a subprocess whose first path entry is a distribution with this tree's entry points (as ``pip install``
writes them), so it shadows whatever vllm-attn-compat the environment has installed.
"""

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

pytestmark = pytest.mark.vllm

pytest.importorskip("vllm", reason="the real vLLM package is not installed (run scripts/install-vllm-tier.sh)")

ROOT = Path(__file__).resolve().parents[1]
GROUP = "vllm.general_plugins"

_LOAD = f"""
import json, logging
from importlib.metadata import entry_points

class Lines(logging.Handler):
    lines = []
    def emit(self, record):
        self.lines.append(record.getMessage())

import vllm.plugins  # before the handler: vLLM 0.20 configures logging at import, disabling existing loggers
logger = logging.getLogger("vllm.plugins.vllm_attn_compat")
logger.addHandler(Lines())
logger.setLevel(logging.INFO)
vllm.plugins.load_general_plugins()
before = list(Lines.lines)  # the plugin installs as vLLM imports what it patches: nothing yet
import vllm.model_executor.layers.attention.attention, vllm.model_executor.layers.attention.mla_attention
import vllm.config, vllm.forward_context
found = [ep.value for ep in entry_points(group="{GROUP}") if ep.name == "vllm_attn_compat"]
print(json.dumps({{"found": found, "before": before, "lines": Lines.lines}}))
"""


def _dist_info(site: Path) -> str:
    """A vllm-attn-compat distribution declaring this tree's vLLM entry point; returns that entry point's value."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"][GROUP]
    dist_info = site / "vllm_attn_compat-0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-attn-compat\nVersion: 0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in target.items())
    (dist_info / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}")
    return str(target["vllm_attn_compat"])


def test_vllms_loader_runs_the_declared_entry_point_and_the_plugin_installs(tmp_path):
    value = _dist_info(tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env |= {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{ROOT}", "VLLM_PLUGINS": "vllm_attn_compat"}
    out = subprocess.run(
        [sys.executable, "-c", _LOAD], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["found"] == [value]  # this tree's declaration, not the installed one's
    assert not [line for line in result["before"] if line.startswith("vllm-attn-compat:")]
    (line,) = [line for line in result["lines"] if line.startswith("vllm-attn-compat:")]
    assert line.startswith("vllm-attn-compat: installed ")
    assert "AttentionBackend.accept_output_buffer" in line and "torch.ops.vllm.unified_attention" in line
