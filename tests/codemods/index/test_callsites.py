"""Which uses withhold VAC002/VAC003 (codemods/index/callsites.py, over what index/calls.py collects), beyond the
rules' examples."""

from __future__ import annotations

import pickle

import pytest

from vllm_attn_compat.codemods.findings import Status
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module

from rule_testing import assert_names_use, run, source, statuses

IMPL = """
import torch
from vllm.v1.attention.backend import AttentionImpl


class MyImpl(AttentionImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        return output
"""

# The same method opening with an allocation fallback (VAC003's).
WITH_FALLBACK = IMPL.replace(
    "        return output",
    "        if output is None:\n            output = torch.empty_like(query)\n        return output",
)


@pytest.mark.parametrize(
    "caller",
    [
        # Could not bind to forward's signature: raises TypeError today, so nothing changes for it.
        "def f(model, x):\n    return model.forward(x)\n",
        # `self` of a class unrelated to MyImpl.
        (
            "import torch\n\nclass Net(torch.nn.Module):\n    def run(self, a, b, c, d, e, f):\n"
            "        return self.forward(a, b, c, d, e, f)\n"
        ),
        # A module's function, not a method.
        "import helpers\n\ndef f(a):\n    return helpers.forward(a, a, a, a, a, a)\n",
        # Passes the buffer by keyword or at its place.
        (
            "def f(impl, a, out):\n    impl.forward(a, a, a, a, a, a, out)\n"
            "    return impl.forward(a, a, a, a, a, a, output=out)\n"
        ),
        # `output=None` still binds once `output` is required (only deleting a fallback breaks it).
        "def f(impl, a):\n    return impl.forward(a, a, a, a, a, a, output=None)\n",
        # Keywords forward does not take: whatever `**kw` holds, the call raises TypeError today.
        "def f(model, kw):\n    return model.forward(input_ids=kw, positions=kw, **kw)\n",
        # `*args` beside the buffer passed by keyword.
        "def f(impl, args, out):\n    return impl.forward(*args, output=out)\n",
    ],
)
def test_uses_that_cannot_break_leave_the_fix_safe(caller):
    result = run(IMPL, ["VAC002"], others=[("caller.py", caller)])
    assert statuses(result) == [Status.FIXED]


@pytest.mark.parametrize(
    "caller",
    [
        "def f(impl, a):\n    return impl.forward(a, a, a, a, a, a)\n",
        "def f(impl, args):\n    return impl.forward(*args)\n",
        "def f(impl, kwargs):\n    return impl.forward(None, **kwargs)\n",
        "from plugin_mod import MyImpl\n\ndef f(impl, a):\n    return MyImpl.forward(impl, a, a, a, a, a, a)\n",
        "def f(impl, table):\n    table['attn'] = impl.forward\n",
        "def f(impl):\n    return getattr(impl, 'forward')\n",
    ],
)
def test_uses_that_may_break_withhold_the_fix(caller):
    result = run(IMPL, ["VAC002"], others=[("caller.py", caller)])
    assert statuses(result) == [Status.UNSAFE_FIX_AVAILABLE]
    assert "caller.py:" in result.findings[0].message


@pytest.mark.parametrize(
    "caller",
    [
        "import inspect\n\ndef f(impl):\n    return inspect.signature(impl.forward).parameters\n",
        "from inspect import Signature\n\ndef f(impl):\n    return Signature.from_callable(impl.forward)\n",
    ],
)
def test_reading_the_signature_withholds_only_the_fix_that_changes_it(caller):
    """A signature read never calls the method: deleting its fallback changes nothing it reads, making
    `output` required changes `output`'s default."""
    result = run(WITH_FALLBACK, ["VAC002", "VAC003"], others=[("caller.py", caller)])
    assert [(f.code, f.status) for f in result.findings] == [
        ("VAC002", Status.UNSAFE_FIX_AVAILABLE),
        ("VAC003", Status.FIXED),
    ]
    assert "withheld: `impl.forward` at caller.py:4 reads its signature" in result.findings[0].message
    assert run(caller, ["VAC002"], path="caller.py", others=[("plugin_mod.py", WITH_FALLBACK)]).findings == []


def test_a_signature_read_through_a_receiver_not_shown_keeps_its_placeholder():
    """`type(self).forward` is shown as `(...).forward`, as elsewhere: the message read "`.forward`'s signature"
    (vLLM 0.20.0's `ultravox.py`, NVIDIA/Model-Optimizer's distillation model)."""
    caller = "import inspect\n\ndef f(impl):\n    return inspect.signature(type(impl).forward).parameters\n"
    [finding, _] = run(WITH_FALLBACK, ["VAC002", "VAC003"], others=[("caller.py", caller)]).findings
    assert "withheld: `(...).forward` at caller.py:4 reads its signature" in finding.message


