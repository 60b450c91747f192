"""Do no harm, at run time: every backend shape that works on vLLM without the plugin gives the same output, bit for
bit, with it. Both sides run through vLLM's real ``Attention`` in child processes (``plugin_differential.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="the real vLLM package is not installed (run scripts/install-vllm-tier.sh)")

PROBE = Path(__file__).with_name("plugin_differential.py")


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    from importlib.metadata import entry_points

    from vllm.v1.attention.backend import AttentionBackend

    from vllm_attn_compat.compat import plugin

    if plugin.old_api_reason(AttentionBackend) is not None:
        pytest.skip("this tier needs vLLM >= 0.20; the installed vLLM has the old attention API")
    if not any(ep.name == "vllm_attn_compat" for ep in entry_points(group="vllm.general_plugins")):
        pytest.skip("vllm-attn-compat is not pip-installed, so vLLM cannot find its entry point (pip install -e .)")
    folder = tmp_path_factory.mktemp("differential")
    done = subprocess.run([sys.executable, str(PROBE), str(folder)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return tuple(torch.load(folder / f"{side}.pt", weights_only=False) for side in ("without", "with"))


def _works(result):
    """Ran without raising and wrote every element (torch.empty gives NaN in the probe, so a NaN is unwritten)."""
    return result[0] == "ok" and not result[1].isnan().any().item()


def _bits(tensor):
    return tensor.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])


def test_every_shape_that_works_without_the_plugin_gives_the_same_bits_with_it(sides):
    without, with_plugin = (dict(side) for side in sides)
    assert with_plugin.pop("output guard installed") is False and without.pop("output guard installed") is False
    working = [name for name, result in without.items() if _works(result)]
    # The oracle is not vacuous: the table's writers all work without the plugin, the LSE-returning ones included.
    assert {"writes, returns its LSE [T, heads]", "writes, returns (output, lse)", "writes, returns None"} <= set(
        working
    )
    differs = {}
    for name in working:
        result = with_plugin[name]
        if result[0] != "ok":
            differs[name] = result[1]
        elif not torch.equal(_bits(result[1]), _bits(without[name][1])):
            differs[name] = "different bits"
    assert differs == {}


def test_shapes_the_plugin_repairs_work_with_it(sides):
    """The legacy shapes (a result returned, `output` left alone) are broken without the plugin and work with it."""
    without, with_plugin = (dict(side) for side in sides)
    repaired = ["returns a new 2-D tensor", "returns a new 3-D tensor"]
    assert not any(_works(without[name]) for name in repaired)
    assert all(_works(with_plugin[name]) for name in repaired)


def test_a_removed_member_works_with_the_plugin_only_where_vllm_removed_it(sides):
    """A backend reading ``seq_lens_cpu``: vLLM < 0.30 has it (both sides the same bits); vLLM >= 0.30 removed it, so
    it raises without the plugin and, with it, gives the bits of the same backend reading ``seq_lens``."""
    from importlib.metadata import version

    without, with_plugin = (dict(side) for side in sides)
    removed, current = (
        "writes, reads the metadata's seq_lens_cpu (removed in 0.30)",
        "writes, reads the metadata's seq_lens",
    )
    release = tuple(int(part) for part in version("vllm").split("+")[0].split(".")[:2])
    if release < (0, 30):
        assert _works(without[removed]) and torch.equal(_bits(with_plugin[removed][1]), _bits(without[removed][1]))
    else:
        assert without[removed][:2] == (
            "raised",
            "AttributeError: 'CommonAttentionMetadata' object has no attribute 'seq_lens_cpu'",
        )
    assert _works(with_plugin[removed])
    assert torch.equal(_bits(with_plugin[removed][1]), _bits(with_plugin[current][1]))
