"""An opt-in cache of each file's migration (``migrate --cache-dir DIR``), for reruns in pre-commit and CI.

A file's migration depends on its bytes and path, the rules and options of the run, this tool's code
and libcst's, and (through the class hierarchy and the call-site analysis) on every file the hierarchy
pass indexed. So an entry's key hashes all of that: the run's digest (:func:`run_digest`) covers the
indexed files' paths and bytes, so a change to any of them misses for every file; a hit spares libcst
(parse, rules, rendering, safety checks). And a run over the very same files (every file read, by path
as given and bytes) with the same settings replays the whole run's report, with no parse at all: the
common rerun in CI or pre-commit. Such an entry is kept for runs without errors that changed no file
(or, with ``--check``, reported the files that would change).

Entries are JSON (never pickle: a cache folder is not trusted to hold code), one file per key, written
atomically. An entry that cannot be read, does not parse, holds another key or has the wrong shape is
ignored with a warning on stderr, and the work is done as if there were none (and the entry
rewritten). Errors are never cached: a file that failed fails again, with its message. A rewrite
``--check`` computed (without the safety checks: it writes nothing) is never replayed by a run that
may write or show it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

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
    def __init__(self, folder: str, settings: Sequence[object]) -> None:
        """``settings``: what else decides the results (rule codes, options), JSON-serializable."""
        self.folder = os.path.join(folder, _FOLDER)
        self.prefix = json.dumps([FORMAT, _code_digest(), list(settings)]).encode()

    # --- whole runs: every file read, as given and as found, unchanged ---

    def run_key(self, files: Mapping[str, bytes], mode: str) -> str:
        """The key of a run in ``mode`` over ``files`` (path as given -> bytes): all of them, in the same
        places (a file's own entry depends only on whether its rewrite passed the safety checks, which
        ``--check`` skips: the settings say so; a run's report depends on the mode)."""
        digest = hashlib.sha256(self.prefix + b"\0run\0" + mode.encode())
        for path in sorted(files):
            digest.update(path.encode("utf-8", "surrogateescape") + b"\0")
            digest.update(os.path.normpath(os.path.abspath(path)).encode("utf-8", "surrogateescape") + b"\0")
            digest.update(hashlib.sha256(files[path]).digest())
        return digest.hexdigest()

    def load_run(self, key: str) -> tuple[list[tuple[str, Finding]], list[str], int] | None:
        """``(findings by path, changed paths, files parsed)`` of a run, or None."""
        entry = self._read(key)
        if entry is None:
            return None
        try:
            if entry.get("kind") != "run":
                raise ValueError("it is no run's entry")
            findings = [(path, _finding(item)) for path, *item in entry["findings"]]
            changed, parsed = entry["changed"], entry["parsed"]
            if not (isinstance(parsed, int) and all(isinstance(path, str) for path, _ in findings)
                    and isinstance(changed, list) and all(isinstance(path, str) for path in changed)):  # fmt: skip
                raise TypeError("malformed paths or counts")
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            _warn(self._file(key), f"is not a valid entry ({error})")
            return None
        return findings, changed, parsed

    def store_run(self, key: str, findings: Iterable[tuple[str, Finding]], changed: list[str], parsed: int) -> None:
        rows = [[path, *_row(finding)] for path, finding in findings]
        self._write(key, {"kind": "run", "findings": rows, "changed": changed, "parsed": parsed})

    # --- single files, within a run whose indexed files are ``run`` (`run_digest`) ---

    def file_key(self, run: str, path: str, source: bytes) -> str:
        digest = hashlib.sha256(self.prefix + b"\0file\0" + run.encode())
        digest.update(b"\0" + os.path.normpath(os.path.abspath(path)).encode("utf-8", "surrogateescape") + b"\0")
        digest.update(hashlib.sha256(source).digest())
        return digest.hexdigest()

    def load(self, key: str) -> tuple[bytes | None, list[Finding]] | None:
        """The cached ``(new source or None, findings)`` of a file, or None."""
        entry = self._read(key)
        if entry is None:
            return None
        try:
            if entry.get("kind") != "file":
                raise ValueError("it is no file's entry")
            new_source = entry["new_source"]
            if new_source is not None and not isinstance(new_source, str):
                raise TypeError("new_source must be a string or null")
            findings = [_finding(item) for item in entry["findings"]]
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            _warn(self._file(key), f"is not a valid entry ({error})")
            return None
        return (None if new_source is None else new_source.encode("latin-1")), findings

    def store(self, key: str, new_source: bytes | None, findings: Iterable[Finding]) -> None:
        text = None if new_source is None else new_source.decode("latin-1")
        self._write(key, {"kind": "file", "new_source": text, "findings": [_row(f) for f in findings]})

    # --- entries on disk ---

    def _file(self, key: str) -> str:
        return os.path.join(self.folder, key[:2], key)

    def _read(self, key: str) -> dict[str, Any] | None:
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
            if not isinstance(entry, dict) or entry.get("format") != FORMAT:
                raise ValueError(f"expected format {FORMAT!r}")
            if entry.get("key") != key:
                raise ValueError("it holds another key (a foreign or moved file)")
        except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            _warn(path, f"is not a valid entry ({error})")
            return None
        return entry

    def _write(self, key: str, content: dict[str, Any]) -> None:
        path = self._file(key)
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(temporary, "w", encoding="utf-8") as handle:
                json.dump({"format": FORMAT, "key": key, **content}, handle)
            os.replace(temporary, path)
        except OSError as error:  # a read-only or full cache folder costs the cache, not the run
            _warn(path, f"cannot be written ({error.strerror or error})")
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _row(finding: Finding) -> list[object]:
    return [finding.line, finding.column, finding.code, finding.message, finding.status.value]


def _finding(item: object) -> Finding:
    if not (isinstance(item, list) and len(item) == 5):
        raise TypeError(f"malformed finding {item!r}")
    line, column, code, message, status = item
    if not (isinstance(line, int) and isinstance(column, int) and isinstance(code, str) and isinstance(message, str)):
        raise TypeError(f"malformed finding {item!r}")
    return Finding(line, column, code, message, Status(status))


def _warn(path: str, why: str) -> None:
    print(f"warning: ignoring the cache entry {path}: it {why}", file=sys.stderr)
