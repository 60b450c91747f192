"""A cheap scan of ``class`` statements that spares the ``ast`` parse of files whose classes cannot matter.

On a fork of vLLM, hundreds of files mention vLLM and define classes (every model has its layers), but
only a few dozen can define an attention class. A class can be one only if a name in its bases (or an
alias imported for such a name) is one of vLLM's base names or interface classes (`names.VLLM_INTERFACE_NAMES`:
a metadata builder's), ends like vLLM's in-tree backends (``Backend``, ``Impl``) or is an attention class found so
far in the run; or if its own name is one of these (a fork defines vLLM's bases itself); or if the file defines
``get_impl_cls`` (a backend by its shape). The scan reads the ``class`` headers as text and says
either "no class here can be one" (a :class:`ScannedIndex`) or "parse it" (None): the runner then
indexes the file with :func:`hierarchy.index_module`, which is exact.

The exact index records more than classes: the code a module patches onto classes at run time
(`runtime_patches`), duck-typed backends, and the attribute calls and references the call-site
analysis (`callsites`) checks. A spared file must hold none of them that could matter, so the scan also
sends to the parser a file that sets ``accept_output_buffer``, may build a class with ``type(name, bases,
namespace)`` (a decorator may be that builder), calls anything named like a patch helper
(or ``setattr``), assigns to an attribute of, or decorates with, a name that can be an attention class;
and the runner has a spared file parsed as soon as it names (as a whole word) an attention class or
patched function found later, or uses (`calltext.may_use`) a method whose fix the call-site analysis checks.

The scan only ever errs towards parsing: a header it cannot read with certainty (nested brackets,
strings or comments among the bases, a line continuation, non-ASCII names) sends the file to the
parser, and text that merely looks like a header (inside a docstring) only adds names to check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vllm_attn_compat.codemods.index.calltext import OPENING, SEP, call_extent
from vllm_attn_compat.codemods.index.handed import may_hand
from vllm_attn_compat.codemods.index.hierarchy import ModuleIndex
from vllm_attn_compat.codemods.index.names import (
    IDENTIFIER_BYTES,
    IDENTIFIER_PATTERN,
    IN_TREE_SUFFIXES,
    NOT_AFTER_IDENTIFIER,
    VLLM_BASE_NAMES,
    VLLM_INTERFACE_NAMES,
    guess_module_name,
    normalize_path,
)
from vllm_attn_compat.codemods.index.runtime_patches import is_patch_object, patch_words

# A class header as one statement: name, optional bases in one level of nested brackets, then the colon.
_HEADER = re.compile(rb"[ \t\f]*class[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*(?:\(([^()]*(?:\([^()]*\)[^()]*)*)\))?[ \t]*:")
_WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
_BLANKS = b" \t\f\r\n\\"
_BEFORE_DOT = _BLANKS + b")"  # what may stand between the object of an attribute assignment and its dot

_IDENT = IDENTIFIER_PATTERN
# Calls of something named like a patch helper (`runtime_patches._is_patch_helper`: a callee whose name
# holds one of its words, or whose object's name ends with "patch"): `setattr(`, `patch.object(`. Found
# by the word (in the lower-cased text), then the rest of the identifier and what follows it.
_CALLED = re.compile(rb"[A-Za-z0-9_\x80-\xff]*" + SEP + rb"[(.]")


def _atomic(pattern: bytes, name: str) -> bytes:
    """``pattern`` matched once and never backtracked into: an atomic group, spelled with a lookahead
    (Python 3.10 has no ``(?>...)``). For a part whose match cannot end elsewhere, the same matches for
    far less backtracking."""
    return rb"(?=(?P<%s>%s))(?P=%s)" % (name.encode(), pattern, name.encode())


# `.attr = value` (not `==`): a patch of class X in `X.attr = value` when X resolves. Found from the dot
# (a literal the regex engine looks for quickly); the word before it is read backwards. In full:
# `\.` SEP _IDENT (SEP `\)`)* SEP `=`; each part ends where the next cannot start (a separator at a
# non-blank that is no comment, a name at a non-identifier byte), so each is atomic.
_ATTRIBUTE_ASSIGNMENT = re.compile(
    rb"\."
    + _atomic(SEP, "before")
    + _atomic(_IDENT, "name")
    + _atomic(rb"[ \t\f\r\n\\)]*(?:#[^\r\n]*[\r\n][ \t\f\r\n\\)]*)*", "after")  # (SEP `)`)* SEP
    + rb"=(?!=)"
)
# `import X as Y`, `from m import (X as Y, ...)`: what an import statement binds to its aliases (the only
# names a patch's target resolves through: `runtime_patches` uses bound names only).
_IMPORT_ALIAS = re.compile(rb"(" + _IDENT + rb")" + SEP + NOT_AFTER_IDENTIFIER + rb"as" + SEP + rb"(" + _IDENT + rb")")
_ANY_WORD = re.compile(_IDENT)
_METHOD_CALL = re.compile(SEP + _IDENT + SEP + rb"\(")
# Two patterns, each with a literal the regex engine looks for quickly (an alternation has none). In text
# such as `def class X` (a comment), both names count: the scan only adds names to check.
_DEFINED = tuple(re.compile(keyword + rb"[ \t\f\\]+(" + _IDENT + rb")") for keyword in (rb"def", rb"class"))
# `def ` (or `async def `) right before a name: what follows is defined, not called.
_DEFINES = re.compile(NOT_AFTER_IDENTIFIER + rb"def[ \t\f]+\Z")
_DEFINITION = re.compile(rb"[\r\n][ \t\f]*(?:async[ \t\f]+def|def|class)[ \t\f\\]")

_SUFFIXES = tuple(suffix.encode() for suffix in IN_TREE_SUFFIXES)
# A string naming an old op in its dotted form, or composing one (`occurrences.op_strings`).
_OP_NAME = re.compile(rb"vllm\.(?:unified_|[\"'{])")
_BASE_NAMES = frozenset(name.encode() for name in VLLM_BASE_NAMES | VLLM_INTERFACE_NAMES)


@dataclass(frozen=True)
class ScannedIndex(ModuleIndex):
    """The index of a module none of whose classes can be an attention class, as far as the names known
    when it was scanned go. ``classes`` is empty; ``base_words`` are the names its class headers use,
    the names its patches could target (and the names aliased to either), and the names it defines
    (``def``, ``class``: another module may patch them onto an attention class), so that a later round
    finding one of them an attention class or patched code has the file parsed (:meth:`names_any`)."""

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
        line_start = _line_start(source, at)
        keyword = end == len(source) or source[end] not in IDENTIFIER_BYTES
        if keyword and not source[line_start:at].strip(b" \t\f"):
            match = _HEADER.match(source, line_start)
            bases = (match and match.group(2)) or b""
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
        if end == len(source) or source[end] not in IDENTIFIER_BYTES:
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
    while start and rest[start - 1] in IDENTIFIER_BYTES:
        start -= 1
    return rest[start:word_end] or None


def _line_start(source: bytes, at: int) -> int:
    """Where the line holding ``at`` starts (after LF, CR or CRLF). The CR is looked for only after the last
    LF: a search back to the file's start, for every class or decorator, would make the scan quadratic."""
    after_lf = source.rfind(b"\n", 0, at) + 1
    return source.rfind(b"\r", after_lf, at) + 1 or after_lf


