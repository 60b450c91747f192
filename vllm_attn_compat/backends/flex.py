"""FlexAttention backend, with vLLM's optional ``out_transform(out, lse)`` epilogue.

The batch runs as one flex call over the packed query tokens against the packed keys and
values of every sequence (gathered from the paged cache when the batch has one). The
document mask (a token sees only its own sequence) and the causal mask are combined into a
`BlockMask` when the metadata is built (`FlexAttentionMetadata`), outside the op: building
it inside a compiled graph would run vmap inside the op (torch-notes 4.3).

Kernels:

- no epilogue: the compiled flex kernel, ``torch.compile(flex_attention)``, not fullgraph: a
  serving process meets a new token count almost every step, and once dynamo's recompile limit
  is reached a fullgraph function raises where this one runs the eager kernel (dynamo warns).
  On CUDA its shapes are dynamic after the first recompile (measured on an H200, torch 2.11:
  3 compiles of about 4 s over 8 batch shapes, against one a shape when static), and it is
  always flex's main Triton kernel: the decoding kernel it would pick for fewer than 128
  packed query tokens found no valid configuration there for 8 query heads over 2 KV heads.
  The Triton kernel needs head sizes of at least 16: smaller ones are refused before anything
  is written. On the CPU its shapes are static (torch 2.13 fails to compile the CPU template
  for symbolic ones), so each new shape compiles, which takes seconds;
- with ``out_transform``: the eager kernel with ``return_aux=AuxRequest(lse=True)``, since
  compiled flex on the CPU cannot return the log-sum-exp (torch 2.13 raises
  NotImplementedError). The eager kernel materialises the full score matrix and warns so.
  Inside a ``torch.compile``'d model this path fails on the first call of each graph unless
  ``torch._functorch.config.check_custom_op_aliasing = False`` (eager flex runs vmap).

FlexAttention has no ``out=`` argument: the result reaches ``output`` by exactly one
``copy_`` into ``output[:num_actual_tokens]``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, create_block_mask, flex_attention

from vllm_attn_compat.backends.abstract import (
    AttentionBackend,
    AttentionImpl,
    reject_output_quantization,
)
from vllm_attn_compat.backends.metadata import AttentionMetadata
from vllm_attn_compat.backends.paged import gather_kv

OutTransform = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# flex's Triton template (CUDA) refuses smaller head sizes ("NYI: embedding dimension ... must be at least 16").
MIN_CUDA_HEAD_SIZE = 16


@functools.cache
def _compiled_flex(on_cuda: bool) -> Callable[..., Any]:
    # Not fullgraph: past `torch._dynamo.config.recompile_limit` shapes, a fullgraph function raises
    # (FailOnRecompileLimitHit) where this one runs flex_attention eagerly. Static shapes on the CPU only.
    return torch.compile(flex_attention, dynamic=None if on_cuda else False)


@dataclasses.dataclass(eq=False)
class FlexAttentionMetadata(AttentionMetadata):
    """`AttentionMetadata` plus the packed-KV index and the block mask, built once per step."""

    block_mask: BlockMask | None = dataclasses.field(default=None, init=False)
    kv_packed_index: torch.Tensor = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        device = self.query_start_loc.device
        layout = self.layout
        seq_lens = torch.tensor(self.seq_lens_list, dtype=torch.long, device=device)
        q_lens = torch.tensor(self.query_lens, dtype=torch.long, device=device)
        valid = torch.arange(self.max_seq_len, device=device)[None, :] < seq_lens[:, None]
        self.kv_packed_index = layout.kv_index[valid]
        kv_doc = torch.repeat_interleave(torch.arange(self.num_seqs, device=device), seq_lens)
        kv_starts = torch.cumsum(seq_lens, 0) - seq_lens
        kv_pos = torch.arange(kv_doc.numel(), device=device) - kv_starts[kv_doc]
        q_doc = layout.token_seq
        q_pos = layout.token_row + (seq_lens - q_lens)[q_doc]
        causal = self.causal

        def document_mask(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            same = q_doc[q_idx] == kv_doc[kv_idx]
            return same & (kv_pos[kv_idx] <= q_pos[q_idx]) if causal else same

        if self.num_actual_tokens and kv_doc.numel():
            self.block_mask = create_block_mask(
                document_mask, None, None, self.num_actual_tokens, kv_doc.numel(), device=device
            )


class FlexAttentionImpl(AttentionImpl):
    """``out_transform(out, lse)``: optional epilogue on flex's ``[1, H, n, Dv]`` result and its
    ``[1, H, n]`` fp32 log-sum-exp; it must return a tensor of the result's shape.
    ``compile_kernel=False`` runs the eager kernel also without an epilogue."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        head_size_v: int,
        out_transform: OutTransform | None = None,
        compile_kernel: bool = True,
    ) -> None:
        super().__init__(num_heads, head_size, scale, num_kv_heads, head_size_v)
        self.out_transform = out_transform
        self.compile_kernel = compile_kernel

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Write attention for rows ``[:num_actual_tokens]`` into ``output`` (one copy)."""
        reject_output_quantization("flex", output_scale, output_block_scale)
        if not isinstance(attn_metadata, FlexAttentionMetadata):
            raise TypeError(
                "attn_metadata: the flex backend needs its block mask built outside the op, "
                f"expected FlexAttentionMetadata, got {type(attn_metadata).__name__}"
            )
        attn_metadata.check_fits(query.shape[0], kv_cache)
        if self.compile_kernel and self.out_transform is None and query.is_cuda:
            smallest = min(self.head_size, self.head_size_v)
            if smallest < MIN_CUDA_HEAD_SIZE:
                raise ValueError(
                    f"flex: the compiled kernel on CUDA needs head sizes of at least {MIN_CUDA_HEAD_SIZE}, "
                    f"got head_size={self.head_size}, head_size_v={self.head_size_v}; "
                    "pass compile_kernel=False for the eager kernel, or use another backend"
                )
        n = attn_metadata.num_actual_tokens
        if n == 0:
            return output
        key_packed, value_packed = gather_kv(
            attn_metadata, key, value, kv_cache, self.head_size, attn_metadata.kv_packed_index, query.dtype
        )
        args = (_to_bhsd(query[:n]), _to_bhsd(key_packed), _to_bhsd(value_packed))
        gqa = self.num_kv_heads != self.num_heads
        mask, scale = attn_metadata.block_mask, self.scale
        result: torch.Tensor
        if self.out_transform is None:
            if self.compile_kernel and query.is_cuda:
                options = {"FORCE_USE_FLEX_ATTENTION": True}  # never the decoding kernel (module docstring)
                result = _compiled_flex(True)(
                    *args, block_mask=mask, scale=scale, enable_gqa=gqa, kernel_options=options
                )
            elif self.compile_kernel:
                result = _compiled_flex(False)(*args, block_mask=mask, scale=scale, enable_gqa=gqa)
            else:
                result = flex_attention(*args, block_mask=mask, scale=scale, enable_gqa=gqa)
        else:
            raw, aux = flex_attention(
                *args, block_mask=mask, scale=scale, enable_gqa=gqa, return_aux=AuxRequest(lse=True)
            )
            if aux.lse is None:
                raise RuntimeError("flex_attention: asked for the log-sum-exp (AuxRequest(lse=True)), got none")
            result = self.out_transform(raw, aux.lse)
            if not isinstance(result, torch.Tensor) or result.shape != raw.shape:
                raise ValueError(
                    f"out_transform: expected a tensor of shape {list(raw.shape)}, got "
                    f"{list(result.shape) if isinstance(result, torch.Tensor) else type(result).__name__}"
                )
        output[:n].copy_(result[0].transpose(0, 1))
        return output


def _to_bhsd(x: torch.Tensor) -> torch.Tensor:
    """``[S, H, D]`` -> ``[1, H, S, D]``, the layout flex_attention takes."""
    return x.transpose(0, 1).unsqueeze(0)


class FlexAttentionBackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "flex"

    @staticmethod
    def get_impl_cls() -> type[FlexAttentionImpl]:
        return FlexAttentionImpl

    @staticmethod
    def get_metadata_cls() -> type[FlexAttentionMetadata]:
        return FlexAttentionMetadata