def test_a_handed_on_method_that_only_looks_like_a_signature_read_withholds_everything():
    caller = (
        "import inspect\n\ndef f(impl, signature):\n    return signature(impl.forward), inspect.stack(impl.forward)\n"
    )
    result = run(WITH_FALLBACK, ["VAC002", "VAC003"], others=[("caller.py", caller)])
    assert statuses(result) == [Status.UNSAFE_FIX_AVAILABLE, Status.UNSAFE_FIX_AVAILABLE]


@pytest.mark.parametrize("fallback", [False, True], ids=["plain", "with-fallback"])
def test_a_call_omitting_output_withholds_no_fix_the_rule_cannot_make(fallback):
    """With a defaulted parameter before it, `output` cannot simply lose its default: VAC002 only reports, so
    a call omitting `output` withholds nothing of it (found over baidu/vLLM-Kunlun, where the callers said a
    fix that did not exist was withheld)."""
    text = (WITH_FALLBACK if fallback else IMPL).replace(
        "attn_metadata, output=None", "attn_metadata, kind=1, output=None"
    )
    caller = "def f(impl, a):\n    return impl.forward(a, a, a, a, a, a)\n"
    result = run(text, ["VAC002", "VAC003"], others=[("caller.py", caller)])
    assert [(f.code, f.status) for f in result.findings] == [("VAC002", Status.MANUAL)] + (
        [("VAC003", Status.UNSAFE_FIX_AVAILABLE)] if fallback else []
    )
    assert run(caller, ["VAC002", "VAC003"], path="caller.py", others=[("plugin_mod.py", text)]).findings == []


def _instance_caller(expression: str) -> str:
    """A function evaluating ``expression`` with ``impl``, a `MyImpl` it made (a receiver the run knows), at line 6."""
    head = "from plugin_mod import MyImpl\n\n\ndef f(a, out, args, given):\n    impl = MyImpl()\n"
    return f"{head}    return {expression}\n"


@pytest.mark.parametrize(
    ("caller", "listed"),
    [
        (_instance_caller("impl.forward(a, a, a, a, a, a)"), "does not pass `output`"),
        (_instance_caller("impl.forward(a, a, a, a, a, a, 2, out)"), "passes `output` by position"),
        # None by position, or a parameter that may be None (`forwarded`): the move breaks those too.
        (_instance_caller("impl.forward(a, a, a, a, a, a, 2, None)"), "passes `output` by position"),
        (
            "from plugin_mod import MyImpl\n\n\ndef f(a, out=None):\n    impl = MyImpl()\n"
            "    return impl.forward(a, a, a, a, a, a, 2, out)\n",
            "passes `output` by position",
        ),
        (_instance_caller("impl.forward(*args)"), "passes `*args`/`**kwargs` that may lack `output`"),
        (_instance_caller("getattr(impl, 'forward')"), "hands it on"),
        (_instance_caller("impl.forward(a, a, a, a, a, a, output=out)"), None),
        (_instance_caller("impl.forward(a, a, a, a, a, a, 2, output=out)"), None),
        (_instance_caller("impl.forward(a, a, a, a, a, a, output=None)"), None),
        # A receiver the run cannot tell (a parameter): maybe another class's `forward`, so not named.
        (_instance_caller("given.forward(a, a, a, a, a, a)"), None),
    ],
)
def test_where_vac002_has_no_fix_it_names_the_uses_its_change_by_hand_breaks(caller, listed):
    """VAC002 asks for `output` keyword-only and required by hand where a defaulted parameter comes before it: the
    calls that omit it or pass it by position would then raise TypeError. They are named at the method, and
    reported nowhere else: they withhold no fix."""
    text = IMPL.replace("attn_metadata, output=None", "attn_metadata, kind=1, output=None")
    [finding] = run(text, ["VAC002"], others=[("caller.py", caller)]).findings
    assert finding.status is Status.MANUAL and "keyword-only and required" in finding.message
    lead = "that breaks the run's uses of the method that do not pass it by keyword"
    assert_names_use(finding.message, lead, "caller.py:6", listed)
    assert run(caller, ["VAC002"], path="caller.py", others=[("plugin_mod.py", text)]).findings == []


OTHER = "class Other:\n    def forward(self, *args):\n        return args\n"


def _local_caller(imported: str, binding: str) -> str:
    """A function calling `forward` without `output` on the local `impl`, bound by ``binding``."""
    body = "".join(f"    {line}\n" for line in binding.splitlines())
    return f"{imported}\n\ndef f(a, given):\n{body}    return impl.forward(a, a, a, a, a, a)\n"


