"""The cache: one JSON file per project root, as ruff keeps its cache, reused while nothing a result depends on
changed.

The file lives in the cache folder (`cachedir`: ``.vllm-attn-compat-cache/`` at the project's root by default), in
the tool's own folder there, named for the project's root. It is tied to what decides every result (the *key*): this
package's version and the size and ``mtime_ns`` of each of its ``codemods`` modules (an edit of a development
install changes them, a reinstall too), libcst's version file the same way, Python's version, and the settings that
change results (``select``, ``ignore``, ``unsafe-fixes``, ``old-op-calls``). A file made under another key is
ignored and rewritten. It holds:

* per file, by its real path: its status (size, inode, ``mtime_ns``, ``ctime_ns``) and the SHA-256 of its bytes
  (`hashlib`); and its results: the answers to what the run asked of its bytes (`reading.RunFile.ask`), its class
  index (`index.records`) with the path and module name it was made for, and its migration with every question it
  asked of the class hierarchy (`index.questions`), which serves a later run only if that run's hierarchy answers
  each one the same;
* the last run's report, with the files it read (as given, as found, excluded or not) and its mode.

A file whose status is the one recorded is trusted to hold the same bytes without being read, as ruff and mypy
trust theirs. One whose status changed is read, and keeps its results when the SHA-256 of its bytes is the one
recorded (``touch``, a checkout that wrote the same bytes back, a fresh clone in CI). The digest is taken when a run
reads a file the cache knew (its status changed) or one modified too recently to be trusted by its status next
time (git's racy rule: less than `RACY_NS` before the run started; recorded without its status): a first run
hashes nothing else, and the file's next change is told by its status. When every file is unchanged, a rerun in
the same mode over the same files replays the report without reading any file (`replay`).

The file is JSON lines, written atomically: a first line with the key, the statuses and the report (all that a
replay reads), a second with the files' results. JSON only, never pickle: a cache folder is not trusted to hold
code. A file that cannot be read or parsed, or is of another shape, is ignored with a warning and rewritten; a
folder that cannot be written costs the cache, never the run.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from vllm_attn_compat.codemods.findings import Finding, Status
from vllm_attn_compat.codemods.run import cachedir, sources

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.run.files import Discovered
    from vllm_attn_compat.codemods.run.report import RunReport

FORMAT = "vllm-attn-compat-cache/4"
# A file whose mtime or ctime is this close to the start of the run that read it is not trusted by its status next
# time: timestamps are coarse (a few milliseconds on Linux, 2 s on FAT), and git trusts a file no sooner.
RACY_NS = 3_000_000_000
_CODEMODS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = os.path.dirname(_CODEMODS)
_MANIFEST = os.path.join(_PACKAGE, "manifest")


def digest(source: bytes) -> str:
    """What the cache knows a file's bytes by."""
    import hashlib  # only for runs that read files: a replay hashes nothing

    return hashlib.sha256(source).hexdigest()


def status_of(stat: os.stat_result) -> list[int]:
    return [stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns]


def racy(stat: os.stat_result, started_ns: int) -> bool:
    """Whether the file was modified too close to ``started_ns`` (when the run started) for its status to tell."""
    return max(stat.st_mtime_ns, stat.st_ctime_ns) >= started_ns - RACY_NS


def code_key() -> list[object]:
    """What the code a result comes from is known by: this package's version, the size and ``mtime_ns`` of each of
    its codemods modules, of the manifest's modules and data (the rules' knowledge of each vLLM release) and of
    libcst's version file, and Python's version (statuses only: no module is read)."""
    from vllm_attn_compat import __version__

    modules = []
    for top in (_CODEMODS, _MANIFEST):
        for folder, names, found in os.walk(top):
            names[:] = sorted(name for name in names if name != "__pycache__")
            for name in sorted(found):
                if name.endswith((".py", ".json", ".txt")):
                    path = os.path.join(folder, name)
                    stat = os.stat(path)
                    modules.append([os.path.relpath(path, _PACKAGE), stat.st_size, stat.st_mtime_ns])
    return [FORMAT, __version__, sys.version, _libcst_version(), modules]


