"""An opt-in cache of each file's migration (``migrate --cache-dir DIR``), for reruns in pre-commit and CI.

A file's migration depends on its bytes and path, the rules and options of the run, this tool's code
and libcst's, and (through the class hierarchy and the call-site analysis) on every file the hierarchy
pass indexed. So an entry's key hashes all of that: the run's digest (:func:`run_digest`) covers the
indexed files' paths and bytes, so a change to any of them misses for every file. The hierarchy pass
itself still runs on a warm run; what a hit spares is libcst (parse, rules, rendering, safety checks).

Entries are JSON (never pickle: a cache folder is not trusted to hold code), one file per key, written
atomically. An entry that cannot be read, does not parse, holds another key or has the wrong shape is
ignored with a warning on stderr, and the file is migrated as if there were none (and the entry
rewritten). Errors are never cached: a file that failed fails again, with its message.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence

from vllm_attn_compat.codemods.findings import Finding, Status

FORMAT = "vllm-attn-compat-cache/1"
_FOLDER = "vllm-attn-compat"


def _code_digest() -> str:
    """This package's codemods code, libcst's version and Python's: any change of them misses."""
    from importlib import metadata

    from vllm_attn_compat import __version__

    digest = hashlib.sha256(f"{__version__}\0{sys.version}".encode())
    try:
        digest.update(metadata.version("libcst").encode())
    except metadata.PackageNotFoundError:
        digest.update(b"no libcst")
    here = os.path.dirname(os.path.abspath(__file__))
    for folder, names, files in os.walk(here):
        names.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as handle:
                    digest.update(os.path.relpath(path, here).encode() + b"\0" + handle.read())
    return digest.hexdigest()


def run_digest(indexed: Mapping[str, bytes]) -> str:
    """The digest of what the class hierarchy and the call-site analysis are built from: the normalized
    path and bytes of every file the hierarchy pass indexed (or scanned for it)."""
    digest = hashlib.sha256()
    for path in sorted(indexed):
        digest.update(os.path.normpath(os.path.abspath(path)).encode() + b"\0")
        digest.update(hashlib.sha256(indexed[path]).digest())
    return digest.hexdigest()


class Cache:
    def __init__(self, folder: str, settings: Sequence[object], run: str) -> None:
        """``settings``: what else decides a file's migration (rule codes, options), JSON-serializable."""
        self.folder = os.path.join(folder, _FOLDER)
        self.prefix = json.dumps([FORMAT, _code_digest(), run, list(settings)]).encode()
        self.hits = 0

    def key(self, path: str, source: bytes) -> str:
        digest = hashlib.sha256(self.prefix)
        digest.update(b"\0" + os.path.normpath(os.path.abspath(path)).encode() + b"\0")
        digest.update(hashlib.sha256(source).digest())
        return digest.hexdigest()

    def _file(self, key: str) -> str:
        return os.path.join(self.folder, key[:2], key)

    def load(self, key: str) -> tuple[bytes | None, list[Finding]] | None:
        """The cached ``(new source or None, findings)``, or None on a miss or an entry not trusted."""
        path = self._file(key)
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return None
        except OSError as error:
            _warn(path, f"cannot be read ({error.strerror or error})")
            return None
        try:
            entry = json.loads(raw)
            outcome = _outcome(entry, key)
        except (ValueError, TypeError, KeyError) as error:
            _warn(path, f"is not a valid entry ({error})")
            return None
        self.hits += 1
        return outcome

    def store(self, key: str, new_source: bytes | None, findings: Iterable[Finding]) -> None:
        entry = {
            "format": FORMAT,
            "key": key,
            "new_source": None if new_source is None else new_source.decode("latin-1"),
            "findings": [[f.line, f.column, f.code, f.message, f.status.value] for f in findings],
        }
        path = self._file(key)
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(temporary, "w", encoding="utf-8") as handle:
                json.dump(entry, handle)
            os.replace(temporary, path)
        except OSError as error:  # a read-only or full cache folder costs the cache, not the run
            _warn(path, f"cannot be written ({error.strerror or error})")
            try:
                os.unlink(temporary)
            except OSError:
                pass


def _outcome(entry: object, key: str) -> tuple[bytes | None, list[Finding]]:
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        raise ValueError(f"expected format {FORMAT!r}")
    if entry.get("key") != key:
        raise ValueError("it holds another key (a foreign or moved file)")
    new_source = entry["new_source"]
    if new_source is not None and not isinstance(new_source, str):
        raise TypeError("new_source must be a string or null")
    findings = []
    for item in entry["findings"]:
        line, column, code, message, status = item
        if not (isinstance(line, int) and isinstance(column, int) and isinstance(code, str) and isinstance(message, str)):
            raise TypeError(f"malformed finding {item!r}")
        findings.append(Finding(line, column, code, message, Status(status)))
    return (None if new_source is None else new_source.encode("latin-1")), findings


def _warn(path: str, why: str) -> None:
    print(f"warning: ignoring the cache entry {path}: it {why}", file=sys.stderr)
