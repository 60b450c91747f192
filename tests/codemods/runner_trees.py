"""Real plugin files on disk for the runner and CLI tests (the rules themselves are tested in rules/).

A uniquely named module rather than ``conftest``: several test folders have a conftest.py, and
``from conftest import ...`` would pick whichever was imported first.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

BASE = """\
from vllm.v1.attention.backend import AttentionImpl


class PluginImplBase(AttentionImpl):
    def __init__(self, num_heads, head_size, scale):
        self.scale = scale
"""

# Derives from vLLM only through PluginImplBase, defined in another file.
IMPL = """\
from plugin.base import PluginImplBase


class MyImpl(PluginImplBase):
    def forward(self, layer, query, key, value, cache, metadata, output, output_scale=None, output_block_scale=None):
        # the buffer comes from the layer
        assert output is not None, "Output tensor must be provided."

        output.copy_(query)
        return output
"""

IMPL_MIGRATED = """\
from plugin.base import PluginImplBase


class MyImpl(PluginImplBase):
    def forward(self, layer, query, key, value, cache, metadata, output, output_scale=None, output_block_scale=None):
        # the buffer comes from the layer
        output.copy_(query)
        return output
"""

# A finding no fix can resolve: a person has to simplify the condition.
MANUAL = """\
from vllm.v1.attention.backend import AttentionImpl


class OtherImpl(AttentionImpl):
    def forward(self, layer, query, key, value, cache, metadata, output, output_scale=None, output_block_scale=None):
        assert output is not None and output.is_contiguous()
        output.copy_(query)

    def __init__(self, *args, **kwargs):
        pass
"""

UNRELATED = """\
def helper(output):
    assert output is not None
    return output
"""


# vllm-mlx's shape: a platform names a backend by its dotted path, in a module that never imports vLLM, whose impl
# derives from nothing and returns a new tensor.
PLATFORM = """\
from vllm.platforms.interface import Platform


class MyPlatform(Platform):
    @classmethod
    def get_attn_backend_cls(cls, selected_backend, head_size, dtype, *args, **kwargs):
        return "plugin.attention.PlainBackend"
"""
PLAIN_BACKEND = """\
class PlainBackend:
    @staticmethod
    def get_name():
        return "PLAIN"

    @staticmethod
    def get_impl_cls():
        return PlainImpl

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):
        return (num_blocks, block_size, num_kv_heads, head_size)


class PlainImpl:
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output):
        return query * 2
"""


def write_tree(root: Path, layout: dict[str, str | bytes]) -> Path:
    for relative, content in layout.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(textwrap.dedent(content))
    return root
