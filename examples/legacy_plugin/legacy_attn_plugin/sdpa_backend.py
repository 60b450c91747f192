"""The plugin's main backend: writes into the layer's output buffer (vLLM <= 0.19 style)."""

from typing import Optional

import torch

from legacy_attn_plugin.base import PluginBackend, PluginImpl


class SdpaBackend(PluginBackend):
    # The layer preallocates the output and we write into it, which keeps the
    # output inside the CUDA graph under piecewise compilation.
    accept_output_buffer: bool = True

    @staticmethod
    def get_impl_cls():
        return SdpaImpl


class SdpaImpl(PluginImpl):
    def forward(
        self,
        layer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata,
        output: Optional[torch.Tensor] = None,
        output_scale: Optional[torch.Tensor] = None,
        output_block_scale: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Causal attention of one sequence, written into ``output``."""
        assert output is not None, "Output tensor must be provided."

        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("SdpaImpl does not fuse output quantization")
        return self.prefill(query, key, value, output)

    def prefill(self, query, key, value, output=None):
        # Older callers did not pass a buffer.
        if output is None:
            output = torch.empty_like(query)

        tokens = query.shape[0]
        output.view(tokens, self.num_heads, -1).copy_(self.causal_sdpa(query, key, value))
        return output
