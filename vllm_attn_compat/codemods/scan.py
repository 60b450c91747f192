"""The literal prefilter: does a file contain one of many byte strings, at close to ``grep -F`` speed?

``token in source`` runs at memory speed, but once per token: twenty tokens cost twenty passes over
every file. Most tokens share substrings (``ttention`` is in ``vllm.v1.attention``,
``class AttentionImpl`` and ``unified_attention``), so the scan looks for a few such *anchors* first,
chosen so that every token contains one: a file without any anchor cannot contain any token. Only the
few files that hold an anchor are checked against the tokens themselves, so the answer is exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Long enough to be selective in ordinary code, short enough to be shared by related tokens.
ANCHOR_LENGTH = 8


def _candidates(token: bytes, length: int) -> set[bytes]:
    return {token} | {token[i : i + length] for i in range(len(token) - length + 1)}


def _selectivity(gram: bytes) -> tuple[int, int]:
    # Longer is rarer; so are capitals, digits and punctuation next to the lowercase of prose.
    return len(gram), sum(not (97 <= byte <= 122) for byte in gram)


def choose_anchors(tokens: Iterable[bytes], length: int = ANCHOR_LENGTH) -> tuple[bytes, ...]:
    """Few substrings such that each token contains at least one (greedy set cover).

    Candidates are each token's ``length``-grams and the token itself. The anchor covering the
    most tokens comes first; among equals the most selective (a token shared with no other is its
    own anchor). Past a few hundred tokens the choice would cost more than it saves: each token is
    then its own anchor.
    """
    uncovered = set(tokens)
    if len(uncovered) > 200:
        return tuple(sorted(uncovered))
    candidates = {gram for token in uncovered for gram in _candidates(token, length)}
    anchors: list[bytes] = []
    while uncovered:
        covers = {gram: sum(gram in token for token in uncovered) for gram in candidates}
        best = max(covers, key=lambda gram: (covers[gram], *_selectivity(gram), gram))  # deterministic
        anchors.append(best)
        uncovered = {token for token in uncovered if best not in token}
        candidates = {gram for gram in candidates if covers[gram]}
    return tuple(anchors)


# Bytes that can continue a Python identifier (non-ASCII too: identifiers may be Unicode).
_IDENTIFIER_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") | frozenset(
    range(128, 256)
)


def contains_word(source: bytes, word: bytes) -> bool:
    """Whether ``word`` occurs in ``source`` as a whole identifier: ``SdpaBackend``, not ``setSdpaBackends``."""
    start = source.find(word)
    while start != -1:
        end = start + len(word)
        if (start == 0 or source[start - 1] not in _IDENTIFIER_BYTES) and (
            end == len(source) or source[end] not in _IDENTIFIER_BYTES
        ):
            return True
        start = source.find(word, start + 1)
    return False


# Past this many occurrences of an anchor in one file, confirming each occurrence costs more than
# looking for each of the anchor's tokens in the whole file.
_OCCURRENCES_CHECKED = 32


def _word_at(source: bytes, start: int, end: int) -> bool:
    return (start == 0 or source[start - 1] not in _IDENTIFIER_BYTES) and (
        end == len(source) or source[end] not in _IDENTIFIER_BYTES
    )


class TokenScan:
    """A callable answering exactly ``any(token in source for token in tokens)``, faster.

    With ``whole_words``, a token counts only as a whole identifier (see :func:`contains_word`): a
    class name found inside a longer name is no reference to that class.
    """

    def __init__(self, tokens: Iterable[bytes], *, whole_words: bool = False) -> None:
        self.tokens = tuple(dict.fromkeys(token for token in tokens if token))
        self.whole_words = whole_words
        anchors = choose_anchors(self.tokens)
        # Each anchor with the tokens containing it: a hit on an anchor is confirmed by those alone.
        self.groups = tuple((anchor, tuple(t for t in self.tokens if anchor in t)) for anchor in anchors)
        # Where the anchor first stands in each of its tokens: a token found at ``p`` puts the anchor at
        # ``p + offset``, so the anchor's occurrences are the only places a token can start from.
        self._placed = tuple(
            (anchor, tuple((token, token.index(anchor)) for token in group)) for anchor, group in self.groups
        )
        # Without whole words, one regular-expression search of the bytes around an anchor's occurrence
        # confirms it (any token found there is a token of the file), instead of a test per token.
        self._windows = tuple(
            (
                re.compile(b"|".join(re.escape(token) for token, _ in placed)),
                max(offset for _, offset in placed),
                max(len(token) - offset for token, offset in placed),
            )
            for _, placed in self._placed
        )

    @property
    def anchors(self) -> tuple[bytes, ...]:
        return tuple(anchor for anchor, _ in self.groups)

    def __call__(self, source: bytes) -> bool:
        for (anchor, tokens), (_, placed), (window, before, after) in zip(self.groups, self._placed, self._windows):
            at = source.find(anchor)
            if at == -1:
                continue
            for _ in range(_OCCURRENCES_CHECKED):
                if not self.whole_words:
                    if window.search(source, max(at - before, 0), at + after):
                        return True
                else:
                    for token, offset in placed:
                        start = at - offset
                        end = start + len(token)
                        if start >= 0 and source.startswith(token, start) and _word_at(source, start, end):
                            return True
                at = source.find(anchor, at + 1)
                if at == -1:
                    break
            else:  # a common anchor in this file: look for the tokens themselves
                if self.whole_words:
                    if any(contains_word(source, token) for token in tokens):
                        return True
                elif any(token in source for token in tokens):
                    return True
        return False