def _libcst_version() -> list[int] | None:
    """The size and ``mtime_ns`` of libcst's version file, found without importing libcst (a tenth of a second)."""
    import importlib.util

    spec = importlib.util.find_spec("libcst")
    if spec is None or spec.origin is None:
        return None
    try:
        stat = os.stat(os.path.join(os.path.dirname(spec.origin), "_version.py"))
    except OSError:
        return None
    return [stat.st_size, stat.st_mtime_ns]


class Cache:
    """The cache file of the project ``root`` in the cache folder ``folder``, for runs with ``settings``."""

    def __init__(self, folder: str, root: str, settings: Sequence[object]) -> None:
        self.folder = folder
        name = zlib.crc32(root.encode("utf-8", "surrogateescape"))  # a name, not a check: the key holds the root
        self.path = os.path.join(cachedir.entries_folder(folder), f"{name:08x}.json")
        self.key = {"root": root, "code": code_key(), "settings": list(settings)}
        # real path -> [size, inode, mtime_ns, ctime_ns, digest]: the four None where the file was racy, the digest
        # None where it was not taken
        self.statuses: dict[str, list[Any]] = {}
        self.run: dict[str, Any] | None = None  # the last run's report and files
        self._results: dict[str, dict[str, Any]] | None = None  # real path -> results, read when first asked for
        # What `replay` read of files whose status changed, for the run that follows when it found them changed; and
        # the status it took of the others (the run that follows takes no second one).
        self.read: dict[str, tuple[bytes, os.stat_result]] = {}
        self.seen: dict[str, os.stat_result] = {}
        self._warned = False
        # The results are read once a run asks for them (a replay never does), from the file the first line came
        # from: kept open until then (another run may replace the file meanwhile).
        self._rest: BinaryIO | None = None
        try:
            self._rest = open(self.path, "rb")  # noqa: SIM115 - closed once the results are read
            first = self._rest.readline()
        except FileNotFoundError:
            return
        except OSError as error:
            self.warn(f"cannot be read ({error.strerror or error})")
            self._forget()
            return
        try:
            header = json.loads(first)
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise ValueError(f"expected format {FORMAT!r}")
            if header.get("key") != self.key:  # another version, other settings or another project: not ours to use
                self._forget()
                return
            self.statuses = _statuses(header["statuses"])
            self.run = _run(header["run"])
        except (ValueError, TypeError, KeyError) as error:
            self.statuses, self.run = {}, None
            self._forget()
            self.warn(f"is not valid ({error})")

    def _forget(self) -> None:
        if self._rest is not None:
            self._rest.close()
            self._rest = None

    def warn(self, why: str) -> None:
        """Say once on stderr why the cache file is ignored or not written; the run goes on without it."""
        if not self._warned:
            self._warned = True
            print(f"warning: the cache file {self.path} {why}; the run goes on without it", file=sys.stderr)

    def trusts(self, real_path: str, stat: os.stat_result) -> bool:
        """Whether the file's status is the one recorded: its bytes are those its results were made of."""
        row = self.statuses.get(real_path)
        return row is not None and row[:4] == status_of(stat)

    def knows(self, real_path: str) -> bool:
        return real_path in self.statuses

    def recorded(self, real_path: str) -> str | None:
        """The digest recorded for the file (of the bytes its results were made of), if one was taken."""
        row = self.statuses.get(real_path)
        return None if row is None else row[4]

    def results(self, real_path: str) -> dict[str, Any] | None:
        """The results kept of the file (made of the bytes its recorded status and digest are of), or None."""
        return self._all_results().get(real_path)

    def _all_results(self) -> dict[str, dict[str, Any]]:
        if self._results is None:
            self._results = {}
            if self._rest is not None:
                try:
                    results = json.loads(self._rest.read())
                    if not isinstance(results, dict) or not all(isinstance(r, dict) for r in results.values()):
                        raise TypeError("expected an object of objects")
                    self._results = results
                except (OSError, ValueError, TypeError) as error:
                    self.warn(f"holds results that cannot be read or are not valid ({error})")
                self._forget()
        return self._results

    # --- the runs users repeat ---

    def replay(self, found: Discovered, mode: str, report: RunReport) -> bool:
        """Put the report of the last run into ``report`` when it was a run in ``mode`` over the very files found,
        each with the bytes it read (by its status, or read and hashed again); False, having put nothing, otherwise."""
        run = self.run
        if run is None or run["mode"] != mode or run["cwd"] != os.getcwd() or run["files"] != _listed(found):
            return False
        restated = {}
        for source_file in [*found.files, *found.excluded]:
            try:
                stat = source_file.status or os.stat(source_file.real_path)
            except OSError:
                return False
            self.seen[source_file.real_path] = stat
            if not self.trusts(source_file.real_path, stat):
                recorded = self.recorded(source_file.real_path)
                if recorded is None:
                    return False
                try:
                    source, stat = sources.read_source(source_file.real_path)
                except sources.SourceError:
                    return False
                self.read[source_file.real_path] = source, stat
                if digest(source) != recorded:
                    return False
                restated[source_file.real_path] = stat
        report.findings += [(path, _finding(row)) for path, *row in run["findings"]]
        report.changed += run["changed"]
        report.parsed, report.scanned = run["parsed"], len(found.files)
        if restated:  # the same bytes with another status (a touch, a fresh clone): trusted by the new one next time
            import time

            started = time.time_ns()
            for real_path, stat in restated.items():
                self.record(real_path, stat, self.statuses[real_path][4], racy(stat, started))
            self.save(self.run, self._all_results())
        self._forget()
        return True

    def record(self, real_path: str, stat: os.stat_result, file_digest: str | None, is_racy: bool) -> None:
        """Record the status and digest of the bytes a run read (without the status where the file is racy)."""
        if is_racy:
            self.statuses[real_path] = [None, None, None, None, file_digest]
        else:
            self.statuses[real_path] = [stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, file_digest]

    def keep_run(self, found: Discovered, mode: str, report: RunReport) -> dict[str, Any]:
        """The run to record with the statuses (`save`): its report and the files it read."""
        findings = [[path, *_row(finding)] for path, finding in report.findings]
        return {
            "mode": mode,
            "cwd": os.getcwd(),
            "files": _listed(found),
            "findings": findings,
            "changed": list(report.changed),
            "parsed": report.parsed,
        }

    def encode(self, results: dict[str, dict[str, Any]]) -> tuple[str, frozenset[str]]:
        """Results (real path -> results) as `save` writes them, and their paths: made ahead of it, while the
        workers migrate."""
        return json.dumps(results, separators=(",", ":")), frozenset(results)

    def save(
        self,
        run: dict[str, Any] | None,
        results: dict[str, dict[str, Any]],
        listed: Iterable[str] = (),
        ahead: tuple[str, frozenset[str]] = ("{}", frozenset()),
    ) -> None:
        """Write the file: the statuses recorded, ``run`` (None: no report to replay), and the files' results:
        ``results`` (real path -> results) and those encoded ``ahead`` (`encode`). Statuses and results of files
        outside the folders ``listed`` are kept as they were: another run over other paths of the project keeps
        its own."""
        roots = tuple(root.rstrip(os.sep) + os.sep for root in listed)
        encoded, done = ahead
        statuses = {
            path: row
            for path, row in self.statuses.items()
            if path in results or path in done or not path.startswith(roots)
        }
        kept = {
            path: entry
            for path, entry in self._all_results().items()
            if path not in results and path not in done and path in statuses and not path.startswith(roots)
        }
        header = json.dumps(
            {"format": FORMAT, "key": self.key, "statuses": statuses, "run": run}, separators=(",", ":")
        )
        rest = self.encode({**kept, **results})[0]
        body = rest if encoded == "{}" else encoded if rest == "{}" else f"{encoded[:-1]},{rest[1:]}"
        try:
            cachedir.make(self.folder)
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            cachedir.write_atomically(self.path, f"{header}\n{body}\n".encode("utf-8", "surrogateescape"))
        except OSError as error:  # a read-only or full cache folder costs the cache, not the run
            self.warn(f"cannot be written ({error.strerror or error})")


