"""Plugin trees in the shapes of real out-of-tree plugins (vllm-ascend, MetaX, ROCm ATOM, vllm-gaudi, tpu-inference,
vllm-rbln, Kunlun, vllm-gcu), written here: backends, metadata builders and metadata overriding hooks that later
vLLM releases removed or stopped calling, through bases in other files, backends vLLM uses by their shape alone,
classes that merely share a hook's name, and the projects' own copies of vLLM's classes.

Each line a release's rules must report ends with a marker: ``# VAC010 0.29.0`` (an override of a hook that release
removed or stopped calling, at its ``def``), ``# VAC011 0.26.0`` (an import of a name that release removed).
`expected` reads them back."""

from __future__ import annotations

import re

ASCEND = {
    "vllm_ascend/__init__.py": "",
    "vllm_ascend/attention/__init__.py": "",
    "vllm_ascend/attention/attention_v1.py": """
import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionMetadataBuilder, CommonAttentionMetadata


class AscendAttentionBackend(AttentionBackend):
    @staticmethod
    def get_name():
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return AscendAttentionBackendImpl

    @staticmethod
    def get_builder_cls():
        return AscendAttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):  # VAC010 0.29.0
        return (2, num_blocks, block_size, num_kv_heads, head_size)


class AscendAttentionMetadataBuilder(AttentionMetadataBuilder):
    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        return common_attn_metadata

    def build_for_drafting(self, common_attn_metadata, draft_index):  # VAC010 0.34.0
        return self.build(0, common_attn_metadata)


class AscendCommonAttentionMetadata(CommonAttentionMetadata):
    def unpadded(self, num_actual_tokens, num_actual_reqs):  # VAC010 0.34.0
        return self


class AscendAttentionBackendImpl:
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        return output.copy_(query)
""",
    "vllm_ascend/_310p/__init__.py": "",
    "vllm_ascend/_310p/attention_v1.py": """
from vllm_ascend.attention.attention_v1 import AscendAttentionBackend, AscendAttentionMetadataBuilder


class AscendAttentionBackend310(AscendAttentionBackend):
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):  # VAC010 0.29.0
        return (2, num_blocks, num_kv_heads * head_size // 16, block_size, 16)


class AscendAttentionMetadataBuilder310(AscendAttentionMetadataBuilder):
    def build_for_drafting(self, common_attn_metadata, draft_index):  # VAC010 0.34.0
        return super().build_for_drafting(common_attn_metadata, draft_index)
""",
}

METAX = {
    "vllm_metax/__init__.py": "",
    "vllm_metax/flashinfer.py": """
from vllm.v1.attention.backend import AttentionBackend, AttentionMetadataBuilder


class MacaFlashInferBackend(AttentionBackend):
    @staticmethod
    def get_name():
        return "FLASHINFER"

    @staticmethod
    def get_impl_cls():
        return object

    @staticmethod
    def get_builder_cls():
        return FlashInferMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):  # VAC010 0.29.0
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension=False):  # VAC010 0.29.0
        return (0, 1, 2, 3, 4)

    @classmethod
    def get_required_kv_cache_layout(cls):  # VAC010 0.29.0
        return "HND"


class FlashInferMetadataBuilder(AttentionMetadataBuilder):
    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        return common_attn_metadata

    def use_cascade_attention(self, *args, **kwargs):  # VAC010 0.32.0
        return False
""",
    "vllm_metax/mla/__init__.py": "",
    "vllm_metax/mla/flashmla_sparse.py": """
from vllm.v1.attention.backend import (
    AttentionBackend,
    SparseMLAAttentionImpl,  # VAC011 0.26.0
)


class MacaFlashMLASparseImpl(SparseMLAAttentionImpl):
    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        return q
""",
}

# A backend vLLM uses by its shape (no base class), and a builder deriving from vLLM's.
ATOM = {
    "atom/__init__.py": "",
    "atom/plugin/__init__.py": "",
    "atom/plugin/backend.py": """
import torch
from vllm.v1.attention.backend import MultipleOf


class AiterMhaBackendForVllm:
    supported_dtypes: list = [torch.float16, torch.bfloat16]

    @staticmethod
    def get_name():
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return object

    @classmethod
    def get_kv_cache_block_dim(cls, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):  # VAC010 0.29.0
        return 2

    @classmethod
    def indexes_kv_by_block_stride(cls):  # VAC010 0.29.0
        return False


class SparseIndexerBackend(AiterMhaBackendForVllm):
    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension=False):  # VAC010 0.29.0
        return (0, 1, 2)
""",
    "atom/plugin/metadata.py": """
from vllm.v1.attention.backend import AttentionMetadataBuilder


class AiterMhaMetadataBuilderForVllm(AttentionMetadataBuilder):
    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        return common_attn_metadata

    def build_for_drafting(self, common_attn_metadata, draft_index):  # VAC010 0.34.0
        return self.build(0, common_attn_metadata)
""",
}

# A backend deriving from vLLM's, and a helper class with the same hook name that derives from nothing.
GAUDI = {
    "vllm_gaudi/__init__.py": "",
    "vllm_gaudi/hpu_attn.py": """
from vllm.v1.attention.backend import AttentionBackend


class HPUPagedAttention:
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):
        return (num_blocks, block_size, num_kv_heads, head_size)


class HPUAttentionBackend(AttentionBackend):
    @staticmethod
    def get_name():
        return "HPU_ATTN"

    @staticmethod
    def get_impl_cls():
        return object

    @staticmethod
    def get_builder_cls():
        return object

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):  # VAC010 0.29.0
        return HPUPagedAttention.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)


class HPUMLAAttentionBackend(HPUAttentionBackend):
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):  # VAC010 0.29.0
        return (num_blocks * block_size, head_size)
""",
}