@pytest.mark.parametrize(
    ("caller", "withheld", "resolved"),
    [
        # A local bound once to an instance of the impl: the run knows the receiver.
        (_local_caller("from plugin_mod import MyImpl", "impl = MyImpl()"), True, True),
        # ... of a class the method does not belong to: the call cannot reach it.
        (_local_caller("from other_mod import Other", "impl = Other()"), False, None),
        # What a function returned, or a name bound twice: anything.
        (_local_caller("from plugin_mod import build", "impl = build()"), True, False),
        (_local_caller("from other_mod import Other", "impl = Other()\nif a:\n    impl = given"), True, False),
    ],
    ids=["impl", "other-class", "factory", "bound-twice"],
)
def test_a_local_bound_once_to_an_instance_is_a_receiver_the_run_knows(caller, withheld, resolved):
    others = [("caller.py", caller), ("other_mod.py", OTHER)]
    result = run(IMPL + "\n\ndef build():\n    return MyImpl()\n", ["VAC002"], others=others)
    assert statuses(result) == [Status.UNSAFE_FIX_AVAILABLE if withheld else Status.FIXED]
    assert run(caller, ["VAC002"], path="caller.py", others=[("plugin_mod.py", IMPL), others[1]]).findings == []
    if withheld:  # the fix's finding names the call, by the receiver the run knows or as the call reads
        assert "caller.py:" in result.findings[0].message


def test_a_function_sharing_the_name_of_an_unrelated_class_makes_no_instance_of_it():
    factory = "from plugin_mod import MyImpl\n\ndef Other():\n    return MyImpl()\n"
    caller = _local_caller("from factory_mod import Other", "impl = Other()")
    others = [("caller.py", caller), ("other_mod.py", OTHER), ("factory_mod.py", factory)]
    assert statuses(run(IMPL, ["VAC002"], others=others)) == [Status.UNSAFE_FIX_AVAILABLE]


def test_after_the_fix_a_call_on_a_local_instance_is_reported_as_raising_type_error():
    caller = _local_caller("from plugin_mod import MyImpl", "impl = MyImpl()")
    [finding] = run(caller, ["VAC002"], path="caller.py", others=[("plugin_mod.py", REQUIRING)]).findings
    assert finding.status == Status.MANUAL and "the call raises TypeError" in finding.message


def test_an_impl_that_is_a_module_runs_its_forward_through_calls_of_the_module():
    impl = """
    import torch
    from vllm.v1.attention.backend import AttentionImpl


    class MyImpl(AttentionImpl, torch.nn.Module):
        def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
            return output
    """
    result = run(impl, ["VAC002"])
    assert statuses(result) == [Status.UNSAFE_FIX_AVAILABLE]
    assert "layer(...)" in result.findings[0].message


LAYER = """
import torch
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.attention.mla_attention import MLAAttention


class MyAttention(Attention):
    def forward(self, query, key, value, output: torch.Tensor | None = None, output_shape=None):
        if output is None:
            output = torch.empty_like(query)
        assert output is not None
        self.impl.forward(self, query, key, value, self.kv_cache, None, output=output)
        return output


class MyMLA(MLAAttention):
    def forward(self, q, kv_c_normed, k_pe, output=None, **kwargs):
        out = self.impl.run(q, kv_c_normed, k_pe)
        if output is not None:
            output.copy_(out)
        return out

    def forward_impl(self, q, k_c_normed, k_pe, kv_cache, attn_metadata, output=None):
        assert output is not None
        return output
"""


def test_a_vllm_layer_s_forward_is_left_alone_since_vllm_never_passes_it_output():
    """A model calls a layer as `layer(q, k, v)`: vLLM passes no `output` to a layer's `forward` (the layer
    allocates it), so the rules' premise does not hold there. The unsafe fixes made such an `output` required
    and deleted the layer's allocation, breaking every call (found over vllm-project/tpu-inference's MLA layer).
    The MLA layer's `forward_impl`, which vLLM >= 0.20 calls with `output`, is still migrated."""
    caller = "def f(attn, q):\n    return attn.forward(q, q, q)\n"
    result = run(LAYER, ["VAC001", "VAC002", "VAC003"], unsafe=True, others=[("caller.py", caller)])
    impl = next(number for number, line in enumerate(source(LAYER).splitlines(), 1) if "def forward_impl" in line)
    fixes = {(f.line, f.code) for f in result.findings if f.status is not Status.MANUAL}
    assert fixes == {(impl, "VAC002"), (impl + 1, "VAC001")}
    # The layer's `forward` testing its own `output` against None: reported for a person, never fixed (#50).
    reported = [f for f in result.findings if f.status is Status.MANUAL]
    assert reported and all("a layer's own `output`" in f.message for f in reported)
    assert result.source.decode().split("def forward_impl")[0] == LAYER.split("def forward_impl")[0].lstrip()
    at_caller = run(caller, ["VAC001", "VAC002", "VAC003"], path="caller.py", others=[("plugin_mod.py", LAYER)])
    assert at_caller.findings == []


