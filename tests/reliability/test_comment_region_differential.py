"""The write-time comment check reads only the statements around the edit (`safety.edited_statements`) and
finds what reading the whole files finds: every kind of line edit that leaves a file that parses, on real
files (this package's own modules, tests and benchmarks), gives the same problems both ways."""

from __future__ import annotations

import ast
import pathlib
import warnings

from hypothesis import assume, event, given
from hypothesis import strategies as st

from vllm_attn_compat.codemods.engine.safety import comment_problems, edited_statements

from .profile import reliability_settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = sorted(
    path
    for folder in ("vllm_attn_compat", "tests", "benchmarks")
    for path in (ROOT / folder).rglob("*.py")
    if path.stat().st_size < 20_000
)
LINES = [
    b"# a new comment\n",
    b"    # an indented comment\n",
    b"x = 1  # with a comment\n",
    b"        pass\n",
    b"    return (output\n",  # an open bracket
    b'"""\n',  # an open string
    b"\n",
    b"\\\n",  # a continuation
]


@st.composite
def edits(draw, source: bytes) -> bytes:
    """``source`` with a few of its lines deleted, replaced, inserted, re-indented or stripped of a comment."""
    lines = source.splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(lines)))
        kind = draw(st.sampled_from(["delete", "insert", "replace", "indent", "uncomment"]))
        if kind == "insert" or not lines or at == len(lines):
            lines[at:at] = [draw(st.sampled_from(LINES))]
        elif kind == "delete":
            del lines[at : at + draw(st.integers(1, 4))]
        elif kind == "replace":
            lines[at] = draw(st.sampled_from(LINES))
        elif kind == "indent":
            lines[at] = b"    " + lines[at]
        else:
            lines[at] = lines[at].split(b"#", 1)[0].rstrip() + lines[at][len(lines[at].rstrip(b"\r\n")) :]
    return b"".join(lines)


def _parsed(source: bytes) -> ast.Module | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an edit may leave an invalid escape sequence
        try:
            return ast.parse(source)
        except (SyntaxError, ValueError):
            return None


def _same_both_ways(old: bytes, new: bytes, removed: list[str]) -> None:
    # The write-time checks read comments only once the rewritten file parses (`check_rewrite`).
    tree = _parsed(old)
    assume(tree is not None and _parsed(new) is not None)
    whole = comment_problems(old, new, removed)
    # Python's tokenize module refuses some code CPython parses (a backslash alone on a line before an indented
    # statement): reading whole, such a file cannot be checked at all; the edited statements still can be.
    assume(not (whole and whole[0].startswith("the rewritten source cannot be tokenized")))
    assert comment_problems(old, new, removed, tree) == whole
    assert tree is not None
    event("read the edited statements" if edited_statements(old, new, tree) else "read the whole files")


@given(st.data())
@reliability_settings(ci=300, long=5_000)
def test_edits_of_real_files_find_the_same_problems_both_ways(data):
    path = data.draw(st.sampled_from(CORPUS))
    old = path.read_bytes()
    new = data.draw(edits(old))
    removed = data.draw(st.lists(st.sampled_from(["# a new comment", "# why", "# noqa"]), max_size=2))
    _same_both_ways(old, new, removed)
