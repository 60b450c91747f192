"""The cache of the work of a run (on by default, `cachedir`; ``--cache-dir DIR``), for reruns in pre-commit and CI.

Five kinds of entries, each keyed on this tool's code, libcst's and Python's versions (:attr:`Cache.code`),
the rules and options of the run where they decide it (:attr:`Cache.prefix`), and on what else decides it:

* a file's class index (`index.hierarchy.index_module`): its path, module name and bytes, whatever the rules
  and options (a ``--check`` in pre-commit and a ``--diff`` or a run that writes share them, as they share
  `answers`). A run indexes again only the files that changed (what the class scan, `index.classscan`, made
  of a file is kept with the other answers to what a run asks of a file's bytes: `answers`).
* a file's migration: its path and bytes. A file's migration also depends on the other files of the run,
  but only through what it asks of the class hierarchy (`index.questions`): the entry holds every
  question asked and its answer, and serves a run only if that run's hierarchy gives each answer again.
  An edit elsewhere that changes none of them (most edits) spares libcst here. It keeps the latest
  migrations of those bytes, one per set of answers (`MIGRATIONS_KEPT`): trees that alternate each find
  theirs.
* a whole run: every file listed, as given and as found (by the digest of its bytes, which `stats` knows
  from an unchanged file's status: `rerun` replays such a run without reading a file). A run over the
  very same files with the same settings replays the whole report, with no parse at all: the common
  rerun in CI or pre-commit. Such an entry is kept for runs without errors that changed no file (or,
  with ``--check``, reported the files that would change), a run with nothing to migrate included.
* the statuses of a run's files (``seen``): the key of the run over them (`rerun`).
* what a run's report rests on (``basis``, `RunBasis`): the files that took part in it beyond answering its
  questions, and those questions, from which a rerun after an edit of the others finds its report
  (`bystanders`).

Entries are JSON (never pickle: a cache folder is not trusted to hold code), one file per key, written
atomically, all in one folder: a folder made per entry (as git shards its objects) cost a first run, which
writes a hundred entries on a fork, more than writing them (measured: 0.8 ms an entry on ext4, against 0.3 ms
in one folder). An entry that cannot be read, does not parse, holds another key or has the wrong shape is
ignored with a warning on stderr, and the work is done as if there were none (and the entry
rewritten). Entries no run has used for `KEEP_DAYS` days are deleted, at most once a day. Errors are
never cached: a file that failed fails again, with its message. A rewrite ``--check`` computed (without
the safety checks: it writes nothing) is never replayed by a run that may write or show it.
"""

from __future__ import annotations

import _thread
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from vllm_attn_compat.codemods.findings import Finding, Status
from vllm_attn_compat.codemods.index.names import normalize_path
from vllm_attn_compat.codemods.run import cachedir, codekey, keyhash

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.index import questions
    from vllm_attn_compat.codemods.index.hierarchy import ModuleIndex
    from vllm_attn_compat.codemods.run.files import SourceFile
    from vllm_attn_compat.codemods.run.stats import Status as FileStatus
    from vllm_attn_compat.codemods.run.worker import Migrated

# The index's and the worker's modules are imported where an entry of theirs is read or written: a rerun
# that replays a whole run (`rerun`) needs none of them.

FORMAT = "vllm-attn-compat-cache/2"
# Migrations kept per file's bytes: one per set of answers (trees that alternate, such as branches, each
# find theirs), the latest first.
MIGRATIONS_KEPT = 4
# Entries no run has read or written for this long are deleted (`Cache.prune`), at most once a day.
KEEP_DAYS = 30
_DAY = 24 * 3600
_PRUNED = ".pruned"  # the marker of the last pruning, in the cache's folder
# What the cache writes: entries, and the temporary files of writes a killed run left behind.
_WRITTEN = re.compile(r"[0-9a-f]{64}(\.[0-9]+\.tmp)?")
Decoded = TypeVar("Decoded")