def _strip_end(source: bytes, end: int, chars: bytes) -> int:
    """``len(source[:end].rstrip(chars))``, without copying the text before ``end``."""
    while end and source[end - 1] in chars:
        end -= 1
    return end


def _word_before(source: bytes, end: int, skip: bytes) -> bytes | None:
    """The identifier that ends ``source[:end]`` once the bytes in ``skip`` are stripped from its end."""
    end = _strip_end(source, end, skip)
    start = end
    while start and source[start - 1] in IDENTIFIER_BYTES:
        start -= 1
    return source[start:end] or None


def _calls_patch_helper(source: bytes, bound: set[bytes]) -> bool:
    """Whether the file may call a patch helper with a value to copy that resolves: `runtime_patches` makes
    an entry of such a call only where an argument after the first (the first is the target) is a name, or
    attribute of a name, bound by an import or a definition; ``bound`` holds every word that could be one.
    A call whose extent cannot be read counts."""
    lowered = source.lower()
    for name_start, end in patch_words(lowered):
        called = _CALLED.match(lowered, end)
        if not called:
            continue
        opening = called.end() - 1
        while name_start and lowered[name_start - 1] in IDENTIFIER_BYTES:
            name_start -= 1
        if _DEFINES.search(lowered, max(name_start - 32, 0), name_start):
            continue  # `def get_patches(...)`: a definition, not a call
        if lowered[opening] == ord("."):  # `patch.object(`: the object's name must end with "patch"
            name_end = called.start()
            while name_end < len(lowered) and lowered[name_end] in IDENTIFIER_BYTES:
                name_end += 1
            method = _METHOD_CALL.match(source, opening + 1)
            if not is_patch_object(lowered[:name_end]) or not method:
                continue
            opening = method.end() - 1
        words = _value_words(source, opening)
        if words is None or not bound.isdisjoint(words):
            return True
    return False


