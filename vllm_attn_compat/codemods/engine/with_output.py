"""VAC007's rewrite of a call of a removed op into what vLLM 0.20's layers do: allocate the output,
call the ``_with_output`` op, use the buffer.

The rewrite needs the layer's output shape where the call stands. It is known from a local
``output_shape`` (MLA's layer, and the attention layer once it has defaulted it), or from the
layer's own attributes: ``self.num_heads`` with ``self.head_size_v`` (MLA: ``self.v_head_dim``),
found in the class or implied by deriving from vLLM's ``Attention`` / ``MLAAttention``. The views
are those of vLLM's layer (and of this package's forwarders): query ``[T, num_heads, head_size]``,
key and value ``[T, num_kv_heads, head_size(_v)]``, output ``[T, num_heads, head_size_v]``; the
value of the old call becomes the 2-D buffer, the shape the old op returned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from vllm_attn_compat.codemods.engine.edits import CommentSink
from vllm_attn_compat.codemods.engine.scope import dotted_name
from vllm_attn_compat.codemods.engine.walk import walk

PARAMETERS = {
    "unified_attention": ("query", "key", "value", "layer_name"),
    "unified_mla_attention": ("q", "kv_c_normed", "k_pe", "layer_name", "kv_cache_dummy_dep"),
}
REQUIRED = 4
LINE_LENGTH = 88  # vLLM's (ruff's default)
# What vLLM's layer classes set in __init__; a subclass has them without naming them.
_LAYER_ATTRIBUTES = {
    "Attention": frozenset({"num_heads", "head_size", "num_kv_heads", "head_size_v"}),
    "MLAAttention": frozenset({"num_heads", "v_head_dim", "head_size", "num_kv_heads"}),
}
_HEADS = ("num_heads", "head_size", "num_kv_heads", "head_size_v")
_BUFFER_NAMES = ("output", "attn_output", "output_buffer")


@dataclass(frozen=True)
class Plan:
    """How one call becomes statements: the op to call, the allocation, the views."""

    op: str  # e.g. torch.ops.vllm.unified_attention_with_output
    arguments: dict[str, str]  # parameter -> source of the argument
    shape: str  # source of the shape expression
    views: bool  # view query/key/value/output as [T, heads, size] (the attention layer's form)
    buffer: str
    assign_to: str | None  # the old call's value was assigned to this name after the call
    returns: bool
    indent: int  # columns of the statement, for line lengths


def call_arguments(call: cst.Call, op: str, module: cst.Module) -> dict[str, str] | None:
    """Each argument's source by the old op's parameter name; None for star arguments or unknown names."""
    names = PARAMETERS[op]
    found: dict[str, str] = {}
    for index, arg in enumerate(call.args):
        if arg.star:
            return None
        name = arg.keyword.value if arg.keyword is not None else (names[index] if index < len(names) else None)
        if name not in names or name in found:
            return None
        found[name] = module.code_for_node(arg.value)
    return found if all(name in found for name in names[:REQUIRED]) else None


def self_attributes(klass: cst.ClassDef, imports: dict[str, str]) -> frozenset[str]:
    """``x`` for every ``self.x`` in the class, and what a vLLM layer base class gives it."""
    found: set[str] = set()
    for base in klass.bases:
        target = dotted_name(base.value)
        resolved = imports.get(target.partition(".")[0], "") if target else ""
        full = f"{resolved}{target[len(target.partition('.')[0]) :]}" if target else ""
        if full.startswith("vllm.") and full.rpartition(".")[2] in _LAYER_ATTRIBUTES:
            found |= _LAYER_ATTRIBUTES[full.rpartition(".")[2]]

    def visit(node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
            found.add(node.attr.value)
        return True

    walk(klass.body, visit, lambda node: None)
    return frozenset(found)


def names_in(node: cst.CSTNode) -> frozenset[str]:
    found: set[str] = set()

    def visit(child: cst.CSTNode) -> bool:
        if isinstance(child, cst.Name):
            found.add(child.value)
        return True

    walk(node, visit, lambda child: None)
    return frozenset(found)


def binds(function: cst.FunctionDef, name: str) -> bool:
    """Whether ``name`` is a parameter of ``function`` or assigned in its body (not in nested scopes)."""
    params = function.params
    if any(p.name.value == name for p in (*params.posonly_params, *params.params, *params.kwonly_params)):
        return True
    found = False

    def visit(node: cst.CSTNode) -> bool:
        nonlocal found
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) and node is not function:
            return False
        if isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Name) and node.target.value == name:
            found = True
        return not found

    walk(function, visit, lambda node: None)
    return found


def shape_of(op: str, query: str, attributes: frozenset[str], output_shape: bool) -> tuple[str, bool] | None:
    """``(shape source, views)`` for the output of ``op``, or None when the shape is not known."""
    if op == "unified_mla_attention":
        if output_shape:
            return "output_shape", False
        if {"num_heads", "v_head_dim"} <= attributes:
            return f"({query}.shape[0], self.num_heads * self.v_head_dim)", False
        return None
    if set(_HEADS) <= attributes:
        return f"({query}.shape[0], self.num_heads * self.head_size_v)", True
    if output_shape:
        return "output_shape", False
    return None


def buffer_name(used: frozenset[str]) -> str | None:
    return next((name for name in _BUFFER_NAMES if name not in used), None)


def is_plain(source: str) -> bool:
    """Whether ``source`` is a name or a chain of attributes (reading it twice reads the same)."""
    try:
        return dotted_name(cst.parse_expression(source)) is not None
    except cst.ParserSyntaxError:
        return False


def _atom(source: str) -> str:
    """``source`` safe to put before ``.view(...)``."""
    try:
        expression = cst.parse_expression(source)
    except cst.ParserSyntaxError:
        return f"({source})"
    simple = (cst.Name, cst.Attribute, cst.Call, cst.Subscript)
    return source if isinstance(expression, simple) and not expression.lpar else f"({source})"


def _call(function: str, arguments: list[str], indent: int, prefix: str = "") -> str:
    """``prefix + function(arguments)`` as ruff formats it: on one line when it fits, else the
    arguments on one line of their own, else one argument per line."""
    joined = ", ".join(arguments)
    line = f"{prefix}{function}({joined})"
    if "\n" not in line and indent + len(line) <= LINE_LENGTH:
        return line
    if "\n" not in joined and indent + 4 + len(joined) <= LINE_LENGTH:
        return f"{prefix}{function}(\n    {joined}\n)"
    inner = "".join(f"    {argument},\n" for argument in arguments)
    return f"{prefix}{function}(\n{inner})"


def statements(plan: Plan) -> list[str]:
    args = plan.arguments
    query = args.get("query", args.get("q"))
    allocate = _call(
        "torch.empty",
        [plan.shape, f"dtype={query}.dtype", f"device={query}.device"],
        plan.indent,
        prefix=f"{plan.buffer} = ",
    )
    if plan.views:
        inputs = [
            f"{_atom(args['query'])}.view(-1, self.num_heads, self.head_size)",
            f"{_atom(args['key'])}.view(-1, self.num_kv_heads, self.head_size)",
            f"{_atom(args['value'])}.view(-1, self.num_kv_heads, self.head_size_v)",
            f"{plan.buffer}.view(-1, self.num_heads, self.head_size_v)",
        ]
        names = PARAMETERS["unified_attention"]
    else:
        names = PARAMETERS["unified_mla_attention" if "q" in args else "unified_attention"]
        inputs = [*(args[name] for name in names[:3]), plan.buffer]
    rest = [args["layer_name"]] + [f"{name}={args[name]}" for name in names[REQUIRED:] if name in args]
    lines = [allocate, _call(plan.op, [*inputs, *rest], plan.indent)]
    if plan.assign_to is not None:
        lines.append(f"{plan.assign_to} = {plan.buffer}")
    if plan.returns:
        lines.append(f"return {plan.buffer}")
    return lines


def build(
    plan: Plan, config: cst.PartialParserConfig
) -> Callable[[cst.SimpleStatementLine, CommentSink], cst.FlattenSentinel[cst.BaseStatement]]:
    """The ``Replace`` builder: the old statement line becomes the new statements; its leading lines go
    first, its trailing comment stays on the last line, comments inside the old call are declared removed."""

    def replace(line: cst.SimpleStatementLine, sink: CommentSink) -> cst.FlattenSentinel[cst.BaseStatement]:
        newline = config.default_newline
        assert isinstance(newline, str), "Module.config_for_parsing names the module's own newline"
        new = [cst.parse_statement(text + newline, config) for text in statements(plan)]
        new[0] = new[0].with_changes(leading_lines=line.leading_lines)
        new[-1] = new[-1].with_changes(trailing_whitespace=line.trailing_whitespace)
        lost = Counter(c.value for c in _comments(line)) - Counter(c.value for s in new for c in _comments(s))
        sink.removed.extend(lost.elements())
        return cst.FlattenSentinel(new)

    return replace


def _comments(node: cst.CSTNode) -> list[cst.Comment]:
    found: list[cst.Comment] = []

    def visit(child: cst.CSTNode) -> bool:
        if isinstance(child, cst.Comment):
            found.append(child)
        return True

    walk(node, visit, lambda child: None)
    return found