class Cache:
    def __init__(self, folder: str, settings: Sequence[object]) -> None:
        """``settings``: what else decides the results (rule codes, options), JSON-serializable."""
        self.root = folder
        self.folder = cachedir.entries_folder(folder)
        code = codekey.digest(folder)
        # What a file's index and the answers of its bytes depend on: the code alone, not the run's settings.
        self.code = json.dumps([FORMAT, code]).encode()
        self.prefix = json.dumps([FORMAT, code, list(settings)]).encode()
        # A folder that cannot be read or written fails alike for each of the hundreds of entries of a run:
        # said once per reason, and once writing failed, nothing more is written.
        self._unreadable: set[str] = set()
        self._unwritable = False
        self._saying = _thread.allocate_lock()  # one warning when both writers find the folder unwritable
        self._made = False  # the root folder (tagged if this cache made it) and the entries' folder exist
        self._kept: dict[str, list[Any]] = {}  # the migrations each file's entry held when loaded
        # Entries of class indexes made while deferring (`defer`), written later in a thread.
        self._deferred: list[tuple[str, Callable[[], dict[str, Any]]]] | None = None
        # The names of the methods whose uses the run's call-site analysis read, once its hierarchy is built: an index
        # stored after keeps their uses ready to read (`records.to_data`).
        self.read_names: frozenset[str] = frozenset()

    # --- whole runs: every file read, as given and as found, unchanged ---

    def run_key(self, digests: Mapping[str, str], excluded: Set[str], mode: str) -> str:
        """The key of a run in ``mode`` over the files of ``digests`` (path as given -> `digest` of its
        bytes), those of ``excluded`` read for context only: all of them, in the same places (a file's own
        entry depends only on whether its rewrite passed the safety checks, which ``--check`` skips: the
        settings say so; a run's report depends on the mode). The digests may come from `stats.StatTable`:
        a rerun need not read the files."""
        # Where the files are: each path as given, from the working directory (which decides where a relative
        # path leads, as `normalize_path` would find it for each).
        parts = [self.prefix + b"\0run\0" + mode.encode() + b"\0" + os.getcwd().encode("utf-8", "surrogateescape")]
        for path in sorted(digests):
            spelled = path.encode("utf-8", "surrogateescape") + b"\0" + digests[path].encode()
            parts.append(spelled + (b"\0excluded\0" if path in excluded else b"\0"))
        return keyhash.hexdigest(b"".join(parts))

    def seen_key(self, statuses: Sequence[tuple[SourceFile, FileStatus]], excluded: Set[str], mode: str) -> str:
        """The key under which a run over files of these statuses (`stats.status_of`, in the order of their
        paths; ``excluded`` as in :meth:`run_key`) finds its run's key: one hash over the working directory
        and every path and status, cheaper than asking the table for each file's digest."""
        parts = [self.prefix.decode(), "seen", mode, os.getcwd()]
        for source_file, (size, inode, mtime, ctime) in statuses:
            mark = "x" if source_file.path in excluded else ""
            parts.append(f"{source_file.path}\0{source_file.real_path}\0{size} {inode} {mtime} {ctime}{mark}")
        return keyhash.hexdigest("\0".join(parts).encode("utf-8", "surrogateescape"))

    def load_seen(self, key: str) -> str | None:
        """The key of the run recorded under ``key`` (:meth:`seen_key`), or None."""
        return self._load(key, "seen", lambda entry: _run_key(entry["run"]))

    def store_seen(self, key: str, run_key: str) -> None:
        self._write(key, {"kind": "seen", "run": run_key})

    def load_run(self, key: str) -> tuple[list[tuple[str, Finding]], list[str], int] | None:
        """``(findings by path, changed paths, files parsed)`` of a run, or None."""
        return self._load(key, "run", _run)

    def store_run(self, key: str, findings: Iterable[tuple[str, Finding]], changed: list[str], parsed: int) -> None:
        rows = [[path, *_row(finding)] for path, finding in findings]
        self._write(key, {"kind": "run", "findings": rows, "changed": changed, "parsed": parsed})

    def load_basis(self, run_key: str) -> RunBasis | None:
        """What the report of the run ``run_key`` rests on, or None."""
        return self._load(_basis_key(run_key), "basis", _basis)

    def store_basis(self, run_key: str, basis: RunBasis) -> None:
        asked = [[kind, list(terms)] for kind, terms in sorted(basis.asked)]
        answers = {digest: dict(kept) for digest, kept in basis.answers.items()}
        entry = {"kind": "basis", "involved": sorted(basis.involved), "asked": asked, "answered": basis.answered}
        self._write(_basis_key(run_key), {**entry, "looked_for": sorted(basis.looked_for), "answers": answers})

    # --- single files ---

    def index_key(self, path: str, module: str, digest: str) -> str:
        """The key of a file's class index: its path, the module name its folders give it, its bytes (their
        `stats.digest`, as for the other keys of a file)."""
        return self._key(b"index", path, digest, module.encode(), keyed_on=self.code)

    def load_index(self, key: str) -> ModuleIndex | None:
        from vllm_attn_compat.codemods.index import records

        return self._load(key, "index", lambda entry: records.from_data(entry["index"], self._file(key)))

    def store_index(self, key: str, index: ModuleIndex) -> None:
        from vllm_attn_compat.codemods.index import records

        self._write_later(key, lambda: {"kind": "index", "index": records.to_data(index, self.read_names)})

    def file_key(self, path: str, digest: str) -> str:
        """The key of a file's migration: its path and bytes (the rest of the run: see `load`)."""
        return self._key(b"file", path, digest)

    def holds_migration(self, path: str, digest: str) -> bool:
        """Whether the cache holds a migration of the file's bytes (`file_key`, `holds`), whatever its questions."""
        return self.holds(self.file_key(path, digest))

    def holds(self, key: str) -> bool:
        """Whether an entry of ``key`` exists (valid or not): a file without one is migrated whatever the run's
        hierarchy, so it may be handed to a worker before the last round."""
        return os.path.exists(self._file(key))

    def load(self, key: str, hierarchy: questions.Questions) -> Migrated | None:
        """The cached migration of a file, or None: the latest of those kept whose questions ``hierarchy``
        answers as that migration's hierarchy did."""

        from vllm_attn_compat.codemods.index import questions

        def migrated(entry: dict[str, Any]) -> Migrated | None:
            kept = entry["migrations"]
            if not (isinstance(kept, list) and kept):
                raise TypeError("migrations must be a list of one or more")
            decoded = [_migration(item) for item in kept]
            self._kept[key] = kept
            return next((m for m in decoded if questions.still_holds(m.answers or (), hierarchy)), None)

        return self._load(key, "file", migrated)

    def store(self, key: str, migrated: Migrated) -> None:
        """Keep a migration whose questions can be asked again (else nothing), with the latest others of the
        file's bytes :meth:`load` found (those the hierarchy of another run, or another branch, answers)."""
        if migrated.answers is None:
            return
        text = None if migrated.new_source is None else migrated.new_source.decode("latin-1")
        findings = [_row(f) for f in migrated.findings]
        answers = [[question, list(arguments), answer] for (question, arguments), answer in migrated.answers]
        others = [item for item in self._kept.get(key, []) if item["answers"] != answers]
        kept = [{"new_source": text, "findings": findings, "answers": answers}, *others][:MIGRATIONS_KEPT]
        self._write(key, {"kind": "file", "migrations": kept})

    def _key(self, kind: bytes, path: str, source_digest: str, *more: bytes, keyed_on: bytes | None = None) -> str:
        digest = keyhash.new((self.prefix if keyed_on is None else keyed_on) + b"\0" + kind + b"\0")
        digest.update(normalize_path(path).encode("utf-8", "surrogateescape") + b"\0")
        for part in more:
            digest.update(part + b"\0")
        digest.update(source_digest.encode())
        return digest.hexdigest()

    # --- entries on disk ---

    def _load(self, key: str, kind: str, decode: Callable[[dict[str, Any]], Decoded]) -> Decoded | None:
        """``decode(entry)`` of the entry of ``key``, or None when there is none or it is not a valid entry
        of ``kind`` (with a warning)."""
        entry = self._read(key)
        if entry is None:
            return None
        try:
            if entry.get("kind") != kind:
                raise ValueError(f"it is no {kind!r} entry")
            decoded = decode(entry)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            _warn(self._file(key), f"is not a valid entry ({error})")
            return None
        if decoded is not None:
            with contextlib.suppress(OSError):  # used: kept by `prune` (a read-only folder is never pruned)
                os.utime(self._file(key))
        return decoded

    def prune(self) -> None:
        """Delete the entries no run has used for `KEEP_DAYS` days, at most once a day; only files named as
        this cache names them are touched. A folder that cannot be pruned is left as it is, silently."""
        marker = os.path.join(self.folder, _PRUNED)
        now = time.time()
        try:
            if now - os.stat(marker).st_mtime < _DAY:
                return
        except FileNotFoundError:
            pass
        except OSError:
            return
        limit = now - KEEP_DAYS * _DAY
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.folder):
                if (
                    _WRITTEN.fullmatch(entry.name)
                    and entry.is_file(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_mtime < limit
                ):
                    os.unlink(entry.path)
            with open(marker, "a"):
                pass
            os.utime(marker)

    def _file(self, key: str) -> str:
        return os.path.join(self.folder, key)

    def _read(self, key: str) -> dict[str, Any] | None:
        path = self._file(key)
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return None
        except OSError as error:
            why = error.strerror or str(error)
            if why not in self._unreadable:
                self._unreadable.add(why)
                _warn(path, f"cannot be read ({why}); the others failing so are ignored without another warning")
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

    # --- writing the index's entries while the workers migrate ---

    def defer(self) -> None:
        """Keep the class indexes stored from now on (made during the hierarchy's rounds, on the run's
        critical path) until :meth:`write_deferred`."""
        self._deferred = []

    def write_deferred(self) -> Callable[[], None]:
        """Start writing the entries kept since :meth:`defer` in a thread (stores write at once again) and
        return what waits for it: the run calls this once the workers have the files to migrate, and spends
        the wait for their answers encoding and writing entries instead. Other kinds of entries are not
        deferred, so no entry is written by both the thread and the run."""
        pending, self._deferred = self._deferred or [], None
        if not pending:
            return lambda: None
        import threading

        thread = threading.Thread(target=self._write_all, args=(pending,), name="vllm-attn-compat-cache")
        thread.start()
        return thread.join

    def _write_all(self, pending: Sequence[tuple[str, Callable[[], dict[str, Any]]]]) -> None:
        for key, content in pending:
            self._write(key, content())

    def _write_later(self, key: str, content: Callable[[], dict[str, Any]]) -> None:
        if self._deferred is None:
            self._write(key, content())
        else:
            self._deferred.append((key, content))

    def _write(self, key: str, content: dict[str, Any]) -> None:
        if self._unwritable:
            return
        path = self._file(key)
        try:
            if not self._made:
                cachedir.make(self.root)
                os.makedirs(self.folder, exist_ok=True)
                self._made = True
            # json.dumps, not json.dump: only the one-shot encoding runs in C (json.dump streams the text through
            # the pure-Python encoder, which made a third of a cold run's cost of filling the cache).
            text = json.dumps({"format": FORMAT, "key": key, **content})
            cachedir.write_atomically(path, text.encode("utf-8"))
        except OSError as error:  # a read-only or full cache folder costs the cache, not the run
            with self._saying:  # the thread writing the index's entries may fail at the same moment
                if not self._unwritable:
                    self._unwritable = True
                    _warn(path, f"cannot be written ({error.strerror or error}); this run writes no more entries")


class RunBasis(NamedTuple):
    """What a run's report rests on: the files (path as given) that took part in the run beyond answering
    its questions of their bytes (indexed, scanned for classes, parsed, or with a finding), every question
    of `scans` it asked of some file (kind and spelled terms), the classes whose module it looked for by the
    files' paths, and where its answers are: those of the bytes of files edited or added since the run that
    made the answers file (`answered`, its key) are in ``answers`` (digest -> question -> answer), the others
    in that file (`answers.Answers`)."""

    involved: frozenset[str]
    asked: frozenset[tuple[str, tuple[str, ...]]]
    looked_for: frozenset[str]
    answered: str
    answers: Mapping[str, Mapping[str, bool]]


def _run_key(value: object) -> str:
    """``value`` if it is a run's key (`Cache.run_key`), as an entry names it."""
    if not (isinstance(value, str) and _WRITTEN.fullmatch(value) and "." not in value):
        raise TypeError(f"malformed run key {value!r:.80}")
    return value


def _basis_key(run_key: str) -> str:
    return keyhash.hexdigest(b"basis\0" + run_key.encode())


def _basis(entry: dict[str, Any]) -> RunBasis:
    involved, asked = entry["involved"], entry["asked"]
    if not (isinstance(involved, list) and all(isinstance(path, str) for path in involved)):
        raise TypeError("involved must be a list of paths")
    if not (
        isinstance(asked, list)
        and all(
            isinstance(row, list) and len(row) == 2 and isinstance(row[0], str) and isinstance(row[1], list)
            and all(isinstance(term, str) for term in row[1])
            for row in asked
        )
    ):  # fmt: skip
        raise TypeError("asked must be a list of [kind, [term, ...]]")
    answered, answers = _run_key(entry["answered"]), entry["answers"]
    if not (
        isinstance(answers, dict)
        and all(isinstance(kept, dict) and all(type(answer) is bool for answer in kept.values())
                for kept in answers.values())
    ):  # fmt: skip
        raise TypeError("answers must map digests to questions to booleans")
    looked_for = entry["looked_for"]
    if not (isinstance(looked_for, list) and all(isinstance(name, str) for name in looked_for)):
        raise TypeError("looked_for must be a list of class names")
    asked_set = frozenset((kind, tuple(terms)) for kind, terms in asked)
    return RunBasis(frozenset(involved), asked_set, frozenset(looked_for), answered, answers)


def _run(entry: dict[str, Any]) -> tuple[list[tuple[str, Finding]], list[str], int]:
    findings = [(path, _finding(item)) for path, *item in entry["findings"]]
    changed, parsed = entry["changed"], entry["parsed"]
    if not (isinstance(parsed, int) and all(isinstance(path, str) for path, _ in findings)
            and isinstance(changed, list) and all(isinstance(path, str) for path in changed)):  # fmt: skip
        raise TypeError("malformed paths or counts")
    return findings, changed, parsed


def _row(finding: Finding) -> list[object]:
    return [finding.line, finding.column, finding.code, finding.message, finding.status.value]


def _finding(item: object) -> Finding:
    if not (isinstance(item, list) and len(item) == 5):
        raise TypeError(f"malformed finding {item!r}")
    line, column, code, message, status = item
    if not (isinstance(line, int) and isinstance(column, int) and isinstance(code, str) and isinstance(message, str)):
        raise TypeError(f"malformed finding {item!r}")
    return Finding(line, column, code, message, Status(status))


def _migration(item: object) -> Migrated:
    from vllm_attn_compat.codemods.run.worker import Migrated

    if not isinstance(item, dict):
        raise TypeError(f"malformed migration {item!r:.80}")
    new_source = item["new_source"]
    if new_source is not None and not isinstance(new_source, str):
        raise TypeError("new_source must be a string or null")
    findings = [_finding(row) for row in item["findings"]]
    return Migrated(None if new_source is None else new_source.encode("latin-1"), findings, _answers(item["answers"]))


def _answers(rows: object) -> questions.Answers:
    if not isinstance(rows, list):
        raise TypeError("answers must be a list")
    answers = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3):
            raise TypeError(f"malformed answer {row!r:.80}")
        question, arguments, answer = row
        if not (
            isinstance(question, str) and isinstance(arguments, list) and all(isinstance(a, str) for a in arguments)
        ):
            raise TypeError(f"malformed question {row!r:.80}")
        if not (answer is None or isinstance(answer, (bool, str))):
            raise TypeError(f"malformed answer {row!r:.80}")
        answers.append(((question, tuple(arguments)), answer))
    return tuple(answers)


def _warn(path: str, why: str) -> None:
    print(f"warning: ignoring the cache entry {path}: it {why}", file=sys.stderr)
