"""The forward context: how an attention op finds its layer and metadata by name.

Like vLLM, layers register themselves by name at construction in a static registry
(`STATIC_FORWARD_CONTEXT`, vLLM's ``compilation_config.static_forward_context``); a model
runner wraps each step in `set_forward_context`, and the op bodies call
`get_attention_context(layer_name)`. Layer names travel into compiled graphs as plain
strings, so the ops stay opaque to torch.compile while the layers stay Python objects.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch

#: Process-wide registry of attention layers by name; `Attention` registers here by default.
STATIC_FORWARD_CONTEXT: dict[str, torch.nn.Module] = {}


class UnknownLayerError(LookupError):
    """An op was called with a layer name that the forward context does not hold."""


class NoForwardContextError(RuntimeError):
    """An attention op ran outside `set_forward_context`."""


@dataclasses.dataclass
class ForwardContext:
    no_compile_layers: Mapping[str, torch.nn.Module]
    # One metadata object per layer name, or one object that every layer shares.
    attn_metadata: Mapping[str, Any] | Any


_current: ForwardContext | None = None


def register_layer(layer_name: str, layer: torch.nn.Module, registry: dict[str, torch.nn.Module] | None = None) -> None:
    """Add ``layer`` under ``layer_name``; a duplicate name is an error, as in vLLM."""
    registry = STATIC_FORWARD_CONTEXT if registry is None else registry
    if not isinstance(layer_name, str) or not layer_name:
        raise ValueError(f"layer_name: expected a non-empty str, got {layer_name!r}")
    if layer_name in registry and registry[layer_name] is not layer:
        raise ValueError(
            f"layer_name: expected a name not yet registered, got duplicate {layer_name!r} "
            "(give each attention layer a unique prefix, or unregister_layer() the old one)"
        )
    registry[layer_name] = layer


def unregister_layer(layer_name: str, registry: dict[str, torch.nn.Module] | None = None) -> None:
    (STATIC_FORWARD_CONTEXT if registry is None else registry).pop(layer_name, None)


@contextlib.contextmanager
def set_forward_context(
    attn_metadata: Mapping[str, Any] | Any,
    static_forward_context: Mapping[str, torch.nn.Module] | None = None,
) -> Iterator[ForwardContext]:
    """Make ``attn_metadata`` (by layer name, or one shared object) and the registered layers
    visible to the attention ops for the duration of the block. Contexts nest."""
    global _current
    layers = STATIC_FORWARD_CONTEXT if static_forward_context is None else static_forward_context
    previous, _current = _current, ForwardContext(layers, attn_metadata)
    try:
        yield _current
    finally:
        _current = previous


def get_forward_context() -> ForwardContext:
    if _current is None:
        raise NoForwardContextError(
            "forward context: expected an attention op to run inside "
            "`with set_forward_context(attn_metadata):`, got a call outside one"
        )
    return _current


def get_attention_context(layer_name: str) -> tuple[Any, Any, torch.Tensor]:
    """(attn_metadata, layer, kv_cache) for ``layer_name``, as vLLM's op bodies look them up.

    The layer is typed ``Any``: it is whatever module registered the name (this package's layers,
    or vLLM's through the compat route), and the op bodies call what their kind of layer has."""
    context = get_forward_context()
    layer = context.no_compile_layers.get(layer_name)
    if layer is None:
        known = sorted(context.no_compile_layers)
        shown = known[:8] + (["..."] if len(known) > 8 else [])
        raise UnknownLayerError(
            f"layer_name: expected the name of a registered attention layer "
            f"({len(known)} known: {shown}), got {layer_name!r}"
        )
    metadata = context.attn_metadata
    if isinstance(metadata, Mapping):
        if layer_name not in metadata:
            raise UnknownLayerError(
                f"attn_metadata: expected an entry for layer {layer_name!r}, got entries for {sorted(metadata)[:8]}"
            )
        metadata = metadata[layer_name]
    if metadata is None:
        raise ValueError(f"attn_metadata: expected metadata for layer {layer_name!r}, got None")
    kv_cache = layer.kv_cache
    if not isinstance(kv_cache, torch.Tensor):
        raise TypeError(f"layer {layer_name!r}: expected kv_cache to be a torch.Tensor, got {type(kv_cache).__name__}")
    return metadata, layer, kv_cache
