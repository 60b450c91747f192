"""Compilation settings the plugin recommends."""

import torch

# Piecewise CUDA graphs split the model at these ops.
SPLITTING_OPS = [
    "vllm::unified_attention",
    "vllm::unified_attention_with_output",
    "vllm::unified_mla_attention",
]


def attention_through_the_op(query, key, value, layer_name: str) -> torch.Tensor:
    """Run a layer's attention through vLLM's custom op (used by the plugin's debug tools)."""
    return torch.ops.vllm.unified_attention(query, key, value, layer_name)
