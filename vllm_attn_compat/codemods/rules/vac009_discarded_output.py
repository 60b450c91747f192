"""VAC009: report a ``forward`` that replaces the ``output`` buffer before writing into it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.engine.rule import Example, Rule, class_source, narrowed_to_methods
from vllm_attn_compat.codemods.findings import FixSafety, Status

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    import libcst as cst

_IMPL_HEADER = """\
    import torch
    from vllm.v1.attention.backend import AttentionImpl


    class MyImpl(AttentionImpl):
"""

# The methods vLLM >= 0.20 calls with the layer's buffer and reads the result from: an impl's `forward`, an MLA
# impl's `forward_mha`, an MLA layer's `forward_impl` (a layer's own `forward` takes no buffer from vLLM), and only
# those: of a layer, only `forward_impl`; of an impl, never it.
_GIVEN_THE_BUFFER = frozenset({"forward", "forward_mha", "forward_impl"})
# Of an impl, those vLLM >= 0.20 calls with ``output=``: one without the parameter cannot be called.
_IMPL_METHODS = frozenset({"forward", "forward_mha"})


class DiscardedOutput(Rule):
    """vLLM >= 0.20 passes every backend a preallocated ``output`` and reads the result from it: the tensor
    ``forward`` returns is ignored. A ``forward`` written for the old no-output path returns a new tensor and
    never names ``output`` at all, or opens with ``output = torch.empty_like(query)`` (or any other value) and
    returns that: the buffer it was given is then never written, and the layer hands on uninitialised memory,
    silently; one whose ``forward`` (an MLA impl's ``forward_mha``) takes no ``output`` at all cannot even be
    called: vLLM passes ``output=``, and the call raises TypeError. The rule reports such a method (whatever
    ``accept_output_buffer`` says: its unsafe deletion, VAC004, never makes the method callable), the parameter of a
    method whose body never names it (an abstract method or a
    stub, ``...``, ``pass`` or ``raise``, computes nothing and is left alone), and the assignment that is the
    first statement of the method to name ``output`` when it does not read it (``output = output.view(...)``
    keeps the buffer): from there on, nothing can reach the buffer. Statements before it that cannot write
    into the buffer are passed over (``if output is None: output = ...``, ``return output`` on a profiling
    path, an assignment under a condition), and an ``if`` whose every branch, ``else`` included, replaces
    ``output`` replaces it. A method that stops when given a buffer (``assert output is None``, ``if output is
    not None: raise ...``) loses nothing silently, and an assignment after a statement that may write into the
    buffer may not lose it: both are left alone, and so is every method but those vLLM calls with the buffer
    (an impl's ``forward``, an MLA impl's ``forward_mha``, an MLA layer's ``forward_impl``). Such a backend
    used to declare ``accept_output_buffer = False`` (VAC004): this finding stays once that flag is gone. No
    fix: write the result into ``output``, or decorate the impl class with
    ``@vllm_attn_compat.compat.adapt_legacy_impl``, which copies the returned tensor into it.
    """

    code = "VAC009"
    name = "discarded-output"
    summary = "Report a `forward` that never writes into `output` (never names it, or replaces it first)."
    fix_safety = FixSafety.DISPLAY_ONLY
    since = "0.20.0"  # the release that made the output buffer mandatory
    # The parameter however spelled (`output: torch.Tensor`, `output=None`, `output)`), and its replacement.
    tokens = (b"output =", b"output=", b"output:", b"output,", b"output)", b"def forward")
    # Of a method's body: the statements naming `output`, the first of which it looks at (those that make a body
    # a stub, `pass`, `raise`, `...` and docstrings, are never stubbed).
    reads_statements = (b"output",)

    # It acts in the methods vLLM passes the buffer, and an impl's `forward` (`buffer_methods`): a file whose
    # index shows none needs no parse.
    narrows = True
    acts_in = narrowed_to_methods("buffer", "forward")

    examples = (
        Example(
            "a forward without an output parameter cannot be called by vLLM >= 0.20",
            class_source(
                _IMPL_HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata):
                    return query * 2
                """,
            ),
            findings=(Status.MANUAL,),
        ),
        Example(
            "a forward that allocates its own result and returns it",
            class_source(
                _IMPL_HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    num_tokens = query.shape[0]
                    output = torch.empty_like(query)
                    output.copy_(query[:num_tokens])
                    return output
                """,
            ),
            findings=(Status.MANUAL,),
        ),
        Example(
            "a forward whose every branch allocates its own result, after its profiling path",
            class_source(
                _IMPL_HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    if attn_metadata is None:
                        return output
                    if attn_metadata.num_prefills:
                        output = self.prefill(query, key, value)
                    else:
                        output = self.decode(query, kv_cache)
                    return output
                """,
            ),
            findings=(Status.MANUAL,),
        ),
        Example(
            "a forward that never names the buffer",
            class_source(
                _IMPL_HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    return self.sdpa(query, key, value).reshape(query.shape[0], -1)
                """,
            ),
            findings=(Status.MANUAL,),
        ),
        Example(
            "an abstract forward computes nothing",
            class_source(
                _IMPL_HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                    raise NotImplementedError
                """,
            ),
        ),
        Example(
            "a view of the buffer keeps it",
            class_source(
                _IMPL_HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output: torch.Tensor):
                    output = output.view(-1, self.num_heads, self.head_size)
                    output.copy_(query)
                    return output
                """,
            ),
        ),
        Example(
            "a replacement after the buffer is written, or under a condition, is left alone",
            class_source(
                _IMPL_HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output: torch.Tensor):
                    if attn_metadata is None:
                        output = query.new_zeros(query.shape)
                    output.copy_(query)
                    output = output[: attn_metadata.num_actual_tokens]
                    return output
                """,
            ),
        ),
        Example(
            "the buffer written before the name is bound to another tensor: left alone",
            class_source(
                _IMPL_HEADER,
                """
                def forward(self, layer, query, key, value, kv_cache, attn_metadata, output: torch.Tensor):
                    output.copy_(query)
                    output = torch.empty_like(query)
                    return output
                """,
            ),
        ),
        Example(
            "a helper vLLM does not call may replace its argument",
            class_source(
                _IMPL_HEADER,
                """
                def _prefill(self, query, output=None):
                    output = torch.empty_like(query)
                    return output
                """,
            ),
        ),
    )

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._without_output(node)
        method = self.ctx.output_method()
        if method is None or method.node is not node or node.name.value not in _GIVEN_THE_BUFFER:
            return
        if node.name.value == "forward_impl" and not self.ctx.in_layer_class(method):
            return  # an impl's `forward_impl` is a helper of the project's own (of a layer, `output_method` keeps
            # only an MLA layer's `forward_impl`, which vLLM calls with the buffer)
        lost = "vLLM >= 0.20 reads the buffer it passes, left unwritten: write the result into `output`"
        if not any(_names_output(part) for _, part in _statements(node)):
            param = method.param("output")
            if param is not None and not _is_declaration(node):
                self.ctx.report(self, param, f"`{node.name.value}` never names `output`: {lost}")
            return
        first = _first_use(part for _, part in _statements(node))
        if first is not None and _replaces(first):
            where = "on every branch here" if _is_if(first) else "here"
            self.ctx.report(self, first, f"`output` is replaced {where} before it is written: {lost}")

    def _without_output(self, node: cst.FunctionDef) -> None:
        """An impl's ``forward`` (an MLA impl's ``forward_mha``) taking no ``output``: vLLM >= 0.20 calls it with
        ``output=``, and the call raises TypeError, whatever ``accept_output_buffer`` says (#50)."""
        frame = self.ctx.current_function()
        if (
            node.name.value not in _IMPL_METHODS
            or frame is None
            or frame.node is not node
            or frame.attention_class is None
            or frame.param("output") is not None
            or node.params.star_kwarg is not None  # `**kwargs` takes `output=`
            or self.ctx.in_layer_class(frame)
            or _is_declaration(node)
        ):
            return
        message = f"`{node.name.value}` takes no `output`, which vLLM >= 0.20 passes: the call raises TypeError"
        self.ctx.report(self, node.name, message)


