"""Attention layers: the one place that allocates, validates and reshapes the output buffer.

``forward`` mirrors vLLM >= 0.20: it accepts 2-D ``[T, heads * head_size]`` or 3-D inputs,
makes the 3-D views, allocates ``[T, num_heads, head_size_v]`` with ``torch.empty`` (or
validates the caller's buffer once), calls the mandatory-output op and returns the 2-D view
``[T, num_heads * head_size_v]`` of that same buffer. Backends never allocate their result
buffer; the deprecated forwarders in ``compat`` call `allocate_output` too.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_attn_compat.backends import ops  # noqa: F401  (registers torch.ops.vllm_attn_compat)
from vllm_attn_compat.backends.abstract import AttentionBackend, AttentionImpl, MLAAttentionImpl
from vllm_attn_compat.backends.buffers import validate_output_buffer
from vllm_attn_compat.backends.forward_context import register_layer
from vllm_attn_compat.backends.registry import get_backend


def view_heads(name: str, tensor: torch.Tensor, heads: int, size: int) -> torch.Tensor:
    """``tensor`` as ``[T, heads, size]``, from 2-D ``[T, heads * size]`` or 3-D input;
    a clear error naming ``name`` otherwise."""
    if tensor.dim() == 3 and list(tensor.shape[1:]) == [heads, size]:
        return tensor
    if tensor.dim() == 2 and tensor.shape[1] == heads * size:
        return tensor.view(-1, heads, size)
    raise ValueError(f"{name}: expected shape [T, {heads * size}] or [T, {heads}, {size}], got {list(tensor.shape)}")


class _AttentionLayerBase(torch.nn.Module):
    num_heads: int
    head_size_v: int
    attn_backend: type[AttentionBackend]

    def _register(
        self,
        prefix: str,
        attn_backend: str | type[AttentionBackend],
        registry: dict[str, torch.nn.Module] | None,
    ) -> None:
        self.layer_name = prefix
        self.attn_backend = get_backend(attn_backend)
        # Not a buffer: the cache is bound after construction and read inside the op only.
        self.kv_cache = torch.empty(0)
        register_layer(prefix, self, registry)

    def allocate_output(self, query: torch.Tensor) -> torch.Tensor:
        """The output buffer ``[T, num_heads, head_size_v]`` for ``query`` (uninitialised)."""
        return torch.empty([query.shape[0], self.num_heads, self.head_size_v], dtype=query.dtype, device=query.device)

    def validate_output(self, output: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """Check a caller's buffer against ``query``; returns its 3-D view."""
        return validate_output_buffer(
            output,
            num_tokens=query.shape[0],
            num_heads=self.num_heads,
            head_size_v=self.head_size_v,
            dtype=query.dtype,
            device=query.device,
        )

    def _output_for(self, query: torch.Tensor, output: torch.Tensor | None) -> torch.Tensor:
        return self.allocate_output(query) if output is None else self.validate_output(output, query)

    def _allocate_kv_cache(
        self, shape: tuple[int, ...], dtype: torch.dtype | None, device: torch.device | str | None
    ) -> torch.Tensor:
        self.kv_cache = torch.zeros(shape, dtype=dtype or torch.get_default_dtype(), device=device)
        return self.kv_cache


