"""A cheap scan of ``class`` statements that spares the ``ast`` parse of files whose classes cannot matter.

On a fork of vLLM, hundreds of files mention vLLM and define classes (every model has its layers), but
only a few dozen can define an attention class. A class can be one only if a name in its bases (or an
alias imported for such a name) is one of vLLM's base names, ends like vLLM's in-tree backends
(``Backend``, ``Impl``) or is an attention class found so far in the run; or if its own name is one of
these (a fork defines vLLM's bases itself). The scan reads the ``class`` headers as text and says
either "no class here can be one" (a :class:`ScannedIndex`) or "parse it" (None): the runner then
indexes the file with :func:`hierarchy.index_module`, which is exact.

The scan only ever errs towards parsing: a header it cannot read with certainty (nested brackets,
strings or comments among the bases, a line continuation, non-ASCII names) sends the file to the
parser, and text that merely looks like a header (inside a docstring) only adds names to check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vllm_attn_compat.codemods.hierarchy import (
    _IN_TREE_SUFFIXES,
    VLLM_BASE_NAMES,
    ModuleIndex,
    guess_module_name,
    normalize_path,
)
from vllm_attn_compat.codemods.scan import _IDENTIFIER_BYTES

# A class header as one statement: name, optional bases in one level of nested brackets, then the colon.
_HEADER = re.compile(rb"[ \t\f]*class[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*(?:\(([^()]*(?:\([^()]*\)[^()]*)*)\))?[ \t]*:")
_WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
_BLANKS = b" \t\f\r\n\\"

_SUFFIXES = tuple(suffix.encode() for suffix in _IN_TREE_SUFFIXES)
_BASE_NAMES = frozenset(name.encode() for name in VLLM_BASE_NAMES)


@dataclass(frozen=True)
class ScannedIndex(ModuleIndex):
    """The index of a module none of whose classes can be an attention class, as far as the names known
    when it was scanned go. ``classes`` is empty; ``base_words`` are the names its class headers use
    (and the aliases bound to them), so that a later round finding one of them an attention class has
    the file parsed (:meth:`names_any`)."""

    base_words: frozenset[str] = frozenset()

    def names_any(self, names: frozenset[str] | set[str]) -> bool:
        return not self.base_words.isdisjoint(names)


def _capable(word: bytes, known: frozenset[bytes]) -> bool:
    return word in _BASE_NAMES or word in known or word.endswith(_SUFFIXES)


def _headers(source: bytes) -> list[tuple[bytes, bytes]] | None:
    """``(name, bases text)`` of every line starting with the ``class`` keyword; None when one of them
    cannot be read with certainty."""
    found = []
    at = source.find(b"class")
    while at != -1:
        end = at + 5
        line_start = max(source.rfind(b"\n", 0, at), source.rfind(b"\r", 0, at)) + 1
        keyword = end == len(source) or source[end] not in _IDENTIFIER_BYTES
        if keyword and not source[line_start:at].strip(b" \t\f"):
            match = _HEADER.match(source, line_start)
            bases = match and match.group(2) or b""
            # Strings or comments could hide brackets; names beyond ASCII, parts of words.
            if match is None or not bases.isascii() or any(c in bases for c in (b'"', b"'", b"#", b"\\")):
                return None
            found.append((match.group(1), bases))
        at = source.find(b"class", end)
    return found


def _aliased(source: bytes, alias: bytes) -> list[bytes]:
    """The names bound to ``alias`` with ``as`` (``import X as alias``; a ``with``/``except`` target
    too, which only adds a name to check). Blanks, line continuations and (inside brackets) newlines
    may stand around ``as``."""
    names = []
    at = source.find(alias)
    while at != -1:
        end = at + len(alias)
        if end == len(source) or source[end] not in _IDENTIFIER_BYTES:
            name = _word_before_as(source[max(at - 300, 0) : at])
            if name:
                names.append(name)
        at = source.find(alias, end)
    return names


def _word_before_as(head: bytes) -> bytes | None:
    """``X`` when ``head`` ends with ``X as`` and blanks."""
    stripped = head.rstrip(_BLANKS)
    if len(stripped) == len(head) or not stripped.endswith(b"as"):
        return None
    rest = stripped[:-2]
    word_end = len(rest.rstrip(_BLANKS))
    if word_end == len(rest):  # ``alias`` after a longer word ending in "as"
        return None
    start = word_end
    while start and rest[start - 1] in _IDENTIFIER_BYTES:
        start -= 1
    return rest[start:word_end] or None


def quick_index(source: bytes, path: str, known: frozenset[str]) -> ScannedIndex | None:
    """A :class:`ScannedIndex` when the file defines classes and none can be an attention class given
    the attention-class names ``known`` so far; None when the file must be parsed (no class at all
    counts too: parsing it costs little and settles it)."""
    headers = _headers(source)
    if not headers:
        return None
    known_bytes = frozenset(name.encode() for name in known)
    words: set[bytes] = set()
    for name, bases in headers:
        if _capable(name, known_bytes):
            return None
        words.update(_WORD.findall(bases))
    # A base named through an alias is the aliased name: it decides, now and in later rounds.
    words.update(name for alias in list(words) for name in _aliased(source, alias))
    if any(_capable(word, known_bytes) for word in words):
        return None
    return ScannedIndex(
        normalize_path(path), guess_module_name(path), (), frozenset(word.decode() for word in words)
    )