def test_the_analysis_travels_to_the_workers_without_the_call_index():
    caller = "def f(impl, a):\n    return impl.forward(a, a, a, a, a, a)\n"
    indexes = [index_module(IMPL.encode(), "plugin_mod.py"), index_module(caller.encode(), "caller.py")]
    hierarchy = pickle.loads(pickle.dumps(ClassHierarchy.build(indexes)))
    assert hierarchy.calls.blockers("plugin_mod.MyImpl", "forward", "VAC002")
    assert b"Use" not in pickle.dumps(hierarchy)  # the per-file uses stay in the main process


def test_passing_none_withholds_only_the_fallback_deletion():
    caller = "def f(impl, a):\n    return impl.forward(a, a, a, a, a, a, output=None)\n"
    result = run(WITH_FALLBACK, ["VAC002", "VAC003"], others=[("caller.py", caller)])
    assert [(f.code, f.status) for f in result.findings] == [
        ("VAC002", Status.FIXED),
        ("VAC003", Status.UNSAFE_FIX_AVAILABLE),
    ]


def test_a_file_outside_the_run_adds_its_own_calls():
    text = IMPL + "\n    def warm_up(self, q):\n        return self.forward(None, q, q, q, None, None)\n"
    hierarchy = ClassHierarchy.build([])  # the engine indexes the file itself (`ClassHierarchy.extended`)
    extended = hierarchy.extended(index_module(text.encode(), "plugin_mod.py"))
    assert extended.calls.blockers("plugin_mod.MyImpl", "forward", "VAC002")


def test_the_collector_finds_every_attribute_call_ast_walk_finds():
    """On this repository's own sources: the call index misses no call (it walks with its own stack)."""
    import ast
    from pathlib import Path

    from vllm_attn_compat.codemods.index.forwarded import is_none

    root = Path(__file__).resolve().parents[3]
    files = sorted((root / "vllm_attn_compat").rglob("*.py")) + sorted((root / "tests").rglob("*.py"))
    assert len(files) > 50
    for path in files:
        source = path.read_bytes()
        uses = index_module(source, str(path)).calls.uses
        found = {(use.line, use.column) for use in uses if use.kind == "call"}
        expected, passing_a_name = set(), set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                output = [k.value for k in node.keywords if k.arg == "output" and not is_none(k.value)]
                # `output=<value>` is a buffer where the value cannot be None (`forwarded.Parameters.cannot_be_none`).
                where = (node.lineno, node.col_offset + 1)
                (passing_a_name if output else expected).add(where)
        assert expected <= found <= expected | passing_a_name, path


@pytest.mark.parametrize(
    ("call", "newline", "status"),
    [
        ("impl.forward(a, a, a, a, a, a)  # noqa: VAC002", "\n", Status.SUPPRESSED),
        ("impl.forward(\n        a, a, a, a, a, a,\n    )  # NOQA", "\n", Status.SUPPRESSED),  # any line of the use
        ("impl.forward(a, a, a, a, a, a)  # noqa: VAC002", "\r", Status.SUPPRESSED),  # lines `ast` counts
        ("impl.forward(a, a, a, a, a, a)  # noqa: VAC003", "\r\n", Status.MANUAL),  # another rule's
        ("impl.forward(a, a, a, 'a  # noqa', a, a)", "\n", Status.MANUAL),  # in a string: no comment
        ("impl.forward(a, a, a, a, a, a)\n    # noqa: VAC002", "\n", Status.MANUAL),  # the line after the use
    ],
)
def test_a_noqa_comment_on_the_call_s_lines_silences_its_finding(call, newline, status):
    from vllm_attn_compat.codemods.index import callsites

    caller = f"def f(impl, a):\n    return {call}\n".replace("\n", newline).encode()
    indexes = [index_module(REQUIRING.encode(), "plugin_mod.py"), index_module(caller, "caller.py")]
    hierarchy = ClassHierarchy.build(indexes)
    found = callsites.findings_for_run(hierarchy.calls, {"caller.py": caller}, ["VAC002"])
    assert [(path, finding.line, finding.status) for path, finding in found] == [("caller.py", 2, status)]


