"""The hash that names what the cache keeps (its entries, the run's key, the answers' questions): BLAKE2b of 32
bytes. The bytes of the project's files are known by SHA-256 instead (`stats.digest`, `sha256`: OpenSSL's for a
first run's whole tree); but ``import hashlib`` loads OpenSSL, 2 ms of a 40 ms rerun that replays a run and hashes
nothing but its keys. hashlib's own BLAKE2b is CPython's ``_blake2`` module in any case, imported here without it.
"""

from __future__ import annotations

try:
    from _blake2 import blake2b as _blake2b
except ImportError:  # pragma: no cover - an interpreter without CPython's module: hashlib's, whatever it is
    from hashlib import blake2b as _blake2b

Hash = _blake2b


def new(data: bytes = b"") -> Hash:
    """A hash of ``data`` to update, whose hex digest (64 digits) names a key."""
    return _blake2b(data, digest_size=32)


def hexdigest(data: bytes) -> str:
    return new(data).hexdigest()
