"""Run as a script: every backend shape of the table through vLLM's real ``Attention``, without and with the plugin.

vLLM is imported once; each side runs in a forked child (the plugin installs once per process and patches vLLM's
classes for good): ``without`` never loads a plugin, ``with`` loads vLLM's general plugins, restricted to this
package's, as vLLM does at start-up. ``torch.empty`` fills with NaN in both (torch's deterministic mode), so an
output row a backend leaves unwritten is visible and the two sides are comparable bit for bit. Each child saves
``{shape: ("ok", output) | ("raised", "<Type>: <message>")}`` as ``<side>.pt`` in the folder given.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this tree's package, not an installed one

import torch

torch.set_num_threads(1)  # before any op: the children are forked

import vllm.plugins  # noqa: E402
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers.attention.attention import Attention  # noqa: E402
from vllm.v1.attention.backend import AttentionImpl  # noqa: E402

from vllm_backends import backend_for  # noqa: E402  (the script's own folder, on sys.path)

VLLM_CONFIG = VllmConfig(device_config=DeviceConfig(device="cpu"))
HEADS, KV_HEADS, T = 4, 2, 6


def reference(impl, query, key, value):
    """Causal attention of one sequence, ``[T, heads, size_v]``, in the inputs' dtype."""
    q, k, v = (
        x.reshape(x.shape[0], h, -1) for x, h in zip((query, key, value), (HEADS, KV_HEADS, KV_HEADS), strict=True)
    )
    group = HEADS // KV_HEADS
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * impl.scale
    n = q.shape[0]
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    probs = scores.softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v), torch.logsumexp(scores, -1).transpose(0, 1)


class Impl(AttentionImpl):
    """Each shape is a subclass overriding ``run(query, key, value, output)``; ``forward`` returns what it returns."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, *args, **kwargs):
        self.scale = scale

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None, output_block_scale=None
    ):
        self.metadata = attn_metadata
        return self.run(query, key, value, output)

    def run(self, query, key, value, output):
        raise NotImplementedError


def writes(returned):
    """A >= 0.20 impl that writes its result into ``output``, then returns ``returned(result, lse, output)``."""

    def run(self, query, key, value, output):
        result, lse = reference(self, query, key, value)
        output.copy_(result.reshape(output.shape))
        return returned(result, lse, output)

    return run


def returns(make):
    """A <= 0.19 impl that leaves ``output`` alone and returns ``make(result)``."""

    def run(self, query, key, value, output):
        return make(reference(self, query, key, value)[0])

    return run


def scales_by(member):
    """A >= 0.20 impl whose result depends on the batch's sequence lengths, read from the CommonAttentionMetadata its
    builder kept as ``member`` (``seq_lens``; ``seq_lens_cpu``, which vLLM 0.30 removed)."""

    def run(self, query, key, value, output):
        seq_lens = getattr(self.metadata.common, member)
        result, _ = reference(self, query, key, value)
        output.copy_((result * (1 + seq_lens.float().mean() / 64)).reshape(output.shape))
        return output

    return run


# name -> (run, head_size, head_size_v, dtype). Every shape a backend's forward takes on 0.20 and its return value.
SHAPES = {
    "writes, returns output": (writes(lambda r, lse, out: out), 16, 16, torch.float32),
    "writes, returns None": (writes(lambda r, lse, out: None), 16, 16, torch.float32),
    "writes, returns a 2-D view of output": (
        writes(lambda r, lse, out: out.view(out.shape[0], -1)),
        16,
        8,
        torch.float32,
    ),
    "writes, returns a row slice of output": (writes(lambda r, lse, out: out[: T - 1]), 16, 16, torch.float32),
    "writes, returns its LSE [T, heads]": (writes(lambda r, lse, out: lse), 16, 16, torch.float32),
    "writes, returns its LSE [heads, T]": (writes(lambda r, lse, out: lse.T.contiguous()), 16, 8, torch.float32),
    "writes, returns (output, lse)": (writes(lambda r, lse, out: (out, lse)), 16, 16, torch.float32),
    "writes, returns a scalar tensor": (writes(lambda r, lse, out: lse.sum()), 16, 16, torch.float32),
    "writes, returns an empty tensor": (writes(lambda r, lse, out: out.new_empty(0)), 16, 16, torch.float32),
    "writes, returns a dict": (writes(lambda r, lse, out: {"lse": lse}), 16, 16, torch.float32),
    "writes, returns a copy of its result": (writes(lambda r, lse, out: r.clone()), 16, 8, torch.float32),
    "writes, returns its LSE, bfloat16": (writes(lambda r, lse, out: lse), 16, 16, torch.bfloat16),
    "writes, returns its LSE, a CPU tensor of another dtype": (
        writes(lambda r, lse, out: lse.double()),
        16,
        16,
        torch.float32,
    ),
    "returns a new 2-D tensor": (returns(lambda r: r.reshape(r.shape[0], -1)), 16, 8, torch.float32),
    "returns a new 3-D tensor": (returns(lambda r: r.clone()), 16, 16, torch.float32),
    "returns its rows without padding": (returns(lambda r: r[: T - 2].reshape(T - 2, -1)), 16, 16, torch.float32),
    "returns nothing": (returns(lambda r: None), 16, 16, torch.float32),
    "writes, reads the metadata's seq_lens": (scales_by("seq_lens"), 16, 16, torch.float32),
    "writes, reads the metadata's seq_lens_cpu (removed in 0.30)": (scales_by("seq_lens_cpu"), 16, 16, torch.float32),
}


def common_metadata():
    """A real CommonAttentionMetadata for the batch: two requests, of 4 and 2 new tokens on 5 and 3 cached."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    query_start_loc = torch.tensor([0, 4, T])
    return CommonAttentionMetadata(
        query_start_loc=query_start_loc,
        query_start_loc_cpu=query_start_loc.clone(),
        seq_lens=torch.tensor([9, 5]),
        num_reqs=2,
        num_actual_tokens=T,
        max_query_len=4,
        max_seq_len=9,
        block_table_tensor=torch.zeros(2, 4, dtype=torch.int32),
        slot_mapping=torch.arange(T),
    )


