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


def write_tree(root: Path, layout: dict[str, str | bytes]) -> Path:
    for relative, content in layout.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(textwrap.dedent(content))
    return root
