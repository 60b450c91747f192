"""The literal prefilter: does a file contain one of many byte strings, at close to ``grep -F`` speed?

``token in source`` runs at memory speed, but once per token: twenty tokens cost twenty passes over
every file. Most tokens share substrings (``ttention`` is in ``vllm.v1.attention``,
``class AttentionImpl`` and ``unified_attention``), so the scan looks for a few such *anchors* first,
chosen so that every token contains one: a file without any anchor cannot contain any token. Only the
few files that hold an anchor are checked against the tokens themselves, so the answer is exact.
For whole identifiers (the class names of the hierarchy rounds), each occurrence of an anchor is
checked by looking up the identifier around it among the names.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable

from vllm_attn_compat.codemods.index.names import IDENTIFIER_BYTES as _IDENTIFIER_BYTES
from vllm_attn_compat.codemods.index.names import IDENTIFIER_PATTERN as IDENTIFIER_PATTERN
from vllm_attn_compat.codemods.index.names import NOT_AFTER_IDENTIFIER as NOT_AFTER_IDENTIFIER
from vllm_attn_compat.codemods.index.names import NOT_BEFORE_IDENTIFIER as NOT_BEFORE_IDENTIFIER
from vllm_attn_compat.codemods.index.names import starting_word as starting_word

# Long enough to be selective in ordinary code, short enough to be shared by related tokens.
ANCHOR_LENGTH = 8
# Identifiers (the class names of the hierarchy rounds) may share shorter anchors: a capitalized word
# such as ``Impl`` or ``Sdpa`` is rarer in code than a lowercase fragment, and each anchor costs a
# pass over every file, far more than checking its extra occurrences (on torch's sources, the legacy
# plugin's seven class names take 4 passes instead of 6).
WORD_ANCHOR_SHORTEST = 4


def _candidates(token: bytes, shortest: int, longest: int) -> set[bytes]:
    grams = {token}
    for length in range(shortest, longest + 1):
        grams.update(token[i : i + length] for i in range(len(token) - length + 1))
    return grams


def _preference(gram: bytes) -> tuple[int, int, bytes, bytes]:
    # Longer is rarer; so are capitals, digits and punctuation next to the lowercase of prose. The
    # last two keys break ties (the greatest gram first) and carry the gram itself.
    return -len(gram), -sum(not (97 <= byte <= 122) for byte in gram), bytes(255 - byte for byte in gram), gram


def choose_anchors(
    tokens: Iterable[bytes], length: int = ANCHOR_LENGTH, shortest: int | None = None
) -> tuple[bytes, ...]:
    """Few substrings such that each token contains at least one (greedy set cover).

    Candidates are each token's substrings of ``shortest`` (default: ``length``) to ``length`` bytes,
    and the token itself. The anchor covering the most tokens comes first; among equals the most
    selective (a token shared with no other is its own anchor). Past a few hundred tokens the choice
    would cost more than it saves: each token is then its own anchor.
    """
    uncovered = set(tokens)
    if len(uncovered) > 200:
        return tuple(sorted(uncovered))
    shortest = shortest or length
    holders: dict[bytes, set[bytes]] = {}  # candidate -> the tokens containing it
    for token in uncovered:
        for gram in _candidates(token, shortest, length):
            holders.setdefault(gram, set()).add(token)
    for token in uncovered:  # a whole token of another length than the grams may lie in other tokens
        if not shortest <= len(token) <= length:
            holders[token] = {other for other in uncovered if token in other}
    # Lazy greedy: a gram covers ever fewer tokens as others are chosen, so the count it was queued
    # with is an upper bound, and a gram whose count still holds when it comes first is the best.
    queue = [(-len(held), *_preference(gram)) for gram, held in holders.items()]
    heapq.heapify(queue)
    anchors: list[bytes] = []
    while uncovered:
        stale, length, rarity, order, gram = heapq.heappop(queue)
        count = len(holders[gram] & uncovered)
        if count == -stale:
            anchors.append(gram)
            uncovered -= holders[gram]
        elif count:
            heapq.heappush(queue, (-count, length, rarity, order, gram))
    return tuple(anchors)


# How many bytes of sources a scan looks for each token in before it chooses anchors. Choosing them costs about as
# much as looking for each of the prefilter's tokens in 100 KB of source more than for their anchors: a rerun after
# an edit asks its questions of the edited file alone.
PLAIN_BYTES = 64 * 1024

# Past this many occurrences of an anchor in one file, confirming each occurrence costs more than
# looking for each of the anchor's tokens in the whole file.
_OCCURRENCES_CHECKED = 32


class TokenScan:
    """A callable answering exactly ``any(token in source for token in tokens)``, faster.

    With ``whole_words``, the tokens are identifiers and count only as whole ones (see
    the tests' ``contains_word``): a class name found inside a longer name is no reference to that class.
    Choosing anchors costs milliseconds (a greedy cover of the tokens' substrings), more than looking for each
    token in a file or two: a scan looks for each token (each its own anchor) in its first `PLAIN_BYTES` of
    sources, and chooses anchors for the rest. With ``once``, it never does (a scan made for a file or two).
    """

    def __init__(self, tokens: Iterable[bytes], *, whole_words: bool = False, once: bool = False) -> None:
        self.tokens = tuple(dict.fromkeys(token for token in tokens if token))
        self.whole_words = whole_words
        if whole_words and not all(_IDENTIFIER_BYTES.issuperset(token) for token in self.tokens):
            raise ValueError(f"whole words must be identifiers, found {self.tokens!r}")
        self._plain_left = PLAIN_BYTES  # bytes to look through for each token before choosing anchors
        self._settled = once  # whether the anchors are chosen, or never will be
        self.groups: tuple[tuple[bytes, frozenset[bytes]], ...] = ()
        self._windows: list[tuple[re.Pattern[bytes], int, int] | None] = []
        if whole_words:  # (plain tokens are looked for as they are: `__call__`)
            self._group(self.tokens)

    def _group(self, anchors: Iterable[bytes]) -> None:
        # Each anchor with the tokens containing it: a hit on an anchor is confirmed by those alone.
        self.groups = tuple((anchor, frozenset(t for t in self.tokens if anchor in t)) for anchor in anchors)
        # One regular-expression search of the bytes around an anchor's occurrence confirms it (a token found
        # there is a token of the file), instead of a test per token. A token found at ``p`` first holds the
        # anchor at ``p + token.index(anchor)``, and every occurrence of the anchor is visited, so that window is
        # all there is to search. A whole word is found there with nothing of an identifier before it (the
        # search sees the bytes before the window), the longest first, and nothing after it (`_holds_word`).
        # Each is made the first time its anchor is found: a scan of a file or two meets a few.
        self._windows = [None] * len(self.groups)

    def _window(self, place: int) -> tuple[re.Pattern[bytes], int, int]:
        window = self._windows[place]
        if window is None:
            anchor, group = self.groups[place]
            pattern = b"|".join(re.escape(token) for token in sorted(group, key=lambda t: (-len(t), t)))
            window = self._windows[place] = (
                re.compile((NOT_AFTER_IDENTIFIER if self.whole_words else b"") + b"(?:" + pattern + b")"),
                max(token.index(anchor) for token in group),
                max(len(token) - token.index(anchor) for token in group),
            )
        return window

    def choose_anchors(self) -> TokenScan:
        """Choose the anchors now (a scan about to serve many sources), unless made ``once``; the scan itself."""
        if not self._settled:
            self._settled = True
            self._group(choose_anchors(self.tokens, shortest=WORD_ANCHOR_SHORTEST if self.whole_words else None))
        return self

    @property
    def anchors(self) -> tuple[bytes, ...]:
        """What the scan looks for first: its anchors, or its tokens while it looks for each."""
        return tuple(anchor for anchor, _ in self.groups) if self.groups else self.tokens

    def __call__(self, source: bytes) -> bool:
        if not self._settled:
            self._plain_left -= len(source)
            if self._plain_left < 0:
                self.choose_anchors()
        if self.whole_words:
            for place, (anchor, _) in enumerate(self.groups):
                at = source.find(anchor)
                if at != -1 and _holds_word(source, anchor, at, *self._window(place)):
                    return True
            return False
        if not self.groups:
            return any(token in source for token in self.tokens)
        for place, (anchor, tokens) in enumerate(self.groups):
            at = source.find(anchor)
            if at == -1:
                continue
            window, before, after = self._window(place)
            for _ in range(_OCCURRENCES_CHECKED):
                if window.search(source, max(at - before, 0), at + after):
                    return True
                at = source.find(anchor, at + 1)
                if at == -1:
                    break
            else:  # a common anchor in this file: look for the tokens themselves
                if any(token in source for token in tokens):
                    return True
        return False


def _holds_word(source: bytes, anchor: bytes, at: int, window: re.Pattern[bytes], before: int, after: int) -> bool:
    """Whether a word of ``window`` (all containing ``anchor``: `TokenScan`) stands in ``source`` as a whole
    identifier, looked for around each occurrence of the anchor. (Nothing of an identifier may follow it: checked
    here, the window ending where its longest word would.) ``at``: the anchor's first occurrence."""
    while at != -1:
        for found in window.finditer(source, max(at - before, 0), at + after):
            end = found.end()
            if end == len(source) or source[end] not in _IDENTIFIER_BYTES:
                return True
        at = source.find(anchor, at + 1)
    return False


class GuardedScan:
    """``TokenScan(plain)``, or for some group ``(required, tokens)`` one of ``required`` and one of ``tokens`` in
    the source (`migrate.prefilter_groups`): the group's many tokens are looked for only where its requirement is."""

    def __init__(self, plain: Iterable[bytes], groups: Iterable[tuple[tuple[bytes, ...], tuple[bytes, ...]]]) -> None:
        self.plain = TokenScan(plain)
        self.groups = tuple((required, TokenScan(tokens)) for required, tokens in groups)

    def __call__(self, source: bytes) -> bool:
        return self.plain(source) or any(
            any(token in source for token in required) and scan(source) for required, scan in self.groups
        )

    @staticmethod
    def terms(plain: Iterable[bytes], groups: Iterable[tuple[tuple[bytes, ...], tuple[bytes, ...]]]) -> list[bytes]:
        """What the scan's answer depends on, for its question's name (`reading.asking`)."""
        return [
            *plain,
            *(b"if " + b"|".join(required) + b" then " + token for required, tokens in groups for token in tokens),
        ]
