"""The unsafe migration of a fork's layers, executed before and after: the rewritten code returns what
the old code returned, on a stub ``vllm`` with the old API and on one with the new API only.

The stub (``stub_vllm/``) is a few dozen lines of vLLM's layer contract: layers registered by name,
the ops looked up by layer name, and a backend that writes into ``output`` when it gets one and
returns a new tensor otherwise, as backends supporting both vLLM paths did. Each run is a fresh
interpreter with the stub first on ``sys.path``, so the real vLLM (if installed) is never imported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_attn_compat.codemods.cli import main

STUB = Path(__file__).resolve().parent / "stub_vllm"
REPO = Path(__file__).resolve().parents[2]

FORK_LAYERS = '''\
"""A fork's attention layers, as written for vLLM 0.19."""

import torch
from vllm.model_executor.layers.attention import Attention, MLAAttention, unified_attention


class ForkAttention(Attention):
    def forward(self, query, key, value):
        # Backends that take the buffer write into it.
        if self.attn_backend.accept_output_buffer:
            output = torch.empty(
                (query.shape[0], self.num_heads * self.head_size_v), dtype=query.dtype, device=query.device
            )
            torch.ops.vllm.unified_attention_with_output(
                query.view(-1, self.num_heads, self.head_size),
                key.view(-1, self.num_kv_heads, self.head_size),
                value.view(-1, self.num_kv_heads, self.head_size_v),
                output.view(-1, self.num_heads, self.head_size_v),
                self.layer_name,
            )
            return output

        # Legacy backends return their result.
        return unified_attention(query, key, value, self.layer_name)


class ForkMLAAttention(MLAAttention):
    def forward(self, q, kv_c_normed, k_pe, output_shape=None):
        if self.use_output:
            output = torch.empty(output_shape, dtype=q.dtype, device=q.device)
            torch.ops.vllm.unified_mla_attention_with_output(q, kv_c_normed, k_pe, output, self.layer_name)
            return output
        # NOTE(fork): kept for the old kernels
        else:
            # They return a new tensor;
            # the layer passes it on.
            return torch.ops.vllm.unified_mla_attention(q, kv_c_normed, k_pe, self.layer_name)


class DebugAttention(Attention):
    """Always through the op that returns its result (a debugging aid)."""

    def forward(self, query, key, value):
        out = torch.ops.vllm.unified_attention(query, key, value, self.layer_name)  # old op
        return out


class DebugMLAAttention(MLAAttention):
    def forward(self, q, kv_c_normed, k_pe):
        return torch.ops.vllm.unified_mla_attention(q, kv_c_normed, k_pe, self.layer_name)
