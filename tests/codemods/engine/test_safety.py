"""The invariants checked on every rewritten file, each shown to catch the failure it exists for."""

from __future__ import annotations

import codecs

from vllm_attn_compat.codemods.engine.safety import check_rewrite, comment_problems, layout_problems

OLD = b"def f(x):\n    # keep me\n    assert x  # why\n    return x\n"


def unchanged(source: bytes) -> bytes:
    return source


def test_a_clean_rewrite_passes_every_check():
    new = b"def f(x):\n    # keep me\n    return x\n"
    assert check_rewrite(OLD, new, ["# why"], unchanged) == []


def test_output_that_does_not_parse_is_refused():
    problems = check_rewrite(OLD, b"def f(x):\n    # keep me\n    return (x\n", ["# why"], unchanged)
    assert len(problems) == 1 and problems[0].startswith("the rewritten source does not parse")


def test_a_fix_that_needs_a_second_run_is_refused():
    new = b"def f(x):\n    # keep me\n    return x\n"
    problems = check_rewrite(OLD, new, ["# why"], lambda source: source + b"x = 1\n")
    assert problems == ["applying the rules again changes the file (the fixes are not idempotent)"]


def test_a_crash_on_the_second_run_is_reported_not_raised():
    def crashing(source: bytes) -> bytes:
        raise RuntimeError("boom")

    problems = check_rewrite(OLD, b"def f(x):\n    # keep me\n    return x\n", ["# why"], crashing)
    assert problems == ["applying the rules again fails: RuntimeError: boom"]


def test_lost_added_and_falsely_declared_comments_are_refused():
    assert comment_problems(OLD, b"def f(x):\n    return x\n", ["# why"]) == ["comment lost: '# keep me'"]
    assert comment_problems(OLD, OLD + b"# new\n", []) == ["comment added: '# new'"]
    assert comment_problems(OLD, OLD, ["# why"]) == ["comment declared removed but still present: '# why'"]


def test_duplicate_comments_are_counted_not_just_compared_as_a_set():
    old = b"# a\nx = 1  # a\n"
    assert comment_problems(old, b"# a\nx = 1\n", []) == ["comment lost: '# a'"]


def test_crlf_lines_written_with_lf_are_refused_but_kept_crlf_passes():
    old = b"def f(x):\r\n    assert x\r\n    return x\r\n"
    assert layout_problems(old, b"def f(x):\r\n    return x\r\n") == []
    assert layout_problems(old, b"def f(x):\r\n    pass\n    return x\r\n") == ["line 2 ends with LF, expected CRLF"]


def test_mixed_line_endings_must_match_the_region_that_was_edited():
    old = b"a = 1\r\nb = 2\r\n\nc = 3\nd = 4\n"
    assert layout_problems(old, b"a = 1\r\nb = 2\r\n\nc = 3\ne = 5\nd = 4\n") == []
    assert layout_problems(old, b"a = 1\r\nb = 2\r\n\nc = 3\nd = 4\r\n") != []


def test_bom_coding_declaration_and_final_newline_must_survive():
    bom = codecs.BOM_UTF8
    assert layout_problems(bom + b"x = 1\n", b"x = 1\n") == ["the UTF-8 byte-order mark was added or removed"]
    latin = b"# -*- coding: latin-1 -*-\nx = 1\n"
    assert "coding declaration changed" in layout_problems(latin, b"# -*- coding: utf-8 -*-\nx = 1\n")[0]
    assert layout_problems(b"x = 1\ny = 2", b"x = 1\ny = 2\n") == [
        "the end of the file changed from no final newline to LF"
    ]
    assert layout_problems(b"x = 1\ny = 2", b"y = 2") == []


def test_latin1_source_is_tokenized_with_its_declared_encoding():
    old = b"# -*- coding: latin-1 -*-\ns = 1  # caf\xe9\nassert s\n"
    new = b"# -*- coding: latin-1 -*-\ns = 1  # caf\xe9\n"
    assert check_rewrite(old, new, [], unchanged) == []


def test_thousands_of_identical_lines_edited_at_both_ends():
    # Quadratic diffing would not finish here; the edited middle is all that is diffed.
    filler = b"x = 1\n" * 20000
    old, new = b"a = 0\n" + filler + b"b = 0\n", b"a = 9\n" + filler + b"b = 9\n"
    assert layout_problems(old, new) == []
    assert layout_problems(old, b"a = 9\r\n" + filler + b"b = 9\n") == ["line 1 ends with CRLF, expected LF"]


