"""Hand libcst only the statements that can hold a finding: the rest of the file becomes stubs.

libcst's parse and our traversal cost about ten times `ast`'s, and in a backend file most of that goes
to methods no rule can act on (the metadata builder, the helpers). :func:`reduce` replaces every
``def`` and ``class`` statement, of the module or of a kept class, that holds none of the rules' tokens
with a stub of the same shape::

    def build(self, common_prefix_len, ...):        def build():
        ...                                            '''vac-span-0:3.
        return metadata                            '''

The stub keeps what the rest of the file can see of the statement: its name (a binding of its block),
its kind, its lines (every finding keeps its line and column), and whether its body is indented, with
the same indentation (libcst gives the comments after a block to the block or to the next statement by
comparing indentation). The rules then run on the reduced source, and :meth:`Reduction.restore` puts
the original lines back in place of each stub, found by its unique marker. Where that cannot be done
exactly the caller migrates the whole file instead: a stub that did not come back unchanged, or an
import edit (whether an import is still used depends on the code the stubs hide).

What a rule reads beyond the statements holding its tokens, it declares (`Rule.reads`, `Rule.reads_in_class`,
`Rule.reads_statements`): the names that mark code it reads anywhere in a file holding one of its tokens (the
imports VAC008 follows), or in a class holding one (the attributes VAC007 reads of a layer), and, for a rule that
reads no more of a function's body than some statements, the names that mark those (VAC001, VAC003 and VAC009:
the statements naming ``output``, VAC002 none). In a function kept only for such rules, the other statements
become stubs too: runs of them, each a neutral expression statement of the same lines (a string holding the
marker, ``.strip()`` called), never an assert, ``pass``, ``raise``, docstring, ``...`` or definition (rules tell
those apart). The rules that act only in attention code count their tokens only where the class hierarchy puts
attention code. Each rule's examples are migrated with every stub this can make and without any, and must come
out the same (tests/codemods/rules/test_examples.py): a rule that reads code it does not declare fails its own
tests. Tests run vLLM's own sources and generated modules both ways too.
"""

from __future__ import annotations

import ast
import bisect
import codecs
import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from vllm_attn_compat.codemods.engine import statements
from vllm_attn_compat.codemods.engine.safety import CODING_LINE

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_INDENT = re.compile(rb"[ \t\f]*")
_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
# One byte of an identifier (non-ASCII bytes too: a UTF-8 letter continues a name).
_WORD_BYTES = frozenset(
    bytes([b]) for b in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_"
) | frozenset(bytes([b]) for b in range(0x80, 0x100))
# Not worth it below this: a stub saves less than the ast parse costs.
_MIN_SAVED = 2048


@dataclass(frozen=True)
class _Stub:
    first: int  # 0-based index of its first line
    lines: tuple[bytes, ...]  # what replaced the original lines, one for one
    marker: bytes
    marker_line: int  # index in ``lines`` of the line holding the marker


@dataclass(frozen=True)
class Reduction:
    source: bytes
    original_lines: tuple[bytes, ...]
    stubs: tuple[_Stub, ...]
    nonce: bytes

    def restore(self, new: bytes) -> bytes | None:
        """The original file with the edits made to the reduced one, or None where the stubs did not
        all come back unchanged and in order (the caller then migrates the whole file)."""
        lines = new.splitlines(keepends=True)
        found: dict[bytes, int] = {}
        for index, line in enumerate(lines):
            if self.nonce in line:
                for marker in re.findall(re.escape(self.nonce) + rb"[0-9]+\.", line):
                    if marker in found:
                        return None
                    found[marker] = index
        pieces: list[bytes] = []
        at = 0
        for stub in self.stubs:
            marked = found.get(stub.marker)
            if marked is None:
                return None
            start = marked - stub.marker_line
            end = start + len(stub.lines)
            if start < at or tuple(lines[start:end]) != stub.lines:
                return None
            pieces += lines[at:start]
            pieces += self.original_lines[stub.first : stub.first + len(stub.lines)]
            at = end
        pieces += lines[at:]
        return b"".join(pieces)


@dataclass(frozen=True)
class Needs:
    """What one rule needs libcst to see (`Rule.tokens`, `Rule.scoped` and what it reads: `Rule.reads`)."""

    tokens: Sequence[bytes]
    reads: Sequence[bytes] = ()
    reads_in_class: Sequence[bytes] = ()
    scoped: bool = False
    reads_statements: Sequence[bytes] | None = None


