"""What a run found, and its three renderings: text for people, JSON for tools, GitHub annotations for CI.

The summary carries the funnel (scanned, parsed, changed) and what is left to do, by status and by
rule, so a maintainer can paste it into a pull request and a CI job can decide from the exit code.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from vllm_attn_compat.codemods.findings import Finding, Status

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.target_version import Target

# Statuses that leave work for a person: they make `migrate` exit 1.
LEFT = (Status.UNSAFE_FIX_AVAILABLE, Status.MANUAL)
# Python's own line breaks only: str.splitlines would also split at form feeds and U+2028.
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")
_MARKERS = {Status.FIXED: "[*] ", Status.UNSAFE_FIX_AVAILABLE: "[unsafe] ", Status.MANUAL: ""}


class FileError(NamedTuple):
    """A file that could not be processed; the run goes on with the others."""

    path: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: {self.message}"


class RunReport:
    """Everything one ``migrate`` run produced. ``mode`` is ``write``, ``check`` or ``diff``."""

    def __init__(
        self,
        mode: str = "write",
        scanned: int = 0,
        parsed: int = 0,
        changed: Iterable[str] = (),
        findings: Iterable[tuple[str, Finding]] = (),
        errors: Iterable[FileError] = (),
        skipped: Iterable[tuple[str, str]] = (),
        target: Target | None = None,
    ) -> None:
        self.mode = mode
        self.target = target  # the vLLM release the run targeted, and why (None: not stated)
        self.scanned = scanned
        self.parsed = parsed
        self.changed = list(changed)
        self.findings = list(findings)
        self.errors = list(errors)
        self.skipped = list(skipped)

    @property
    def by_status(self) -> Counter[Status]:
        return Counter(finding.status for _, finding in self.findings)

    @property
    def left_by_code(self) -> Counter[str]:
        return Counter(finding.code for _, finding in self.findings if finding.status in LEFT)

    def left_by_release(self) -> dict[str, Counter[str]]:
        """The findings left for a person whose cause is a vLLM release's change: by that release (oldest first),
        then by code."""
        from vllm_attn_compat.manifest import version_key

        found: dict[str, Counter[str]] = {}
        for _, finding in self.findings:
            if finding.status in LEFT and finding.release is not None:
                found.setdefault(finding.release, Counter())[finding.code] += 1
        return {release: found[release] for release in sorted(found, key=version_key)}

    def exit_code(self) -> int:
        """0: nothing left to do; 1: findings left, or --check/--diff would change a file; 2: a file failed."""
        if self.errors:
            return 2
        if self.left_by_code or (self.mode != "write" and self.changed):
            return 1
        return 0

    def sorted_findings(self) -> list[tuple[str, Finding]]:
        return sorted(self.findings, key=lambda item: (item[0], item[1].line, item[1].column, item[1].code))


def unified_diff(path: str, old: bytes, new: bytes, encoding: str) -> str:
    """A ``git apply``-able unified diff of one file, decoded with the file's own encoding."""
    import difflib  # here, not at the top: the CLI imports this module on every run, diffs are rare

    old_lines, new_lines = _LINE.findall(old.decode(encoding)), _LINE.findall(new.decode(encoding))
    lines = []
    name = path.lstrip("/")
    for line in difflib.unified_diff(old_lines, new_lines, f"a/{name}", f"b/{name}"):
        if line.endswith(("\r\n", "\n", "\r")):
            lines.append(line if line.endswith("\n") else line + "\n")
        else:
            lines.append(line + "\n\\ No newline at end of file\n")
    return "".join(lines)


def summary_lines(report: RunReport) -> list[str]:
    """The closing summary: the funnel, the findings by status and by rule, and what to do next."""
    would = report.mode != "write"
    counts = report.by_status
    lines = [
        f"Scanned {report.scanned} file{'s' if report.scanned != 1 else ''}: {report.parsed} parsed, "
        f"{len(report.changed)} {'would change' if would else 'changed'}."
    ]
    left = counts[Status.UNSAFE_FIX_AVAILABLE] + counts[Status.MANUAL]
    lines.append(
        f"Findings: {counts[Status.FIXED]} {'fixable' if would else 'fixed'}, {left} left "
        f"({counts[Status.MANUAL]} manual, {counts[Status.UNSAFE_FIX_AVAILABLE]} unsafe fix withheld), "
        f"{counts[Status.SUPPRESSED]} suppressed by noqa."
    )
    if report.target is not None:
        lines.insert(0, f"Target: {report.target.describe()}.")
    if report.left_by_code:
        left_by_code = sorted(report.left_by_code.items())
        lines.append("Left by rule: " + ", ".join(f"{code} {count}" for code, count in left_by_code))
    by_release = report.left_by_release()
    if by_release:
        groups = (
            f"vLLM {release}: {sum(codes.values())} ({', '.join(f'{c} {n}' for c, n in sorted(codes.items()))})"
            for release, codes in by_release.items()
        )
        lines.append("Left by the vLLM release that caused them: " + "; ".join(groups) + ".")
    if counts[Status.UNSAFE_FIX_AVAILABLE]:
        n = counts[Status.UNSAFE_FIX_AVAILABLE]
        lines.append(f"{n} unsafe fix{'es' if n != 1 else ''} available with --unsafe-fixes (review them).")
    if would and report.changed:
        lines.append("Run the same command without --check/--diff to apply the fixes marked [*].")
    if report.skipped:
        lines.append(f"{len(report.skipped)} file(s) skipped on purpose (see above).")
    if report.errors:
        lines.append(f"{len(report.errors)} file(s) could not be processed (see the errors above).")
    return lines


