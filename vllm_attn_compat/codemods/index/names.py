"""vLLM's attention modules and base-class names, and how a file's path maps to its dotted module name: what
the index's modules all go by (a module of its own, so that none of them imports another for it)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from functools import lru_cache

# Module prefixes (dotted) where vLLM defines its attention base classes, old and new layouts.
VLLM_ATTENTION_MODULES = (
    "vllm.v1.attention",
    "vllm.attention",
    "vllm.model_executor.layers.attention",
    "vllm.model_executor.layers.attention_layer_base",
)
VLLM_BASE_NAMES = frozenset(
    {
        "AttentionBackend",
        "AttentionImpl",
        "AttentionImplBase",
        "MLAAttentionImpl",
        "AttentionLayer",
        "AttentionLayerBase",
        "Attention",
        "MLAAttention",
    }
)
# The plain names of the classes of vLLM's attention interface in any release the manifest holds
# (`manifest.interface.resolve_class`): a class deriving from one has that release's interface to keep
# (`interface`), so the class scan has its file parsed. A copy of the manifest's names, which the class scan reads
# without the manifest's data; tests/codemods/index/test_interface.py holds it to the data.
VLLM_INTERFACE_NAMES = frozenset(
    {
        "Attention",
        "AttentionBackend",
        "AttentionBackendEnum",
        "AttentionCGSupport",
        "AttentionImpl",
        "AttentionImplBase",
        "AttentionLayer",
        "AttentionMetadata",
        "AttentionMetadataBuilder",
        "AttentionType",
        "ChunkedLocalAttention",
        "CommonAttentionMetadata",
        "CrossAttention",
        "CudnnPrefillMetadata",
        "EncoderOnlyAttention",
        "FlashInferPrefillMetadata",
        "MLAAttention",
        "MLAAttentionImpl",
        "MLACommonBackend",
        "MLACommonBaseImpl",
        "MLACommonDecodeMetadata",
        "MLACommonImpl",
        "MLACommonMetadata",
        "MLACommonMetadataBuilder",
        "MLACommonPrefillMetadata",
        "MLADims",
        "MMEncoderAttention",
        "MambaAttentionBackendEnum",
        "MultipleOf",
        "PrefillPrefixLMAttention",
        "QueryLenSupport",
        "RSWAAttention",
        "SharedTopkIndicesBuffer",
        "SparseMLAAttentionImpl",
        "SparseMLACommonImpl",
        "SparseMLACommonMetadata",
        "SparseMLACommonMetadataBuilder",
        "SparseMLAPrefillMetadata",
        "StaticSinkAttention",
        "_AttentionBackendEnumMeta",
        "_ContextChunkPlan",
        "_DecodeConcatQuantFP8",
    }
)
# vLLM's attention layers among those bases: a model calls a layer as ``layer(q, k, v)``, so vLLM never passes
# ``output`` to a layer's ``forward`` (the layer allocates it; `hierarchy.ClassHierarchy.is_layer_class`).
VLLM_LAYER_NAMES = frozenset({"AttentionLayer", "AttentionLayerBase", "Attention", "MLAAttention"})
# vLLM's in-tree backends (FlashAttentionBackend, MLACommonImpl, ...) are attention classes
# too; a plugin deriving from them is found by these suffixes on names from the modules above.
IN_TREE_SUFFIXES = ("Backend", "Impl")

# A file defining an attention class either imports from a vLLM attention module (its text
# then contains one of these), defines vLLM's own bases (a fork of vLLM), or derives from an
# attention class of the run, whose names the runner adds as tokens
# (`ClassHierarchy.attention_class_names`).
# The attribute vLLM 0.20 removed from attention backends (`flags` indexes its reads and declarations).
FLAG = "accept_output_buffer"
FLAG_BYTES = FLAG.encode()

BASE_TOKENS: tuple[bytes, ...] = (
    b"vllm.v1.attention",
    b"vllm.attention",
    b"vllm.model_executor.layers.attention",
    b"import attention",
    b"class AttentionBackend",
    b"class AttentionImpl",
    b"class MLAAttentionImpl",
    b"class AttentionLayer",
    b"class Attention(",
    b"class MLAAttention(",
)


def normalize_path(path: str) -> str:
    return path if path == "-" else os.path.normpath(os.path.abspath(path))


def shown_path(path: str) -> str:
    """``path`` as messages show it: relative to the working directory when it is below it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return path if relative.startswith("..") else relative


@lru_cache(maxsize=4096)
def guess_module_name(path: str) -> str:
    """``pkg/sub/mod.py`` -> ``pkg.sub.mod``, walking up while folders hold an ``__init__.py``."""
    if path == "-":
        return "__stdin__"
    head, name = os.path.split(normalize_path(path))
    stem = name.rsplit(".", 1)[0]
    parts = _package_parts(head) + (() if stem == "__init__" else (stem,))
    return ".".join(parts) or stem


def forget_folders() -> None:
    """Forget the module names guessed and which folders are packages, as a process of its own knows none: each
    run asks the file system afresh (an earlier run in this process may have seen other files, or guessed from
    another working directory: `guess_module_name` keeps a path as given)."""
    guess_module_name.cache_clear()
    _package_parts.cache_clear()


