"""libcst imported with the code of its dataclasses' methods kept between runs, as Python keeps modules' bytecode.

Importing libcst makes some 200 dataclasses, and `dataclasses` writes each one's ``__init__``, ``__eq__``,
``__hash__``, ``__repr__`` and ``__setattr__`` as source text and compiles it with ``exec``: 600 compiles, half of
the import (0.1 s of 0.2 s here), paid by every run that migrates a file: on one file, about half of that run. The
compiled code depends on the source text and the interpreter alone (``exec`` compiles it as ``"<string>"`` with
no inherited flags), so it is kept, keyed by that text, in one file beside this package's bytecode (the folder
``__pycache__``, or ``sys.pycache_prefix``'s) under the same rules: written only where Python would write
bytecode (``sys.dont_write_bytecode``), read only by the interpreter that wrote it (its magic number), and a
file that does not check out (a CRC of its contents) is ignored and written again. It lives with the installed
code, not in the project's cache folder: a project is not trusted to supply code that runs. Each ``exec`` of
such source while libcst imports is given the kept code of the same text, else compiles it; the dataclasses
made are the same either way. The file keeps what the last import used (an upgraded libcst replaces it).

This package's own dataclasses (some 120 texts: compiling them took 8 ms of a rerun's main process after an edit,
and 6 ms of its worker's start, each on that rerun's path) are kept the same way, in a second file (`own_code`):
a run's process and its workers import different modules of it, so that file keeps the texts of both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import marshal
import os
import sys
import types
import zlib
from collections.abc import Iterator
from typing import Any

from vllm_attn_compat.codemods.run import cachedir

_NAME = f"libcst-dataclasses.{sys.implementation.cache_tag}.bin"
_OWN_NAME = f"vllm-attn-compat-dataclasses.{sys.implementation.cache_tag}.bin"


def import_libcst() -> None:
    """Import libcst, unless it is already; raises ImportError as ``import libcst`` does."""
    if "libcst" in sys.modules:
        return
    with kept_code(store_path()):
        import libcst  # noqa: F401 - the point is the import itself


def own_code() -> contextlib.AbstractContextManager[KeptCode]:
    """`kept_code` for this package's own dataclasses, made as its modules are imported within the block: those a
    run's process imports, or a worker's. The file keeps what earlier blocks kept too (`kept_code`'s
    ``keep_earlier``)."""
    return kept_code(own_store_path(), keep_earlier=True)


def store_path() -> str:
    """Where the kept code lives: this module's bytecode folder (``sys.pycache_prefix`` honoured)."""
    return os.path.join(os.path.dirname(importlib.util.cache_from_source(__file__)), _NAME)


def own_store_path() -> str:
    """Where the code of this package's own dataclasses is kept (`own_code`), beside libcst's."""
    return os.path.join(os.path.dirname(store_path()), _OWN_NAME)


class KeptCode:
    """The code objects of the source texts ``exec`` was given, kept and newly compiled."""

    def __init__(self, kept: dict[str, types.CodeType]) -> None:
        self.kept = kept
        self.used: dict[str, types.CodeType] = {}
        self.compiled = 0  # how many texts were not kept, each compiled once

    def exec(self, source: str | bytes | types.CodeType, globals: Any = None, locals: Any = None) -> None:
        """``exec(source, globals, locals)``, a source text's code taken from those kept."""
        if globals is None:  # the caller's namespace, as the builtin's (dataclasses always gives its own)
            caller = sys._getframe(1)
            globals, locals = caller.f_globals, caller.f_locals if locals is None else locals
        if not isinstance(source, str):
            exec(source, globals, locals)  # what dataclasses asked for, unchanged
            return
        code = self.kept.get(source)
        if code is None:  # (a third of the calls repeat a text: classes with the same fields)
            code = self.kept[source] = compile(source, "<string>", "exec", dont_inherit=True)
            self.compiled += 1
        self.used[source] = code
        exec(code, globals, locals)


@contextlib.contextmanager
def kept_code(path: str, *, keep_earlier: bool = False) -> Iterator[KeptCode]:
    """Within the block, the dataclasses made compile their methods' source once per text for all runs: the code
    kept in ``path`` is used, and the file is written again afterwards if some text was not in it, with the texts
    the block used; with ``keep_earlier``, those kept before too (blocks in different processes use different
    texts), unless that is more than twice as many (texts no version makes any more, grown over upgrades)."""
    code = KeptCode(load(path))
    # `dataclasses` calls `exec` by its global name: a module global of that name comes before the builtin.
    shadowed = dataclasses.__dict__.get("exec")
    dataclasses.exec = code.exec  # type: ignore[attr-defined]
    try:
        yield code
    finally:
        if shadowed is None:
            del dataclasses.exec  # type: ignore[attr-defined]
        else:
            dataclasses.exec = shadowed  # type: ignore[attr-defined]
    if code.compiled and not sys.dont_write_bytecode:
        store(path, code.kept if keep_earlier and len(code.kept) <= 2 * len(code.used) else code.used)


def load(path: str) -> dict[str, types.CodeType]:
    """The code kept in ``path``; none if the file is missing, another interpreter's, or does not check out."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return {}
    magic = importlib.util.MAGIC_NUMBER
    header = len(magic) + 4
    if data[: len(magic)] != magic or int.from_bytes(data[len(magic) : header], "little") != zlib.crc32(data[header:]):
        return {}
    try:
        kept = marshal.loads(data[header:])
    except (ValueError, EOFError, TypeError):
        return {}
    if not isinstance(kept, dict) or not all(
        type(text) is str and type(code) is types.CodeType for text, code in kept.items()
    ):
        return {}
    return kept


def store(path: str, used: dict[str, types.CodeType]) -> None:
    """Write ``used`` to ``path`` atomically; a folder that cannot be written keeps nothing, silently (as bytecode)."""
    payload = marshal.dumps(used)
    data = importlib.util.MAGIC_NUMBER + zlib.crc32(payload).to_bytes(4, "little") + payload
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        cachedir.write_atomically(path, data)