def _statements(function: cst.FunctionDef) -> Iterator[tuple[cst.CSTNode, cst.CSTNode]]:
    """Each statement of the body with each of its small statements (a compound statement is its own)."""
    import libcst as cst

    for statement in function.body.body:
        for part in statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]:
            yield statement, part


def _parts(block: cst.BaseSuite) -> Iterator[cst.CSTNode]:
    """A block's statements, each small statement of a line apart (``if x: a = 1; b = 2`` too)."""
    import libcst as cst

    for statement in block.body:
        yield from statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]


def _is_if(node: cst.CSTNode) -> bool:
    import libcst as cst

    return isinstance(node, cst.If)


def _first_use(parts: Iterable[cst.CSTNode]) -> cst.CSTNode | None:
    """The first of ``parts`` (a block's statements, small ones apart) that names ``output`` and replaces it or may
    write into it, None where none does: a statement that cannot write into the buffer (`_cannot_write`: it tests
    ``output`` against None, returns it, or binds it under a condition) is passed over, since the buffer is
    still what ``output`` holds after it on the path that received one."""
    for part in parts:
        if _names_output(part) and (_replaces(part) or _ends_with_a_buffer(part) or not _cannot_write(part)):
            return part
    return None


def _ends_with_a_buffer(statement: cst.CSTNode) -> bool:
    """Whether a method given a buffer stops at ``statement`` (``assert output is None``, ``if output is not None:``
    raising or returning): it does not lose the result silently, and what follows runs without one."""
    import libcst as cst

    from vllm_attn_compat.codemods.engine.patterns import none_test

    if isinstance(statement, cst.Assert):
        return none_test(statement.test) == "is"
    if not isinstance(statement, cst.If) or none_test(statement.test) != "is not":
        return False
    last = list(_parts(statement.body))[-1:]
    return bool(last) and isinstance(last[0], (cst.Raise, cst.Return))


