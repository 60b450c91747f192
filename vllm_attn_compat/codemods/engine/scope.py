"""What the rules see while the engine walks a file: scopes, imports, and a place to report.

One `FileContext` per file. The engine's single traversal (`Analyzer`, driven by `walk.walk`) keeps the stack of
enclosing classes and functions up to date and calls the rules' ``visit_<NodeType>`` hooks;
rules ask the context whether they are inside an attention class or one of its methods that
takes an ``output`` parameter, and report findings with the edits that would fix them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, cast

import libcst as cst

from vllm_attn_compat.codemods.engine.edits import Edit
from vllm_attn_compat.codemods.findings import FixSafety, TargetRelease
from vllm_attn_compat.codemods.index import callsites
from vllm_attn_compat.codemods.index.hierarchy import class_scope, layer_given_buffer
from vllm_attn_compat.codemods.index.questions import Questions, interface_of
from vllm_attn_compat.codemods.index.runtime_patches import ATTRIBUTE


class Reporting(Protocol):
    """What the context reads of a rule that reports (`rule.Rule` has it; this module does not import it, since
    a rule holds its `FileContext`)."""

    @property
    def code(self) -> str: ...

    @property
    def fix_safety(self) -> FixSafety: ...

    @property
    def since(self) -> str | None: ...

    @property
    def fix_requires(self) -> str | None: ...


# How a rule's message points to its unsafe fix ("... (the unsafe fix deletes it: --unsafe-fixes)").
_UNSAFE_FIX_HINT = re.compile(r" ?\((?:the )?unsafe fix\b[^()]*\)")


@dataclass(frozen=True)
class Report:
    code: str
    message: str
    node: cst.CSTNode  # where the finding is shown and where a noqa comment is looked for
    edits: tuple[Edit, ...]
    safety: FixSafety
    release: str | None = None  # the vLLM release whose change the finding is about


@dataclass
class ClassFrame:
    node: cst.ClassDef
    qualname: str
    is_attention: bool
    # Set for a "methods" class copied onto a class that could not be resolved: findings are only shown.
    unresolved_patch: bool = False
    # Set (with unresolved_patch) for a "methods" class a decorator builds a backend class of.
    built: bool = False
    # The manifest classes it derives from and whether by a backend's shape alone (`FileContext.vllm_interface`).
    interface: tuple[tuple[str, ...], bool] | None = None


@dataclass
class FunctionFrame:
    node: cst.FunctionDef | cst.Lambda
    qualname: str
    # Set when the function is a method defined directly in an attention class.
    attention_class: ClassFrame | None
    # "attention" when the function is assigned onto an attention class at run time (it is a method of
    # it), "unresolved" when onto a class that could not be resolved (findings are only shown).
    patched: str | None = None
    in_layer: bool | None = None  # a method of a vLLM layer (`FileContext.in_layer_class`), once asked

    def param(self, name: str) -> cst.Param | None:
        params = self.node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            if param.name.value == name:
                return param
        return None


Frame: TypeAlias = ClassFrame | FunctionFrame


def _dotted(node: cst.BaseExpression) -> str | None:
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.insert(0, node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.insert(0, node.value)
    return ".".join(parts)


def dotted_name(node: cst.BaseExpression) -> str | None:
    """``torch.ops.vllm.x`` for an attribute chain of names, else None."""
    return _dotted(node)


def as_name(alias: cst.ImportAlias) -> str | None:
    """The name ``import ... as <name>`` binds; None without ``as``."""
    if alias.asname is None:
        return None
    name = alias.asname.name
    # AsName also serves `with`/`except`, where a tuple or list may follow `as`; an import takes a name only.
    assert isinstance(name, cst.Name), type(name)
    return name.value


class FileContext:
    def __init__(
        self,
        path: str,
        module: cst.Module,
        hierarchy: Questions,
        *,
        old_op_calls: str = "with-output",
        target: TargetRelease | None = None,
    ) -> None:
        self.path = path
        self.old_op_calls = old_op_calls  # how VAC007 rewrites calls whose layer shape is unknown
        if target is None:
            from vllm_attn_compat.manifest import newest

            target = TargetRelease(newest())
        self.target = target  # the vLLM release the run targets
        self.module = module
        self.hierarchy = hierarchy
        self.module_name = hierarchy.module_name(path)
        self.frames: list[Frame] = []
        self.stack: list[cst.CSTNode] = []  # the node being visited and its ancestors
        self.reports: list[Report] = []
        self.imports: dict[str, str] = {}  # bound name -> dotted target, from top-level imports
        self._collect_imports(module.body)

    def _collect_imports(self, body: Sequence[cst.BaseStatement]) -> None:
        for statement in body:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        target = _dotted(alias.name) or ""
                        bound = as_name(alias) or target.split(".")[0]
                        self.imports[bound] = target if alias.asname else bound
                elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                    base = "." * len(small.relative) + (_dotted(small.module) or "" if small.module else "")
                    for alias in small.names:
                        name = alias.name.value if isinstance(alias.name, cst.Name) else ""
                        bound = as_name(alias) or name
                        self.imports[bound] = f"{base}.{name}"

    # --- facts about the file ---------------------------------------------------------
    @property
    def imports_vllm(self) -> bool:
        return any(target == "vllm" or target.startswith("vllm.") for target in self.imports.values())

    def tensor_annotation(self) -> str | None:
        """How this module can spell ``torch.Tensor`` at definition time, if it can."""
        for bound, target in self.imports.items():
            if target == "torch":
                return f"{bound}.Tensor"
        for bound, target in self.imports.items():
            if target == "torch.Tensor":
                return bound
        return None

    # --- scope ------------------------------------------------------------------------
    def current_function(self) -> FunctionFrame | None:
        frame = self.frames[-1] if self.frames else None
        return frame if isinstance(frame, FunctionFrame) else None

    def withheld_reason(self, method: FunctionFrame, code: str) -> str | None:
        """Why the run's uses of ``method`` withhold ``code``'s fix (a call omitting ``output``, a callback), or
        None when the fix stays safe: a safe fix preserves every call the run can see (`index.callsites`)."""
        return callsites.withheld_reason(self, method, code)

    def keyword_only_breaks(self, method: FunctionFrame) -> str | None:
        """Which of the run's uses of ``method`` making ``output`` keyword-only and required by hand would break, where
        VAC002 has no fix (a defaulted parameter before it); None when none does."""
        return callsites.withheld_reason(self, method, callsites.REQUIRED_BY_HAND)

    def uses_passing_no_buffer(self, method: FunctionFrame) -> str | None:
        """The run's uses of ``method`` that may pass it no buffer (omitting ``output``, passing None, handing the
        method on), named for a finding at a test of ``output`` against None; None when there is none."""
        return callsites.withheld_reason(self, method, callsites.NONE_TESTED)

    def output_still_parameter(self, method: FunctionFrame) -> bool:
        """Whether ``output``, where the visit is inside ``method``, is still its parameter: no assignment to it may
        run before (`patterns.rebinds_before`), but for those under ``if output is None:`` (the old fallbacks)."""
        from vllm_attn_compat.codemods.engine import patterns

        path = self.stack[next(i for i, n in enumerate(self.stack) if n is method.node) :]
        return not patterns.rebinds_before(path, "output", ignore=patterns.none_guards(method.node, "output"))

    def output_method(self) -> FunctionFrame | None:
        """The method we are directly inside, if it belongs to an attention class and takes
        an ``output`` parameter (the only place where ``output`` is the layer's buffer): not a vLLM layer's
        ``forward``, which vLLM calls as ``layer(q, k, v)``, never with ``output``."""
        frame = self.current_function()
        if frame is None or (frame.attention_class is None and frame.patched is None):
            return None
        if frame.param("output") is None:
            return None
        return frame if not self.in_layer_class(frame) or self._given_the_layer_s_buffer(frame) else None

    def layer_output_method(self) -> FunctionFrame | None:
        """The method we are directly inside, where it is a vLLM layer's method taking an ``output`` that vLLM does not
        pass it (`output_method` leaves it out): the layer's own parameter. A None test of it is the old API's shape,
        reported for a person (issue #50: such layer files got no finding at all)."""
        frame = self.current_function()
        if frame is None or frame.attention_class is None or frame.param("output") is None:
            return None
        return frame if self.in_layer_class(frame) and not self._given_the_layer_s_buffer(frame) else None

    def in_layer_class(self, method: FunctionFrame) -> bool:
        """Whether ``method`` is a method of a vLLM attention layer (`ClassHierarchy.is_layer_class`)."""
        if method.in_layer is None:
            full = self._owner(method)
            method.in_layer = full is not None and self.hierarchy.is_layer_class(full)
        return method.in_layer

    def _given_the_layer_s_buffer(self, method: FunctionFrame) -> bool:
        """Whether vLLM passes the layer's method its buffer (`hierarchy.layer_given_buffer`)."""
        full = self._owner(method)
        return (
            full is not None
            and isinstance(method.node, cst.FunctionDef)
            and layer_given_buffer(self.hierarchy, full, method.node.name.value)
        )

    def _owner(self, method: FunctionFrame) -> str | None:
        owner = method.attention_class  # (set for a method defined directly in the class)
        return f"{self.module_name}.{owner.qualname}" if owner is not None else None

    def in_unresolved_patch(self) -> bool:
        """Whether the code being visited is copied at run time onto a class that could not be resolved."""
        return any(
            frame.unresolved_patch if isinstance(frame, ClassFrame) else frame.patched == "unresolved"
            for frame in self.frames
        )

    def method_owner(self) -> ClassFrame | None:
        """The class the function being visited is a method of (defined directly in its body), if it is one."""
        if len(self.frames) < 2 or not isinstance(self.frames[-1], FunctionFrame):
            return None
        owner = self.frames[-2]
        return owner if isinstance(owner, ClassFrame) else None

    def vllm_interface(self, frame: ClassFrame) -> tuple[tuple[str, ...], bool]:
        """The manifest classes (qualified names) the class of ``frame`` derives from, () for none, and whether it
        is a backend by its shape alone (`index.interface`)."""
        if frame.interface is None:
            frame.interface = interface_of(self.hierarchy.vllm_interface(f"{self.module_name}.{frame.qualname}"))
        return frame.interface

    def parameters_withheld(self, frame: ClassFrame, method: str) -> str | None:
        """Why adding parameters with defaults to ``method`` of the class of ``frame`` is withheld: a use of the run
        that may see its signature (`index.interface`); None when there is none."""
        return self.hierarchy.parameters_withheld(f"{self.module_name}.{frame.qualname}", method, self.path)

    def attention_class(self) -> ClassFrame | None:
        """The innermost enclosing class, if it is an attention class."""
        for frame in reversed(self.frames):
            if isinstance(frame, ClassFrame):
                return frame if frame.is_attention else None
        return None

    def parent(self, levels: int = 1) -> cst.CSTNode | None:
        index = len(self.stack) - 1 - levels
        return self.stack[index] if index >= 0 else None

    # --- reporting --------------------------------------------------------------------
    def report_unless_withheld(
        self, rule: Reporting, node: cst.CSTNode, method: FunctionFrame, message: str, edit: Edit
    ) -> None:
        """Report a fix the run's uses of ``method`` may withhold (`withheld_reason`): the rule's safety where
        none does, else unsafe, the message saying why."""
        reason = self.withheld_reason(method, rule.code)
        if reason is None:
            self.report(rule, node, message, edit)
        else:
            self.report(rule, node, f"{message}; {reason}", edit, safety=FixSafety.UNSAFE)

    def report(
        self,
        rule: Reporting,
        node: cst.CSTNode,
        message: str,
        *edits: Edit,
        safety: FixSafety | None = None,
        release: str | None = None,
    ) -> None:
        """Record a finding at ``node``; ``edits`` fix it with ``safety`` (the rule's by default), unsafe where the
        fix needs a newer vLLM than the oldest the target allows (`Rule.fix_requires`). Without edits the finding
        is display-only. ``release``: the vLLM release whose change it is about (the rule's `Rule.since`)."""
        chosen = safety if safety is not None else rule.fix_safety
        too_old = self._older_than(rule.fix_requires)
        if edits and too_old and chosen is not FixSafety.DISPLAY_ONLY:
            message += f" (unsafe: the fix needs vLLM >= {rule.fix_requires}, and the target allows {too_old})"
            chosen = FixSafety.UNSAFE
        built = any(isinstance(frame, ClassFrame) and frame.built for frame in self.frames)
        if built or self.in_unresolved_patch():
            # Reported only: the rule's pointer to its unsafe fix would offer a fix that is not there.
            message = _UNSAFE_FIX_HINT.sub("", message)
            edits = ()
        if built:
            message += " (a decorator makes a vLLM class of it: by hand)"
        elif self.in_unresolved_patch():
            message += " (copied onto a class this tool cannot resolve: by hand)"
        if not edits:
            chosen = FixSafety.DISPLAY_ONLY
        self.reports.append(Report(rule.code, message, node, tuple(edits), chosen, release or rule.since))

    def _older_than(self, release: str | None) -> str | None:
        """The oldest release the target allows, where it is older than ``release``; else None."""
        oldest = self.target.oldest
        if release is None or oldest is None:
            return None
        from vllm_attn_compat.manifest import version_key

        return oldest if version_key(oldest) < version_key(release) else None


_HOOK_PREFIX = "visit_"
_SCOPES = (cst.ClassDef, cst.FunctionDef, cst.Lambda)


class Analyzer:
    """The one traversal (:func:`walk.walk`): maintains scopes, records comments, dispatches to the rules."""

    def __init__(self, ctx: FileContext, rules: Sequence[object]) -> None:
        self.ctx = ctx
        self.comments: list[cst.Comment] = []
        self.parents: dict[int, cst.CSTNode] = {}  # id(node) -> the node it was walked under
        self.hooks: dict[str, list[Callable[[cst.CSTNode], None]]] = {}
        for rule in rules:
            for attr in dir(type(rule)):
                if attr.startswith(_HOOK_PREFIX):
                    self.hooks.setdefault(attr[len(_HOOK_PREFIX) :], []).append(getattr(rule, attr))

    def _prefix(self) -> str:
        if not self.ctx.frames:
            return ""
        frame = self.ctx.frames[-1]
        return frame.qualname + (".<locals>." if isinstance(frame, FunctionFrame) else ".")

    def on_visit(self, node: cst.CSTNode) -> bool:
        ctx = self.ctx
        if ctx.stack:
            self.parents[id(node)] = ctx.stack[-1]
        ctx.stack.append(node)
        # Exact types (the parser makes no subclasses): isinstance on libcst's ABC-based classes is slow.
        kind = type(node)
        if kind is cst.ClassDef:
            node = cast(cst.ClassDef, node)  # its exact type, tested above
            qualname = self._prefix() + node.name.value
            full = f"{ctx.module_name}.{qualname}"
            ctx.frames.append(ClassFrame(node, qualname, *class_scope(ctx.hierarchy, full)))
        elif kind is cst.FunctionDef:
            node = cast(cst.FunctionDef, node)
            owner = ctx.frames[-1] if ctx.frames else None
            attention_class = owner if isinstance(owner, ClassFrame) and owner.is_attention else None
            qualname = self._prefix() + node.name.value
            patched = None if attention_class else ctx.hierarchy.patch_scope(f"{ctx.module_name}.{qualname}", ATTRIBUTE)
            ctx.frames.append(FunctionFrame(node, qualname, attention_class, patched))
        elif kind is cst.Lambda:
            ctx.frames.append(FunctionFrame(cast(cst.Lambda, node), self._prefix() + "<lambda>", None))
        elif kind is cst.Comment:
            self.comments.append(cast(cst.Comment, node))
        for hook in self.hooks.get(kind.__name__, ()):
            hook(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if type(original_node) in _SCOPES:
            self.ctx.frames.pop()
        self.ctx.stack.pop()

    def enclosing(self, nodes: Sequence[cst.CSTNode]) -> set[int] | None:
        """The ids of ``nodes`` and of every node above them, or None if one of them was not walked."""
        found: set[int] = set()
        for node in nodes:
            current = node
            while id(current) not in found:
                found.add(id(current))
                if current is self.ctx.module:
                    break
                parent = self.parents.get(id(current))
                if parent is None:
                    return None
                current = parent
        return found
