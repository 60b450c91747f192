"""The bad-input cases of ``test_cli_bad_input`` fed through standard input (``migrate -``): the same exit
code and message, under the name given by ``--stdin-filename``, and a pipe that never loses code (what
cannot be migrated comes back byte for byte on standard output)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .cli_run import TIMEOUT_S, cli_command, cli_env
from .test_cli_bad_input import _REFERENCE, CASES, Case, _program

# Cases of one file that standard input can carry: no links, permissions, folders or extra paths.
STDIN_CASES = [
    case
    for case in CASES
    if len(case.files) == 1
    and "/" not in next(iter(case.files))
    and not case.extra_args
    and not case.needs_permissions
    and case.prepare is Case.prepare
]


def test_every_single_file_case_is_covered():
    assert {case.name for case in STDIN_CASES} >= {
        "syntax-error",
        "null-bytes",
        "undecodable",
        "deeply-nested-expression",
    }


@pytest.mark.parametrize("case", STDIN_CASES, ids=[case.name for case in STDIN_CASES])
def test_bad_input_on_standard_input(case: Case, tmp_path: Path, migrated_legacy: bytes) -> None:
    _REFERENCE[:] = [_program(migrated_legacy)]
    ((name, source),) = case.files.items()
    result = subprocess.run(
        cli_command("migrate", "--stdin-filename", name, "-"),
        input=source,
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        timeout=case.timeout or TIMEOUT_S,
    )
    report = result.stderr.decode(errors="replace")
    assert result.returncode == case.exit_code, f"exit code {result.returncode}, expected {case.exit_code}:\n{report}"
    if case.message:
        assert case.message in report, f"expected {case.message!r} in the report:\n{report}"
    assert "Traceback" not in report, report
    if name in case.untouched or case.exit_code == 2:
        assert result.stdout == source, "the input did not come back unchanged"
    (tmp_path / name).write_bytes(result.stdout)
    case.check(tmp_path)  # the migrated output, judged as the file-based case judges the file