def reduce(
    source: bytes,
    needs: Sequence[Needs],
    in_scope: Callable[[str, bool], bool] = lambda qualname, is_class: True,
) -> Reduction | None:
    """``source`` with each ``def``/``class`` that can hold no finding stubbed, or None when nothing is
    worth stubbing or the file is not one this can do exactly (unparsable, a coding declaration).

    A statement is kept for a rule when it holds one of the rule's tokens; one of the names it reads, where the
    file holds one of its tokens; or one of the names it reads in a class, inside a class that holds one of its
    tokens. For a scoped rule (acting only in attention code) only if ``in_scope(qualname, is_class)`` holds for
    the statement, for a class or function defined inside it or for an enclosing class. In a function kept only
    for rules that read some of its statements (`Needs.reads_statements`), the others are stubbed."""
    lines = source.splitlines(keepends=True)
    if any(CODING_LINE.match(line) for line in lines[:2]):
        return None  # an encoding other than UTF-8 may be declared: leave the bytes to libcst
    try:
        tree = statements.parse(source)
    except (SyntaxError, ValueError):
        return None  # the whole-file path reports it, with libcst's and CPython's positions
    ends = list(itertools.accumulate(map(len, lines)))
    # Per rule present in the file: its token lines, the lines that count anywhere in a class holding one of
    # them, the lines that count elsewhere, whether it is scoped, and the lines of a body it reads.
    found = []
    for need in needs:
        hits = _hit_lines(source, ends, _with_aliases(source, need.tokens))
        if hits:
            anywhere = _hit_lines(source, ends, need.reads)
            in_class = _merged(anywhere, _hit_lines(source, ends, need.reads_in_class))
            statements_read = need.reads_statements
            read = None if statements_read is None else _merged(hits, _hit_lines(source, ends, statements_read))
            found.append((hits, in_class, anywhere, need.scoped, read))
    nonce = _nonce(source)
    stubs: list[_Stub] = []
    # (statements, qualname prefix, inside attention code, the enclosing class's lines or None)
    pending: list[tuple[list[ast.stmt], str, bool, tuple[int, int] | None]] = [(tree.body, "", False, None)]
    while pending:
        body, prefix, scoped, enclosing = pending.pop()
        wanted_lines = [
            (_merged(hits, in_class if enclosing and _any_between(hits, *enclosing) else anywhere), is_scoped, read)
            for hits, in_class, anywhere, is_scoped, read in found
            if enclosing is None or _any_between(hits, *enclosing) or anywhere
        ]
        for node in body:
            if not isinstance(node, _DEFS):
                continue
            first, last = statements.first_line(node), statements.last_line(node)
            qualname = prefix + node.name
            # The lines each rule that may act here wants, whether it acts only in attention code, and the
            # lines of a function's body it reads (None: all).
            wanted = [want for want in wanted_lines if _any_between(want[0], first, last)]
            if any(not is_scoped for _, is_scoped, _ in wanted) or (
                wanted and (scoped or _defines_scope(node, qualname, in_scope))
            ):
                if isinstance(node, ast.ClassDef):
                    pending.append((node.body, qualname + ".", scoped or in_scope(qualname, True), (first, last)))
                elif all(read is not None for _, _, read in wanted):
                    read_lines = sorted({line for _, _, read in wanted for line in read or ()})
                    for run in _statement_runs(node.body, read_lines, lines):
                        stubs.append(_run_stub(*run, lines, nonce, len(stubs)))
                continue
            stub = _stub(node, first, last, lines, nonce, len(stubs))
            if stub is not None:
                stubs.append(stub)
    stubs.sort(key=lambda stub: stub.first)
    saved = sum(len(lines[s.first + i]) - len(line) for s in stubs for i, line in enumerate(s.lines))
    if not stubs or saved < _MIN_SAVED:
        return None
    reduced = list(lines)
    for stub in stubs:
        reduced[stub.first : stub.first + len(stub.lines)] = stub.lines
    return Reduction(b"".join(reduced), tuple(lines), tuple(stubs), nonce)


