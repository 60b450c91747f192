"""vLLM's attention interface, release by release, from 0.19.0 to the newest release the registries held when
the data was generated (``releases()``).

The data, ``attention_api.json``, is generated from the released wheels by ``scripts/attention_manifest.py``
(sources read with ``ast``, nothing of vLLM imported) and covers ``vllm/v1/attention/backend.py``, the layers of
``vllm/model_executor/layers/attention/``, the ops those modules register, and the backend registry
(``vllm/v1/attention/backends/registry.py``). It is read on first use; this package imports nothing else of
vllm-attn-compat, no torch and no libcst, so the CLI and the runtime half both use it.

Typical questions::

    from vllm_attn_compat import manifest

    release = manifest.resolve("0.34")                                   # "0.34.0"
    backend = "vllm.v1.attention.backend.AttentionBackend"
    manifest.dead_hooks(release, backend)["get_kv_cache_shape"]          # removed in 0.29.0, successor ...
    manifest.abstract_members(release, backend)                          # {"get_name", ...}
    manifest.history(backend, "get_required_kv_cache_layout").successor  # supported_kv_cache_layouts
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .releases import UnknownRelease, newest, releases, resolve, version_key

if TYPE_CHECKING:
    from .query import (
        abstract_members,
        class_info,
        classes,
        dead_hooks,
        find_class,
        forwardable_members,
        functions,
        history,
        member,
        members,
        module_names,
        modules,
        mro,
        name_history,
        ops,
        own_members,
        removed_between,
        signature,
    )
    from .types import (
        ClassInfo,
        DeadHook,
        Drift,
        Member,
        MemberHistory,
        Op,
        Parameter,
        Removal,
        Signature,
        Successor,
        incompatibilities,
    )

__all__ = [
    "ClassInfo",
    "DeadHook",
    "Drift",
    "Member",
    "MemberHistory",
    "Op",
    "Parameter",
    "Removal",
    "Signature",
    "Successor",
    "UnknownRelease",
    "abstract_members",
    "class_info",
    "classes",
    "dead_hooks",
    "find_class",
    "forwardable_members",
    "functions",
    "history",
    "incompatibilities",
    "member",
    "members",
    "module_names",
    "modules",
    "mro",
    "name_history",
    "newest",
    "ops",
    "own_members",
    "releases",
    "removed_between",
    "resolve",
    "signature",
    "version_key",
]


def __getattr__(name: str) -> Any:
    """The queries and their types, imported on first use: resolving a release reads releases.txt alone, and the
    queries load the JSON data when first asked."""
    if name in __all__:
        for module in ("query", "types"):
            value = getattr(importlib.import_module(f"{__name__}.{module}"), name, None)
            if value is not None:
                globals()[name] = value
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
