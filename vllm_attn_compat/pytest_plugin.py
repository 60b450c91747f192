"""The pytest plugin (entry point ``pytest11``): the deprecated uses a test session made, and how to migrate them.

Loaded by pytest in every session of an environment that has vllm-attn-compat; it imports neither torch nor
libcst. It counts each use of an API removed in vLLM 0.20 that went through this package's forwarders (every
call, whatever the warning filters or ``VLLM_ATTN_COMPAT_WARNINGS`` say), and at the end of the session:

- ``--vllm-attn-compat=summary`` (default): lists them in the terminal summary, if there were any;
- ``--vllm-attn-compat=error``: the same, and the session fails (exit code 1) if there were any;
- ``--vllm-attn-compat=off``: counts nothing, prints nothing, installs nothing;
- ``--vllm-attn-compat-report=PATH``: writes them as JSON (schema in docs/runtime.md).

The ini option ``vllm_attn_compat`` sets the mode too; the command line wins. Under pytest-xdist each worker
counts its own uses and the controller adds them up.

Unless the mode is ``off``, each process of the session (controller and xdist workers) gets the vLLM plugin's
shim as vLLM's own processes do, once it imports vLLM (:mod:`session_shim`).
``--vllm-attn-compat-check-output`` (ini ``vllm_attn_compat_check_output``) sets
``VLLM_ATTN_COMPAT_CHECK_OUTPUT=error`` for the session, which the plugin's install reads: the output guard.
"""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING, Protocol

import pytest

from vllm_attn_compat import deprecated_uses
from vllm_attn_compat.deprecated_uses import Tally, Use

MODES = ("summary", "error", "off")
SCHEMA = "vllm-attn-compat/deprecated-uses/1"
_WORKER_OUTPUT = "vllm_attn_compat_uses"  # the key of a worker's uses in xdist's workeroutput
# Read by the vLLM plugin when it installs (compat/plugin.py); the pytest option sets it for the session.
ENV_CHECK_OUTPUT = "VLLM_ATTN_COMPAT_CHECK_OUTPUT"

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from vllm_attn_compat.session_shim import SessionShim


class _WorkerNode(Protocol):
    """What this plugin reads of xdist's ``WorkerController`` (xdist is optional and untyped)."""

    config: pytest.Config


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vllm-attn-compat", "deprecated vLLM attention APIs (vllm-attn-compat)")
    group.addoption(
        "--vllm-attn-compat", choices=MODES, default=None, dest="vllm_attn_compat",
        help="summary: list the deprecated uses seen at the end (default); error: also fail the session if "
        "there were any; off: count nothing. Overrides the ini option vllm_attn_compat.",
    )  # fmt: skip
    group.addoption(
        "--vllm-attn-compat-report", metavar="PATH", default=None, dest="vllm_attn_compat_report",
        help="write the deprecated uses seen to PATH as JSON",
    )  # fmt: skip
    group.addoption(
        "--vllm-attn-compat-check-output", action="store_true", default=False, dest="vllm_attn_compat_check_output",
        help=f"turn the output guard on, in error mode, for the session and its xdist workers ({ENV_CHECK_OUTPUT}"
        "=error): a backend that leaves rows of `output` unwritten fails the test. Also ini "
        "vllm_attn_compat_check_output.",
    )  # fmt: skip
    parser.addini("vllm_attn_compat", f"deprecated vLLM attention APIs: {', '.join(MODES)} (default summary)")
    parser.addini(
        "vllm_attn_compat_check_output", f"the output guard in error mode for the session ({ENV_CHECK_OUTPUT}=error)",
        type="bool", default=False,
    )  # fmt: skip


class _Session:
    """The plugin's state for one pytest session: its mode, this process's tally and the workers' uses."""

    def __init__(self, config: pytest.Config, mode: str) -> None:
        self.config = config
        self.mode = mode
        self.tally = Tally()
        self.from_workers: list[Use] = []
        self.previous_tally = deprecated_uses.tally
        self.shim: SessionShim | None = None  # calls the vLLM plugin's entry point once the session imports vLLM
        self.previous_check_output: str | None = None  # the environment's value before the session set it
        self.sets_check_output = False

    @property
    def is_worker(self) -> bool:
        # Read when needed: xdist sets workerinput on a worker's config after the session has started.
        return hasattr(self.config, "workerinput")

    def uses(self) -> list[Use]:
        return deprecated_uses.merge([*self.tally.uses(), *self.from_workers])


_KEY = pytest.StashKey[_Session]()
_STARTED = pytest.StashKey[bool]()