# A backend registered by a decorator, and the old module layout imported under a guard.
TPU = {
    "tpu_inference/__init__.py": "",
    "tpu_inference/flash_attn.py": """
from vllm.v1.attention.backend import AttentionBackend
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

try:
    from vllm.v1.attention.backend import SparseMLAAttentionImpl
except ImportError:
    SparseMLAAttentionImpl = None


@register_backend(AttentionBackendEnum.FLASH_ATTN)
class PallasAttentionBackend(AttentionBackend):
    @staticmethod
    def get_name():
        return "FLASH_ATTN"

    @staticmethod
    def get_impl_cls():
        return object

    @staticmethod
    def get_builder_cls():
        return object

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):  # VAC010 0.29.0
        return (num_blocks, block_size, num_kv_heads * 2, head_size)
""",
}

# An MLA backend deriving from vLLM's MLACommonBackend, as the layer module exports it.
RBLN = {
    "vllm_rbln/__init__.py": "",
    "vllm_rbln/flashattn_mla.py": """
from vllm.model_executor.layers.attention.mla_attention import MLACommonBackend, MLACommonMetadataBuilder


class RBLNFlashAttnMLABackend(MLACommonBackend):
    @staticmethod
    def get_name():
        return "RBLN_MLA"

    @staticmethod
    def get_impl_cls():
        return object

    @staticmethod
    def get_builder_cls():
        return RBLNMLAMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):  # VAC010 0.29.0
        return (num_blocks, block_size, head_size)


class RBLNMLAMetadataBuilder(MLACommonMetadataBuilder):
    def use_cascade_attention(self, *args, **kwargs):  # VAC010 0.32.0
        return False
""",
}

# The project's own copy of a vLLM class of the same name, deriving from vLLM's base; a builder deriving from none,
# which vLLM makes and calls as the backend's (`get_builder_cls`): its hooks die with vLLM's.
KUNLUN = {
    "vllm_kunlun/__init__.py": "",
    "vllm_kunlun/mla_common.py": """
from vllm.v1.attention.backend import AttentionBackend


class MLACommonBackend(AttentionBackend):
    @staticmethod
    def get_name():
        return "KUNLUN_MLA"

    @staticmethod
    def get_builder_cls():
        return KunlunAttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):  # VAC010 0.29.0
        return (num_blocks, block_size, head_size)


class KunlunAttentionMetadataBuilder:
    def build_for_drafting(self, common_attn_metadata, draft_index):  # VAC010 0.34.0
        return common_attn_metadata

    def use_cascade_attention(self, *args, **kwargs):  # VAC010 0.32.0
        return False
""",
    "vllm_kunlun/flashmla.py": """
from vllm_kunlun.mla_common import MLACommonBackend


class FlashMLABackend(MLACommonBackend):
    @staticmethod
    def get_impl_cls():
        return object
""",
}

GCU = {
    "vllm_gcu/__init__.py": "",
    "vllm_gcu/paged_attn.py": """
class PagedAttention:
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):
        return (2, num_blocks, block_size * num_kv_heads * head_size)
""",
    "vllm_gcu/xformers.py": """
from vllm.v1.attention.backend import AttentionBackend

from vllm_gcu.paged_attn import PagedAttention


class GCUXFormersBackend(AttentionBackend):
    @staticmethod
    def get_name():
        return "XFORMERS"

    @staticmethod
    def get_impl_cls():
        return object

    @staticmethod
    def get_builder_cls():
        return object

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):  # VAC010 0.29.0
        return PagedAttention.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)
""",
}

# A project whose attention classes derive from its own ABCs of vLLM's names, none of them vLLM's (vllm-omni's
# diffusion backends have this shape): nothing of vLLM's interface to keep.
OWN_ABCS = {
    "omni/__init__.py": "",
    "omni/abstract.py": """
import abc


class AttentionBackend(abc.ABC):
    @staticmethod
    @abc.abstractmethod
    def get_kv_cache_shape(num_blocks, block_size): ...


class AttentionMetadataBuilder(abc.ABC):
    def build_for_drafting(self, metadata, index):
        return metadata
""",
    "omni/sdpa.py": """
from vllm.logger import init_logger

from omni.abstract import AttentionBackend, AttentionMetadataBuilder

logger = init_logger(__name__)


class SDPABackend(AttentionBackend):
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size):
        return (num_blocks, block_size)


class SDPABuilder(AttentionMetadataBuilder):
    def build_for_drafting(self, metadata, index):
        return metadata

    def use_cascade_attention(self):
        return False
""",
}

PLUGINS = {
    "vllm-ascend": ASCEND,
    "MetaX": METAX,
    "ATOM": ATOM,
    "vllm-gaudi": GAUDI,
    "tpu-inference": TPU,
    "vllm-rbln": RBLN,
    "Kunlun": KUNLUN,
    "vllm-gcu": GCU,
}

_MARKER = re.compile(r"# (VAC01[01]) (\d+\.\d+\.\d+)$")


def expected(files: dict[str, str], release_key: tuple[object, ...], key: object) -> set[tuple[str, int, str]]:
    """(path, line, code) of each marked line whose release is at or before the target (``key`` orders them:
    `manifest.version_key`, ``release_key`` the target's)."""
    found = set()
    for path, text in files.items():
        for number, line in enumerate(text.lstrip("\n").splitlines(), start=1):
            match = _MARKER.search(line)
            if match and key(match.group(2)) <= release_key:  # type: ignore[operator]
                found.add((path, number, match.group(1)))
    return found
