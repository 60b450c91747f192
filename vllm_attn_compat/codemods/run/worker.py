"""What runs in a worker process for one file: index its classes, or migrate it and check the result.

Every function here returns its failure as a value (a :class:`FileError`) rather than raising, so one
bad file never takes the others with it; only the death of the process itself is left to
:mod:`parallel`. The engine is imported here, inside the functions, so the parent process imports
libcst only when it migrates files itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from vllm_attn_compat.codemods.findings import Finding, TargetRelease
from vllm_attn_compat.codemods.run import dependencies
from vllm_attn_compat.codemods.run.report import FileError

if TYPE_CHECKING:
    from typing import TypeAlias

    from vllm_attn_compat.codemods.engine.migrate import MigrationResult
    from vllm_attn_compat.codemods.engine.rule import Rule
    from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, ModuleIndex
    from vllm_attn_compat.codemods.index.questions import Answers, Recorder

    # What `migrate_file` hands back for one file.
    MigrateOutcome: TypeAlias = "Migrated | FileError | dependencies.MissingDependency"

Parsed = TypeVar("Parsed")


class Migrated(NamedTuple):
    """A file's migration: the new source (None when unchanged), the findings, and every question the
    migration asked of the class hierarchy with its answer (`index.questions`; None when that record
    cannot be replayed), which the cache keeps."""

    new_source: bytes | None
    findings: list[Finding]
    answers: Answers | None = None


# Set once per process by `setup`: the same for every file, so sent once rather than per task.
_settings: dict[str, Any] = {}

BUG = "this is a bug in vllm-attn-compat, please report it; the file was not changed"


def preload() -> None:
    """The initializer of the run's worker processes: import what migrating a file needs before the first file
    arrives (libcst's import takes a tenth of a second or more). A missing dependency is left to the tasks, each
    handing it back (`dependencies`)."""
    try:
        import importlib

        import libcst  # noqa: F401 - imported to have it loaded

        from vllm_attn_compat.codemods import noqa, registry  # noqa: F401 - likewise
        from vllm_attn_compat.codemods.engine import apply, migrate, positions, safety, scope, spans  # noqa: F401

        registry.all_rules()
        importlib.import_module("libcst.native")  # its parser, which its first parse loads (a module without types)
    except ImportError:
        pass


def index_file(source: bytes, path: str, names: frozenset[str] | None = None) -> ModuleIndex | FileError:
    """The file's class index (``hierarchy.ModuleIndex``), recording the uses of the attribute ``names`` (None: all),
    or a :class:`FileError` if it does not parse."""
    from vllm_attn_compat.codemods.index import hierarchy

    return _parsed(lambda text, name: hierarchy.index_module(text, name, names=names), source, path)


def check_syntax(source: bytes, path: str) -> bool | FileError:
    """True, or a :class:`FileError` if the file does not parse (as :func:`index_file` reports it)."""
    import ast

    def parses(text: bytes, name: str) -> bool:
        ast.parse(text, filename=name)
        return True

    return _parsed(parses, source, path)


def _parsed(parse: Callable[[bytes, str], Parsed], source: bytes, path: str) -> Parsed | FileError:
    try:
        return parse(source, path)
    except SyntaxError as error:
        return FileError(path, error.lineno or 1, error.offset or 1, f"could not parse: {error.msg}")
    except (RecursionError, MemoryError):
        # CPython's parser raises an empty MemoryError for deep nesting ("too many nested parentheses" is the
        # tokenizer's own limit); say what is wrong instead of echoing the exception's name.
        return FileError(path, 1, 1, "could not parse: the code is nested too deeply for the parser")
    except ValueError as error:  # e.g. null bytes
        return FileError(path, 1, 1, f"could not parse: {error}")
    except Exception as error:  # noqa: BLE001 - reported per file, see the module docstring
        message = f"internal error while indexing classes: {type(error).__name__}: {error}; {BUG}"
        return FileError(path, 1, 1, message)


def setup(
    rules: Sequence[type[Rule]],
    hierarchy: ClassHierarchy,
    unsafe_fixes: bool,
    old_op_calls: str = "with-output",
    verify: bool = True,
    target: TargetRelease | None = None,
) -> None:
    """``verify``: run the safety checks on each rewritten source (always, where it may be written). ``target``:
    the vLLM release the run targets (None: the newest)."""
    _settings.update(
        rules=list(rules),
        hierarchy=hierarchy,
        unsafe_fixes=unsafe_fixes,
        old_op_calls=old_op_calls,
        verify=verify,
        target=target,
    )
    _settings.pop("pickled", None)


def migrate_with(settings: bytes, source: bytes, path: str) -> MigrateOutcome:
    """:func:`migrate_file` with the pickled arguments of :func:`setup` (the run's settings and class hierarchy:
    a worker started before the rounds gets them with its tasks, and unpickles them once)."""
    if _settings.get("pickled") != settings:
        import pickle

        setup(*pickle.loads(settings))
        _settings["pickled"] = settings
    return migrate_file(source, path)


def _migrate(source: bytes, path: str, hierarchy: Recorder, *, with_findings: bool = True) -> MigrationResult:
    from vllm_attn_compat.codemods.engine.migrate import migrate_source

    return migrate_source(
        source,
        path=path,
        rules=_settings["rules"],
        hierarchy=hierarchy,
        unsafe_fixes=_settings["unsafe_fixes"],
        with_findings=with_findings,
        old_op_calls=_settings.get("old_op_calls", "with-output"),
        target=_settings.get("target"),
    )


def migrate_file(source: bytes, path: str) -> MigrateOutcome:
    """The file's :class:`Migrated`, or the :class:`FileError` that stops this file, or the
    :class:`dependencies.MissingDependency` (libcst) that stops the run.

    A rewritten source is returned only if it passes every check of :func:`safety.check_rewrite`.
    """
    import gc

    # libcst makes an object of every token and space of the file: the cyclic collector, started again and
    # again by those allocations, walks them for nothing (a twentieth of the time). Cycles made here, if
    # any, wait for the next collection.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _migrate_file(source, path)
    finally:
        if collecting:
            gc.enable()


def _migrate_file(source: bytes, path: str) -> MigrateOutcome:
    from vllm_attn_compat.codemods.engine import safety
    from vllm_attn_compat.codemods.engine.migrate import ParseError
    from vllm_attn_compat.codemods.index.questions import Recorder

    hierarchy = Recorder(_settings["hierarchy"])
    try:
        result = _migrate(source, path, hierarchy)
    except ParseError as error:
        return FileError(path, error.line, error.column, f"could not parse: {error.message}")
    except RecursionError:
        return FileError(path, 1, 1, "could not parse: the code is nested too deeply for the parser")
    except Exception as error:  # noqa: BLE001 - reported per file, see the module docstring
        # libcst missing or broken stops the run instead (runner.py raises it), named once.
        return dependencies.missing(error) or FileError(
            path, 1, 1, f"internal error: {type(error).__name__}: {error}; {BUG}"
        )
    if result.source == source:
        return Migrated(None, list(result.findings), hierarchy.answers)
    if not _settings.get("verify", True):
        return Migrated(result.source, list(result.findings), hierarchy.answers)  # `--check`: nothing is written
    problems = safety.check_rewrite(
        source,
        result.source,
        result.removed_comments,
        lambda again: _migrate(again, path, hierarchy, with_findings=False).source,
    )
    if problems:
        message = f"internal error: the fixed file failed a safety check ({'; '.join(problems)}); {BUG}"
        return FileError(path, 1, 1, message)
    return Migrated(result.source, list(result.findings), hierarchy.answers)
