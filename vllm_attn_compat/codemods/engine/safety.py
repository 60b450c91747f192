"""Invariants the runner checks on every rewritten file before it may be written.

The rules are tested one by one; these checks guard the combination, on the user's real files, against
the failures migration tools are known for (lost comments, rewritten line endings, invalid output,
fixes that need a second run). A file that fails any check is not written, and the run reports an
internal error for it.
"""

from __future__ import annotations

import ast
import codecs
import difflib
import io
import re
import tokenize
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

from vllm_attn_compat.codemods.engine import statements
from vllm_attn_compat.codemods.engine.statements import first_line, last_line, sub_blocks

# PEP 263: the declaration must be in a comment on line 1 or 2.
CODING_LINE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+")


def _ending(line: bytes) -> bytes:
    if line.endswith(b"\r\n"):
        return b"\r\n"
    if line.endswith((b"\n", b"\r")):
        return line[-1:]
    return b""


def _ending_name(ending: bytes) -> str:
    return {b"\r\n": "CRLF", b"\n": "LF", b"\r": "CR", b"": "no final newline"}[ending]


def comments(source: bytes) -> Counter[str]:
    """The multiset of comment texts (trailing blanks ignored); raises SyntaxError/TokenError if untokenizable."""
    found: Counter[str] = Counter()
    for token in tokenize.tokenize(io.BytesIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.string.rstrip()] += 1
    return found


def comment_problems(
    old: bytes, new: bytes, removed_comments: Sequence[str], old_tree: ast.Module | None = None
) -> list[str]:
    """Comments that vanished without a rule declaring it, or that appeared from nowhere.

    With ``old_tree`` (``old`` parsed by ``ast``), only the statements around the edited lines are tokenized
    (`edited_statements`): the lines before and after them are the same in both files, comments included.
    Where those statements do not tokenize alone, both files are read whole.
    """
    counted = _edited_statements_comments(old, new, old_tree) if old_tree is not None else None
    if counted is None:
        try:
            counted = comments(old), comments(new)
        except (SyntaxError, tokenize.TokenError) as error:
            return [f"the rewritten source cannot be tokenized: {error}"]
    before, after = counted
    declared = Counter(text.rstrip() for text in removed_comments)
    # Sorted: the order must not depend on how much of the files was read.
    problems = [f"comment lost: {text!r}" for text in sorted((before - after - declared).elements())]
    problems += [f"comment added: {text!r}" for text in sorted((after - before).elements())]
    still_present = declared - (before - after)
    problems += [f"comment declared removed but still present: {text!r}" for text in sorted(still_present.elements())]
    return problems


def _edited_statements_comments(
    old: bytes, new: bytes, old_tree: ast.Module
) -> tuple[Counter[str], Counter[str]] | None:
    """The comments of `edited_statements` in ``old`` and in ``new``; None where they do not tokenize alone."""
    pieces = edited_statements(old, new, old_tree)
    if pieces is None:
        return None
    try:
        return comments(pieces[0]), comments(pieces[1])
    except (SyntaxError, tokenize.TokenError):
        return None


def _enclosing_statements(tree: ast.Module, first: int, last: int) -> tuple[int, int] | None:
    """Lines ``(start, end)`` (1-based, inclusive) of the innermost run of sibling statements that covers
    lines ``first`` to ``last``; None when no run does (the lines reach past the module's statements)."""
    found = None
    block: list[ast.stmt] = tree.body
    while block:
        covering = [st for st in block if first_line(st) <= last and last_line(st) >= first]
        if not covering or first_line(covering[0]) > first or last_line(covering[-1]) < last:
            break
        found = (first_line(covering[0]), last_line(covering[-1]))
        if len(covering) > 1:
            break
        block = next((b for b in sub_blocks(covering[0]) if first_line(b[0]) <= first and last_line(b[-1]) >= last), [])
    return found


def edited_statements(old: bytes, new: bytes, old_tree: ast.Module) -> tuple[bytes, bytes] | None:
    """The statements of ``old`` around its edited lines and what became of them in ``new``: two pieces of
    source that hold every comment the edit could have touched. None where the whole files must be read.

    Outside the edited lines both files are the same bytes. The pieces start at a statement's first line,
    which the tokenizer meets in either file at no open bracket or string (what comes before it is the
    same in both), and end after the last statement, of the innermost block holding the edit, that the
    edit touched; a piece that does not end where a statement may is found by the tokenizer, which then
    fails (the caller reads the whole files).
    """
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    head, tail = _common_ends(old_lines, new_lines)
    if head == len(old_lines) == len(new_lines):
        return b"", b""
    first, last = head + 1, len(old_lines) - tail  # 1-based lines of old that the edit replaced
    if last >= first:
        found = _enclosing_statements(old_tree, first, last)
    else:  # lines inserted after line `head`: a run holding the line before them or the line after holds them
        found = (_enclosing_statements(old_tree, head, head) if head else None) or (
            _enclosing_statements(old_tree, first, first) if first <= len(old_lines) else None
        )
    if found is None:
        return None
    start, end = found[0] - 1, found[1]
    new_end = end - (len(old_lines) - len(new_lines))
    pieces = old_lines[start:end], new_lines[start:new_end]
    # A coding declaration in a piece's first two lines would make the tokenizer decode that piece otherwise.
    if any(CODING_LINE.match(line) for source in (old_lines, new_lines, *pieces) for line in source[:2]):
        return None
    return b"".join(pieces[0]), b"".join(pieces[1])