def _listed(found: Discovered) -> list[list[object]]:
    """The files of a run as its record keeps them: path as given, real path, excluded."""
    return sorted(
        [[f.path, f.real_path, False] for f in found.files] + [[f.path, f.real_path, True] for f in found.excluded]
    )


def _statuses(data: object) -> dict[str, list[Any]]:
    if not isinstance(data, dict):
        raise TypeError("statuses must be an object")
    for path, row in data.items():
        if not (
            isinstance(row, list)
            and len(row) == 5
            and (all(type(n) is int for n in row[:4]) or row[:4] == [None] * 4)
            and (row[4] is None or (isinstance(row[4], str) and len(row[4]) == 64))
        ):
            raise TypeError(f"malformed status of {path!r:.80}")
    return data


def _run(data: object) -> dict[str, Any] | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise TypeError("the run must be an object or null")
    if not (
        isinstance(data["mode"], str)
        and isinstance(data["cwd"], str)
        and isinstance(data["files"], list)
        and isinstance(data["changed"], list)
        and all(isinstance(path, str) for path in data["changed"])
        and type(data["parsed"]) is int
    ):
        raise TypeError("malformed run")
    for row in data["findings"]:
        if not (isinstance(row, list) and row and isinstance(row[0], str)):
            raise TypeError(f"malformed finding {row!r:.80}")
        _finding(row[1:])
    return data