class Attention(_AttentionLayerBase):
    """Multi-head / grouped-query attention over a backend chosen by name (see `registry`).

    ``prefix`` is the layer name the ops use to find this layer; it is registered in
    ``static_forward_context`` (default: the process-wide `STATIC_FORWARD_CONTEXT`).
    ``extra_impl_args`` go to the backend's impl (e.g. ``out_transform`` for flex).
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        *,
        prefix: str,
        head_size_v: int | None = None,
        attn_backend: str | type[AttentionBackend] = "sdpa",
        static_forward_context: dict[str, torch.nn.Module] | None = None,
        **extra_impl_args: Any,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads: expected a positive divisor of num_heads={num_heads}, got {num_kv_heads}")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_size = head_size
        self.head_size_v = head_size if head_size_v is None else head_size_v
        self.scale = scale
        backend = get_backend(attn_backend)
        impl_cls = backend.get_impl_cls()
        if not issubclass(impl_cls, AttentionImpl):
            raise TypeError(
                f"attn_backend: expected a backend with an AttentionImpl, got {backend.get_name()!r} "
                f"whose impl is {impl_cls.__name__} (use MLAAttention for MLA backends)"
            )
        self.impl = impl_cls(num_heads, head_size, scale, num_kv_heads, self.head_size_v, **extra_impl_args)
        self._register(prefix, backend, static_forward_context)

    def allocate_kv_cache(
        self,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """Allocate (zeroed) and bind this layer's paged cache; returns it."""
        shape = self.attn_backend.get_kv_cache_shape(
            num_blocks, block_size, self.num_kv_heads, self.head_size, self.head_size_v
        )
        return self._allocate_kv_cache(shape, dtype, device)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        query = view_heads("query", query, self.num_heads, self.head_size)
        key = view_heads("key", key, self.num_kv_heads, self.head_size)
        value = view_heads("value", value, self.num_kv_heads, self.head_size_v)
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(
                f"key/value: expected {query.shape[0]} tokens like query, got key "
                f"{key.shape[0]} and value {value.shape[0]}"
            )
        output = self._output_for(query, output)
        torch.ops.vllm_attn_compat.unified_attention_with_output(query, key, value, output, self.layer_name)
        return output.view(-1, self.num_heads * self.head_size_v)


class MLAAttention(_AttentionLayerBase):
    """Multi-head latent attention (DeepSeek-style) with vLLM's argument names.

    The cache stores the latent ``kv_c_normed`` and ``k_pe`` per token
    (``[num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]``); ``kv_b_proj`` maps
    the latent to per-head ``k_nope`` and ``v`` (``[T, num_heads * (qk_nope + v_head_dim)]``).
    """

    def __init__(
        self,
        num_heads: int,
        scale: float,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        kv_lora_rank: int,
        kv_b_proj: torch.nn.Module | None = None,
        *,
        prefix: str,
        attn_backend: str | type[AttentionBackend] = "mla_reference",
        static_forward_context: dict[str, torch.nn.Module] | None = None,
        **extra_impl_args: Any,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, 1
        self.scale = scale
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.v_head_dim = self.head_size_v = v_head_dim
        self.kv_lora_rank = kv_lora_rank
        self.head_size = kv_lora_rank + qk_rope_head_dim  # what the cache holds per token
        self.kv_b_proj = kv_b_proj or torch.nn.Linear(
            kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False
        )
        backend = get_backend(attn_backend)
        impl_cls = backend.get_impl_cls()
        if not issubclass(impl_cls, MLAAttentionImpl):
            raise TypeError(
                f"attn_backend: expected a backend with an MLAAttentionImpl, got "
                f"{backend.get_name()!r} whose impl is {impl_cls.__name__}"
            )
        self.impl = impl_cls(**extra_impl_args)
        self._register(prefix, backend, static_forward_context)

    def allocate_kv_cache(
        self,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        shape = self.attn_backend.get_kv_cache_shape(
            num_blocks, block_size, 1, self.kv_lora_rank, self.qk_rope_head_dim
        )
        return self._allocate_kv_cache(shape, dtype, device)

    def forward(
        self,
        q: torch.Tensor,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q = view_heads("q", q, self.num_heads, self.qk_head_dim)
        k_pe = view_heads("k_pe", k_pe, 1, self.qk_rope_head_dim)
        if kv_c_normed.dim() != 2 or kv_c_normed.shape[1] != self.kv_lora_rank:
            raise ValueError(f"kv_c_normed: expected shape [T, {self.kv_lora_rank}], got {list(kv_c_normed.shape)}")
        if not q.shape[0] == kv_c_normed.shape[0] == k_pe.shape[0]:
            raise ValueError(
                f"kv_c_normed/k_pe: expected {q.shape[0]} tokens like q, got {kv_c_normed.shape[0]} and {k_pe.shape[0]}"
            )
        output = self._output_for(q, output)
        torch.ops.vllm_attn_compat.unified_mla_attention_with_output(q, kv_c_normed, k_pe, output, self.layer_name)
        return output.view(-1, self.num_heads * self.v_head_dim)

    def forward_impl(
        self,
        q: torch.Tensor,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: Any,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """What vLLM's MLA op body calls: the impl writes ``output``."""
        return self.impl.forward(
            self, q, kv_c_normed, k_pe, kv_cache, attn_metadata, output, output_scale, output_block_scale
        )