def _defines_scope(node: ast.stmt, qualname: str, in_scope: Callable[[str, bool], bool]) -> bool:
    """Whether ``node`` (named ``qualname``), or a class or function defined anywhere inside it, is attention
    code: the names are those the engine's scopes give (``C.m``, ``f.<locals>.g``)."""
    pending = [(node, qualname)]
    while pending:
        current, name = pending.pop()
        is_class = isinstance(current, ast.ClassDef)
        if in_scope(name, is_class):
            return True
        prefix = name + ("." if is_class else ".<locals>.")
        nested = list(getattr(current, "body", ()))
        while nested:
            statement = nested.pop()
            if isinstance(statement, _DEFS):
                pending.append((statement, prefix + statement.name))
                continue
            for block in statements.sub_blocks(statement):
                nested += block
    return False


def _hit_lines(source: bytes, ends: list[int], tokens: Sequence[bytes]) -> list[int]:
    """The 1-based numbers of the lines holding a token, sorted (a token never spans lines); ``ends[i]``
    is the offset just past line ``i + 1``. A token that is an identifier counts only as a whole word:
    the rules match names exactly (``unified_attention`` is not ``kernel_unified_attention_2d``)."""
    found: set[int] = set()
    for token in tokens:
        word = _IDENTIFIER.fullmatch(token) is not None
        at = source.find(token)
        while at != -1:
            end = at + len(token)
            if word and (source[at - 1 : at] in _WORD_BYTES or source[end : end + 1] in _WORD_BYTES):
                at = source.find(token, end)
                continue
            line = bisect.bisect_right(ends, at)
            found.add(line + 1)
            at = source.find(token, ends[line])  # the rest of this line adds nothing
    return sorted(found)


def _with_aliases(source: bytes, tokens: Sequence[bytes]) -> list[bytes]:
    """``tokens`` and the names the file binds to them with ``as`` (``import unified_attention as attend``):
    a rule following imports meets the old name under its alias, in code that never spells it."""
    names = [token for token in tokens if _IDENTIFIER.fullmatch(token)]
    if not names or b" as" not in source:
        return list(tokens)
    alias = re.compile(rb"(?:" + b"|".join(map(re.escape, names)) + rb")[A-Za-z0-9_]*\s+as\s+(\w+)")
    return [*tokens, *{match.group(1) for match in alias.finditer(source)}]


def _merged(a: list[int], b: list[int]) -> list[int]:
    return sorted({*a, *b}) if a and b else a or b


def _any_between(sorted_lines: list[int], first: int, last: int) -> bool:
    at = bisect.bisect_left(sorted_lines, first)
    return at < len(sorted_lines) and sorted_lines[at] <= last


def _nonce(source: bytes) -> bytes:
    number = 0
    while b"vac-span-%d:" % number in source:
        number += 1
    return b"vac-span-%d:" % number


def _ending(line: bytes) -> bytes:
    if line.endswith(b"\r\n"):
        return b"\r\n"
    return line[-1:] if line.endswith((b"\n", b"\r")) else b""


def _stub(
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef,
    first: int,
    last: int,
    lines: list[bytes],
    nonce: bytes,
    number: int,
) -> _Stub | None:
    """The stub for ``node`` (lines ``first``..``last``, 1-based), or None where its shape cannot be kept
    exactly: after a byte-order mark, a body after a line continuation."""
    if (first == 1 and lines[0].startswith(codecs.BOM_UTF8)) or last > len(lines):
        return None
    keyword = {ast.ClassDef: b"class", ast.FunctionDef: b"def", ast.AsyncFunctionDef: b"async def"}[type(node)]
    marker = nonce + b"%d." % number  # the dot: stub 3's marker is no prefix of stub 31's
    indent = _INDENT.match(lines[first - 1])
    assert indent is not None  # the pattern matches the empty string
    header = indent.group() + keyword + b" " + node.name.encode() + (b"" if keyword == b"class" else b"()") + b":"
    body_line = node.body[0].lineno
    body_text = lines[body_line - 1][: node.body[0].col_offset]
    indented = not body_text.strip(b" \t\f")
    if indented and lines[body_line - 2].rstrip(b"\r\n").endswith(b"\\"):
        return None  # the body follows a line continuation: a suite that only looks indented
    ends = [_ending(line) for line in lines[first - 1 : last]]
    if last == first:
        if indented:
            return None
        stub = (header + b' """' + marker + b'"""' + ends[0],)
        return _Stub(first - 1, stub, marker, 0)
    if indented:
        body_indent = _INDENT.match(lines[body_line - 1])
        assert body_indent is not None
        opening = [header + ends[0], body_indent.group() + b'"""' + marker + ends[1]]
        if last == first + 1:
            opening[1] = body_indent.group() + b'"""' + marker + b'"""' + ends[1]
            return _Stub(first - 1, tuple(opening), marker, 1)
        return _Stub(first - 1, (*opening, *ends[2:-1], b'"""' + ends[-1]), marker, 1)
    opening_line = header + b' """' + marker + ends[0]
    return _Stub(first - 1, (opening_line, *ends[1:-1], b'"""' + ends[-1]), marker, 0)