def _row(finding: Finding) -> list[object]:
    return [finding.line, finding.column, finding.code, finding.message, finding.status.value, finding.release]


def _finding(item: object) -> Finding:
    if not (isinstance(item, list) and len(item) == 6):
        raise TypeError(f"malformed finding {item!r:.80}")
    line, column, code, message, status, release = item
    if not (type(line) is int and type(column) is int and isinstance(code, str) and isinstance(message, str)):
        raise TypeError(f"malformed finding {item!r:.80}")
    if not (release is None or isinstance(release, str)):
        raise TypeError(f"malformed finding {item!r:.80}")
    return Finding(line, column, code, message, Status(status), release)


def migration_to_data(new_source: bytes | None, findings: Sequence[Finding], answers: object, verified: bool) -> object:
    """A file's migration as its results keep it (`index.questions.Answers` as rows)."""
    rows = [[question, list(arguments), answer] for (question, arguments), answer in answers]  # type: ignore[attr-defined]
    text = None if new_source is None else new_source.decode("latin-1")
    return {"new_source": text, "findings": [_row(f) for f in findings], "answers": rows, "verified": verified}


def migration_from_data(data: object) -> tuple[bytes | None, list[Finding], tuple[Any, ...], bool]:
    """What `migration_to_data` made; ``ValueError`` or ``TypeError`` on anything else."""
    if not isinstance(data, dict):
        raise TypeError(f"malformed migration {data!r:.80}")
    new_source, verified = data["new_source"], data["verified"]
    if not ((new_source is None or isinstance(new_source, str)) and isinstance(verified, bool)):
        raise TypeError("malformed migration")
    answers = []
    for row in data["answers"]:
        if not (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str) and isinstance(row[1], list)):
            raise TypeError(f"malformed answer {row!r:.80}")
        question, arguments, answer = row
        if not (all(isinstance(a, str) for a in arguments) and (answer is None or isinstance(answer, (bool, str)))):
            raise TypeError(f"malformed answer {row!r:.80}")
        answers.append(((question, tuple(arguments)), answer))
    findings = [_finding(row) for row in data["findings"]]
    return None if new_source is None else new_source.encode("latin-1"), findings, tuple(answers), verified
