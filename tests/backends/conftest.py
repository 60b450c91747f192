"""Fixtures for the backend tests: fresh layer names and layers, unregistered afterwards."""

from __future__ import annotations

import itertools
import math

import pytest

from vllm_attn_compat.backends import STATIC_FORWARD_CONTEXT, Attention

_names = itertools.count()


@pytest.fixture
def layer_name():
    """A fresh layer name, unregistered again after the test."""
    created = []

    def make(prefix="test.attn"):
        name = f"{prefix}.{next(_names)}"
        created.append(name)
        return name

    yield make
    for name in created:
        STATIC_FORWARD_CONTEXT.pop(name, None)


@pytest.fixture
def make_layer(layer_name):
    def make(num_heads=4, head_size=16, num_kv_heads=None, head_size_v=None, backend="sdpa", **kw):
        return Attention(
            num_heads,
            head_size,
            1 / math.sqrt(head_size),
            num_kv_heads,
            prefix=layer_name(),
            head_size_v=head_size_v,
            attn_backend=backend,
            **kw,
        )

    return make