'''

# Runs in a fresh interpreter: argv = stub folder, code folder, API ("old"/"new"), accept flag, result file.
PROBE = """\
import sys

import torch

stub, code, api, accept, result_file = sys.argv[1:]
sys.path[:0] = [stub, code]
import vllm_stub_config

vllm_stub_config.configure(api=api, accept_output_buffer=accept == "1")
import fork_layers as m

gen = torch.Generator().manual_seed(0)
tokens, heads, kv_heads, head_size, head_size_v = 5, 4, 2, 8, 6
query = torch.randn(tokens, heads * head_size, generator=gen)
key = torch.randn(tokens, kv_heads * head_size, generator=gen)
value = torch.randn(tokens, kv_heads * head_size_v, generator=gen)
results = {}
for name in ("ForkAttention", "DebugAttention"):
    layer = getattr(m, name)(heads, head_size, kv_heads, head_size_v, prefix=name)
    results[name] = layer(query, key, value)

v_head_dim, rank, rope = 6, 10, 3
q = torch.randn(tokens, heads, rank + rope, generator=gen)
kv_c_normed = torch.randn(tokens, rank, generator=gen)
k_pe = torch.randn(tokens, 1, rope, generator=gen)
fork_mla = m.ForkMLAAttention(heads, v_head_dim, rank, rope, prefix="ForkMLAAttention")
results["ForkMLAAttention"] = fork_mla(q, kv_c_normed, k_pe, output_shape=(tokens, heads * v_head_dim))
debug_mla = m.DebugMLAAttention(heads, v_head_dim, rank, rope, prefix="DebugMLAAttention")
results["DebugMLAAttention"] = debug_mla(q, kv_c_normed, k_pe)
torch.save(results, result_file)
"""


def _run(code: Path, api: str, accept: bool, tmp_path: Path) -> dict:
    import torch

    result_file = tmp_path / f"{code.name}-{api}-{int(accept)}.pt"
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    completed = subprocess.run(
        [sys.executable, str(probe), str(STUB), str(code), api, "1" if accept else "0", str(result_file)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    return torch.load(result_file)


def test_the_migrated_layers_return_what_the_old_layers_returned(tmp_path):
    pytest.importorskip("torch")
    old = tmp_path / "old"
    old.mkdir()
    (old / "fork_layers.py").write_text(FORK_LAYERS)
    new = tmp_path / "new"
    shutil.copytree(old, new)
    assert main(["migrate", "--unsafe-fixes", "--quiet", str(new)]) == 0
    migrated = (new / "fork_layers.py").read_text()
    for gone in (
        "use_output",
        "accept_output_buffer",
        "unified_attention(",
        "unified_mla_attention(",
        "vllm_attn_compat",
    ):
        assert gone not in migrated
    assert "import torch\nfrom vllm.model_executor.layers.attention import Attention, MLAAttention\n" in migrated
    # Nothing is left for a person either, and a second run changes nothing.
    assert main(["migrate", "--check", "--unsafe-fixes", "--quiet", str(new)]) == 0

    legacy = _run(old, "old", accept=False, tmp_path=tmp_path)  # the old path: backends returning their result
    buffered = _run(old, "old", accept=True, tmp_path=tmp_path)  # the old code's with-output path
    on_old_vllm = _run(new, "old", accept=True, tmp_path=tmp_path)
    on_new_vllm = _run(new, "new", accept=True, tmp_path=tmp_path)  # no flags, no old ops: vLLM >= 0.20
    assert set(legacy) == {"ForkAttention", "DebugAttention", "ForkMLAAttention", "DebugMLAAttention"}
    for name, expected in legacy.items():
        for other in (buffered, on_old_vllm, on_new_vllm):
            assert other[name].shape == expected.shape, name
            assert other[name].dtype == expected.dtype, name
            assert other[name].equal(expected), name


VLLM_0_19_LAYERS = Path("/tmp/vllm-src/0.19.1/vllm/model_executor/layers/attention")


def test_commented_branches_of_layer_code_never_make_the_run_fail(tmp_path, capsys):
    # The else-branch layouts real forks use: comments before `else:`, opening it, closing the kept branch.
    (tmp_path / "fork_layers.py").write_text(FORK_LAYERS.replace("# Legacy backends", "# Legacy backends:\n        #"))
    assert main(["migrate", "--unsafe-fixes", "--diff", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "internal error" not in captured.err and "+++ " in captured.out
    assert main(["migrate", "--unsafe-fixes", str(tmp_path)]) == 0


@pytest.mark.skipif(
    not VLLM_0_19_LAYERS.is_dir(), reason=f"vLLM 0.19.1's sources are not unpacked at {VLLM_0_19_LAYERS}"
)
def test_vllm_0_19_layers_migrate_to_the_0_20_form(tmp_path, capsys):
    for name in ("attention.py", "mla_attention.py"):
        shutil.copy(VLLM_0_19_LAYERS / name, tmp_path / name)
    assert main(["migrate", "--unsafe-fixes", str(tmp_path)]) in (0, 1)
    captured = capsys.readouterr()
    assert "internal error" not in captured.out + captured.err
    layer = (tmp_path / "attention.py").read_text()
    mla = (tmp_path / "mla_attention.py").read_text()
    for text in (layer, mla):
        compile(text, "layer", "exec")
        for gone in ("use_output", ".accept_output_buffer", "torch.ops.vllm.unified_attention(", "vllm_attn_compat"):
            assert gone not in text
        assert "torch.ops.vllm.unified_mla_attention(" not in text
    # Upstream's 0.20 forward: allocate once, view, call the with-output op, return the 2-D view.
    assert "\n        output = torch.empty(output_shape, dtype=output_dtype, device=query.device)\n" in layer
    assert "\n        return output.view(-1, hidden_size)\n" in layer
    assert mla.count("\n            output = torch.empty(output_shape, dtype=q.dtype, device=q.device)\n") == 2
    assert main(["migrate", "--check", "--unsafe-fixes", str(tmp_path)]) in (0, 1)
    assert "[*]" not in capsys.readouterr().out  # nothing left to fix: the fixes were complete


LAYER_WITH_OLD_PATH = """\
import torch
from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backend import AttentionImpl


class ForkImpl(AttentionImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        output.copy_(query)
        return output


class ForkAttention(Attention):
    def forward(self, query, key, value):
        if self.use_output:
            output = torch.empty_like(query)
            self.impl.forward(self, query, key, value, None, None, output=output)
            return output
        else:
            return self.impl.forward(self, query, key, value, None, None)
"""


@pytest.mark.parametrize("kept", [False, True], ids=["deleted", "kept-elsewhere"])
def test_a_call_the_unsafe_fixes_delete_is_not_reported_as_broken_by_them(tmp_path, capsys, kept):
    """VAC005 keeps the `use_output` branch and deletes the `else` holding the only call without `output`
    (rebellions-sw/vllm-rbln's layer): the run taking both fixes reports no call they break, as the next
    `--check` does not; a call of the same method without `output` elsewhere is named by the fix's finding, and the
    next `--check` reports it as raising TypeError."""
    text = LAYER_WITH_OLD_PATH
    if kept:
        text += "\n\ndef warm_up(impl, q):\n    return ForkImpl.forward(impl, None, q, q, q, None, None)\n"
    (tmp_path / "layer.py").write_text(text)
    later = ["--ignore", "VAC01"]  # (a fork's toy impl: what later releases' rules report of it is not this test's)
    for mode in (["--diff"], ["-"], []):
        arguments = ["migrate", "--unsafe-fixes", "--no-cache", *later, *mode]
        if mode == ["-"]:
            arguments += ["--stdin-filename", str(tmp_path / "layer.py")]
            code = _main_with_stdin(arguments, text)
        else:
            code = main([*arguments, str(tmp_path)])
        captured = capsys.readouterr()
        report = captured.err if mode else captured.out
        # The fix's finding names the old path's call, and the one in `warm_up` as one more.
        assert "`self.impl.forward(...)` at line 19 does not pass `output`" in report, (mode, report)
        assert ("does not pass `output` (and 1 more)" in report) is kept, (mode, report)
        assert report.count("layer.py:19:") == 0, report  # the deleted call's line: no finding there
        assert code == (1 if mode == ["--diff"] else 0), (mode, report)
    assert main(["migrate", "--check", "--no-cache", *later, str(tmp_path)]) == (1 if kept else 0)
    assert ("raises TypeError" in capsys.readouterr().out) is kept


def _main_with_stdin(arguments, text):
    import io

    stdin, stdout = sys.stdin, sys.stdout
    sys.stdin = io.TextIOWrapper(io.BytesIO(text.encode()))
    sys.stdout = io.TextIOWrapper(io.BytesIO())
    try:
        return main(arguments)
    finally:
        sys.stdin, sys.stdout = stdin, stdout