@pytest.mark.parametrize(
    ("caller", "receiver"),
    [
        ("def f(impl, a):\n    return impl.forward(a, a, a, a, a, a)\n", "`impl`"),  # a parameter
        ("def f(a):\n    return make().forward(a, a, a, a, a, a)\n", "its receiver"),  # a call's result
        ("def f(models, a):\n    return models['x'].forward(*a)\n", "its receiver"),
        ("import functools\n\ndef f(net):\n    return functools.partial(net.forward)\n", "`net`"),
        # The receiver resolves to the class: no doubt to state.
        ("from plugin_mod import MyImpl\n\ndef f(a):\n    return MyImpl.forward(a, a, a, a, a, a, a)\n", None),
    ],
)
def test_the_fix_s_finding_names_a_use_the_run_cannot_tell_as_it_reads_and_the_use_is_no_finding(caller, receiver):
    """A generic name gathers uses from all over a tree (`mlp.forward` handed on in a test): such a use withholds the
    fix (it may reach the method), and the fix's finding names it as the code reads; a finding at the use would
    be one in code that may have nothing to do with the class (#50)."""
    from vllm_attn_compat.codemods.index import callsites

    second = IMPL.replace("class MyImpl", "class OtherImpl")
    indexes = [index_module(IMPL.encode(), "plugin_mod.py"), index_module(second.encode(), "other_mod.py")]
    indexes.append(index_module(caller.encode(), "caller.py"))
    hierarchy = ClassHierarchy.build(indexes)
    assert callsites.findings_for_run(hierarchy.calls, {"caller.py": caller.encode()}, ["VAC002"]) == []
    reason = hierarchy.calls.reason("plugin_mod.MyImpl", "forward", "VAC002", "plugin_mod.py") or ""
    shown = "(...)" if receiver == "its receiver" else (receiver or "`MyImpl`").strip("`")
    assert reason.startswith(f"withheld: `{shown}.forward") and "at caller.py:" in reason, reason


REQUIRING = IMPL.replace("output=None", "output")


@pytest.mark.parametrize(
    ("caller", "reported"),
    [
        ("from plugin_mod import MyImpl\n\ndef f(impl, a):\n    return MyImpl.forward(impl, a, a, a, a, a, a)\n", True),
        (
            "from plugin_mod import MyImpl\n\nclass Sub(MyImpl):\n    def warm(self, a):\n"
            "        return self.forward(a, a, a, a, a, a)\n",
            True,
        ),
        # A receiver the run cannot tell (the old op's `self.impl.forward(...)` after `--unsafe-fixes`): the
        # finding says so.
        ("def f(impl, a):\n    return impl.forward(a, a, a, a, a, a)\n", True),
        ("def f(layer, a):\n    return layer.impl.forward(layer, a, a, a, a, a)\n", True),
        (
            "from plugin_mod import MyImpl\n\ndef f(impl, a, o):\n"
            "    return MyImpl.forward(impl, a, a, a, a, a, a, o)\n",
            False,
        ),
        (
            "from plugin_mod import MyImpl\n\ndef f(impl, a):\n    return MyImpl.forward(impl, a, a)\n",
            False,
        ),  # more missing
        ("from plugin_mod import MyImpl\n\ndef f(impl, a):\n    return MyImpl.forward(impl, *a)\n", False),
    ],
)
def test_a_call_omitting_a_required_output_is_reported(caller, reported):
    """After vLLM 0.20 (or `--unsafe-fixes`) made `output` required, such a call raises TypeError: a `--check`
    must not pass over it, on a receiver the run cannot tell either (saying so)."""
    from vllm_attn_compat.codemods.index import callsites

    indexes = [index_module(REQUIRING.encode(), "plugin_mod.py"), index_module(caller.encode(), "caller.py")]
    hierarchy = ClassHierarchy.build(indexes)
    found = callsites.findings_for_run(hierarchy.calls, {"caller.py": caller.encode()}, ["VAC002"])
    if not reported:
        assert found == []
        return
    [(_, finding)] = found
    assert finding.code == "VAC002" and finding.status is Status.MANUAL
    assert "which `MyImpl.forward` requires (vLLM >= 0.20): the call raises TypeError" in finding.message
    told = "MyImpl" in caller or "self." in caller
    assert ("(the run cannot tell)" not in finding.message) is told, finding.message
    assert callsites.findings_for_run(hierarchy.calls, {"caller.py": caller.encode()}, ["VAC001"]) == []


@pytest.mark.parametrize(
    "call",
    [
        "super().forward(*args, **kwargs)",  # a forwarder of its own arguments (vLLM 0.34.0's `forward_mha`)
        "self.forward(*parts, layer=None)",  # `output` in a local tuple (vLLM 0.34.0's `_forward_prefill`)
    ],
)
def test_a_call_passing_star_arguments_to_a_method_requiring_output_is_not_reported(call):
    """Whether `*args`/`**kwargs` hold `output` cannot be seen: vLLM 0.34.0's own code passes it so, and a report
    there would fail every check of a clean tree. While such a call withholds a fix, the fix's finding names it;
    once `output` is required, checks pass over it."""
    from vllm_attn_compat.codemods.index import callsites

    caller = (
        "from plugin_mod import MyImpl\n\n\nclass Sub(MyImpl):\n    def run(self, *args, **kwargs):\n"
        f"        parts = args\n        return {call}\n"
    )
    after = [index_module(REQUIRING.encode(), "plugin_mod.py"), index_module(caller.encode(), "caller.py")]
    found = callsites.findings_for_run(ClassHierarchy.build(after).calls, {"caller.py": caller.encode()}, ["VAC002"])
    assert found == []
    before = ClassHierarchy.build([index_module(IMPL.encode(), "plugin_mod.py"), after[1]])
    assert callsites.findings_for_run(before.calls, {"caller.py": caller.encode()}, ["VAC002"]) == []
    reason = before.calls.reason("plugin_mod.MyImpl", "forward", "VAC002", "plugin_mod.py") or ""
    assert "passes `*args`/`**kwargs` that may lack `output`" in reason


