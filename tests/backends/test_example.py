"""examples/attention_layer.py runs and checks what it prints."""

from __future__ import annotations

import runpy
from pathlib import Path

from vllm_attn_compat.backends import STATIC_FORWARD_CONTEXT

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "attention_layer.py"


def test_attention_layer_example_runs(capsys):
    try:
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    finally:
        STATIC_FORWARD_CONTEXT.pop("model.layers.0.attn", None)
    printed = capsys.readouterr().out
    assert "prefill: output (33, 512)" in printed
    assert "padding untouched" in printed and "gives the same rows" in printed
