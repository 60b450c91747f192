"""What replaces a member vLLM deprecated or removed, where vLLM's own sources say so.

Two sources, nothing guessed:
- a deprecation message naming code to use instead ("use `seq_lens.cpu()` instead"): read from the data;
- ``CURATED``: a few members whose replacement vLLM states in code rather than in a message, each citing the
  files and releases it was read in.

An entry: ``{"use": text, "kind": "member" | "expression", "source": where it was read}``. A "member" is another
member of the same class that takes over the role (an override belongs there now); an "expression" is code over
the instance (``self.``) that gives the same value, what a forwarder may compute.
"""

from __future__ import annotations

import re
from typing import Any

_BACKEND = "vllm.v1.attention.backend.AttentionBackend"
_METADATA = "vllm.v1.attention.backend.CommonAttentionMetadata"

_LAYOUT_SOURCE = (
    "vllm/v1/worker/gpu/attn_utils.py in 0.28.0 reshapes each layer's KV cache with "
    "backend.get_kv_cache_shape(...) and backend.get_kv_cache_stride_order(); in 0.29.0 init_kv_cache allocates it "
    "with cache_config.get_resolved_kv_cache_layout(), a KVCacheLayout (vllm/v1/kv_cache_layout.py: 'The logical "
    "shape is always [L, B, H, N, <content>]. Each member's value is a stride permutation') resolved from every "
    "backend's supported_kv_cache_layouts() (vllm/v1/attention/backends/utils.py, get_supported_kv_cache_layouts)"
)

CURATED: dict[str, dict[str, str]] = {
    f"{_BACKEND}.get_required_kv_cache_layout": {
        "use": "supported_kv_cache_layouts",
        "kind": "member",
        "source": (
            "vllm/v1/attention/selector.py in 0.28.0 sets the KV cache layout from "
            "backend.get_required_kv_cache_layout(); in 0.29.0 that code is gone ('The KV cache layout is resolved "
            "across all of the model's backends at once'), and vllm/v1/attention/backends/utils.py's "
            "get_supported_kv_cache_layouts() reads backend.supported_kv_cache_layouts() ('Every backend declares "
            "the layouts its kernels support, most preferred first')"
        ),
    },
    f"{_BACKEND}.get_kv_cache_shape": {"use": "supported_kv_cache_layouts", "kind": "member", "source": _LAYOUT_SOURCE},
    f"{_BACKEND}.get_kv_cache_stride_order": {
        "use": "supported_kv_cache_layouts",
        "kind": "member",
        "source": _LAYOUT_SOURCE,
    },
    f"{_METADATA}.num_computed_tokens_cpu": {
        "use": "self.seq_lens.cpu() - (self.query_start_loc_cpu[1:] - self.query_start_loc_cpu[:-1])",
        "kind": "expression",
        "source": (
            "the deprecation message of CommonAttentionMetadata.num_computed_tokens_cpu (vllm/v1/attention/"
            "backend.py, 0.19.0 to 0.29.0: 'If a CPU copy is needed, it can be derived from query_start_loc_cpu "
            "and seq_lens'), and the property's body there: seq_lens_cpu - (query_start_loc_cpu[1:] - "
            "query_start_loc_cpu[:-1])"
        ),
    },
}

# "use `seq_lens.cpu()` instead", as vLLM's messages word it.
_USE_INSTEAD = re.compile(r"\buse `([^`]+)` instead", re.IGNORECASE)


def from_messages(manifest: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Successors named by deprecation messages: an expression over the instance's own members."""
    found: dict[str, dict[str, str]] = {}
    for qualified, entry in manifest["classes"].items():
        members = entry["members"]
        for name, history in members.items():
            for release, state in history:
                match = _USE_INSTEAD.search((state or {}).get("deprecated") or "")
                if match is None:
                    continue
                code = match.group(1)
                head = re.match(r"\w+", code)
                if head is None or head.group(0) not in members:
                    continue
                found[f"{qualified}.{name}"] = {
                    "use": f"self.{code}",
                    "kind": "expression",
                    "source": f"the deprecation message of {qualified.rpartition('.')[2]}.{name} in {release}: "
                    f"{state['deprecated']!r}",
                }
                break
    return found


def successors(manifest: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Every successor: those the messages name, and the curated ones whose member and successor member the data
    holds (a curated entry wins). tests/scripts/test_attention_manifest.py holds every curated entry to the
    shipped data, so that a renamed member cannot leave a stale entry behind."""
    curated = {}
    for key, entry in CURATED.items():
        qualified, _, member = key.rpartition(".")
        members = manifest["classes"].get(qualified, {}).get("members", {})
        if member in members and (entry["kind"] != "member" or entry["use"] in members):
            curated[key] = entry
    return {**from_messages(manifest), **curated}