def _mode(config: pytest.Config, options: argparse.Namespace) -> str:
    chosen: str | None = options.vllm_attn_compat
    if chosen is not None:
        return chosen
    configured = (config.getini("vllm_attn_compat") or "summary").strip().lower()
    if configured not in MODES:
        raise pytest.UsageError(f"ini option vllm_attn_compat must be one of {', '.join(MODES)}; found {configured!r}")
    return configured


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Start before the first conftest is imported: a conftest importing vLLM then gets the shim, counted."""
    _start(early_config, early_config.known_args_namespace)


def pytest_configure(config: pytest.Config) -> None:
    if not config.stash.get(_STARTED, False):  # loaded too late for the hook above (a conftest's pytest_plugins)
        _start(config, config.option)


def _start(config: pytest.Config, options: argparse.Namespace) -> None:
    config.stash[_STARTED] = True
    mode = _mode(config, options)
    check_output = bool(options.vllm_attn_compat_check_output or config.getini("vllm_attn_compat_check_output"))
    if mode == "off":
        if options.vllm_attn_compat_report:
            raise pytest.UsageError("--vllm-attn-compat-report needs the uses counted: not with --vllm-attn-compat=off")
        if check_output:
            raise pytest.UsageError(
                "--vllm-attn-compat-check-output (or ini vllm_attn_compat_check_output) needs the shim this plugin "
                "installs: not with --vllm-attn-compat=off"
            )
        return
    session = _Session(config, mode)
    config.stash[_KEY] = session
    deprecated_uses.tally = session.tally
    if check_output:
        # Before the shim installs, whose install reads it. xdist workers inherit it when the controller spawns
        # them (after this), and their own plugin, given the controller's arguments, sets it again.
        session.previous_check_output = os.environ.get(ENV_CHECK_OUTPUT)
        session.sets_check_output = True
        os.environ[ENV_CHECK_OUTPUT] = "error"
    from vllm_attn_compat import session_shim  # no vLLM, no torch: they load when the code under test imports them

    session.shim = session_shim.watch()


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_KEY, None)
    if session is None:
        return
    if session.shim is not None:
        session.shim.stop()  # what it installed stays: vLLM's classes keep the shim for the rest of the process
    if session.sets_check_output:
        if session.previous_check_output is None:
            os.environ.pop(ENV_CHECK_OUTPUT, None)
        else:
            os.environ[ENV_CHECK_OUTPUT] = session.previous_check_output
    if deprecated_uses.tally is session.tally:
        deprecated_uses.tally = session.previous_tally  # a pytester session inside a session


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: _WorkerNode, error: object) -> None:
    """xdist, on the controller: a worker finished; add up the uses it counted."""
    session = node.config.stash.get(_KEY, None)
    output = getattr(node, "workeroutput", None) or {}
    if session is not None:
        session.from_workers += [Use.from_json(use) for use in output.get(_WORKER_OUTPUT, ())]


@pytest.hookimpl(trylast=True)  # after session-scoped fixtures are torn down; before xdist sends workeroutput
def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(_KEY, None)
    if state is None:
        return
    if state.is_worker:
        output = session.config.workeroutput  # type: ignore[attr-defined]  # set by xdist on a worker
        output[_WORKER_OUTPUT] = [use.as_json() for use in state.tally.uses()]
        return
    uses = state.uses()
    report = session.config.getoption("vllm_attn_compat_report")
    if report:
        _write_report(report, state, uses)
    if uses and state.mode == "error" and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    state = config.stash.get(_KEY, None)
    if state is None or state.is_worker:
        return
    uses = state.uses()
    if not uses:
        return
    total = sum(use.count for use in uses)
    write = terminalreporter
    title = f"vllm-attn-compat: {_plural(total, 'deprecated use')} at {_plural(len(uses), 'place')}"
    write.section(title, yellow=True)
    here = config.invocation_params.dir
    for use in uses:
        place = f"{_path(use.path, here)}:{use.line}"
        write.line(f"{use.rule or '?':7} {place}: {use.old_api} ({_plural(use.count, 'call')})")
        command = _command(use, here)
        if command:
            write.line(f"        fix: {command}")
        elif deprecated_uses.BY_HAND in use.message:
            write.line(f"        fix by hand (migrate cannot find it): {deprecated_uses.replacement(use.message)}")
    if state.mode == "error":
        write.line(
            f"vllm-attn-compat: the session fails: {_plural(total, 'deprecated use')} (--vllm-attn-compat=error)",
            red=True, bold=True,
        )  # fmt: skip


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _path(path: str, here: Path) -> str:
    """``path`` relative to the directory pytest was run from when it lies inside it (as a command takes it)."""
    try:
        relative = os.path.relpath(path, here)
    except ValueError:  # another drive (Windows)
        return path
    return path if relative.startswith(os.pardir) else relative


def _command(use: Use, here: Path) -> str | None:
    """The ``migrate`` command for this use's rule and file; ``--unsafe-fixes`` where the rule's fix is unsafe."""
    if use.rule is None or not os.path.isfile(use.path):  # code compiled from a string has no file to migrate
        return None
    if deprecated_uses.BY_HAND in use.message:  # nothing in the source marks this use: migrate cannot find it
        return None
    # Rule metadata only: neither libcst nor torch.
    from vllm_attn_compat.codemods import registry
    from vllm_attn_compat.codemods.findings import FixSafety

    unsafe = any(rule.code == use.rule and rule.fix_safety is FixSafety.UNSAFE for rule in registry.all_rules())
    words = ["vllm-attn-compat", "migrate", "--select", use.rule, *(["--unsafe-fixes"] if unsafe else [])]
    return shlex.join([*words, _path(use.path, here)])


def _write_report(path: str, state: _Session, uses: list[Use]) -> None:
    import json

    here = state.config.invocation_params.dir
    document = {
        "schema": SCHEMA,
        "mode": state.mode,
        "total": sum(use.count for use in uses),
        "uses": [{**use.as_json(), "path": _path(use.path, here), "command": _command(use, here)} for use in uses],
    }
    target = os.path.join(here, path)
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    with open(target, "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=2)
        stream.write("\n")