def render_text(report: RunReport, *, quiet: bool = False) -> str:
    lines = [str(error) for error in report.errors]
    if not quiet:
        lines += [f"{path}: skipped: {reason}" for path, reason in report.skipped]
    for path, finding in report.sorted_findings():
        if finding.status is not Status.SUPPRESSED:
            marker = _MARKERS[finding.status]
            lines.append(f"{path}:{finding.line}:{finding.column}: {finding.code} {marker}{finding.message}")
    if not quiet:
        lines += summary_lines(report)
    return "".join(line + "\n" for line in lines)


# The version of the JSON report's schema (docs/json-report.md).
JSON_VERSION = 2


def render_json(report: RunReport) -> str:
    """The report as docs/json-report.md describes it: under ``--check`` and ``--diff`` a fix the run would take is
    ``fixable``, not ``fixed``, and the files it would change are not counted as changed."""
    written = report.mode == "write"

    def status(value: Status) -> str:
        return "fixable" if value is Status.FIXED and not written else value.value

    counts = Counter(status(finding.status) for _, finding in report.findings)
    names = ["fixed", "fixable", *(value.value for value in Status if value is not Status.FIXED)]
    document = {
        "version": JSON_VERSION,
        "mode": report.mode,
        "findings": [
            {
                "file": path,
                "line": finding.line,
                "column": finding.column,
                "code": finding.code,
                "message": finding.message,
                "status": status(finding.status),
                "release": finding.release,
            }
            for path, finding in report.sorted_findings()
        ],
        "errors": [{"file": e.path, "line": e.line, "column": e.column, "message": e.message} for e in report.errors],
        "skipped": [{"file": path, "reason": reason} for path, reason in report.skipped],
        "target": None
        if report.target is None
        else {"release": report.target.release, "oldest": report.target.oldest, "reason": report.target.reason},
        "summary": {
            "files_scanned": report.scanned,
            "files_parsed": report.parsed,
            "files_changed": len(report.changed) if written else 0,
            "files_would_change": 0 if written else len(report.changed),
            "files_failed": len(report.errors),
            "findings": {name: counts[name] for name in names},
            "left_by_code": dict(sorted(report.left_by_code.items())),
            "left_by_release": {
                release: dict(sorted(codes.items())) for release, codes in report.left_by_release().items()
            },
            "exit_code": report.exit_code(),
        },
    }
    import json  # here, not at the top: most runs print text

    return json.dumps(document, indent=2) + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _annotation(level: str, path: str, line: int, column: int, title: str, message: str) -> str:
    return (
        f"::{level} file={_escape_property(path)},line={line},col={column},"
        f"title={_escape_property(title)}::{_escape_data(message)}"
    )


def render_github(report: RunReport, *, quiet: bool = False) -> str:
    """GitHub Actions workflow commands: an error per file failure and per finding left (or fixable)."""
    lines = [_annotation("error", e.path, e.line, e.column, "vllm-attn-compat", e.message) for e in report.errors]
    for path, finding in report.sorted_findings():
        if finding.status is Status.SUPPRESSED:
            continue
        applied = finding.status is Status.FIXED and report.mode == "write"
        message = finding.message + (" (fixed)" if applied else "")
        level = "notice" if applied else "error"
        lines.append(_annotation(level, path, finding.line, finding.column, finding.code, message))
    if not quiet:
        lines += summary_lines(report)
    return "".join(line + "\n" for line in lines)


RENDERERS = {"text": render_text, "github": render_github}


def render(report: RunReport, output_format: str, *, quiet: bool = False) -> str:
    if output_format == "json":
        return render_json(report)
    return RENDERERS[output_format](report, quiet=quiet)
