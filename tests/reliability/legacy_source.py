"""Hypothesis strategies that write attention modules against vLLM's old output-buffer API.

Each generated module comes with the program its safe migration must produce, written line by
line next to the old one, so a test can compare syntax trees: formatting is the rules' business,
but every statement the rules should keep must still be there, and every one they should remove
must be gone. Comments (each one unique) and blank lines are drawn in every position the line
layout allows, including inside parameter lists, list literals and multi-line asserts.

Only constructs whose migration issue 3 pins down exactly are woven in as fixable; the others
(reads of ``use_output``, calls of the removed ops, comparisons with old op names,
``accept_output_buffer = False``, the same code in classes of an unrelated hierarchy) must come
out untouched by the safe fixes.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from .source_writer import SAME, SourceWriter

VLLM_IMPL_BASES = [
    ("vllm.v1.attention.backend", "AttentionImpl"),
    ("vllm.v1.attention.backend", "MLAAttentionImpl"),
    ("vllm.attention.backends.abstract", "AttentionImpl"),
]
VLLM_BACKEND_BASES = [
    ("vllm.v1.attention.backend", "AttentionBackend"),
    ("vllm.attention.backends.abstract", "AttentionBackend"),
]
FOREIGN_MODULE = "myproject.attention.base"  # an unrelated project's own AttentionBackend/AttentionImpl

OP_NAMES = {  # op -> its old and new names, in the "vllm::" and the dotted "vllm." forms
    "attention": (
        ("vllm::unified_attention", "vllm.unified_attention"),
        ("vllm::unified_attention_with_output", "vllm.unified_attention_with_output"),
    ),
    "mla": (
        ("vllm::unified_mla_attention", "vllm.unified_mla_attention"),
        ("vllm::unified_mla_attention_with_output", "vllm.unified_mla_attention_with_output"),
    ),
}
UNRELATED_OPS = [
    "vllm::mamba_mixer2",
    "vllm::unified_attention_v2",  # merely starts with an old name: never touched
    "custom::unified_attention",
    "vllm::unified_attention_with_output_extra",
]


@dataclass(frozen=True)
class GeneratedModule:
    source: bytes  # the old-API module, encoded as its header says
    expected: bytes  # the same module with every safe fix applied (compare syntax trees only)
    comments: tuple[str, ...]  # every comment written, each unique
    removable_comments: frozenset[str]  # comments documenting a removed accept_output_buffer
    unsafe_removable_comments: frozenset[str]  # the same for `accept_output_buffer = False` (unsafe fix)
    newline: str  # "\n", "\r\n" or "mixed"
    encoding: str  # "utf-8", "utf-8-sig" (BOM) or "latin-1" (with a coding declaration)
    changes_expected: bool  # whether the safe fixes must change the module
    suppressed: int  # lines whose old-API code a noqa comment suppresses


# -- pieces of a module ---------------------------------------------------------------------------


def _import_line(w: SourceWriter, module: str, name: str, style: str) -> str:
    """Writes an import of ``name`` from ``module``; returns how the code refers to it."""
    if style == "from":
        w.statement(0, f"from {module} import {name}")
        return name
    if style == "alias":
        w.statement(0, f"from {module} import {name} as Base{name}")
        return f"Base{name}"
    w.statement(0, f"import {module}")
    return f"{module}.{name}"


_OUTPUT_PARAMS = [  # (old text, migrated text, needs)
    ("output: Optional[torch.Tensor] = None", "output: torch.Tensor", "Optional"),
    ("output: torch.Tensor | None = None", "output: torch.Tensor", ""),
    ("output: Union[torch.Tensor, None] = None", "output: torch.Tensor", "Union"),
    ("output: Optional[Tensor] = None", "output: Tensor", "Optional"),
    ("output=None", "output: torch.Tensor", ""),
    ("output: torch.Tensor", "output: torch.Tensor", ""),  # already required
]


def _forward(w: SourceWriter, depth: int, *, in_scope: bool, name: str = "forward") -> None:
    """A forward method with an old-API ``output`` parameter, assert and fallback."""
    draw = w.draw
    param_old, param_new, _ = draw(st.sampled_from(_OUTPUT_PARAMS))
    if not in_scope:
        param_new = param_old
    before = ["self", "layer", "query", "key", "value", "kv_cache", "attn_metadata"]
    if draw(st.booleans()):
        before = [p if p in ("self", "layer", "kv_cache", "attn_metadata") else f"{p}: torch.Tensor" for p in before]
    after = draw(st.sampled_from([[], ["output_scale=None"], ["output_scale=None", "output_block_scale=None"]]))
    ret = draw(st.sampled_from(["", " -> torch.Tensor"]))
    w.gap(depth)
    if draw(st.booleans()):  # one line
        params = [*before, "{OUT}", *after]
        old = f"def {name}(" + ", ".join(params) + f"){ret}:"
        w.line(depth, old.replace("{OUT}", param_old), old.replace("{OUT}", param_new))
    else:  # one parameter per line, comments between them
        w.line(depth, f"def {name}(")
        params = [*before, None, *after]
        for i, p in enumerate(params):
            comma = "," if i < len(params) - 1 or draw(st.booleans()) else ""
            w.gap(depth + 1, allow_blank=False)
            if p is None and in_scope and param_old != param_new and draw(st.integers(0, 5)) == 0:
                w.line(depth + 1, f"{param_old}{comma}  # noqa: VAC002", trailing=False)  # suppressed: kept
                w.suppressed += 1
            elif p is None:
                w.line(depth + 1, param_old + comma, param_new + comma)
            else:
                w.line(depth + 1, p + comma)
        w.line(depth, f"){ret}:")
    body = depth + 1
    if draw(st.booleans()):
        w.gap(body)
        w.line(body, '"""Runs attention, writing into output."""')
    guard = draw(st.sampled_from(["none", "assert", "assert_msg", "assert_multiline", "fallback", "noqa", "noqa_bare"]))
    drop: object = None if in_scope else SAME
    if guard in ("noqa", "noqa_bare"):  # suppressed: kept
        w.gap(body)
        w.line(body, "assert output is not None  # noqa" + (": VAC001" if guard == "noqa" else ""), trailing=False)
        w.suppressed += in_scope
    elif guard == "assert":
        w.statement(body, "assert output is not None", drop)
    elif guard == "assert_msg":
        w.statement(body, 'assert output is not None, "Output tensor must be provided."', drop)
    elif guard == "assert_multiline":
        w.gap(body)
        w.line(body, "assert output is not None, (", drop)
        w.gap(body + 1, allow_blank=False)
        w.line(body + 1, '"Output tensor must be provided."', drop)
        w.line(body, ")", drop)
    elif guard == "fallback":
        alloc = draw(
            st.sampled_from(["torch.empty_like(query)", "torch.zeros_like(query)", "torch.empty(query.shape)"])
        )
        w.gap(body)
        w.line(body, "if output is None:", drop)
        w.gap(body + 1, allow_blank=False)
        w.line(body + 1, f"output = {alloc}", drop)
    for stmt in draw(st.lists(st.sampled_from(["scale = self.scale", "x = query * 2", "del kv_cache"]), max_size=2)):
        w.statement(body, stmt)
    w.statement(body, "output.copy_(query)")
    w.statement(body, "return output")


REPORT_ONLY_KINDS = ("use_output", "getattr", "call", "compare")


def _report_only_method(w: SourceWriter, depth: int, kind: str) -> None:
    """Old-API reads and calls that the safe fixes only report (``getattr`` reads the backend's flag too)."""
    w.statement(depth, "def legacy_path(self, query, key, value, name):")
    body = depth + 1
    if kind == "use_output":
        w.statement(body, "if self.use_output:")
        w.statement(body + 1, "return None")
    elif kind == "getattr":
        w.statement(body, 'flag = getattr(self.backend, "accept_output_buffer", False)')
    elif kind == "call":
        w.statement(body, "return torch.ops.vllm.unified_attention(query, key, value, name)")
    else:
        w.statement(body, 'if name == "vllm::unified_attention":')
        w.statement(body + 1, "return None")
    if kind != "use_output":
        w.statement(body, "return query")
        return
    # Unreachable once the unsafe fix keeps the branch that returns: it goes, with the comments about it.
    above = w.gap(body)
    suffix = w.line(body, "return query")
    w.unsafe_removable.update(above + ([suffix.strip()] if suffix else []))


def _local_output_method(w: SourceWriter, depth: int) -> None:
    """A local variable named ``output``: never touched."""
    w.statement(depth, "def combine(self, query):")
    w.statement(depth + 1, "output = None")
    w.statement(depth + 1, "if output is None:")
    w.statement(depth + 2, "output = torch.empty_like(query)")
    w.statement(depth + 1, "assert output is not None")
    w.statement(depth + 1, "return output")


def _backend_class(w: SourceWriter, base: str, *, in_scope: bool, flag_read: bool, depth: int = 0) -> None:
    """``flag_read``: code of the module reads the flag through a receiver that may be this class, so deleting
    ``= True`` would change what it reads: an unsafe fix only."""
    draw = w.draw
    w.statement(depth, f"class {draw(st.sampled_from(['Flash', 'Paged', 'Custom']))}Backend({base}):")
    body = depth + 1
    if draw(st.booleans()):
        w.gap(body)
        w.line(body, '"""A backend written for vLLM <= 0.19."""')
    flag = draw(st.sampled_from(["True", "bool_True", "False", "absent"]))
    if flag in ("True", "bool_True"):
        above = w.gap(body)  # blank lines, then comments directly above: they document the attribute
        text = "accept_output_buffer = True" if flag == "True" else "accept_output_buffer: bool = True"
        safe = in_scope and not flag_read
        suffix = w.line(body, text, None if safe else SAME)
        if in_scope:
            removable = w.removable if safe else w.unsafe_removable
            removable.update(above)
            if suffix:
                removable.add(suffix.strip())
    elif flag == "False":  # an unsafe fix only
        above = w.gap(body)
        suffix = w.line(body, "accept_output_buffer = False")
        if in_scope:
            w.unsafe_removable.update(above + ([suffix.strip()] if suffix else []))
    w.statement(body, "@staticmethod")
    w.line(body, "def get_name() -> str:")
    w.statement(body + 1, 'return "CUSTOM"')


def _impl_class(w: SourceWriter, base: str, *, in_scope: bool, report_only: str | None, depth: int = 0) -> None:
    draw = w.draw
    w.statement(depth, f"class {draw(st.sampled_from(['Flash', 'Paged', 'Custom']))}Impl({base}):")
    body = depth + 1
    if draw(st.booleans()):
        w.gap(body)
        w.line(body, '"""An impl written for vLLM <= 0.19."""')
    _forward(w, body, in_scope=in_scope)
    if draw(st.booleans()):
        _forward(w, body, in_scope=in_scope, name="forward_decode")
    if report_only is not None:
        _report_only_method(w, body, report_only)
    if draw(st.booleans()):
        _local_output_method(w, body)


def _op_list(w: SourceWriter, *, compared: bool = False) -> None:
    """A literal of op names: exact old names renamed, dropped where the new one is present; ``compared``: the
    module compares a string with ``"vllm::unified_attention"`` (`_report_only_method`), which may be compared with
    the list, so that op's names stay as they are (the accounting withholds their renaming, #50)."""
    draw = w.draw
    entries: list[tuple[str, object]] = [
        (f'"{op}"', SAME) for op in draw(st.lists(st.sampled_from(UNRELATED_OPS), unique=True, max_size=2))
    ]
    for op, (old_forms, new_forms) in OP_NAMES.items():
        kept = compared and op == "attention"
        # Either form of the old name, and of the new; an old name is dropped where the new one (in
        # either form: they name the same op) is already listed, and renamed in its own form otherwise.
        form = draw(st.integers(0, 1))
        old, renamed, new = old_forms[form], new_forms[form], new_forms[draw(st.integers(0, 1))]
        choice = draw(st.sampled_from(["absent", "old", "new", "both"]))
        if choice == "old":
            entries.append((f'"{old}"', SAME if kept else f'"{renamed}"'))
        elif choice == "new":
            entries.append((f'"{new}"', SAME))
        elif choice == "both":
            pair = [(f'"{old}"', SAME if kept else None), (f'"{new}"', SAME)]
            entries.extend(pair if draw(st.booleans()) else pair[::-1])
    if not entries:
        entries.append(('"vllm::mamba_mixer2"', SAME))
    entries = draw(st.permutations(entries))
    opener, closer = draw(st.sampled_from([("[", "]"), ("(", ")"), ("{", "}")]))
    w.gap(0)
    if draw(st.booleans()):  # one line: rewrite the whole literal

        def render(items: list[str]) -> str:
            tail = "," if opener == "(" and len(items) == 1 else ""
            return f"SPLITTING_OPS = {opener}" + ", ".join(items) + tail + closer

        new_items = [str(e if n is SAME else n) for e, n in entries if n is not None]
        old_items = [e for e, _ in entries]
        w.line(0, render(old_items), SAME if new_items == old_items else render(new_items))
        return
    w.line(0, f"SPLITTING_OPS = {opener}")
    for text, new in entries:
        w.gap(1, allow_blank=False)
        w.line(1, text + ",", SAME if new is SAME else (None if new is None else f"{new},"))
    w.line(0, closer)


def _helper_function(w: SourceWriter) -> None:
    """Module-level function with an ``output`` parameter: not attention code."""
    w.statement(0, "def helper(x, output=None):")
    w.statement(1, "assert output is not None")
    w.statement(1, "return x")


# -- the module strategy --------------------------------------------------------------------------


@st.composite
def legacy_modules(draw) -> GeneratedModule:
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-8-sig", "latin-1"]))
    max_codepoint = 0xFF if encoding == "latin-1" else 0x2FFF
    alphabet = st.characters(
        min_codepoint=0x20, max_codepoint=max_codepoint, blacklist_categories=("Cc", "Cs", "Zl", "Zp")
    )
    unit = draw(st.sampled_from(["    ", "  ", "\t"]))
    w = SourceWriter(draw, unit, alphabet)

    if encoding == "latin-1":
        w.line(0, "# -*- coding: latin-1 -*-", trailing=False)
    if draw(st.booleans()):
        w.gap(0)
        w.line(0, '"""A plugin backend written against vLLM <= 0.19."""')
    w.statement(0, "from __future__ import annotations")
    w.statement(0, "from typing import Optional, Union")
    w.statement(0, "import torch")
    w.statement(0, "from torch import Tensor")

    vllm_side = draw(st.booleans()) or not draw(st.booleans())  # mostly vLLM, sometimes unrelated
    style = draw(st.sampled_from(["from", "alias", "module"]))
    if vllm_side:
        backend_mod, backend_name = draw(st.sampled_from(VLLM_BACKEND_BASES))
        impl_mod, impl_name = draw(st.sampled_from(VLLM_IMPL_BASES))
    else:
        backend_mod, backend_name, impl_mod, impl_name = (
            FOREIGN_MODULE,
            "AttentionBackend",
            FOREIGN_MODULE,
            "AttentionImpl",
        )
    backend_base = _import_line(w, backend_mod, backend_name, style)
    impl_base = _import_line(w, impl_mod, impl_name, style)

    if draw(st.booleans()):
        _helper_function(w)
    report_only = draw(st.none() | st.sampled_from(REPORT_ONLY_KINDS))  # drawn first: the backend's flag depends on it
    _backend_class(w, backend_base, in_scope=vllm_side, flag_read=report_only == "getattr")
    if draw(st.booleans()):  # through a local intermediate base class
        w.statement(0, f"class PluginImplBase({impl_base}):")
        w.statement(1, "scale = 1.0")
        impl_base = "PluginImplBase"
    if draw(st.booleans()):  # defined inside a factory function
        w.statement(0, "def make_impl():")
        _impl_class(w, impl_base, in_scope=vllm_side, report_only=report_only, depth=1)
        w.statement(1, "return None")
    else:
        _impl_class(w, impl_base, in_scope=vllm_side, report_only=report_only)
    if draw(st.booleans()):
        _op_list(w, compared=report_only == "compare")
    w.gap(0)  # comments and blank lines at the end of the file

    newline = draw(st.sampled_from(["\n", "\r\n", "mixed"]))
    final_newline = draw(st.booleans()) or newline != "\n"

    def join(texts: list[str], endings: list[str]) -> str:
        out = "".join(t + e for t, e in zip(texts, endings, strict=True))
        return out if final_newline else out[: -len(endings[-1])] if endings else out

    endings = [newline if newline != "mixed" else draw(st.sampled_from(["\n", "\r\n"])) for _ in w.rows]
    old_text = join([r.old for r in w.rows], endings)  # type: ignore[misc]
    new_rows = [(r.old if r.new is SAME else r.new, e) for r, e in zip(w.rows, endings, strict=True)]
    new_rows = [(t, e) for t, e in new_rows if t is not None]
    new_text = join([t for t, _ in new_rows], [e for _, e in new_rows])
    changes = any(r.new is not SAME and r.new != r.old for r in w.rows)
    return GeneratedModule(
        source=old_text.encode(encoding),
        expected=new_text.encode(encoding),
        comments=tuple(w.comments),
        removable_comments=frozenset(w.removable),
        unsafe_removable_comments=frozenset(w.removable | w.unsafe_removable),
        newline=newline,
        encoding=encoding,
        changes_expected=changes,
        suppressed=w.suppressed,
    )