LAYERS = []  # every layer built, for the check that the guard (off here) installed nothing


def run_shape(index, name):
    run, head_size, head_size_v, dtype = SHAPES[name]
    impl_cls = type(f"Shape{index}Impl", (Impl,), {"run": run, "__module__": "plugin_differential_backends"})
    prefix = f"model.layers.{index}.attn"
    with set_current_vllm_config(VLLM_CONFIG):
        layer = Attention(
            HEADS,
            head_size,
            head_size**-0.5,
            num_kv_heads=KV_HEADS,
            prefix=prefix,
            attn_backend=backend_for(impl_cls),
            head_size_v=head_size_v,
        )
    LAYERS.append(layer)
    # The metadata readers share their inputs: the test compares the one reading a removed member with the other.
    gen = torch.Generator().manual_seed(1000 if "reads the metadata" in name else index)
    q, k, v = (
        torch.randn(T, heads * size, generator=gen).to(dtype)
        for heads, size in ((HEADS, head_size), (KV_HEADS, head_size), (KV_HEADS, head_size_v))
    )
    metadata = SimpleNamespace(num_actual_tokens=T, common=common_metadata())
    with set_forward_context({prefix: metadata}, VLLM_CONFIG, slot_mapping={}):
        return layer(q, k, v)


def side(with_plugin):
    if with_plugin:
        os.environ["VLLM_PLUGINS"] = "vllm_attn_compat"
        vllm.plugins.plugins_loaded = False
        vllm.plugins.load_general_plugins()
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # torch.empty gives NaN: unwritten rows show
    results = {}
    for index, name in enumerate(SHAPES):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results[name] = ("ok", run_shape(index, name).clone())
        except Exception as error:  # noqa: BLE001 - what raised is the result
            results[name] = ("raised", f"{type(error).__name__}: {error}", traceback.format_exc())
    from vllm_attn_compat.compat import output_guard

    # VLLM_ATTN_COMPAT_CHECK_OUTPUT is unset here: the guard must have installed nothing, anywhere.
    results["output guard installed"] = any(
        hasattr(Attention.__init__, output_guard.GUARDS) or "forward" in vars(layer.impl) for layer in LAYERS
    )
    return results


def main(folder):
    os.environ.pop("VLLM_ATTN_COMPAT_CHECK_OUTPUT", None)
    for name, with_plugin in (("without", False), ("with", True)):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                torch.save(side(with_plugin), os.path.join(folder, f"{name}.pt"))
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"the {name!r} side failed")


if __name__ == "__main__":
    main(sys.argv[1])
