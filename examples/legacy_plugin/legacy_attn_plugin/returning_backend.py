"""A backend written for vLLM's no-output path: it returns a new tensor."""

from typing import Optional

import torch

from legacy_attn_plugin.base import PluginBackend, PluginImpl


class ReturningBackend(PluginBackend):
    accept_output_buffer = False

    @staticmethod
    def get_impl_cls():
        return ReturningImpl


class ReturningImpl(PluginImpl):
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
        tokens = query.shape[0]
        return self.causal_sdpa(query, key, value).reshape(tokens, -1)
