"""Run as a script: the plugin against the real vLLM with one version-sensitive name taken away per scenario.

vLLM is imported once; each scenario runs in a forked child (the plugin installs once per process), removes a
name the way a vLLM release without it would lack it, loads vLLM's general plugins as vLLM does, then checks
what still works. Prints one JSON object: scenario -> report.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this tree's package, not an installed one

import torch

torch.set_num_threads(1)  # before any op: the children are forked

import vllm.plugins  # noqa: E402
import vllm.utils.torch_utils as torch_utils  # noqa: E402
from vllm.config import CompilationConfig, DeviceConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers.attention import attention, mla_attention  # noqa: E402
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl  # noqa: E402

from vllm_attn_compat.compat import plugin, vllm_install  # noqa: E402

from vllm_backends import backend_for  # noqa: E402  (the script's own folder, on sys.path)

VLLM_CONFIG = VllmConfig(device_config=DeviceConfig(device="cpu"))  # built before any scenario removes a name


class LegacyImpl(AttentionImpl):
    """Never declared accept_output_buffer; returns its result (here: 2 * query, 2-D)."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, *args, **kwargs):
        pass

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None, output_block_scale=None
    ):
        return (query * 2).reshape(query.shape[0], -1)


LegacyBackend = backend_for(LegacyImpl)


def _missing_module(name):
    sys.modules[name] = None  # what `import` then reports is what a release without the module gives


def _raising(*args, **kwargs):
    raise RuntimeError("changed in this release")


SCENARIOS = {
    "baseline": lambda: None,
    "no _encode_layer_name": lambda: delattr(torch_utils, "_encode_layer_name"),
    "no _resolve_layer_name": lambda: delattr(torch_utils, "_resolve_layer_name"),
    "no LayerNameType": lambda: delattr(torch_utils, "LayerNameType"),
    "_encode_layer_name raises": lambda: setattr(torch_utils, "_encode_layer_name", _raising),
    "no CompilationConfig.__post_init__": lambda: delattr(CompilationConfig, "__post_init__"),
    "no attention layer module": lambda: _missing_module(attention.__name__),
    "no MLA layer module": lambda: _missing_module(mla_attention.__name__),
    "install itself raises": lambda: setattr(vllm_install, "install_features", _raising),
}


def _legacy_layer_output():
    """A default-flag legacy backend through vLLM's real Attention: is the result in the returned output?"""
    with set_current_vllm_config(VLLM_CONFIG):
        layer = attention.Attention(
            4, 8, 8**-0.5, num_kv_heads=4, prefix="model.layers.0.attn", attn_backend=LegacyBackend
        )
    q = torch.randn(3, 32)
    with set_forward_context({layer.layer_name: None}, VLLM_CONFIG, slot_mapping={}):
        out = layer(q, torch.randn(3, 32), torch.randn(3, 32))
    return bool(torch.equal(out, q * 2))


def _report(scenario):
    records = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: records.append(record.getMessage())
    plugin.logger.addHandler(handler)
    plugin.logger.setLevel(logging.INFO)
    SCENARIOS[scenario]()
    os.environ["VLLM_PLUGINS"] = "vllm_attn_compat"
    try:
        vllm.plugins.load_general_plugins()
    except BaseException as error:  # noqa: BLE001 - the one thing the plugin must never do
        return {"loader_raised": repr(error)}
    (line,) = [r for r in records if r.startswith("vllm-attn-compat:")]
    report = {"loader_raised": None, "line": line, "pending": plugin.pending()}
    warnings.simplefilter("ignore")
    report["flag"] = getattr(AttentionBackend, "accept_output_buffer", None)
    report["ops"] = [n for n in ("unified_attention", "unified_mla_attention") if hasattr(torch.ops.vllm, n)]
    report["route"] = type(vllm_install.forwarders.current_route()).__name__
    if "__post_init__" in vars(CompilationConfig):
        report["splitting_ops"] = CompilationConfig(splitting_ops=["vllm::unified_attention"]).splitting_ops
    if sys.modules.get(attention.__name__) is not None:
        report["legacy_layer_correct"] = _legacy_layer_output()
    return report


def main():
    results = {}
    for scenario in SCENARIOS:
        with tempfile.TemporaryFile("w+") as channel:
            pid = os.fork()
            if pid == 0:
                try:
                    json.dump(_report(scenario), channel)
                except BaseException:  # noqa: BLE001 - the forked child reports any failure to the parent
                    json.dump({"probe_error": traceback.format_exc()}, channel)
                channel.flush()
                os._exit(0)
            os.waitpid(pid, 0)
            channel.seek(0)
            results[scenario] = json.load(channel)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
