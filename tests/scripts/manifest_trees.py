"""Three fake vLLM releases for the manifest script's tests, written as source trees (DIR/<version>/vllm/...):
each change the script must record happens once between them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from textwrap import dedent

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script():
    """scripts/attention_manifest.py as a module (it puts scripts/ on sys.path for its manifest_gen package)."""
    spec = importlib.util.spec_from_file_location("attention_manifest", SCRIPTS / "attention_manifest.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


BACKEND_OLD = '''
    from abc import ABC, abstractmethod
    from dataclasses import dataclass
    from enum import Enum

    import torch
    from typing_extensions import deprecated


    class AttentionType(str, Enum):
        DECODER = "decoder"


    class AttentionBackend(ABC):
        accept_output_buffer: bool = False

        @staticmethod
        @abstractmethod
        def get_name() -> str:
            raise NotImplementedError

        @staticmethod
        @abstractmethod
        def get_kv_cache_shape(num_blocks: int, block_size: int, cache_dtype_str: str = "auto") -> tuple[int, ...]:
            raise NotImplementedError

        @classmethod
        def get_required_kv_cache_layout(cls):
            return None

        @classmethod
        def validate_configuration(cls, head_size: int, dtype) -> list[str]:
            return []


    @dataclass
    class CommonAttentionMetadata:
        seq_lens: torch.Tensor
        query_start_loc_cpu: torch.Tensor

        # WARNING: Deprecated fields. Will be removed in a future release
        _seq_lens_cpu: torch.Tensor | None = None
        _old_cache: torch.Tensor | None = None

        num_reqs: int = 0

        @property
        @deprecated("""
        Prefer using device seq_lens directly.
        If a CPU copy is needed, use `seq_lens.cpu()` instead.
        """)
        def seq_lens_cpu(self) -> torch.Tensor:
            return self.seq_lens.cpu()

        @property
        def num_computed_tokens_cpu(self) -> torch.Tensor:
            warnings.warn(
                "num_computed_tokens_cpu is deprecated; derive it from query_start_loc_cpu", DeprecationWarning
            )
            return self.seq_lens

        def replace(self, **kwargs) -> "CommonAttentionMetadata":
            return self


    class SparseMLAAttentionImpl(ABC):
        @abstractmethod
        def forward_mqa(self, q, kv_cache, attn_metadata, layer): ...


    class AttentionMetadataBuilder(ABC):
        def build(self, common_prefix_len: int, common_attn_metadata, fast_build: bool = False):
            """Build the metadata.

            Args:
                common_prefix_len: the length of the common prefix.
                common_attn_metadata: the metadata.
            """
            raise NotImplementedError

        def build_for_drafting(self, common_attn_metadata, draft_index: int):
            return self.build(0, common_attn_metadata, fast_build=True)
'''

BACKEND_NEW = '''
    from abc import ABC, abstractmethod
    from dataclasses import dataclass
    from enum import Enum

    import torch


    class AttentionType(str, Enum):
        DECODER = "decoder"


    class AttentionBackend(ABC):
        @staticmethod
        @abstractmethod
        def get_name() -> str:
            raise NotImplementedError

        @staticmethod
        @abstractmethod
        def get_builder_cls():
            raise NotImplementedError

        @classmethod
        def supported_kv_cache_layouts(cls):
            return None

        @classmethod
        def validate_configuration(cls, head_size: int, dtype, use_mm_prefix: bool = False) -> list[str]:
            return []


    @dataclass
    class CommonAttentionMetadata:
        seq_lens: torch.Tensor
        query_start_loc_cpu: torch.Tensor
        num_reqs: int = 0

        def replace(self, **kwargs) -> "CommonAttentionMetadata":
            return self


    class AttentionMetadataBuilder(ABC):
        def build(self, common_prefix_len: int, common_attn_metadata, fast_build: bool = False):
            """Build the metadata.

            Args:
                common_prefix_len: Deprecated and always 0. Kept for
                    out-of-tree builders.
                common_attn_metadata: the metadata.
            """
            raise NotImplementedError

        def build_for_drafting(self, common_attn_metadata, draft_index: int):
            return self.build(0, common_attn_metadata, fast_build=True)
'''

LAYER_NEW = """
    from vllm.utils.torch_utils import direct_register_custom_op
    from vllm.v1.attention.backend import AttentionBackend


    class Attention:
        def __init__(self, num_heads: int, head_size: int, scale: float, *, prefix: str = ""):
            self.num_heads = num_heads

        def forward(self, query, key, value, output_shape=None):
            return torch.ops.vllm.unified_attention_with_output(query, key, value, output, "layer")


    class MLAAttention(Attention):
        pass


    def unified_attention_with_output(query, key, value, output, layer_name: str, output_scale=None) -> None:
        output.copy_(query)


    direct_register_custom_op(
        op_name="unified_attention_with_output",
        op_func=unified_attention_with_output,
        mutates_args=["output"],
    )