def _copies_members(source: bytes) -> bool:
    """Whether the file may copy a class's members onto another (``for name, value in vars(X).items():
    setattr(cls, name, value)``): `runtime_patches` makes an entry of such a loop wherever ``X`` resolves,
    whatever ``setattr``'s target, so the names in the call say nothing."""
    return b"setattr" in source and any(word in source for word in (b"__dict__", b"vars", b"getmembers"))


def _value_words(source: bytes, opening: int) -> set[bytes] | None:
    """The words of the call whose ``(`` is at ``opening`` after its first top-level comma (its arguments
    after the first, keywords included), outside strings and comments; None when its closing bracket
    cannot be found. ``self.patch_embed(x)`` has none: a helper needs a value to copy besides its target."""
    extent = call_extent(source, opening)
    if extent is None:
        return None
    words: set[bytes] = set()
    after_first = False
    for start, end, depth in extent[0]:
        if after_first:
            words.update(_ANY_WORD.findall(source, start, end))
        elif depth == 1 and (comma := source.find(b",", start, end)) != -1:
            after_first = True
            words.update(_ANY_WORD.findall(source, comma + 1, end))
    return words


def _imports(source: bytes) -> tuple[dict[bytes, list[bytes]], set[bytes]]:
    """Alias -> the names an import statement binds to it with ``as``; and every word of the import
    statements after ``import`` (the names they can bind)."""
    found: dict[bytes, list[bytes]] = {}
    bound: set[bytes] = set()
    at = source.find(b"import")
    while at != -1:
        before, at = source[at - 1 : at], at + 6
        if (before and before[0] in IDENTIFIER_BYTES) or (at < len(source) and source[at] in IDENTIFIER_BYTES):
            at = source.find(b"import", at)
            continue
        opening = OPENING.match(source, at)
        if opening:  # `from m import (...)`: up to the closing bracket
            end = source.find(b")", opening.end())
        else:  # up to the end of the line, past continuations
            end = at
            while True:
                end = source.find(b"\n", end)
                if end == -1 or (source[end - 1 : end] != b"\\" and source[end - 2 : end] != b"\\\r"):
                    break
                end += 1
        statement = source[at : len(source) if end == -1 else end]
        bound.update(_ANY_WORD.findall(statement))
        if b"as" in statement:
            for name, alias in _IMPORT_ALIAS.findall(statement):
                found.setdefault(alias, []).append(name)
        at = source.find(b"import", at)
    return found, bound