# A method requiring `output` with the parameters of vLLM's layer's `forward` (MiniMax-M3's sparse impls in vLLM
# 0.34.0), and other classes defining a `forward` without it.
SPARSE_IMPL = """
from vllm.v1.attention.backend import AttentionImpl


class SparseImpl(AttentionImpl):
    def forward(self, query, key, value, output):
        return output
"""
PLAIN_LAYER = """
from vllm.model_executor.layers.attention import Attention


class MyLayer(Attention):
    def forward(self, query, key, value, output_shape=None):
        return query
"""
# Takes anything: tells nothing of what a call is for.
CATCH_ALL = """
from vllm.v1.attention.backend import AttentionImpl


class Wrapping(AttentionImpl):
    def forward(self, *args, **kwargs):
        return args
"""
NOT_ATTENTION = """
class Runner:
    def forward(self, input_ids, positions, inputs_embeds=None):
        return input_ids
"""


@pytest.mark.parametrize(
    ("others", "call", "reported"),
    [
        # On a receiver the run cannot tell, a call that another attention class's `forward` takes whole may be
        # meant for it: vLLM 0.34.0's `self_attn.forward(query, key, value)` on its layer.
        ([PLAIN_LAYER], "attn.forward(q, k, v)", False),
        ([PLAIN_LAYER], "attn.forward(query=q, key=k, value=v)", False),
        ([PLAIN_LAYER], "attn.forward(q, k, value=v)", False),
        # The layer's parameters do not take it (keywords it lacks; one it requires missing): reported.
        ([PLAIN_LAYER.replace("query, key, value", "x, y, z")], "attn.forward(query=q, key=k, value=v)", True),
        ([PLAIN_LAYER.replace("output_shape=None", "output_shape")], "attn.forward(q, k, v)", True),
        # No evidence: a method taking `*args`/`**kwargs`, or a class that is no attention class.
        ([CATCH_ALL], "attn.forward(q, k, v)", True),
        ([NOT_ATTENTION], "attn.forward(q, k, v)", True),
        ([], "attn.forward(q, k, v)", True),
    ],
)
def test_a_call_omitting_output_that_another_attention_class_takes_is_not_reported(others, call, reported):
    """A report says the call raises TypeError; where the receiver could be an instance of another attention class
    whose method of that name takes the call, parameter for parameter, the run has no ground to say so."""
    from vllm_attn_compat.codemods.index import callsites

    caller = f"def f(attn, q, k, v, s):\n    return {call}\n"
    sources = [SPARSE_IMPL, *others, caller]
    paths = [f"mod{number}.py" for number in range(len(sources))]
    indexes = [index_module(text.encode(), path) for text, path in zip(sources, paths, strict=True)]
    found = callsites.findings_for_run(ClassHierarchy.build(indexes).calls, {paths[-1]: caller.encode()}, ["VAC002"])
    assert [finding.message.partition(" (vLLM")[0] for _, finding in found] == (
        ["`attn.forward(...)` does not pass `output`, which `SparseImpl.forward` requires"] if reported else []
    )


def test_a_call_on_a_receiver_the_run_knows_is_reported_whatever_other_classes_take():
    """The narrowing is for receivers the run cannot tell: `self.forward(q, k, v)` in a subclass of the impl
    requiring `output` raises, whatever vLLM's layer takes."""
    from vllm_attn_compat.codemods.index import callsites

    caller = "from mod0 import SparseImpl\n\n\nclass Sub(SparseImpl):\n    def warm(self, q):\n"
    caller += "        return self.forward(q, q, q)\n"
    indexes = [index_module(SPARSE_IMPL.encode(), "mod0.py"), index_module(PLAIN_LAYER.encode(), "mod1.py")]
    indexes.append(index_module(caller.encode(), "caller.py"))
    [(_, finding)] = callsites.findings_for_run(
        ClassHierarchy.build(indexes).calls, {"caller.py": caller.encode()}, ["VAC002"]
    )
    assert "`self.forward(...)` does not pass `output`, which `SparseImpl.forward` requires" in finding.message


# vLLM 0.19.1's `unified_attention` op, as its forks keep it: the backend's `forward` called without `output`.
OLD_OP_BODY = """
from vllm.utils.torch_utils import direct_register_custom_op


@maybe_transfer_kv_layer
def {name}(query, key, value, layer_name):
    attn_metadata, self, kv_cache, _ = get_attention_context(layer_name)
    output = self.impl.forward(self, query, key, value, kv_cache, attn_metadata)
    return output


{registration}
"""
# How the module registers it: as vLLM <= 0.19 does, through torch.library, or not at all (a plugin's copy of the
# body, called directly, as vLLM-Kunlun's `ops/attention/layer.py`).
REGISTRATIONS = {
    "direct_register_custom_op": 'direct_register_custom_op(op_name="{name}", op_func={name})',
    "torch.library": 'op = torch.library.custom_op("vllm::{name}", mutates_args=())({name})',
    "none": "def forward(self, q, k, v):\n    return {name}(q, k, v, self.layer_name)",
}