"""

# The old layer module also has the op without an output, registered positionally.
LAYER_OLD = (
    LAYER_NEW
    + """

    def unified_attention(query, key, value, layer_name: str):
        return query


    direct_register_custom_op("unified_attention", unified_attention, [])
"""
)

INIT = """
    from vllm.model_executor.layers.attention.attention import Attention, MLAAttention

    __all__ = ["Attention", "MLAAttention"]
"""

REGISTRY = """
    from enum import Enum


    class AttentionBackendEnum(Enum):
        FLASH_ATTN = "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"
        CPU_ATTN = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"
    {extra}
        CUSTOM = None


    def register_backend(backend, class_path: str | None = None):
        return backend
"""

# vLLM's own code outside the attention modules: what still uses the members.
RUNNER_OLD = """
    def step(backend, builder, metadata):
        shape = backend.get_kv_cache_shape(1, 16)
        layout = getattr(backend, "get_required_kv_cache_layout")()
        builder.build_for_drafting(metadata, 0)
        return metadata.seq_lens_cpu, metadata.num_computed_tokens_cpu, metadata._seq_lens_cpu, backend.get_name()
"""

RUNNER_NEW = """
    class DraftBuilder:
        def build_for_drafting(self, common_attn_metadata, draft_index):
            # An override calling its base is no use of the hook by vLLM.
            return super().build_for_drafting(common_attn_metadata, draft_index)


    def step(backend, builder, metadata):
        layout = backend.supported_kv_cache_layouts()
        return builder.build(0, metadata), backend.get_name(), backend.get_builder_cls()
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(dedent(text).lstrip("\n"), encoding="utf-8")


def write_releases(root: Path) -> Path:
    """0.40.0: the old interface. 0.41.0: the same sources plus one enum member (a release that changes
    little). 0.42.0: members and a class removed, a signature changed, an op gone, hooks no longer used, a module
    and a package of vLLM's attention packages gone."""
    common = {
        "vllm/__init__.py": "",
        "vllm/model_executor/layers/attention/__init__.py": INIT,
    }
    gone_in_0_42 = {
        "vllm/v1/attention/ops/dcp_alltoall.py": "",
        "vllm/v1/attention/ops/old_ops/__init__.py": "",
        "vllm/v1/attention/ops/old_ops/kernels.py": "",
    }
    _write(
        root / "0.40.0",
        {
            **common,
            **gone_in_0_42,
            "vllm/v1/attention/backend.py": BACKEND_OLD,
            "vllm/model_executor/layers/attention/attention.py": LAYER_OLD,
            "vllm/v1/attention/backends/registry.py": REGISTRY.format(extra=""),
            "vllm/v1/worker/runner.py": RUNNER_OLD,
        },
    )
    extra = '    TREE_ATTN = "vllm.v1.attention.backends.tree_attn.TreeAttentionBackend"'
    _write(
        root / "0.41.0",
        {
            **common,
            **gone_in_0_42,
            "vllm/v1/attention/backend.py": BACKEND_OLD,
            "vllm/model_executor/layers/attention/attention.py": LAYER_OLD,
            "vllm/v1/attention/backends/registry.py": REGISTRY.format(extra=extra),
            "vllm/v1/worker/runner.py": RUNNER_OLD,
        },
    )
    _write(
        root / "0.42.0",
        {
            **common,
            "vllm/v1/attention/backend.py": BACKEND_NEW,
            "vllm/model_executor/layers/attention/attention.py": LAYER_NEW,
            "vllm/v1/attention/backends/registry.py": REGISTRY.format(extra=extra),
            "vllm/v1/worker/runner.py": RUNNER_NEW,
        },
    )
    (root / "0.18.0" / "vllm").mkdir(parents=True)  # older than the manifest's first release: never read
    (root / "notes").mkdir()  # no release at all
    return root
