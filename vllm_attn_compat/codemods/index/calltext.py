"""Reading calls in a file's bytes without parsing it: the text between a call's brackets, and whether the file
may use a name (`may_use`): what the class scan (`classscan`) reads calls with, and what the runner asks of files
for the accounting of the names the safe fixes change (`run.scans`, `accounting`).

Light on purpose: a rerun that asks an edited file whether it may use a method imports this, not the index.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from vllm_attn_compat.codemods.index.names import IDENTIFIER_BYTES, IDENTIFIER_PATTERN, NOT_BEFORE_IDENTIFIER

# What may stand between two tokens: blanks, line continuations, and (inside brackets) newlines and comments.
# (A comment runs to its newline: one way to match it, whatever the number of '#' in it.)
SEP = rb"[ \t\f\r\n\\]*(?:#[^\r\n]*[\r\n][ \t\f\r\n\\]*)*"
OPENING = re.compile(SEP + rb"\(")
# What changes the reading of a call's text: brackets, a comment, a string's opening quote.
_CALL_SPECIAL = re.compile(rb"[()\[\]{}#'\"]")
_QUOTED = re.compile(rb"[\"'](" + IDENTIFIER_PATTERN + rb")[\"']")
_ADJACENT_STRINGS = re.compile(rb"[\"'][ \t\f\r\n]*[rbuRBU]{0,2}[\"']")
_LINE_END = re.compile(rb"[\r\n]")
_STRING_BODY = {
    (triple, quote): re.compile(
        (rb"(%s)(?:[^\\%s]|\\.|%s(?!%s))*\1" % (bytes([quote]) * 3, bytes([quote]), bytes([quote]), bytes([quote]) * 2))
        if triple
        else rb"%s(?:[^\\%s\r\n]|\\.)*%s" % (bytes([quote]), bytes([quote]), bytes([quote])),
        re.DOTALL,
    )
    for triple in (False, True)
    for quote in b"'\""
}


def uses_pattern(names: frozenset[str] | set[str]) -> re.Pattern[bytes] | None:
    """What :func:`may_use` looks for, compiled once per set of method names (None for none)."""
    if not names:
        return None
    alternatives = b"|".join(re.escape(name.encode()) for name in sorted(names))
    return re.compile(rb"\." + SEP + rb"(?:" + alternatives + rb")" + NOT_BEFORE_IDENTIFIER)


def may_use(source: bytes, names: frozenset[str] | set[str], pattern: re.Pattern[bytes] | None) -> bool:
    """Whether the file may call, reference or ``getattr`` one of the methods ``names`` (``pattern`` is
    ``uses_pattern(names)``), as the call-site analysis records it: an attribute ``.name`` (blanks, line
    continuations and comments may stand after the dot), or ``getattr(x, "name")``. Never False where the
    exact index records such a use: a ``getattr`` whose text cannot be read plainly (its end not found,
    a backslash, strings side by side, a comment) counts as using every name. (What else may use a name, the
    accounting asks with :func:`holds_names`.)"""
    if pattern is None:
        return False
    if pattern.search(source) is not None:
        return True
    at = source.find(b"getattr")
    while at != -1:
        opening = OPENING.match(source, at + 7)
        at = source.find(b"getattr", at + 7)
        if opening is None:
            continue  # `getattr` not called here: handed on, which the index does not follow either
        text = call_text(source, opening.end() - 1)
        if text is None or b"\\" in text or b"#" in text or _ADJACENT_STRINGS.search(text):
            return True
        if any(name.encode() in _QUOTED.findall(text) for name in names):
            return True
    return False


class Needles(NamedTuple):
    """What `holds_names` looks for (`names_needles`)."""

    words: tuple[bytes, ...]  # identifiers, each as a whole word
    texts: re.Pattern[bytes] | None  # anything else, as it is


def names_needles(names: frozenset[str] | set[str]) -> Needles:
    """What :func:`holds_names` looks for: each name that is an identifier as a whole word, with ``bytes.find`` (a
    regular expression of them all took a tree of torch's size a third of a second); anything else (``vllm::``) as
    it is, in one pattern: those texts start alike (`occurrences.OP_TEXTS`), and `re` looks for their common start
    at memory speed (one pass instead of one per text, a tenth of the time over a fork of vLLM)."""
    words = tuple(sorted(name.encode() for name in names if name.isidentifier()))
    texts = sorted(name.encode() for name in names if not name.isidentifier())
    return Needles(words, re.compile(b"|".join(map(re.escape, texts))) if texts else None)


def holds_names(source: bytes, needles: Needles) -> bool:
    """Whether the text of the file holds one of the names ``needles`` stand for (`names_needles`): an identifier
    as a whole word, in code, a string or a comment alike (the accounting parses the file to tell them apart: issue
    #50), or any other text as it is. Never False where the index records an occurrence of one of them."""
    if (needles.texts is not None and needles.texts.search(source)) or _holds_word(source, needles.words):
        return True
    # Python reads identifiers in their NFKC form (a fullwidth `forward` is `forward`): non-ASCII text is read so too,
    # for the names that are identifiers (a string's text is what it is).
    return bool(needles.words) and not source.isascii() and _holds_word(_nfkc(source), needles.words)


def _holds_word(source: bytes, words: tuple[bytes, ...]) -> bool:
    for word in words:
        at = source.find(word)
        while at != -1:
            end = at + len(word)
            if (not at or source[at - 1] not in IDENTIFIER_BYTES) and (
                end == len(source) or source[end] not in IDENTIFIER_BYTES
            ):
                return True
            at = source.find(word, at + 1)
    return False


def _nfkc(source: bytes) -> bytes:
    import unicodedata

    return unicodedata.normalize("NFKC", source.decode("utf-8", "replace")).encode("utf-8", "surrogateescape")


def call_text(source: bytes, opening: int) -> bytes | None:
    """The text of the call whose ``(`` is at ``opening``, up to its closing bracket; None when that
    cannot be found."""
    extent = call_extent(source, opening)
    return None if extent is None else source[opening : extent[1]]


def call_extent(source: bytes, opening: int) -> tuple[list[tuple[int, int, int]], int] | None:
    """The spans of code (outside strings and comments) of the call whose ``(`` is at ``opening``, each with
    its bracket depth (1: the call's own arguments), and the end of its closing bracket; None when that
    cannot be found."""
    code: list[tuple[int, int, int]] = []
    depth, at = 0, opening
    while True:
        special = _CALL_SPECIAL.search(source, at)
        if special is None:
            return None
        code.append((at, special.start(), depth))
        char, at = source[special.start()], special.end()
        if char in b"([{":
            depth += 1
        elif char in b")]}":
            depth -= 1
            if depth == 0:
                return code, at
        elif char == ord("#"):
            newline = _LINE_END.search(source, at)
            if newline is None:
                return None
            at = newline.end()
        else:  # a quote: the string's end
            quotes = source[special.start() : special.start() + 3] == bytes([char]) * 3
            end = _STRING_BODY[quotes, char].match(source, special.start())
            if end is None:
                return None
            at = end.end()
