"""How vLLM marks a deprecation in its attention modules, read from the source (each form seen in a release or
kept because vLLM uses it elsewhere):

- a ``@deprecated("...")`` decorator (``typing_extensions.deprecated``: ``CommonAttentionMetadata.seq_lens_cpu``
  and ``num_computed_tokens_cpu``, 0.19.0 to 0.29.0);
- a warning in the body, ``warnings.warn(...)`` or ``logger.warning_once(...)`` / ``.warning(...)``, whose text
  says "deprecat...": the member's deprecation, or one of its parameters' when the text names that parameter;
- a docstring saying "deprecated": an ``Args:`` line ``name: Deprecated ...`` deprecates that parameter
  (``AttentionMetadataBuilder.build``'s ``common_prefix_len`` since 0.33.0), any other line the member;
- a comment block right above a member, or above a run of class statements with no blank line between them,
  saying "deprecat..." (``# WARNING: Deprecated fields. Will be removed ...`` above ``_seq_lens_cpu``).

A message is vLLM's own text with its whitespace collapsed.
"""

from __future__ import annotations

import ast
import inspect
import re

_DEPRECAT = re.compile(r"deprecat", re.IGNORECASE)
_WARNING_CALLS = {"warn", "warning", "warning_once", "warn_once"}
# An ``Args:`` line of a Google-style docstring: ``name: text`` or ``name (type): text``.
_ARG_LINE = re.compile(r"^(\s*)\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def collapse(text: str) -> str:
    """vLLM's text with its indentation and line breaks folded into single spaces."""
    return " ".join(inspect.cleandoc(text).split())


def decorator_name(node: ast.expr) -> str:
    """The dotted name a decorator applies (``deprecated`` for ``@deprecated("...")``, ``x.setter``), or ""."""
    if isinstance(node, ast.Call):
        node = node.func
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def string_text(node: ast.expr | None) -> str | None:
    """The text of a string literal or f-string (placeholders kept as ``{expr}``), or None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = string_text(node.left), string_text(node.right)
        return None if left is None or right is None else left + right
    return None


def from_decorators(decorators: list[ast.expr]) -> str | None:
    """The message of a ``@deprecated(...)`` decorator, or None."""
    for decorator in decorators:
        if decorator_name(decorator).split(".")[-1] == "deprecated":
            if isinstance(decorator, ast.Call) and decorator.args:
                text = string_text(decorator.args[0])
                return collapse(text) if text is not None else ast.unparse(decorator.args[0])
            return "deprecated"
    return None


def _own_nodes(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """The function's body nodes, without those of nested functions and classes."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        found.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))
    return found


def from_warnings(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str | None, dict[str, str]]:
    """(the member's deprecation, {parameter: deprecation}) from warnings its body issues."""
    parameters = {arg.arg for arg in _arguments(function.args)}
    member: str | None = None
    by_parameter: dict[str, str] = {}
    for node in _own_nodes(function):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)):
            continue
        if decorator_name(node.func).split(".")[-1] not in _WARNING_CALLS or not node.args:
            continue
        text = string_text(node.args[0])
        if text is None or not _DEPRECAT.search(text):
            continue
        message = collapse(text)
        named = [name for name in sorted(parameters) if re.search(rf"\b{re.escape(name)}\b", text)]
        named = [name for name in named if name not in ("self", "cls")]
        if named:
            for name in named:
                by_parameter.setdefault(name, message)
        elif member is None:
            member = message
    return member, by_parameter


def from_docstring(node: ast.AST, parameters: set[str]) -> tuple[str | None, dict[str, str]]:
    """(the member's deprecation, {parameter: deprecation}) from its docstring."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return None, {}
    docstring = ast.get_docstring(node, clean=True)
    if not docstring or not _DEPRECAT.search(docstring):
        return None, {}
    lines = docstring.splitlines()
    by_parameter: dict[str, str] = {}
    member_lines: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        match = _ARG_LINE.match(line)
        if match and match.group(2) in parameters:
            indent = len(match.group(1))
            text = [match.group(3)]
            index += 1
            while (
                index < len(lines) and lines[index].strip() and len(lines[index]) - len(lines[index].lstrip()) > indent
            ):
                text.append(lines[index])
                index += 1
            joined = " ".join(" ".join(text).split())
            if _DEPRECAT.search(joined):
                by_parameter[match.group(2)] = joined
            continue
        if _DEPRECAT.search(line):
            member_lines.append(line)
        index += 1
    member = _paragraph_of(docstring, member_lines[0]) if member_lines else None
    return member, by_parameter


def _paragraph_of(docstring: str, line: str) -> str:
    for paragraph in docstring.split("\n\n"):
        if line in paragraph.splitlines():
            return " ".join(paragraph.split())
    return " ".join(line.split())  # pragma: no cover - the line comes from the docstring


def comment_above(lines: list[str], first_line: int) -> str | None:
    """The comment block ending on the line above ``first_line`` (1-based), when it says "deprecat..."."""
    block: list[str] = []
    index = first_line - 2
    while index >= 0 and lines[index].strip().startswith("#"):
        block.append(lines[index].strip().lstrip("#").strip())
        index -= 1
    text = " ".join(reversed(block))
    return " ".join(text.split()) if _DEPRECAT.search(text) else None


def comment_runs(lines: list[str], body: list[ast.stmt]) -> dict[int, str]:
    """{index in ``body``: message} for the statements under a deprecating comment: the statement right after
    the comment and those following it with no blank line (nor other comment) in between."""
    marked: dict[int, str] = {}
    current: str | None = None
    previous_end = 0
    for position, statement in enumerate(body):
        first = statement.lineno
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and statement.decorator_list:
            first = min(first, *(d.lineno for d in statement.decorator_list))
        above = comment_above(lines, first)
        between = lines[previous_end : first - 1] if previous_end else []
        contiguous = (
            bool(previous_end)
            and all(line.strip() for line in between)
            and not any(line.strip().startswith("#") for line in between)
        )
        if above is not None:
            current = above
        elif not contiguous:
            current = None
        if current is not None:
            marked[position] = current
        previous_end = statement.end_lineno or statement.lineno
    return marked


def _arguments(args: ast.arguments) -> list[ast.arg]:
    found = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    found += [arg for arg in (args.vararg, args.kwarg) if arg is not None]
    return found