def _patch_words(source: bytes) -> tuple[set[bytes], dict[bytes, list[bytes]], set[bytes]] | None:
    """The words a patch in the file could target: the object of every attribute assignment and every
    word of a decorator (up to the definition it decorates); None when the file calls a patch helper
    (whose target may not resolve: its code is reported, so the file must be indexed). With them, the
    aliases of the file's imports and the names it defines."""
    aliases, bound = _imports(source)
    defined = {name for pattern in _DEFINED for name in pattern.findall(source)}
    bound |= defined
    if _calls_patch_helper(source, bound) or _copies_members(source):
        return None
    words = set()
    for assignment in _ATTRIBUTE_ASSIGNMENT.finditer(source):
        dot = assignment.start()
        before = _strip_end(source, dot, _BEFORE_DOT)
        if b"\n" in source[before:dot] or b"\r" in source[before:dot]:
            line_start = _line_start(source, before)
            if b"#" in source[line_start:before]:
                return None  # a comment may end the line before the dot: what it hides is the parser's to read
        word = _word_before(source, before, b"")
        if word:
            words.add(word)
    at = source.find(b"@")
    while at != -1:
        start, at = at + 1, source.find(b"@", at + 1)
        line_start = _line_start(source, start)
        if source[line_start : start - 1].strip(b" \t\f"):
            continue  # `a @ b`, or an address in a string: not a decorator
        definition = _DEFINITION.search(source, start)
        decorator = source[start : definition.start() if definition else len(source)]
        lowered = decorator.lower()
        if next(patch_words(lowered), None):
            return None  # a patch helper as decorator: an entry for the definition, whatever its target
        words.update(_ANY_WORD.findall(decorator))
    return words, aliases, defined


def quick_index(source: bytes, path: str, known: frozenset[str]) -> ScannedIndex | None:
    """A :class:`ScannedIndex` when none of the file's classes (if any) can be an attention class given
    the attention-class names ``known`` so far, nor be shaped like a backend, and the file patches no
    code onto one; None when the file must be parsed."""
    if b"accept_output_buffer" in source or may_hand(source):
        # a duck-typed backend (`interface`), a "methods" class, a class handing vLLM another (`handed`): `ast` decides
        return None
    if b"vllm::" in source or (b"vllm." in source and _OP_NAME.search(source)):
        return None  # an old op's name in a string: an op list to rename, or a use that withholds it (`accounting`)
    if _may_build(source):  # a class builder a decorator may be (`runtime_patches.builder_entry`)
        return None
    headers = _headers(source)
    if headers is None:
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
    found = _patch_words(source)
    if found is None:
        return None
    patch_targets, aliases, defined = found
    if patch_targets:
        patch_targets.update(name for alias in list(patch_targets) for name in aliases.get(alias, ()))
    if any(_capable(word, known_bytes) for word in patch_targets):
        return None
    try:
        names = frozenset(word.decode() for word in words | patch_targets | defined)
    except UnicodeDecodeError:  # not UTF-8 (a coding declaration): the parser reads it right
        return None
    return ScannedIndex(normalize_path(path), guess_module_name(path), (), base_words=names)


# `type(` called by its plain name, as `runtime_patches.builder_entry` requires (the byte before is read
# apart: a look-behind would leave the regex engine no literal to search for).
_TYPE_CALL = re.compile(rb"type" + SEP + rb"\(")


def _may_build(source: bytes) -> bool:
    """Whether the file may build a class with ``type(name, bases, namespace)`` or ``new_class(...)``: a
    ``type(`` call with a comma among its own arguments (``type(self)`` has none), or one whose end the
    scan cannot find."""
    if b"new_class" in source:
        return True
    for match in _TYPE_CALL.finditer(source):
        if match.start() and (source[match.start() - 1] in IDENTIFIER_BYTES or source[match.start() - 1] == 0x2E):
            continue  # `mytype(`, `obj.type(`
        extent = call_extent(source, match.end() - 1)
        if extent is None:
            return True
        spans, _ = extent
        if any(b"," in source[start:end] for start, end, depth in spans if depth == 1):
            return True
    return False
