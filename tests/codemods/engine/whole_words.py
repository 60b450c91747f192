"""Whole-identifier occurrence, written plainly: the definition `engine.scan.TokenScan` (``whole_words``) is tested
against. Shared by the scan's tests."""

from __future__ import annotations

from vllm_attn_compat.codemods.index.names import IDENTIFIER_BYTES as _IDENTIFIER_BYTES


def contains_word(source: bytes, word: bytes) -> bool:
    """Whether ``word`` occurs in ``source`` as a whole identifier: ``SdpaBackend``, not ``setSdpaBackends``.

    The definition :class:`TokenScan` answers faster with ``whole_words``."""
    start = source.find(word)
    while start != -1:
        end = start + len(word)
        if (start == 0 or source[start - 1] not in _IDENTIFIER_BYTES) and (
            end == len(source) or source[end] not in _IDENTIFIER_BYTES
        ):
            return True
        start = source.find(word, start + 1)
    return False