def _replaces(statement: cst.CSTNode) -> bool:
    """Whether ``statement`` is an assignment binding ``output`` to a value that does not read it, or an ``if``
    each of whose branches (``else`` included) opens its use of ``output`` with such a replacement."""
    import libcst as cst

    if isinstance(statement, cst.If):
        branch: cst.If | cst.Else | None = statement
        while isinstance(branch, cst.If):
            first = _first_use(_parts(branch.body))
            if first is None or not _replaces(first):
                return False
            branch = branch.orelse
        if branch is None:
            return False  # without an `else`, a path keeps the buffer
        first = _first_use(_parts(branch.body))
        return first is not None and _replaces(first)
    if isinstance(statement, cst.Assign):
        targets, value = [target.target for target in statement.targets], statement.value
    elif isinstance(statement, cst.AnnAssign) and statement.value is not None:
        targets, value = [statement.target], statement.value
    else:
        return False
    bound = [_bound_names(target) for target in targets]
    if any(names is None for names in bound) or not any("output" in names for names in bound if names):
        return False
    return not _names_output(value)


def _cannot_write(statement: cst.CSTNode) -> bool:
    """Whether ``statement`` cannot write into the buffer: it names ``output`` only where an assignment binds it
    (to a value not naming it), where ``output is None`` or ``output is not None`` tests it, or where it is
    returned as it is; and it defines no function, which could write into it later."""
    import libcst as cst

    from vllm_attn_compat.codemods.engine.patterns import none_test
    from vllm_attn_compat.codemods.engine.walk import walk

    harmless: set[int] = set()  # the `output` names in those places
    may_write = False

    def visit(node: cst.CSTNode) -> bool:
        nonlocal may_write
        if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            may_write = True
        elif isinstance(node, cst.Assign) and not _names_output(node.value):
            for target in node.targets:
                harmless.update(id(name) for name in _bound_name_nodes(target.target) or ())
        elif isinstance(node, cst.Comparison) and none_test(node) is not None:
            harmless.add(id(node.left))
        elif isinstance(node, cst.Return):
            harmless.add(id(node.value))
        elif isinstance(node, cst.Attribute):
            harmless.add(id(node.attr))  # `self.output`: another thing (`_names_output`)
        elif isinstance(node, cst.Arg) and node.keyword is not None:
            harmless.add(id(node.keyword))
        elif isinstance(node, cst.Name) and node.value == "output" and id(node) not in harmless:
            may_write = True
        return not may_write

    walk(statement, visit, _nothing)
    return not may_write


def _is_declaration(function: cst.FunctionDef) -> bool:
    """An abstract method or a stub (``...``, ``pass``, a docstring, ``raise``): it computes nothing to lose."""
    import libcst as cst

    from vllm_attn_compat.codemods.engine.patterns import is_docstring
    from vllm_attn_compat.codemods.engine.scope import dotted_name

    if any((dotted_name(d.decorator) or "").rpartition(".")[2] == "abstractmethod" for d in function.decorators):
        return True
    return all(
        isinstance(part, (cst.Pass, cst.Raise))
        or (isinstance(part, cst.Expr) and isinstance(part.value, cst.Ellipsis))
        or is_docstring(statement)
        for statement, part in _statements(function)
    )


def _bound_name_nodes(target: cst.BaseExpression) -> list[cst.Name] | None:
    """The names an assignment target binds, as nodes; None when it also writes into something."""
    import libcst as cst

    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, cst.StarredElement):
        return _bound_name_nodes(target.value)
    if isinstance(target, (cst.Tuple, cst.List)):
        names: list[cst.Name] = []
        for element in target.elements:
            inner = _bound_name_nodes(element.value)
            if inner is None:
                return None
            names += inner
        return names
    return None


def _bound_names(target: cst.BaseExpression) -> set[str] | None:
    """The names an assignment target binds (``output, lse = ...`` too); None when it also writes into something
    (``output[0] = ...`` writes into the buffer)."""
    names = _bound_name_nodes(target)
    return None if names is None else {name.value for name in names}


def _names_output(node: cst.CSTNode) -> bool:
    """Whether ``node`` names the variable ``output`` (an attribute or a keyword of that name is another thing)."""
    import libcst as cst

    from vllm_attn_compat.codemods.engine.walk import walk

    found = False

    def visit(child: cst.CSTNode) -> bool:
        nonlocal found
        if isinstance(child, cst.Attribute):
            walk(child.value, visit, _nothing)
            return False
        if isinstance(child, cst.Arg):
            walk(child.value, visit, _nothing)
            return False
        found = found or (isinstance(child, cst.Name) and child.value == "output")
        return not found

    walk(node, visit, _nothing)
    return found


def _nothing(node: cst.CSTNode) -> None:
    pass