@lru_cache(maxsize=4096)
def _package_parts(folder: str) -> tuple[str, ...]:
    """The names of the packages ``folder`` is in, outermost first, itself last: each folder holding an
    ``__init__.py``, up to the first that does not. Asked once per folder (a run's files share them)."""
    if not folder or not os.path.isfile(os.path.join(folder, "__init__.py")):
        return ()
    parent, name = os.path.split(folder)
    return ("",) if not name else (*_package_parts(parent), name)


def names_match(reference: str, defined: str) -> bool:
    """Whether the dotted name ``reference`` may name ``defined``: module names guessed from paths may lack their
    package prefix (no __init__.py, src layouts), so a reference matches a name it ends with, or vice versa."""
    return reference == defined or defined.endswith("." + reference) or reference.endswith("." + defined)


class RunModules:
    """The module names of a run's files, asked by dotted name (`names_match`, in time of the name's length)."""

    def __init__(self, modules: Iterable[str], stores: Iterable[str] = ()) -> None:
        """``stores``: the dotted names of the attributes the run's code assigns (`occurrences.Occurrences.stores`),
        asked as ``dotted in modules.stores``."""
        self.names = frozenset(modules)
        self.stores: RunModules | frozenset[str] = RunModules(stores) if stores else frozenset()
        self._suffixes = _suffixes(self.names)
        self._known: dict[str, bool] = {}

    def __contains__(self, dotted: object) -> bool:
        """Whether ``dotted`` may name one of the modules (`names_match`)."""
        if not isinstance(dotted, str):
            return False
        known = self._known.get(dotted)
        if known is None:
            parts = dotted.split(".")
            tails = (".".join(parts[i:]) for i in range(len(parts)))
            known = self._known[dotted] = dotted in self._suffixes or any(tail in self.names for tail in tails)
        return known

    def ends_with(self, dotted: str) -> bool:
        """Whether one of the modules is ``dotted`` or ends with it (``b.c`` for ``a.b.c``)."""
        return dotted in self._suffixes

    def holds(self, dotted: str) -> bool:
        """Whether ``dotted`` may name something defined in one of the modules (a module names its prefix)."""
        owner = dotted.rpartition(".")[0]
        while owner:
            if owner in self:
                return True
            owner = owner.rpartition(".")[0]
        return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


@lru_cache(maxsize=8)
def _suffixes(names: frozenset[str]) -> frozenset[str]:
    """Every module name's dotted suffixes (``b.c`` and ``c`` for ``a.b.c``): a reference a module ends with. Made once
    per set of names: the rounds build a hierarchy, and ask this, after each round, of the same run's modules."""
    return frozenset(name.split(".", i)[i] for name in names for i in range(name.count(".") + 1))


def may_define(module: str, dotted: str) -> bool:
    """Whether the module named ``module`` may be where the class ``dotted`` is defined (a guessed module name may
    lack its package prefix: `names_match`)."""
    owner = dotted.rpartition(".")[0]
    return bool(owner) and names_match(owner, module)


def is_vllm_base(dotted: str) -> bool:
    """True for vLLM's attention base classes (and in-tree backends) by their full dotted name."""
    module, _, name = dotted.rpartition(".")
    if not any(module == prefix or module.startswith(prefix + ".") for prefix in VLLM_ATTENTION_MODULES):
        return False
    return name in VLLM_BASE_NAMES or name.endswith(IN_TREE_SUFFIXES)


# Bytes that can continue a Python identifier (non-ASCII too: identifiers may be Unicode): what the text scans
# check around a name to know it is a whole identifier.
IDENTIFIER_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") | frozenset(
    range(128, 256)
)
# The same in the text scans' regular expressions: a whole identifier, and the look-arounds that keep a match from
# starting or ending inside one.
IDENTIFIER_PATTERN = rb"[A-Za-z_\x80-\xff][A-Za-z0-9_\x80-\xff]*"
NOT_AFTER_IDENTIFIER = rb"(?<![A-Za-z0-9_\x80-\xff])"
NOT_BEFORE_IDENTIFIER = rb"(?![A-Za-z0-9_\x80-\xff])"


def starting_word(word: bytes) -> bytes:
    """A pattern of ``word`` where nothing of an identifier comes before it, as ``NOT_AFTER_IDENTIFIER + word`` but
    starting with the word itself: `re` then looks for the literal at memory speed instead of trying its pattern at
    every byte (a tenth of the time over a file)."""
    return word + rb"(?<![A-Za-z0-9_\x80-\xff]" + word + rb")"


# torch's allocation calls: an `if output is None: output = torch.empty(...)` fallback allocates with one of
# them (VAC003 deletes such a fallback; the call-site analysis names the allocation to pass instead).
ALLOCATORS = frozenset(
    {
        "empty",
        "zeros",
        "ones",
        "full",
        "empty_like",
        "zeros_like",
        "ones_like",
        "full_like",
        "empty_strided",
        "new_empty",
        "new_zeros",
        "new_ones",
        "new_full",
    }
)


def named_as_base(name: str) -> bool:
    """Whether a class's plain name says it is a base that subclasses complete (``PluginImplBase``, ``BaseImpl``,
    ``AbstractImpl``, ``CacheMixin``): VAC013 does not take such a class for a concrete one, nor does the manifest
    generator take vLLM's own (scripts/manifest_gen/left_out.py)."""
    bare = name.lstrip("_")
    return bare.startswith(("Base", "Abstract")) or bare.endswith(("Base", "Mixin"))
