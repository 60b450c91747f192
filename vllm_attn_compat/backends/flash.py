"""flash-attn backend (optional extra ``flash``): the kernel writes straight into ``output``.

flash-attn 2.x's public ``flash_attn_varlen_func`` has no ``out=`` argument, and copying its
result would cost a device-to-device copy per layer (the second seed measured ~14 us). So
the call goes, in order of preference, to:

1. a public ``flash_attn_varlen_func`` that declares ``out`` (vLLM's fork, later releases);
2. the extension's ``varlen_fwd`` (``flash_attn_2_cuda``, flash-attn >= 2.6), whose fourth
   positional argument is the output tensor. This is a private, schema-less binding: the
   argument list below matches flash-attn 2.6-2.8 and is checked against the version.

Both paths cover packed prefill and decode from the paged cache (``block_table``). If the
kernel returns a tensor other than ``output`` (flash-attn 2 does for single-token GQA
decode batches), it is copied in, so the result is never lost. Without a CUDA device or
without flash-attn, constructing the backend raises `FlashUnavailableError` naming what is
missing. flash-attn needs fp16/bf16, ``head_size == head_size_v`` and a head
size divisible by 8 (others are padded and copied inside the kernel wrapper, so they are
refused here rather than silently copied); paged caches need a block size divisible by 256.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import Any

import torch

from vllm_attn_compat.backends.abstract import AttentionBackend, AttentionImpl, reject_output_quantization
from vllm_attn_compat.backends.metadata import AttentionMetadata
from vllm_attn_compat.backends.paged import write_kv

MIN_EXTENSION_VERSION = (2, 6)


class FlashUnavailableError(RuntimeError):
    """The flash backend cannot run here: no CUDA device, or flash-attn is not installed."""


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def load_flash_attn() -> tuple[Any, ModuleType | None]:
    """(``flash_attn_varlen_func`` if it takes ``out``, else None; the extension module or None).

    Raises `FlashUnavailableError` listing every missing piece.
    """
    missing = []
    if not torch.cuda.is_available():
        missing.append("a CUDA device (torch.cuda.is_available() is False)")
    try:
        flash_attn = importlib.import_module("flash_attn")
    except ImportError as exc:
        missing.append(f"the flash-attn package (pip install 'vllm-attn-compat[flash]'; {exc})")
        flash_attn = None
    if missing:
        found = "neither" if len(missing) > 1 else "none"
        raise FlashUnavailableError(f"flash backend: expected {' and '.join(missing)}, got {found}")
    public = getattr(flash_attn, "flash_attn_varlen_func", None)
    if public is not None and "out" in inspect.signature(public).parameters:
        return public, None
    version = getattr(flash_attn, "__version__", "0")
    if _version_tuple(version) < MIN_EXTENSION_VERSION:
        raise FlashUnavailableError(
            f"flash backend: expected flash-attn >= {'.'.join(map(str, MIN_EXTENSION_VERSION))} "
            f"(varlen_fwd with an out argument), got {version}"
        )
    try:
        return None, importlib.import_module("flash_attn_2_cuda")
    except ImportError as exc:
        raise FlashUnavailableError(
            f"flash backend: expected flash-attn's CUDA extension flash_attn_2_cuda, got ImportError: {exc}"
        ) from exc


class FlashAttentionImpl(AttentionImpl):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int, head_size_v: int) -> None:
        super().__init__(num_heads, head_size, scale, num_kv_heads, head_size_v)
        if head_size_v != head_size:
            raise ValueError(f"head_size_v: the flash backend expected {head_size} (= head_size), got {head_size_v}")
        if head_size % 8:
            raise ValueError(
                f"head_size: the flash backend expected a multiple of 8 (flash-attn pads other sizes "
                f"and copies the result), got {head_size}"
            )
        self._public, self._extension = load_flash_attn()

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
        """Have flash-attn write rows ``[:num_actual_tokens]`` of ``output`` itself (no copy)."""
        reject_output_quantization("flash", output_scale, output_block_scale)
        if query.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"query: the flash backend expected float16 or bfloat16, got {query.dtype}")
        md = attn_metadata
        md.check_fits(query.shape[0], kv_cache)
        n = md.num_actual_tokens
        if n == 0:
            return output
        paging = md.paging
        if paging is not None:
            if kv_cache is None or kv_cache.numel() == 0:
                raise ValueError(
                    "kv_cache: attn_metadata has a block table, expected an allocated paged cache, got an empty one"
                )
            if paging.block_size % 256:
                raise ValueError(
                    f"block_size: flash-attn's paged kernel expected a multiple of 256, got {paging.block_size}"
                )
            if key is not None and value is not None:  # None: the cache holds this step's tokens already
                write_kv(kv_cache, key, value, paging.slot_mapping)
            k, v = kv_cache[..., : self.head_size], kv_cache[..., self.head_size :]
            block_table, cu_seqlens_k = paging.block_table, _cumulative(md.seq_lens)
        else:
            if key is None or value is None:
                raise ValueError(
                    "key/value: without a paged cache the batch's keys and values must be passed, got None"
                )
            k, v, block_table, cu_seqlens_k = key[:n], value[:n], None, md.query_start_loc
        q, out = query[:n], output[:n]
        if self._extension is None:  # load_flash_attn found the public function taking `out`
            returned = self._public(
                q, k, v, cu_seqlens_q=md.query_start_loc, cu_seqlens_k=cu_seqlens_k,
                max_seqlen_q=md.max_query_len, max_seqlen_k=md.max_seq_len, softmax_scale=self.scale,
                causal=md.causal, block_table=block_table, out=out,
            )  # fmt: skip
        else:
            returned = self._extension.varlen_fwd(
                q, k, v, out, md.query_start_loc, cu_seqlens_k,
                None, None, block_table, None,  # seqused_k, leftpad_k, block_table, alibi_slopes
                md.max_query_len, md.max_seq_len, 0.0, self.scale,
                False, md.causal, -1, -1,  # zero_tensors, causal, window_size_left/right
                0.0, False, None,  # softcap, return_softmax, generator
            )  # fmt: skip
        _ensure_written(out, returned)
        return output


def _ensure_written(out: torch.Tensor, returned: object) -> None:
    """Copy only if the kernel computed somewhere else (the SGLang pattern). flash-attn 2's
    decode path for grouped-query attention (one query token, more query than kv heads)
    reshapes ``out`` into a temporary and returns that instead of writing the caller's buffer."""
    result = returned[0] if isinstance(returned, (tuple, list)) else returned
    if isinstance(result, torch.Tensor) and result.data_ptr() != out.data_ptr():
        out.copy_(result.reshape(out.shape))


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


class FlashAttentionBackend(AttentionBackend):
    supported_dtypes = (torch.float16, torch.bfloat16)

    @staticmethod
    def get_name() -> str:
        return "flash"

    @staticmethod
    def get_impl_cls() -> type[FlashAttentionImpl]:
        return FlashAttentionImpl