# Kinds a rule tells apart (a body of `pass`, `raise` or `...` computes nothing), and bindings of names.
_NEVER_STUBBED = (ast.Assert, ast.Pass, ast.Raise, *_DEFS)


# Compound statements whose blocks are searched for runs too, when they are kept themselves (`except*`: 3.11+).
_COMPOUND: tuple[type[ast.stmt], ...] = tuple(
    getattr(ast, name)
    for name in ("If", "For", "AsyncFor", "While", "With", "AsyncWith", "Try", "TryStar", "Match")
    if hasattr(ast, name)
)


def _statement_runs(body: list[ast.stmt], read: list[int], lines: list[bytes]) -> list[tuple[int, int]]:
    """The runs of consecutive statements of ``body`` (and of the blocks of its ``if``, ``for``, ``with``,
    ``try`` ... statements) that hold none of the ``read`` lines and can be stubbed exactly, as ``(first
    line, last line)``, 1-based: not an assert, ``pass``, ``raise``, docstring, ``...`` or definition, each on
    lines of its own (not ``a = 1; b = 2``, nor ``if x: a = 1``, nor after a line continuation)."""
    runs: list[tuple[int, int]] = []
    run: tuple[int, int] | None = None
    for index, statement in enumerate(body):
        start, end = statements.first_line(statement), statements.last_line(statement)
        stubbable = (
            not isinstance(statement, _NEVER_STUBBED)
            and not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant))
            and not _any_between(read, start, end)
            and (index == 0 or statements.last_line(body[index - 1]) < start)
            and (index + 1 == len(body) or end < statements.first_line(body[index + 1]))
            and not lines[start - 1][: statement.col_offset].strip(b" \t\f")
            and not lines[start - 2].rstrip(b"\r\n").endswith(b"\\")
        )
        if stubbable:
            run = (start, end) if run is None else (run[0], end)
            continue
        if run is not None:
            runs.append(run)
        run = None
        if isinstance(statement, _COMPOUND):
            for block in _blocks(statement, lines):
                runs += _statement_runs(block, read, lines)
    if run is not None:
        runs.append(run)
    return runs


def _blocks(statement: ast.stmt, lines: list[bytes]) -> Iterator[list[ast.stmt]]:
    """The blocks of statements of a compound statement; an ``elif``'s own blocks in place of it (it is
    part of the ``if`` statement, not a statement of the ``else`` block)."""
    for block in statements.sub_blocks(statement):
        if len(block) == 1 and _is_elif(block[0], lines):
            yield from _blocks(block[0], lines)
        else:
            yield block


def _is_elif(statement: ast.stmt, lines: list[bytes]) -> bool:
    return isinstance(statement, ast.If) and lines[statement.lineno - 1][statement.col_offset :].startswith(b"elif")


def _run_stub(first: int, last: int, lines: list[bytes], nonce: bytes, number: int) -> _Stub:
    """One expression statement in place of the statements on lines ``first``..``last`` (1-based): a string
    holding the marker, whose ``.strip()`` makes it no docstring, at the first statement's indentation."""
    marker = nonce + b"%d." % number
    indent = _INDENT.match(lines[first - 1])
    assert indent is not None  # the pattern matches the empty string
    ends = [_ending(line) for line in lines[first - 1 : last]]
    if len(ends) == 1:
        return _Stub(first - 1, (indent.group() + b'"""' + marker + b'""".strip()' + ends[0],), marker, 0)
    stub = (indent.group() + b'"""' + marker + ends[0], *ends[1:-1], b'""".strip()' + ends[-1])
    return _Stub(first - 1, stub, marker, 0)
