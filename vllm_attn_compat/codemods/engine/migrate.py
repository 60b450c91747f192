"""Apply the selected rules to one file: one libcst parse (of the classes and functions that can hold a
finding: `spans`), one analysis pass for all rules, one transform pass for the fixes that apply,
rendered back byte for byte.

The runner (`runner.py`) decides which files reach this point and checks the result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.engine import tokens
from vllm_attn_compat.codemods.engine.rule import Rule
from vllm_attn_compat.codemods.findings import Finding, FixSafety, Status, TargetRelease
from vllm_attn_compat.codemods.index.handed import HOOK_BYTES, REGISTER_BYTES
from vllm_attn_compat.codemods.index.hierarchy import index_module
from vllm_attn_compat.codemods.index.names import BASE_TOKENS
from vllm_attn_compat.codemods.index.questions import Questions

if TYPE_CHECKING:
    import ast

    import libcst as cst


@dataclass(frozen=True)
class MigrationResult:
    source: bytes
    findings: list[Finding]
    # Text of every comment a rule removed on purpose (e.g. the comment block documenting a
    # removed `accept_output_buffer`), so the runner can prove no other comment was lost.
    removed_comments: tuple[str, ...]


class ParseError(Exception):
    def __init__(self, line: int, column: int, message: str) -> None:
        super().__init__(f"{line}:{column}: {message}")
        self.line = line
        self.column = column
        self.message = message


def prefilter_groups(
    rules: Sequence[type[Rule]],
) -> tuple[tuple[bytes, ...], tuple[tuple[tuple[bytes, ...], tuple[bytes, ...]], ...]]:
    """`prefilter_tokens` of the rules requiring nothing more, and for each rule that does (`Rule.requires`) its
    requirement and its tokens: a file holding none of the first, nor for any group one of its requirement and
    one of its tokens, is not worth parsing (`scan.GuardedScan`)."""
    plain = prefilter_tokens([rule for rule in rules if not rule.requires])
    groups: dict[tuple[bytes, ...], tuple[bytes, ...]] = {}
    for rule in rules:
        if rule.requires:
            groups[rule.requires] = (*groups.get(rule.requires, ()), *rule.tokens)
    if any(rule.scoped or rule.reads_hierarchy for rule in rules):
        # A file naming vLLM that hands it a class by name (`index.handed`) may make another file's classes attention
        # code (that file the rounds find by its module's name, whatever it holds).
        groups[(b"vllm",)] = (*groups.get((b"vllm",), ()), *HOOK_BYTES, REGISTER_BYTES)
    return plain, tuple(groups.items())


def prefilter_tokens(rules: Sequence[type[Rule]]) -> tuple[bytes, ...]:
    """Byte strings of which a file must contain one to be worth parsing for ``rules``.

    A scoped rule contributes the hierarchy's tokens rather than its own: it acts only inside
    attention classes, and a file holding one mentions a vLLM attention module or defines a
    vLLM base (``BASE_TOKENS``), or names an attention class of the run (the runner adds those
    names). Its own tokens are necessary too but far less selective (``output is not None``
    appears in a dozen of torch's files; vLLM's attention modules in none).
    """
    tokens: dict[bytes, None] = {}
    for rule in rules:
        own = () if rule.scoped else rule.tokens
        for token in (*own, *(BASE_TOKENS if rule.scoped or rule.reads_hierarchy else ())):
            tokens[token] = None
    # A token containing another is redundant: the shorter one already matches.
    return tuple(t for t in tokens if not any(other != t and other in t for other in tokens))


def needs_parsing(source: bytes, rules: Sequence[type[Rule]], class_names: frozenset[str] = frozenset()) -> bool:
    """Finer test than `prefilter_tokens`: some rule has both its own token and (if scoped)
    a scope token or attention-class name in ``source`` (`tokens.needs_libcst`)."""
    return tokens.needs_libcst(
        source, tokens.own_tokens(rules, scoped=False), tokens.own_tokens(rules, scoped=True), class_names
    )


def holds_required(rule: type[Rule], source: bytes) -> bool:
    """Whether ``source`` holds what ``rule`` requires besides its tokens (`Rule.requires`)."""
    return not rule.requires or any(token in source for token in rule.requires)


def acting(rules: Sequence[type[Rule]], *, attention: bool, interface: bool) -> list[type[Rule]]:
    """Those of ``rules`` that can act in a file: the rules acting anywhere, those scoped to attention classes where
    it has one (``attention``), those scoped to classes deriving from vLLM's interface where it has one
    (``interface``: `Rule.interface`)."""
    return [rule for rule in rules if not rule.scoped or (interface if rule.interface else attention)]


def _may_apply(source: bytes, path: str, rules: Sequence[type[Rule]], hierarchy: Questions) -> bool:
    if any(token in source for rule in rules if not rule.scoped for token in rule.tokens):
        return True
    attention = any(rule.scoped and not rule.interface for rule in rules) and hierarchy.has_attention_classes(path)
    return attention or (any(rule.interface for rule in rules) and hierarchy.has_interface_classes(path))


def _check_syntax(source: bytes, path: str) -> None:
    import ast

    try:
        ast.parse(source, filename=path)
    except SyntaxError as error:
        raise ParseError(error.lineno or 1, error.offset or 1, error.msg) from None
    except ValueError as error:  # null bytes
        raise ParseError(1, 1, str(error)) from None


def _parse_error(source: bytes, path: str, error: cst.ParserSyntaxError) -> ParseError:
    # CPython's parser pinpoints syntax errors better than libcst's; ask it first.
    import ast

    try:
        ast.parse(source, filename=path)
    except SyntaxError as precise:
        if precise.lineno:
            return ParseError(precise.lineno, precise.offset or 1, precise.msg)
    except ValueError:  # e.g. null bytes
        pass
    else:
        # Valid Python that libcst's parser rejects (a line continuation before a lone CRLF in an LF file, found
        # by generated programs): not the file's fault, and nothing to fix in it.
        return ParseError(
            error.raw_line,
            error.editor_column,
            f"{error.message} (Python accepts this file; libcst, which the codemods rewrite with, does not: "
            "it is left as it is)",
        )
    return ParseError(error.raw_line, error.editor_column, error.message)


def _status(safety: FixSafety, suppressed: bool, unsafe_fixes: bool) -> Status:
    if suppressed:
        return Status.SUPPRESSED
    if safety is FixSafety.SAFE:
        return Status.FIXED
    if safety is FixSafety.UNSAFE:
        return Status.FIXED if unsafe_fixes else Status.UNSAFE_FIX_AVAILABLE
    return Status.MANUAL


def _fixable(safety: FixSafety, unsafe_fixes: bool) -> bool:
    return _status(safety, False, unsafe_fixes) is Status.FIXED


def migrate_source(
    source: bytes,
    *,
    path: str,
    rules: Sequence[type[Rule]],
    hierarchy: Questions,
    unsafe_fixes: bool,
    with_findings: bool = True,
    old_op_calls: str = "with-output",
    reduce_spans: bool = True,
    target: TargetRelease | None = None,
    narrow: bool = True,
) -> MigrationResult:
    """Apply ``rules`` to ``source``. Without ``with_findings`` only the new source is wanted (the
    runner's idempotence check): findings come back empty and positions are computed only where a
    ``# noqa`` comment may hold a fix back. ``old_op_calls`` is ``forwarder`` when calls of the
    removed ops whose layer shape is unknown may go to this package's deprecated forwarders. ``target``: the
    vLLM release the code must run on (None: the newest the manifest knows). ``narrow``: leave out the rules that
    cannot act in this file (`Rule.requires`, `Rule.narrows`)."""
    if not hierarchy.covers(path):
        # A caller that built the hierarchy from other files: this file's classes count too.
        with contextlib.suppress(SyntaxError):  # libcst reports it below, with its position
            hierarchy = hierarchy.extended(index_module(source, path))
    span_tokens = {rule: rule.tokens for rule in rules}
    if narrow:
        from vllm_attn_compat.manifest import newest

        release = target.release if target is not None else newest()
        for rule in rules:
            if not holds_required(rule, source):
                del span_tokens[rule]
            elif rule.narrows:
                facts = rule.facts(source)
                if rule.acts_in(facts, hierarchy, path, release):
                    span_tokens[rule] = rule.span_tokens(facts, hierarchy, path, release)
                else:
                    del span_tokens[rule]
        rules = list(span_tokens)
    if not _may_apply(source, path, rules, hierarchy):
        # No attention class here and no token of a rule that works outside them: nothing can
        # change, so skip libcst's parse and traversal (several times the cost of `ast`).
        _check_syntax(source, path)
        return MigrationResult(source, [], ())
    settings = _Settings(path, rules, hierarchy, unsafe_fixes, with_findings, old_op_calls, target)
    tree = None  # the `ast` tree of ``source`` the spans read, for positions (`positions.positions`)
    if reduce_spans:
        from vllm_attn_compat.codemods.engine import spans, statements

        needs = [
            spans.Needs(span_tokens[rule], rule.reads, rule.reads_in_class, rule.scoped, rule.reads_statements)
            for rule in rules
        ]
        reduction = spans.reduce(source, needs, _scope_test(hierarchy, hierarchy.module_name(path), rules))
        tree = statements.cached(source)
        if reduction is not None:
            try:
                # Its statements at module and class level are the source's (a stub keeps a definition's lines).
                result, edited_imports = _migrate_module(reduction.source, settings, tree)
            except ParseError:
                pass  # the whole file's parse reports it, at the right place
            else:
                if result.source == reduction.source:
                    return MigrationResult(source, result.findings, result.removed_comments)
                restored = None if edited_imports else reduction.restore(result.source)
                if restored is not None:
                    return MigrationResult(restored, result.findings, result.removed_comments)
    return _migrate_module(source, settings, tree)[0]


def _scope_test(hierarchy: Questions, module: str, rules: Sequence[type[Rule]]) -> Callable[[str, bool], bool]:
    """Whether the class or function ``qualname`` of ``module`` is where the scoped ``rules`` act, as the
    engine's scopes decide it (`scope.Analyzer`): an attention class, or code copied onto a class at run
    time (a method of an attention class is in its class's scope); for the rules scoped to vLLM's interface
    (`Rule.interface`), a class deriving from it."""
    from vllm_attn_compat.codemods.index.hierarchy import class_scope
    from vllm_attn_compat.codemods.index.runtime_patches import ATTRIBUTE

    attention = any(rule.scoped and not rule.interface for rule in rules)
    interface = any(rule.interface for rule in rules)

    def in_scope(qualname: str, is_class: bool) -> bool:
        full = f"{module}.{qualname}"
        if is_class:
            return (attention and class_scope(hierarchy, full)[0]) or (
                interface and hierarchy.vllm_interface(full) is not None
            )
        return attention and hierarchy.patch_scope(full, ATTRIBUTE) is not None

    return in_scope


@dataclass(frozen=True)
class _Settings:
    path: str
    rules: Sequence[type[Rule]]
    hierarchy: Questions
    unsafe_fixes: bool
    with_findings: bool
    old_op_calls: str
    target: TargetRelease | None


def _migrate_module(source: bytes, settings: _Settings, tree: ast.Module | None) -> tuple[MigrationResult, bool]:
    """The migration of ``source``, and whether it edited imports (a fix added or dropped one). ``tree``:
    an `ast` tree with the statements of ``source`` at module and class level, if one was parsed."""
    import libcst as cst

    from vllm_attn_compat.codemods.engine.apply import Applier
    from vllm_attn_compat.codemods.engine.edits import AddImport, DropUnusedImport, Edit, RemoveStatement, Replace
    from vllm_attn_compat.codemods.engine.positions import positions
    from vllm_attn_compat.codemods.engine.scope import Analyzer, FileContext
    from vllm_attn_compat.codemods.engine.walk import TRIVIA, walk
    from vllm_attn_compat.codemods.noqa import noqa_codes, suppresses

    path, hierarchy, unsafe_fixes, with_findings = (
        settings.path,
        settings.hierarchy,
        settings.unsafe_fixes,
        settings.with_findings,
    )
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        raise _parse_error(source, path, error) from None

    ctx = FileContext(path, module, hierarchy, old_op_calls=settings.old_op_calls, target=settings.target)
    analyzer = Analyzer(ctx, [rule(ctx) for rule in settings.rules])
    walk(module, analyzer.on_visit, analyzer.on_leave, TRIVIA)
    reports = ctx.reports if with_findings else [r for r in ctx.reports if _fixable(r.safety, unsafe_fixes)]
    if not reports:
        return MigrationResult(source, [], ()), False
    noqa = [(comment, codes) for comment in analyzer.comments if (codes := noqa_codes(comment.value)) is not None]
    # Positions cost a rendering of the statements holding the nodes: paid for findings to show, or for
    # the noqa comments to consult.
    wanted = [*(report.node for report in reports), *(comment for comment, _ in noqa)]
    spans = (
        positions(module, wanted, parents=analyzer.parents, tree=tree, source=source) if with_findings or noqa else {}
    )

    noqa_by_line: dict[int, frozenset[str]] = {}
    for comment, codes in noqa:
        line = spans[id(comment)].start_line
        noqa_by_line[line] = noqa_by_line.get(line, frozenset()) | codes

    findings: list[Finding] = []
    removals: list[RemoveStatement] = []
    replacements: list[Replace] = []
    imports: list[AddImport | DropUnusedImport] = []  # decided once the rest is done
    only_imports: list[tuple[int, list[Edit]]] = []  # findings whose whole fix is import edits
    for report in reports:
        span = spans.get(id(report.node))
        suppressed = span is not None and any(
            suppresses(noqa_by_line[line], report.code)
            for line in range(span.start_line, span.end_line + 1)
            if line in noqa_by_line
        )
        status = _status(report.safety, suppressed, unsafe_fixes)
        if with_findings:
            assert span is not None  # positions were computed for every report's node
            message = report.message
            if status is Status.FIXED and report.safety is FixSafety.UNSAFE:
                # The use that withheld the fix ("withheld: `x.m(...)` at f.py:3 does not pass `output`") is what
                # the fix taken may break: the next `--check` reports each call it broke.
                message = message.replace("; withheld: ", "; taken with --unsafe-fixes, though ", 1)
            findings.append(
                Finding(span.start_line, span.start_column + 1, report.code, message, status, report.release)
            )
        if status is Status.FIXED:
            if with_findings and all(isinstance(edit, (AddImport, DropUnusedImport)) for edit in report.edits):
                only_imports.append((len(findings) - 1, list(report.edits)))
            for edit in report.edits:
                if isinstance(edit, RemoveStatement):
                    removals.append(edit)
                elif isinstance(edit, Replace):
                    replacements.append(edit)
                else:
                    imports.append(edit)
    if not (removals or replacements or imports):
        return MigrationResult(source, sorted(findings), ()), False
    edited = analyzer.enclosing([*(edit.node for edit in removals), *(edit.node for edit in replacements)])
    applier = Applier(removals, replacements, within=edited)
    new_module = module.visit(applier) if removals or replacements else module
    removed = list(applier.sink.removed)
    if imports:
        from vllm_attn_compat.codemods.engine.imports import finish_imports

        is_package = path.replace("\\", "/").rsplit("/", 1)[-1] == "__init__.py"
        new_module, dropped_comments, done = finish_imports(new_module, imports, is_package=is_package)
        removed += dropped_comments
        for index, edits in only_imports:  # nothing to do after all: the finding stays for a person
            if not any(id(edit) in done for edit in edits):
                findings[index] = findings[index]._replace(status=Status.MANUAL)
    new_source = _keep_final_newline(source, new_module.bytes)
    return MigrationResult(new_source, sorted(findings), tuple(removed)), bool(imports)


def _keep_final_newline(original: bytes, new: bytes) -> bytes:
    """Put back a final newline that libcst lost: it drops the one after a last comment ending in a backslash."""
    for newline in (b"\r\n", b"\n", b"\r"):
        if original.endswith(newline):
            return new if new.endswith((b"\n", b"\r")) else new + newline
    return new