# --- the comments of the edited statements only -------------------------------------------------------------

CLASS = b"""\
import torch  # the import


class Impl:
    # before the methods
    def build(self):
        return 1  # build

    @staticmethod
    def forward(output=None):
        # keep me
        assert output is not None  # why
        return output  # the result

    def helper(self):
        return 2  # helper
"""


def _pieces(old: bytes, new: bytes):
    import ast

    from vllm_attn_compat.codemods.engine.safety import edited_statements

    return edited_statements(old, new, ast.parse(old))


def test_an_edit_inside_a_method_reads_the_statements_it_touched_only():
    import ast

    new = CLASS.replace(b"        assert output is not None  # why\n", b"")
    assert _pieces(CLASS, new) == (b"        assert output is not None  # why\n", b"")
    assert comment_problems(CLASS, new, ["# why"], ast.parse(CLASS)) == []
    assert comment_problems(CLASS, new, [], ast.parse(CLASS)) == ["comment lost: '# why'"]


def test_an_edit_of_a_decorated_header_reads_the_whole_definition_from_its_decorator():
    new = CLASS.replace(b"def forward(output=None):", b"def forward(output):")
    old_piece, new_piece = _pieces(CLASS, new)
    assert old_piece.startswith(b"    @staticmethod\n    def forward(output=None):\n") and b"# build" not in old_piece
    assert old_piece.endswith(b"return output  # the result\n") and b"# helper" not in old_piece
    assert new_piece == old_piece.replace(b"output=None", b"output")


def test_an_edit_across_methods_reads_those_methods_and_an_insertion_its_two_neighbours():
    import ast

    new = CLASS.replace(b"return 1  # build", b"return 10  # build").replace(b"return 2  # helper", b"return 20")
    old_piece, _ = _pieces(CLASS, new)
    assert old_piece.startswith(b"    def build(self):") and old_piece.endswith(b"return 2  # helper\n")
    assert comment_problems(CLASS, new, [], ast.parse(CLASS)) == comment_problems(CLASS, new, [])
    assert comment_problems(CLASS, new, []) == ["comment lost: '# helper'"]
    inserted = CLASS.replace(b"import torch  # the import\n", b"import torch  # the import\nimport os  # new\n")
    assert _pieces(CLASS, inserted) == (
        b"import torch  # the import\n",
        b"import torch  # the import\nimport os  # new\n",
    )
    assert comment_problems(CLASS, inserted, [], ast.parse(CLASS)) == ["comment added: '# new'"]


def test_the_whole_files_are_read_where_the_pieces_could_mislead():
    # A coding declaration (in the file, or in the first two lines of a piece), or an edit past the statements.
    latin = b"# -*- coding: latin-1 -*-\n" + CLASS
    assert _pieces(latin, latin.replace(b"  # why", b"")) is None
    two = b"def f():\n    a = 1  # one\n    # coding: latin-1\n    b = 2  # two\n"
    assert _pieces(two, two.replace(b"a = 1", b"a = 3").replace(b"b = 2", b"b = 4")) is None
    assert _pieces(two, two.replace(b"a = 1", b"a = 3")) == (b"    a = 1  # one\n", b"    a = 3  # one\n")
    assert _pieces(CLASS + b"# a\n", CLASS + b"# b\n") is None  # no statement holds the edited line
    appended = _pieces(CLASS, CLASS + b"# trailing\n")  # lines added after the last statement: it holds them
    assert appended == (b"        return 2  # helper\n", b"        return 2  # helper\n# trailing\n")
    assert _pieces(CLASS, CLASS) == (b"", b"")


def test_a_piece_left_unbalanced_falls_back_to_the_whole_files():
    import ast

    # The edit opens a bracket the piece does not close: the piece does not tokenize, the files are read.
    new = CLASS.replace(b"        return output  # the result\n", b"        return (output  # the result\n")
    assert comment_problems(CLASS, new, [], ast.parse(CLASS)) == comment_problems(CLASS, new, [])
    assert comment_problems(CLASS, new, [])[0].startswith("the rewritten source cannot be tokenized")
