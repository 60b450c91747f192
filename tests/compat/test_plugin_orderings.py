"""Whatever the order, nesting or thread its entry points are called in, the vLLM plugin completes every call and
ends installed exactly once (issue 49: a nested call used to wait for the outer one for ever).

Each stage runs in a subprocess (``plugin_orderings.py``) whose scenarios run in forked children with a deadline:
a hang fails a scenario, never the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="the real vLLM package is not installed (run scripts/install-vllm-tier.sh)")

SCRIPT = Path(__file__).with_name("plugin_orderings.py")
# What the log lines name, once each, for every feature the plugin installs into vLLM >= 0.20.
INSTALLED_ONCE = (
    "AttentionBackend.accept_output_buffer",
    "Attention.use_output",
    "result copy for out-of-tree Attention impls",
    "result copy for out-of-tree MLA impls",
    "torch.ops.vllm.unified_attention,",
    "torch.ops.vllm.unified_mla_attention",
    "-> vLLM",
    "CompilationConfig.splitting_ops normalization",
    "dead-override warnings on Attention (",
    "dead-override warnings on MLAAttention (",
)
DEAD = "__vllm_attn_compat_checks_dead_overrides__"
HOOKS = {  # the markers each layer class's __init__ carries once
    "attention_markers": {"__vllm_attn_compat_checks_backend__", "__vllm_attn_compat_adopts_impl_results__", DEAD},
    "mla_markers": {"__vllm_attn_compat_adopts_mla_results__", DEAD},
}
GUARD_MARKER = "__vllm_attn_compat_guards_output__"
# The entry points that import something of vLLM at each stage (register() never does; the others import what the
# stage has not imported yet).
IMPORTING = {"cold": {"loader", "shim", "hook"}, "backend": {"hook"}, "layers": set()}


@pytest.fixture(scope="module", params=["cold", "backend", "layers"])
def stage(request):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_ATTN_COMPAT_")}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), request.param], capture_output=True, text=True, env=env, timeout=1500
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return request.param, json.loads(done.stdout.strip().splitlines()[-1])


def test_every_call_completes_and_the_plugin_ends_installed_once(stage):
    name, reports = stage
    assert reports, name
    for scenario, report in reports.items():
        assert not report.get("hung"), f"{scenario}: missed its deadline (a call waited)"
        assert "probe_error" not in report, (scenario, report.get("probe_error"))
        assert report["errors"] == [], (scenario, report["errors"])
        assert sorted(report["how"]) == sorted(("loader", "shim", "hook", "register")), scenario
        assert report["pending"] == [], scenario
        assert report["flags"] == ["AlwaysTrueFlag", "AlwaysTrueFlag"], scenario
        assert report["ops"] == ["unified_attention", "unified_mla_attention"], scenario
        assert report["route"] == "VllmRoute", scenario
        assert report["warnings"] == 1, scenario  # three reads at one line: one warning
        text = "\n".join(line + "," for line in report["lines"])
        for part in INSTALLED_ONCE:
            assert text.count(part) == 1, (scenario, part, report["lines"])
        assert "skipped" not in text, (scenario, report["lines"])
        guarded = scenario.endswith(" guard")
        assert report["guard"] == ("error" if guarded else None), scenario
        for key, markers in HOOKS.items():
            expected = {marker: 1 for marker in markers} | ({GUARD_MARKER: 1} if guarded else {})
            assert report[key] == expected, (scenario, key, report[key])


def test_each_nesting_nested_where_it_can(stage):
    """The scenarios exercise what they say: an entry point called inside the one before, where that one has a place
    to nest in (the plugin's entry point and install for each; an import for those that import vLLM)."""
    name, reports = stage
    for scenario, report in reports.items():
        order, nesting = scenario.split()[0].split(">"), scenario.split()[1]
        how = report["how"]
        assert how[order[0]] == "first", scenario
        if nesting == "serial":
            assert all(how[entry] == "after" for entry in order[1:]), scenario
        elif nesting in ("entry", "thread"):  # every entry point enters the plugin's: each nests in the one before
            expected = "thread" if nesting == "thread" else "inside (entry)"
            assert all(how[entry] == expected for entry in order[1:]), scenario
        elif nesting == "install" and name != "layers":
            assert how[order[1]] == "inside (install)", scenario
        elif nesting == "import" and order[0] in IMPORTING[name]:
            assert how[order[1]] == "inside (import)", scenario
