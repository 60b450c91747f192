"""One `ast` parse of a source for the steps of a file's migration that read its statements.

`spans.reduce` reads the statements of the file it is given; the write-time checks (`safety`) read those
of the original and of the rewritten file, and then migrate the rewritten file again (its `spans.reduce`
reads them once more). The same bytes come back, so the last few trees are kept.
"""

from __future__ import annotations

import ast
import functools
import warnings


@functools.lru_cache(maxsize=4)
def parse(source: bytes) -> ast.Module:
    """``ast.parse(source)``, warnings silenced (e.g. SyntaxWarning for an invalid escape: not ours to
    report). Raises SyntaxError, or ValueError (null bytes), as ``ast.parse`` does. Callers must not change
    the tree: it is shared."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source)
