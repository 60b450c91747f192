"""The plugin degrades feature by feature when a vLLM release lacks a name it uses, and never raises in vLLM's
plugin loader. Each scenario runs against the real vLLM in a child process (``plugin_degradation.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="the real vLLM package is not installed (run scripts/install-vllm-tier.sh)")

PROBE = Path(__file__).with_name("plugin_degradation.py")
# Each feature (as a skip names it) -> what the log line's installed part says when it is installed.
FEATURES = {
    "AttentionBackend.accept_output_buffer": "AttentionBackend.accept_output_buffer,",
    "Attention.use_output and the legacy adapter": "Attention.use_output,",
    "result copy for Attention impls": "result copy for out-of-tree Attention impls",
    "result copy for MLA impls": "result copy for out-of-tree MLA impls",
    "torch.ops.vllm.unified_attention": "torch.ops.vllm.unified_attention,",
    "torch.ops.vllm.unified_mla_attention": "torch.ops.vllm.unified_mla_attention,",
    "the forwarders' route to vLLM": "unified_mla_attention -> vLLM,",
    "CompilationConfig.splitting_ops normalization": "CompilationConfig.splitting_ops normalization,",
    "dead-override warnings on Attention": "dead-override warnings on Attention (",
    "dead-override warnings on MLAAttention": "dead-override warnings on MLAAttention (",
}
ENCODE = "vllm.utils.torch_utils._encode_layer_name does not exist, and vLLM's unified_attention_with_output does not"
RESOLVE = "vllm.utils.torch_utils._resolve_layer_name does not exist"
# A release without a layer module: the features that patch it wait for it (plugin.pending()), named nowhere else.
NO_LAYER = "pending"
NO_MLA = "pending"

# scenario: {feature skipped: the reason it gives}, and what must still hold
EXPECTED = {
    "baseline": ({}, {"ops": ["unified_attention", "unified_mla_attention"], "route": "VllmRoute"}),
    "no LayerNameType": ({}, {"ops": ["unified_attention", "unified_mla_attention"], "route": "VllmRoute"}),
    "no _encode_layer_name": (
        {
            "torch.ops.vllm.unified_attention": ENCODE,
            "torch.ops.vllm.unified_mla_attention": ENCODE,
            "the forwarders' route to vLLM": ENCODE,
        },
        {"ops": [], "route": "Route"},
    ),
    "no _resolve_layer_name": (
        {"torch.ops.vllm.unified_attention": RESOLVE, "torch.ops.vllm.unified_mla_attention": RESOLVE},
        {"ops": [], "route": "VllmRoute"},
    ),
    "_encode_layer_name raises": (
        {
            "torch.ops.vllm.unified_attention": "unexpected RuntimeError: changed in this release",
            "torch.ops.vllm.unified_mla_attention": "unexpected RuntimeError: changed in this release",
        },
        {"ops": []},
    ),
    "no CompilationConfig.__post_init__": (
        {"CompilationConfig.splitting_ops normalization": "vllm.config.CompilationConfig defines no __post_init__"},
        {"ops": ["unified_attention", "unified_mla_attention"]},
    ),
    "no attention layer module": (
        {
            "Attention.use_output and the legacy adapter": NO_LAYER,
            "result copy for Attention impls": NO_LAYER,
            "torch.ops.vllm.unified_attention": NO_LAYER,
            "the output guard on Attention": NO_LAYER,
            "dead-override warnings on Attention": NO_LAYER,
        },
        {"ops": ["unified_mla_attention"], "route": "VllmRoute"},
    ),
    "no MLA layer module": (
        {
            "result copy for MLA impls": NO_MLA,
            "torch.ops.vllm.unified_mla_attention": NO_MLA,
            "the output guard on MLAAttention": NO_MLA,
            "dead-override warnings on MLAAttention": NO_MLA,
        },
        {"ops": ["unified_attention"], "route": "VllmRoute"},
    ),
}


@pytest.fixture(scope="module")
def reports():
    env = dict(os.environ)
    env.pop("VLLM_ATTN_COMPAT_DISABLE_PLUGIN", None)
    done = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("scenario", list(EXPECTED))
def test_a_missing_name_skips_its_features_only(reports, scenario):
    report = reports[scenario]
    assert "probe_error" not in report, report.get("probe_error")
    assert report["loader_raised"] is None
    skipped, still = EXPECTED[scenario]
    installed, _, skipped_part = report["line"].partition("; skipped ")
    assert installed.startswith("vllm-attn-compat: installed ")
    waiting = {feature for feature, reason in skipped.items() if reason == "pending"}
    assert set(report["pending"]) == waiting
    for feature, install_name in FEATURES.items():
        if feature in waiting:
            assert feature not in skipped_part and install_name not in installed + ",", (feature, report["line"])
        elif feature in skipped:
            assert f"{feature} ({skipped[feature]}" in skipped_part, (feature, report["line"])
            assert install_name not in installed + ",", (feature, report["line"])
        else:
            assert install_name in installed + ",", (feature, report["line"])
    assert bool(skipped_part) == bool(set(skipped) - waiting), report["line"]
    assert report["flag"] is True  # AttentionBackend.accept_output_buffer needs no name any scenario removes
    if "legacy_layer_correct" in report:  # the attention layer module is there: a default-flag backend works
        assert report["legacy_layer_correct"] is True
    for key, value in still.items():
        assert report[key] == value, (key, report)
    if "splitting_ops" in report:
        assert report["splitting_ops"] == ["vllm::unified_attention_with_output"]


def test_an_unexpected_error_in_install_is_logged_not_raised(reports):
    report = reports["install itself raises"]
    assert report["loader_raised"] is None
    assert report["line"] == "vllm-attn-compat: nothing installed (unexpected RuntimeError: changed in this release)"
    # Nothing installed, so the default-flag legacy backend yields torch.empty's contents: what the plugin fixes.
    assert report["flag"] is None and report["ops"] == [] and report["legacy_layer_correct"] is False