@pytest.mark.parametrize("registration", list(REGISTRATIONS))
@pytest.mark.parametrize("unsafe_fixes", [False, True], ids=["check", "unsafe-fixes"])
@pytest.mark.parametrize("impl", [REQUIRING, IMPL], ids=["output-required", "output-defaults-to-none"])
@pytest.mark.parametrize("name", ["unified_attention", "warm_up"])
def test_a_call_omitting_output_in_the_body_of_a_deleted_op_says_to_delete_the_op(
    name, impl, unsafe_fixes, registration
):
    """vLLM 0.20 deleted the op rather than mend its call: where the call breaks (the method requires `output`,
    or `--unsafe-fixes` makes it), and where it withholds the fixes that would. A function named as the op that
    the module does not register is said to be named so, no more."""
    from vllm_attn_compat.codemods.index import callsites

    caller = OLD_OP_BODY.format(name=name, registration=REGISTRATIONS[registration].format(name=name))
    other = impl.replace("class MyImpl", "class OtherImpl")
    indexes = [index_module(text.encode(), path) for text, path in [(impl, "plugin_mod.py"), (other, "o.py")]]
    indexes.append(index_module(caller.encode(), "layer.py"))
    hierarchy = ClassHierarchy.build(indexes)
    found = callsites.findings_for_run(hierarchy.calls, {"layer.py": caller.encode()}, ["VAC002"], unsafe_fixes)
    if impl is not REQUIRING:  # the call withholds the fixes: the fixes' findings name it, it is no finding (#50)
        assert found == []
        reason = hierarchy.calls.reason("plugin_mod.MyImpl", "forward", "VAC002", "plugin_mod.py")
        assert reason is not None and "`self.impl.forward(...)` at layer.py:8 does not pass `output`" in reason
        return
    [(_, finding)] = found
    assert finding.line == 8 and finding.status is Status.MANUAL
    # both classes whose `forward` the call breaks are counted, not the first found
    assert "which `OtherImpl.forward` and 1 other method(s) of the run require (vLLM >= 0.20)" in finding.message
    deleted = "this is the body of `vllm::unified_attention`: delete it (VAC007)"
    named = "this function is named as the deleted op `vllm::unified_attention`"
    old_op = name == "unified_attention"
    assert (deleted in finding.message) is (old_op and registration != "none"), finding.message
    assert (named in finding.message) is (old_op and registration == "none"), finding.message


def test_a_withholding_use_is_no_finding_of_its_own_in_a_safe_run_or_one_taking_the_unsafe_fixes():
    """#50: one finding per withheld fix, at the code it would change, naming the uses."""
    from vllm_attn_compat.codemods.index import callsites

    caller = b"def f(impl, a):\n    return impl.forward(a, a, a, a, a, a)\n"
    indexes = [index_module(IMPL.encode(), "plugin_mod.py"), index_module(caller, "caller.py")]
    calls = ClassHierarchy.build(indexes).calls
    assert callsites.findings_for_run(calls, {"caller.py": caller}, ["VAC002"]) == []
    assert callsites.findings_for_run(calls, {"caller.py": caller}, ["VAC002"], unsafe_fixes=True) == []
    reason = calls.reason("plugin_mod.MyImpl", "forward", "VAC002", "plugin_mod.py")
    assert reason == "withheld: `impl.forward(...)` at caller.py:2 does not pass `output`"


# A `forward` passing its own `output` on to a helper that falls back when it is None: what the helper is given is what
# `forward` was.
RELAY = """
import torch
from vllm.v1.attention.backend import AttentionImpl


class MyImpl(AttentionImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        return self._run(query, output)

    def _run(self, query, output=None):
        return self._decode(query, output=output)

    def _decode(self, query, output=None):
        if output is None:
            output = torch.empty_like(query)
        output.copy_(query)
        return output
"""
OMITS = "def f(impl, a):\n    return impl.forward(a, a, a, a, a, a)\n"


def test_a_helper_given_what_forward_was_given_keeps_its_fallback_while_forward_may_be_given_none():
    result = run(RELAY, ["VAC003"], others=[("caller.py", OMITS)])
    fallback = [f for f in result.findings if f.line == 13]
    assert [f.status for f in fallback] == [Status.UNSAFE_FIX_AVAILABLE]
    assert_names_use(
        fallback[0].message, "withheld", "line 10", "passes on, as `output`, a parameter of its own that may be None"
    )
    assert [f for f in result.findings if f.line == 10] == []  # named by the fix's finding, no finding of its own


