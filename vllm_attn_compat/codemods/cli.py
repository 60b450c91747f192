"""``vllm-attn-compat``: ``migrate`` files and folders, or list and explain the ``rules``.

Exit codes (ruff's convention, so CI can trust them): 0 nothing left to do; 1 findings remain, or
``--check``/``--diff`` would change a file; 2 a usage or configuration error, or a file that could not
be read, decoded or parsed (reported as ``path:line:col: message``; the other files are still processed),
or a dependency missing or broken (one line naming it and its install command; the run stops).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from vllm_attn_compat import __version__
from vllm_attn_compat.codemods.config import ConfigError
from vllm_attn_compat.codemods.run import dependencies

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.config import Config
    from vllm_attn_compat.codemods.run.options import Options

EPILOG = (
    "exit codes: 0 nothing left to do; 1 findings remain, or --check/--diff would change a file; "
    "2 usage or configuration error, or a file could not be read, decoded or parsed."
)


def _codes(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _jobs(value: str) -> int:
    try:
        jobs = int(value)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of processes, found {value!r}")
    return jobs


def _rules_epilog() -> str:
    """The rules, from the rules themselves (``vllm-attn-compat rules CODE`` explains one)."""
    import textwrap

    from vllm_attn_compat.codemods import registry

    lines = [f"  {rule.code} ({rule.fix_safety.value}) {rule.summary}" for rule in registry.all_rules()]
    return "rules:\n" + "\n".join(lines) + "\n\n" + textwrap.fill(EPILOG, 79)


def _help_width() -> int:
    """The width help is wrapped to, as `shutil.get_terminal_size` finds it, less two (argparse's default)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns or 80) - 2


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, told its width: left to find it, argparse imports `shutil` (and with it bz2 and
    lzma) each time a parser is built, a twentieth of a rerun the cache replays, for help rarely shown."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, _help_width() if width is None else width)


class _RawDescriptionFormatter(_Formatter, argparse.RawDescriptionHelpFormatter):
    pass


class _Parser(argparse.ArgumentParser):
    """A parser whose epilog may be made when its help is shown (``epilog_from``): listing the rules imports
    every rule's module, which a run the cache replays never needs."""

    def __init__(self, *args: Any, epilog_from: Callable[[], str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epilog_from = epilog_from

    def format_help(self) -> str:
        if self.epilog_from is not None:
            self.epilog = self.epilog_from()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        formatter_class=_Formatter,
        prog="vllm-attn-compat",
        description="Migrate vLLM attention-backend code to the mandatory output buffer (vLLM >= 0.20).",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{migrate,rules}", parser_class=_Parser)
    migrate = commands.add_parser(
        "migrate", help="apply safe fixes in place (or --check / --diff)", epilog_from=_rules_epilog,
        description="Apply the rules' safe fixes to Python files in place and report what is left.",
        formatter_class=_RawDescriptionFormatter,
    )  # fmt: skip
    migrate.add_argument("paths", nargs="+", metavar="PATH", help="files or folders; '-' reads standard input")
    mode = migrate.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file would change or findings remain"
    )
    mode.add_argument("--diff", action="store_true", help="print a unified diff of the fixes, write nothing")
    migrate.add_argument(
        "--unsafe-fixes", action=argparse.BooleanOptionalAction, default=None,
        help="also apply unsafe fixes (review them); --no-unsafe-fixes overrides the configuration",
    )  # fmt: skip
    migrate.add_argument(
        "--target-version", metavar="X.Y",
        help="the vLLM release the code must run on (default: target-version in [tool.vllm-attn-compat], else the "
        "newest release the project's vLLM requirement allows, else the newest release known)",
    )  # fmt: skip
    migrate.add_argument(
        "--old-op-calls", choices=("with-output", "forwarder"), default=None,
        help="how the unsafe fix rewrites calls of the removed unified_attention ops: with-output (default) "
        "allocates and calls the _with_output op where the layer's shape is known and reports the rest; "
        "forwarder sends the rest to this package's deprecated forwarders",
    )  # fmt: skip
    # Repeatable, and comma-separated lists.
    migrate.add_argument(
        "--select", type=_codes, action="extend", metavar="CODES", help="rule codes or prefixes to run"
    )
    migrate.add_argument(
        "--ignore", type=_codes, action="extend", metavar="CODES", help="rule codes or prefixes to skip"
    )
    migrate.add_argument(
        "--exclude",
        type=_codes,
        action="extend",
        metavar="GLOB",
        help="paths never to change nor report (globs); still read for the others' class hierarchy and callers",
    )
    migrate.add_argument("--jobs", "-j", type=_jobs, default=None, help="worker processes (default: all cores)")
    migrate.add_argument(
        "--format", choices=("text", "json", "github"), default="text",
        help="report format (json's fields: docs/json-report.md in the project's repository)",
    )  # fmt: skip
    caching = migrate.add_mutually_exclusive_group()
    caching.add_argument(
        "--cache-dir", metavar="DIR",
        help="keep results in DIR and reuse them while nothing they depend on changed "
        "(default: .vllm-attn-compat-cache at the project's root)",
    )  # fmt: skip
    caching.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    migrate.add_argument(
        "--quiet", "-q", action="store_true", help="print findings and errors only: no summary, no progress"
    )
    migrate.add_argument("--stdin-filename", metavar="NAME", help="the name to report for '-' (standard input)")
    rules = commands.add_parser(
        "rules", help="list the rules, or explain one with its examples", formatter_class=_Formatter
    )
    rules.add_argument("code", nargs="?", help="a rule code (VAC004) or name to explain")
    return parser


def _options(args: argparse.Namespace) -> Options:
    return _configured(args)[0]


def _configured(args: argparse.Namespace) -> tuple[Options, Config]:
    """The run's options, and the configuration they come from in part."""
    from vllm_attn_compat.codemods.config import load_config
    from vllm_attn_compat.codemods.run.options import Options
    from vllm_attn_compat.codemods.target_version import project_root, target_for

    start = (args.stdin_filename or ".") if args.paths == ["-"] else args.paths[0]
    config = load_config(start)
    target = target_for(project_root(start), explicit=args.target_version, configured=config.target_version)
    mode = "check" if args.check else "diff" if args.diff else "write"
    unsafe = config.unsafe_fixes if args.unsafe_fixes is None else args.unsafe_fixes
    progress = not args.quiet and sys.stderr.isatty() and not os.environ.get("CI")
    options = Options(
        mode=mode,
        unsafe_fixes=unsafe,
        old_op_calls=args.old_op_calls or config.old_op_calls,
        # --select states exactly what to run: the configuration's select and ignore give way to it.
        select=tuple(args.select if args.select is not None else config.select),
        ignore=tuple(args.ignore if args.ignore is not None else () if args.select is not None else config.ignore),
        exclude=tuple(args.exclude if args.exclude is not None else config.exclude),
        base=config.base,
        progress=progress,
        target=target,
    )
    if args.jobs is not None:
        options = options._replace(jobs=args.jobs)
    options = options._replace(cache_dir=_cache_dir(args, config))
    return options, config


def _check_configured_codes(args: argparse.Namespace, config: Config) -> None:
    """A code misspelt in the configuration's select or ignore, named with the file it comes from. Asked by a
    run the cache cannot replay (it imports every rule): a replayed run's codes were valid when it was made,
    the options that select rules and this package's code being in its key."""
    configured = (("select", args.select is None), ("ignore", args.ignore is None and args.select is None))
    for key, from_config in configured:
        codes = getattr(config, key)
        if from_config and codes:
            from vllm_attn_compat.codemods import registry

            try:
                registry.select_rules(codes if key == "select" else (), codes if key == "ignore" else ())
            except ValueError as error:
                raise ConfigError(f"{config.source}: [tool.vllm-attn-compat] {key}: {error}") from None


def _cache_dir(args: argparse.Namespace, config: Config) -> str | None:
    """The cache's folder: ``--cache-dir``, else the configuration's ``cache-dir``, else the default at the
    project's root; None with ``--no-cache``, or with ``VLLM_ATTN_COMPAT_NO_CACHE`` set and no ``--cache-dir``
    (command-line flags win)."""
    from vllm_attn_compat.codemods.run import cachedir

    if args.no_cache:
        return None
    if args.cache_dir:
        return str(args.cache_dir)
    if cachedir.disabled_by_environment():
        return None
    return config.cache_dir or cachedir.default_folder(config.base)


def _migrate(args: argparse.Namespace) -> int:
    for path in args.paths if "-" not in args.paths else ():  # before anything is read or created (the cache)
        if not os.path.lexists(path):
            raise ValueError(f"{path}: no such file or directory (expected a file or folder to migrate)")
    options, config = _configured(args)
    return _migrate_with(args, options, config)


def _reader_gone() -> None:
    """Standard output's reader went away (``| head``): the rest goes nowhere, quietly, and the command exits with
    its own code, as well-behaved commands do (a flush at exit would fail again)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _write(stream: Any, text: str) -> None:
    """``stream.write(text)``, and nothing more once standard output's reader is gone."""
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        if stream is not sys.stdout:
            raise
        _reader_gone()


def _migrate_with(args: argparse.Namespace, options: Options, config: Config) -> int:
    from vllm_attn_compat.codemods.run.report import render

    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # a diff of a latin-1 file on an ASCII terminal must not crash
            stream.reconfigure(errors="backslashreplace")
    if "-" in args.paths:
        if len(args.paths) > 1:
            raise ValueError("'-' (standard input) cannot be combined with other paths")
        from vllm_attn_compat.codemods.run.runner import run_source

        _check_configured_codes(args, config)
        name = args.stdin_filename or "-"
        report, result, diff = run_source(sys.stdin.buffer.read(), name, options)
        try:
            if options.mode == "write":
                sys.stdout.buffer.write(result)
            elif options.mode == "diff":
                sys.stdout.write(diff)
            sys.stdout.flush()
        except BrokenPipeError:
            _reader_gone()
        report_stream = sys.stderr
    else:

        def emit_diff(text: str) -> None:
            _write(sys.stdout, text)

        from vllm_attn_compat.codemods.run.runner import run_paths

        def on_miss() -> None:
            _check_configured_codes(args, config)

        report = run_paths(args.paths, options, emit_diff=emit_diff, on_miss=on_miss)
        report_stream = sys.stderr if options.mode == "diff" else sys.stdout
    _write(report_stream, render(report, args.format, quiet=args.quiet))
    return report.exit_code()


def _rules(args: argparse.Namespace) -> int:
    from vllm_attn_compat.codemods import registry

    known = registry.all_rules()
    if args.code is None:
        width = max((len(rule.name) for rule in known), default=0)
        for rule in known:
            print(f"{rule.code}  {rule.name:<{width}}  {rule.fix_safety.value:<12}  {rule.summary}")
        return 0
    from vllm_attn_compat.codemods.engine.docs import render_rule

    wanted = args.code.strip()
    for rule in known:
        if wanted.upper() == rule.code or wanted == rule.name:
            print(render_rule(rule))
            return 0
    raise ValueError(f"unknown rule {wanted!r}: expected one of {', '.join(rule.code for rule in known)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:  # argparse: --help/--version (0) or a usage error (2)
        return int(exit_request.code or 0)
    try:
        return _migrate(args) if args.command == "migrate" else _rules(args)
    except (ConfigError, ValueError) as error:
        print(f"vllm-attn-compat: error: {error}", file=sys.stderr)
        return 2
    except ImportError as error:  # a dependency missing or broken, here or in a worker (a bug of ours re-raises)
        missing = dependencies.missing(error)
        if missing is None:
            raise
        print(f"vllm-attn-compat: error: {missing}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vllm-attn-compat: interrupted; every file written so far is complete", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `rules ... | head`: the reader is gone, and the command did what it was asked
        _reader_gone()
        return 0


# Allocations between two collections of the cyclic collector's youngest generation (CPython's default: 700).
# A run lives a second or two and makes few cycles, but millions of objects (index records, answers, libcst's
# nodes): at the default pace, a rerun after an edit spent 20-25 ms of its main process in 120 collections and
# a cold run over torch's tree 10-13 ms, and found next to nothing. mypy collects at this pace for that reason.
YOUNG_COLLECTION_THRESHOLD = 200_000


def _collect_less_often() -> None:
    """Set the pace of this process's collector, before any worker is forked (they inherit it). Only the console
    script does: it owns its process, while a caller of :func:`main` keeps the collector it chose."""
    import gc

    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, oldest)


def run() -> NoReturn:
    """The console script: :func:`main`, then an immediate exit with its code.

    A run holds every file it read (tens of megabytes over a large tree) and libcst's thousands of
    objects; the interpreter's orderly shutdown frees them one by one, which takes a tenth of a whole
    ``--check`` run over torch's sources. Nothing is left for it to do: the output is flushed here,
    files were written and closed, and worker processes were stopped and reaped by the run itself.
    """
    _collect_less_often()
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: the reader is gone, as in main()
        _reader_gone()
    with contextlib.suppress(BrokenPipeError):
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
