"""The backend contract of vLLM >= 0.20: ``output`` is required and written in place.

There is no ``accept_output_buffer``: every backend accepts the buffer. The layer
(`vllm_attn_compat.backends.layer`) allocates and validates it; a backend trusts it, writes
rows ``[:attn_metadata.num_actual_tokens]`` and leaves the padding rows after them alone.
Its return value is ignored.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol

import torch

from vllm_attn_compat.backends.metadata import AttentionMetadata
from vllm_attn_compat.backends.paged import kv_cache_shape


class AttentionImpl(ABC):
    """Computes attention for one layer into the caller's ``output``.

    Shapes: query ``[T, num_heads, head_size]``, key ``[T, num_kv_heads, head_size]``, value
    ``[T, num_kv_heads, head_size_v]`` (key/value may be None when the cache holds them),
    output ``[T, num_heads, head_size_v]``. ``T`` may include padding beyond
    ``attn_metadata.num_actual_tokens``.
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        head_size_v: int,
        **extra_impl_args: Any,
    ) -> None:
        if extra_impl_args:
            raise TypeError(f"{type(self).__name__}: unexpected implementation arguments {sorted(extra_impl_args)}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.head_size_v = head_size_v

    @abstractmethod
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
        """Write the attention result into ``output`` and return it."""


class MLALayer(Protocol):
    """What an MLA impl reads of its layer (`layer.MLAAttention` has it; so does vLLM's)."""

    num_heads: int
    scale: float
    qk_nope_head_dim: int
    v_head_dim: int
    kv_lora_rank: int
    kv_b_proj: torch.nn.Module


class MLAAttentionImpl(ABC):
    """Multi-head latent attention into the caller's ``output`` ``[T, num_heads, v_head_dim]``.

    q ``[T, num_heads, qk_nope_head_dim + qk_rope_head_dim]``, kv_c_normed
    ``[T, kv_lora_rank]``, k_pe ``[T, 1, qk_rope_head_dim]``. vLLM splits this into
    ``forward_mha``/``forward_mqa`` behind ``MLAAttention.forward_impl``; one ``forward`` with
    the same output contract is enough for a reference implementation.
    """

    def __init__(self, **extra_impl_args: Any) -> None:
        if extra_impl_args:
            raise TypeError(f"{type(self).__name__}: unexpected implementation arguments {sorted(extra_impl_args)}")

    @abstractmethod
    def forward(
        self,
        layer: MLALayer,
        q: torch.Tensor,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Write the attention result into ``output`` and return it."""


class AttentionBackend(ABC):
    """A named attention implementation: its impl class, metadata class and cache shape."""

    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.float16, torch.bfloat16)
    # As in vLLM: the impl's forward stores this step's key/value into the paged cache itself.
    forward_includes_kv_cache_update: ClassVar[bool] = True

    @staticmethod
    @abstractmethod
    def get_name() -> str: ...

    @staticmethod
    @abstractmethod
    def get_impl_cls() -> type[AttentionImpl] | type[MLAAttentionImpl]: ...

    @staticmethod
    def get_metadata_cls() -> type[AttentionMetadata]:
        return AttentionMetadata

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, head_size_v: int
    ) -> tuple[int, ...]:
        return kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, head_size_v)


def reject_output_quantization(
    backend: str, output_scale: torch.Tensor | None, output_block_scale: torch.Tensor | None
) -> None:
    """Backends here write unquantized output; fail before writing instead of ignoring a scale."""
    for name, tensor in (("output_scale", output_scale), ("output_block_scale", output_block_scale)):
        if tensor is not None:
            raise NotImplementedError(
                f"{name}: the {backend} backend writes unquantized output, expected None, "
                f"got a tensor of shape {list(tensor.shape)}"
            )
