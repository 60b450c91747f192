"""Real sources for tests that compare this package's libcst helpers against libcst itself."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Node types libcst visits conditionally (f-/t-string ``format_spec``), nested specs, and the
# statement and expression forms a backend file rarely holds.
ODD_FORMS = """\
import os as o, sys
from . import (a,
    b as c)
from .x import *
@dec(1)
@dec2
async def f(a, /, b: int = 1, *args, c, d=2, **kw) -> "T":
    global g
    x = f"{a}" f"{b!r:>{width}}" f"{c=}" rf"{d:{e}.{f}}"
    y = [i async for i in z if i] + [*a] ; z = {**k, 'v': 1}
    async with p as (q, r), s:
        await t
    while u := v: break
    else: pass
    try: pass
    except* E as e: raise X from e
    finally: del w[1:2, ::3]
    match m:
        case [1, *rest] | {"k": v, **kw} if v: pass
        case P(a, b=c) as d: pass
    lambda *a, k=1: (yield from a)
    return x if y else -z ** ~w @ v
class C[T: int, *Ts, **P](B, metaclass=M):
    type A[U] = list[U]
    x: int = 1  # trailing
"""


def corpus() -> dict[str, bytes]:
    """The package's own modules, the legacy plugin, and the odd forms in three newline styles."""
    files = sorted((REPO / "vllm_attn_compat" / "codemods").rglob("*.py"))
    files += sorted((REPO / "examples" / "legacy_plugin").rglob("*.py"))
    sources = {str(path.relative_to(REPO)): path.read_bytes() for path in files}
    odd = ODD_FORMS.encode()
    sources["odd forms (LF)"] = odd
    sources["odd forms (CRLF)"] = odd.replace(b"\n", b"\r\n")
    sources["odd forms (mixed, no final newline)"] = odd.replace(b"\n", b"\r\n", 5).rstrip(b"\n")
    return sources
