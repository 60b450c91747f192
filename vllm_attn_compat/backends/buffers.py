"""Validation of caller-owned output buffers: the one check the layer makes before the op.

Backends trust what passes here, so every rule a backend relies on is checked once, with a
message naming the argument, what was expected and what was found.
"""

from __future__ import annotations

import torch


def validate_output_buffer(
    output: torch.Tensor,
    *,
    num_tokens: int,
    num_heads: int,
    head_size_v: int,
    dtype: torch.dtype,
    device: torch.device,
    name: str = "output",
) -> torch.Tensor:
    """Check a caller's buffer and return it as a ``[T, num_heads, head_size_v]`` view.

    Accepted: a strided tensor of shape ``[T, num_heads * head_size_v]`` or
    ``[T, num_heads, head_size_v]`` with the query's dtype and device, each token's heads
    packed together (a row may be a slice of a wider buffer), last dimension contiguous.
    """
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(output).__name__}")
    shape_3d = [num_tokens, num_heads, head_size_v]
    shape_2d = [num_tokens, num_heads * head_size_v]
    if list(output.shape) not in (shape_3d, shape_2d):
        raise ValueError(f"{name}: expected shape {shape_3d} or {shape_2d}, got {list(output.shape)}")
    if output.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} (the query's), got {output.dtype}")
    if output.device != device:
        raise ValueError(f"{name}: expected device {device} (the query's), got {output.device}")
    if output.layout != torch.strided:
        raise ValueError(f"{name}: expected layout torch.strided, got {output.layout}")
    if output.numel() and output.stride(-1) != 1:
        raise ValueError(
            f"{name}: expected a contiguous last dimension (stride 1), got strides {list(output.stride())}"
        )
    view = output if output.dim() == 3 else output.view(shape_3d)
    if num_tokens and num_heads > 1 and view.stride(1) != head_size_v:
        raise ValueError(
            f"{name}: expected the heads of each token packed together (head stride "
            f"{head_size_v}), got strides {list(view.stride())}"
        )
    return view
