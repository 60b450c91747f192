"""How the ops find their layer: registration, the context manager and its errors."""

from __future__ import annotations

import pytest
import torch

from vllm_attn_compat.backends import (
    STATIC_FORWARD_CONTEXT,
    AttentionMetadata,
    NoForwardContextError,
    UnknownLayerError,
    get_attention_context,
    get_forward_context,
    set_forward_context,
)

from backend_helpers import random_qkv

SENTINEL = 42.0


def test_layers_register_by_name_and_duplicates_are_refused(make_layer):
    layer = make_layer()
    assert STATIC_FORWARD_CONTEXT[layer.layer_name] is layer
    message = rf"layer_name: expected a name not yet registered, got duplicate '{layer.layer_name}'"
    with pytest.raises(ValueError, match=message):
        type(layer)(4, 16, 0.25, prefix=layer.layer_name)


def test_a_private_registry_keeps_layers_out_of_the_global_one(make_layer):
    registry: dict = {}
    layer = make_layer(static_forward_context=registry)
    assert registry == {layer.layer_name: layer} and layer.layer_name not in STATIC_FORWARD_CONTEXT
    q, k, v = random_qkv(layer, 2)
    md = AttentionMetadata.from_lengths([2])
    with set_forward_context({layer.layer_name: md}), pytest.raises(UnknownLayerError):
        layer(q, k, v)  # the default context draws from the global registry
    with set_forward_context({layer.layer_name: md}, registry):
        assert layer(q, k, v).shape == (2, 64)


def test_outside_a_context_the_op_fails_and_writes_nothing(make_layer):
    layer = make_layer()
    q, k, v = random_qkv(layer, 3)
    output = torch.full((3, 64), SENTINEL)
    with pytest.raises(NoForwardContextError, match="expected an attention op to run inside"):
        get_forward_context()
    with pytest.raises(NoForwardContextError):
        layer(q, k, v, output=output)
    assert torch.all(output == SENTINEL)


def test_unknown_layer_name_is_named_and_output_untouched(make_layer):
    layer = make_layer()
    q, k, v = random_qkv(layer, 3)
    output = torch.full((3, 4, 16), SENTINEL)
    with set_forward_context(AttentionMetadata.from_lengths([3])):
        message = r"layer_name: expected the name of a registered attention layer .* got 'no.such.layer'"
        with pytest.raises(UnknownLayerError, match=message):
            torch.ops.vllm_attn_compat.unified_attention_with_output(q, k, v, output, "no.such.layer")
    assert torch.all(output == SENTINEL)


def test_missing_metadata_entry_is_named(make_layer):
    layer, other = make_layer(), make_layer()
    q, k, v = random_qkv(layer, 3)
    output = torch.full((3, 64), SENTINEL)
    with set_forward_context({other.layer_name: AttentionMetadata.from_lengths([3])}):
        message = rf"attn_metadata: expected an entry for layer '{layer.layer_name}'"
        with pytest.raises(UnknownLayerError, match=message):
            layer(q, k, v, output=output)
    assert torch.all(output == SENTINEL)


def test_shared_metadata_and_nested_contexts(make_layer):
    layer = make_layer()
    outer, inner = AttentionMetadata.from_lengths([3]), AttentionMetadata.from_lengths([1, 2])
    with set_forward_context(outer):
        assert get_attention_context(layer.layer_name) == (outer, layer, layer.kv_cache)
        with set_forward_context({layer.layer_name: inner}):
            assert get_attention_context(layer.layer_name)[0] is inner
        assert get_forward_context().attn_metadata is outer
    with pytest.raises(NoForwardContextError):
        get_forward_context()
