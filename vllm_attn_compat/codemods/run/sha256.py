"""SHA-256 of files' bytes (`stats.digest`), from the implementation that costs a process least for what it hashes.

OpenSSL's (hashlib's) hashes 1.8-1.9 GB/s here, CPython's own module 340-360 MB/s; but ``import hashlib`` loads
OpenSSL, about 2 ms, which is what CPython's module takes for some 0.8 MB more. A rerun after an edit hashes the
edited files alone, tens of kilobytes, on its way to the worker it forks (2-4% of such a rerun); a first run hashes
the whole tree. So a process hashes with CPython's module until it has hashed `BUILTIN_BELOW` bytes (or has
hashlib already), and with OpenSSL's from then on. Both compute the same function: the digests are the same.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol

    class _Hash(Protocol):
        def digest(self) -> bytes: ...

    Constructor = Callable[[bytes], _Hash]

# Bytes a process hashes with CPython's module before it loads OpenSSL's: about half the break-even.
BUILTIN_BELOW = 512 * 1024
_hashed = 0
_builtin: list[Constructor | None] = []  # CPython's own, once looked up


def digest(source: bytes) -> bytes:
    """The SHA-256 of ``source``."""
    return _implementation(len(source))(source).digest()


def _implementation(size: int) -> Constructor:
    global _hashed
    _hashed += size
    if _hashed <= BUILTIN_BELOW and "hashlib" not in sys.modules:
        if not _builtin:
            _builtin.append(_cpython_sha256())
        if _builtin[0] is not None:
            return _builtin[0]
    import hashlib  # OpenSSL's (or, in a build without CPython's own, whatever hashlib has)

    return hashlib.sha256


def _cpython_sha256() -> Constructor | None:
    """CPython's own SHA-256: `_sha2` since 3.12, `_sha256` before; None in a build without it."""
    for name in ("_sha2", "_sha256"):
        try:
            return cast("Constructor", __import__(name).sha256)
        except ImportError:
            continue
    return None  # pragma: no cover - depends on the Python