def _common_ends(old_lines: list[bytes], new_lines: list[bytes]) -> tuple[int, int]:
    """How many lines both start with, and how many of the rest both end with."""
    head = 0
    while head < min(len(old_lines), len(new_lines)) and old_lines[head] == new_lines[head]:
        head += 1
    tail = 0
    while tail < min(len(old_lines), len(new_lines)) - head and old_lines[-1 - tail] == new_lines[-1 - tail]:
        tail += 1
    return head, tail


def _coding_lines(source: bytes) -> list[bytes]:
    return [line.rstrip(b"\r\n") for line in source.splitlines(keepends=True)[:2] if CODING_LINE.match(line)]


def _edited_spans(old_lines: list[bytes], new_lines: list[bytes]) -> Iterator[tuple[int, int, int, int]]:
    """``(i1, i2, j1, j2)``: ``old_lines[i1:i2]`` became ``new_lines[j1:j2]``; everything else is equal.

    The common head and tail are cut off first (linear, and all a typical fix leaves alone), so the
    diff runs on the edited middle only; with difflib's popular-line heuristic on, a file of
    thousands of identical lines costs linear time, not quadratic.
    """
    head, tail = _common_ends(old_lines, new_lines)
    old_middle = old_lines[head : len(old_lines) - tail]
    new_middle = new_lines[head : len(new_lines) - tail]
    matcher = difflib.SequenceMatcher(None, old_middle, new_middle, autojunk=True)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            yield head + i1, head + i2, head + j1, head + j2


def layout_problems(old: bytes, new: bytes) -> list[str]:
    """BOM, coding declaration, final newline and line endings that differ outside what was edited.

    Lines a rule inserted or rewrote must use the line endings of the lines they replaced or stand
    next to, so a CRLF file stays CRLF and a mixed file keeps each region's endings.
    """
    problems = []
    if old.startswith(codecs.BOM_UTF8) != new.startswith(codecs.BOM_UTF8):
        problems.append("the UTF-8 byte-order mark was added or removed")
    if _coding_lines(old) != _coding_lines(new):
        problems.append(f"the coding declaration changed: {_coding_lines(old)!r} -> {_coding_lines(new)!r}")
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    if old_lines and new_lines and _ending(old_lines[-1]) != _ending(new_lines[-1]):
        problems.append(
            f"the end of the file changed from {_ending_name(_ending(old_lines[-1]))}"
            f" to {_ending_name(_ending(new_lines[-1]))}"
        )
    file_endings = {_ending(line) for line in old_lines} - {b""}
    for i1, i2, j1, j2 in _edited_spans(old_lines, new_lines):
        allowed = {_ending(line) for line in old_lines[max(i1 - 1, 0) : i2 + 1]} - {b""} or file_endings
        for number, line in enumerate(new_lines[j1:j2], start=j1 + 1):
            ending = _ending(line)
            if ending and allowed and ending not in allowed:
                expected = " or ".join(sorted(_ending_name(e) for e in allowed))
                problems.append(f"line {number} ends with {_ending_name(ending)}, expected {expected}")
    return problems


def _parse(source: bytes) -> ast.Module | SyntaxError:
    try:
        return statements.parse(source)
    except SyntaxError as error:
        return error
    except ValueError as error:  # e.g. NUL bytes
        return SyntaxError(str(error))


def check_rewrite(
    old: bytes, new: bytes, removed_comments: Sequence[str], migrate_again: Callable[[bytes], bytes]
) -> list[str]:
    """Every invariant broken by rewriting ``old`` into ``new``; an empty list means it is safe to write.

    ``migrate_again`` applies the same rules with the same settings; its output must equal its input.
    """
    problems = []
    old_tree, error = _parse(old), _parse(new)
    if isinstance(error, SyntaxError) and isinstance(old_tree, ast.Module):
        return [f"the rewritten source does not parse: {error.msg} (line {error.lineno}, column {error.offset})"]
    try:
        if migrate_again(new) != new:
            problems.append("applying the rules again changes the file (the fixes are not idempotent)")
    except Exception as failure:  # noqa: BLE001 - any failure on our own output is the invariant breaking
        problems.append(f"applying the rules again fails: {type(failure).__name__}: {failure}")
    problems += comment_problems(old, new, removed_comments, old_tree if isinstance(old_tree, ast.Module) else None)
    problems += layout_problems(old, new)
    return problems
