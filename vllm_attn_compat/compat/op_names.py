"""Old attention op names and their vLLM >= 0.20 replacements, for ``CompilationConfig.splitting_ops``.

vLLM matches ``splitting_ops`` entries by exact string, so a stale ``"vllm::unified_attention"`` is silently
ignored after the upgrade (no graph split at attention, no piecewise CUDA graphs). This module maps it to the
name that now exists. No torch import: the codemods may use the table too.
"""

from __future__ import annotations

from collections.abc import Iterable

RENAMED_OPS: dict[str, str] = {
    "vllm::unified_attention": "vllm::unified_attention_with_output",
    "vllm::unified_mla_attention": "vllm::unified_mla_attention_with_output",
    # The dotted spelling (as in torch.ops.vllm.<name>) is accepted by the same string match.
    "vllm.unified_attention": "vllm.unified_attention_with_output",
    "vllm.unified_mla_attention": "vllm.unified_mla_attention_with_output",
}

_REPLACEMENTS = frozenset(RENAMED_OPS.values())


def normalize_splitting_ops(ops: Iterable[str]) -> list[str]:
    """Replace exact old op names by their ``_with_output`` names, drop the duplicates this creates, keep order.

    Only whole names are renamed: ``"vllm::unified_attention_foo"`` or ``"myns::unified_attention"`` are kept as
    they are, as is everything that is not an old name (repeats of unrelated names included). A ``_with_output``
    name that occurs more than once keeps its first position.
    """
    if isinstance(ops, str):
        raise TypeError(f"splitting_ops must be a list of op names, not a single string; found {ops!r}")
    normalized: list[str] = []
    seen: set[str] = set()
    for op in ops:
        if not isinstance(op, str):
            raise TypeError(f"splitting_ops entries must be op-name strings like 'vllm::foo'; found {op!r}")
        new = RENAMED_OPS.get(op, op)
        if new in _REPLACEMENTS:
            if new in seen:
                continue
            seen.add(new)
        normalized.append(new)
    return normalized


def renamed_in(ops: Iterable[str]) -> list[str]:
    """The old names present in ``ops``, in order, each once (for reporting what was normalised)."""
    return list(dict.fromkeys(op for op in ops if op in RENAMED_OPS))