@pytest.mark.parametrize("others", [[], [("caller.py", OMITS.replace("a, a)", "a, a, output=a)"))]])
def test_where_every_use_of_forward_passes_a_buffer_the_chain_s_fixes_are_all_safe(others):
    result = run(RELAY, ["VAC002", "VAC003"], others=others)
    assert statuses(result) == [Status.FIXED] * 4
    assert b"if output is None" not in result.source


@pytest.mark.parametrize(
    ("relay", "safe"),
    [
        ("    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):", False),
        ("    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output):", True),
        (
            "    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):\n"
            "        assert output is not None",
            True,
        ),
        (
            "    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):\n"
            "        if output is None:\n"
            "            output = torch.empty_like(query)",
            True,
        ),
    ],
)
def test_only_a_parameter_that_may_still_be_none_at_the_call_withholds(relay, safe):
    text = source(RELAY).replace(
        "    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):", relay, 1
    )
    result = run(text, ["VAC003"], others=[("caller.py", OMITS)])
    decode_fallback = text[: text.rindex("if output is None")].count("\n") + 1
    assert [f.status for f in result.findings if f.line == decode_fallback] == [
        Status.FIXED if safe else Status.UNSAFE_FIX_AVAILABLE
    ]


def test_a_function_the_run_does_not_follow_the_calls_of_withholds_what_it_passes_on():
    caller = "def warm_up(impl, q, out=None):\n    return impl._decode(q, out)\n"
    result = run(
        WITH_FALLBACK.replace("def forward(", "def _decode(").replace(
            "layer, query, key, value, kv_cache, attn_metadata, ", "query, "
        ),
        ["VAC003"],
        others=[("caller.py", caller)],
    )
    assert statuses(result) == [Status.UNSAFE_FIX_AVAILABLE]


def test_a_use_found_later_settles_the_chain_again():
    hierarchy = ClassHierarchy.build([index_module(source(RELAY).encode(), "plugin_mod.py")])
    assert not hierarchy.calls.blockers("plugin_mod.MyImpl", "_decode", "VAC003")
    extended = hierarchy.extended(index_module(OMITS.encode(), "engine.py"))  # a file outside the run's index
    assert extended.calls.blockers("plugin_mod.MyImpl", "forward", "VAC003") == ()  # forward has no fallback
    assert [b.how for b in extended.calls.blockers("plugin_mod.MyImpl", "_run", "VAC003 by hand")] == ["relays"]
    assert [b.line for b in extended.calls.blockers("plugin_mod.MyImpl", "_decode", "VAC003")] == [10]
    assert pickle.loads(pickle.dumps(extended.calls)) == extended.calls


def test_what_withholds_is_the_argument_bound_to_output_not_another_passed_on_beside_it():
    """vllm-gcu's shape: ``super().forward(..., output, output_scale)`` in a ``forward`` whose own uses all pass a
    buffer: ``output_scale`` may be None, but it is not what the base's ``output`` is given."""
    text = source(RELAY).replace(
        "output=None):\n        return self._run(query, output)",
        "output=None, scale=None):\n        return self._run(query, output, scale)",
    )
    text = text.replace("def _run(self, query, output=None):", "def _run(self, query, output=None, scale=None):")
    assert "self._run(query, output, scale)" in text
    result = run(text, ["VAC003"])
    assert statuses(result) == [Status.FIXED]
    swapped = text.replace("self._run(query, output, scale)", "self._run(query, scale, output)")
    # `scale` reaches `_run`'s `output` (named by the fix's finding), and through it `_decode`'s.
    assert statuses(run(swapped, ["VAC003"])) == [Status.UNSAFE_FIX_AVAILABLE]


@pytest.mark.parametrize(("base", "looked_at"), [("MLAAttention", True), ("AttentionLayerBase", False)])
def test_of_a_layer_only_an_mla_layer_s_forward_impl_is_one_vllm_passes_the_buffer(base, looked_at):
    layer = f"""
    import torch
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase


    class Layer({base}):
        def forward_impl(self, q, kv_cache, attn_metadata, output=None):
            if output is None:
                output = torch.empty_like(q)
            output.copy_(q)
            return output

        def _helper(self, q, output=None):
            return output
    """
    op = "def op(layer, q):\n    return layer.forward_impl(q, None, None)\n"
    result = run(layer, ["VAC002", "VAC003"], others=[("ops.py", op)])
    if looked_at:
        assert {f.line for f in result.findings} == {7, 8}  # VAC002 and VAC003
        assert all(f.status is Status.UNSAFE_FIX_AVAILABLE for f in result.findings)
    else:  # the layer's own `output`: its None test is reported for a person, with no fix (#50)
        assert [(f.line, f.code, f.status) for f in result.findings] == [(8, "VAC003", Status.MANUAL)]
