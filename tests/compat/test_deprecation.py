"""Deprecation warnings of every forwarder: category, message, reported location, once per call site, modes."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

from vllm_attn_compat import compat
from vllm_attn_compat.backends import AttentionBackend
from vllm_attn_compat.compat import VllmAttnCompatDeprecationWarning, deprecation, forwarders
from vllm_attn_compat.compat.flags import AlwaysTrueFlag

from compat_helpers import random_inputs


def _recorded(fn):
    """Run ``fn`` with every warning shown (as pytest does); return the package's warnings."""
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        fn()
    return [w for w in log if issubclass(w.category, VllmAttnCompatDeprecationWarning)]


def _line_of(marker: str) -> int:
    import inspect

    lines = inspect.getsource(inspect.getmodule(_line_of)).splitlines()
    return 1 + next(i for i, line in enumerate(lines) if marker in line and "_line_of" not in line)


class _Backend(AttentionBackend):
    @staticmethod
    def get_name():
        return "compat-test"

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError


def test_category_is_a_deprecation_warning_users_can_filter():
    assert issubclass(VllmAttnCompatDeprecationWarning, DeprecationWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VllmAttnCompatDeprecationWarning)
        with pytest.raises(VllmAttnCompatDeprecationWarning):
            _ = _Backend.accept_output_buffer


# One deprecated path per entry: (call, rule code, words the message must name).
def _forwarder_calls(layers, path):
    layer = layers.attention()
    q, k, v = random_inputs(layer, 3)
    mla = layers.mla() if "mla" in path else None
    if mla is not None:
        gen = torch.Generator().manual_seed(1)
        mq = torch.randn(3, mla.num_heads, mla.qk_head_dim, generator=gen)
        kv_c = torch.randn(3, mla.kv_lora_rank, generator=gen)
        k_pe = torch.randn(3, 1, mla.qk_rope_head_dim, generator=gen)
    return {
        "unified_attention": (lambda: compat.unified_attention(q, k, v, layer.layer_name), "VAC007"),  # SITE-fn
        "op unified_attention": (
            lambda: torch.ops.vllm_attn_compat.unified_attention(q, k, v, layer.layer_name),  # SITE-op
            "VAC007",
        ),
        "unified_mla_attention": (
            lambda: compat.unified_mla_attention(mq, kv_c, k_pe, mla.layer_name),  # SITE-mla
            "VAC007",
        ),
        "op unified_mla_attention": (
            lambda: torch.ops.vllm_attn_compat.unified_mla_attention(mq, kv_c, k_pe, mla.layer_name),  # SITE-mop
            "VAC007",
        ),
        "accept_output_buffer on a class": (lambda: _Backend.accept_output_buffer, "VAC005"),  # SITE-cls
        "accept_output_buffer on an instance": (lambda: _Backend().accept_output_buffer, "VAC005"),  # SITE-inst
        "Attention.use_output": (lambda: layer.use_output, "VAC005"),  # SITE-use
    }


SITES = {
    "unified_attention": "SITE-fn",
    "op unified_attention": "SITE-op",
    "unified_mla_attention": "SITE-mla",
    "op unified_mla_attention": "SITE-mop",
    "accept_output_buffer on a class": "SITE-cls",
    "accept_output_buffer on an instance": "SITE-inst",
    "Attention.use_output": "SITE-use",
}


@pytest.mark.parametrize("path", list(SITES))
def test_warns_once_per_call_site_at_the_callers_line(layers, path):
    call, rule = _forwarder_calls(layers, path)[path]
    with layers.context([3]):
        records = _recorded(lambda: [call() for _ in range(3)])
    assert len(records) == 1, [str(r.message) for r in records]
    (record,) = records
    message = str(record.message)
    assert "removed in vLLM 0.20" in message and f"(rule {rule})" in message and "vllm-attn-compat migrate" in message
    assert record.filename == __file__ and record.lineno == _line_of(SITES[path])


def test_messages_name_the_replacement():
    assert "unified_attention_with_output(query, key, value, output, layer_name)" in (
        forwarders.UNIFIED_ATTENTION_MESSAGE
    )
    assert "unified_mla_attention_with_output" in forwarders.UNIFIED_MLA_ATTENTION_MESSAGE
    assert "always True" in AlwaysTrueFlag("X.accept_output_buffer", "VAC005").message


def test_two_call_sites_warn_twice_and_the_flag_reads_true():
    records = _recorded(lambda: (_Backend.accept_output_buffer, _Backend.accept_output_buffer))
    values = []
    records += _recorded(lambda: values.append(_Backend.accept_output_buffer))
    records += _recorded(lambda: values.append(_Backend.accept_output_buffer))
    # One site on the first line, two more lines below: three warnings, the flag True each time.
    assert len(records) == 3 and values == [True, True]


def test_error_mode_raises_on_every_call(monkeypatch, layers):
    monkeypatch.setenv(deprecation.ENV_WARNINGS, "error")
    layer = layers.attention()
    q, k, v = random_inputs(layer, 2)
    with layers.context([2]):
        for _ in range(2):
            with pytest.raises(VllmAttnCompatDeprecationWarning, match=r"rule VAC007"):
                compat.unified_attention(q, k, v, layer.layer_name)


def test_ignore_mode_is_silent(monkeypatch):
    monkeypatch.setenv(deprecation.ENV_WARNINGS, "ignore")
    assert _recorded(lambda: _Backend.accept_output_buffer) == []


def test_bad_mode_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(deprecation.ENV_WARNINGS, "loud")
    expected = r"VLLM_ATTN_COMPAT_WARNINGS must be one of default, error, ignore; found 'loud'"
    with pytest.raises(ValueError, match=expected):
        _ = _Backend.accept_output_buffer


def test_many_threads_on_one_call_site_warn_once():
    barrier = threading.Barrier(16)

    def read():
        barrier.wait()
        for _ in range(200):
            _ = _Backend.accept_output_buffer

    def run():
        threads = [threading.Thread(target=read) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    assert len(_recorded(run)) == 1


def test_pep702_marker_without_a_second_runtime_warning(layers):
    for fn in (compat.unified_attention, compat.unified_mla_attention):
        assert "removed in vLLM 0.20" in fn.__deprecated__
    layer = layers.attention()
    q, k, v = random_inputs(layer, 2)
    with layers.context([2]), warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        compat.unified_attention(q, k, v, layer.layer_name)
    assert [w.category for w in log] == [VllmAttnCompatDeprecationWarning]


@pytest.mark.parametrize("use_op", [False, True], ids=["function", "op"])
def test_forwarders_and_flags_compile_fullgraph_without_warning(layers, use_op):
    layer = layers.attention(head_size_v=8)
    q, k, v = random_inputs(layer, 4)
    name = layer.layer_name
    forwarder = torch.ops.vllm_attn_compat.unified_attention if use_op else compat.unified_attention

    def fn(q, k, v):
        scale = 2 if layer.use_output and _Backend.accept_output_buffer else 3  # the removed flags, read as True
        return forwarder(q, k, v, name) * scale

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    with layers.context([4]):
        expected = layer(q, k, v) * 2
        records = _recorded(lambda: [torch.testing.assert_close(compiled(q, k, v), expected) for _ in range(2)])
    assert [(r.filename, r.lineno, str(r.message)[:60]) for r in records] == []


def test_a_flag_read_by_a_string_torch_evaluates_does_not_warn_and_a_users_does(monkeypatch):
    """torch 2.12's dynamo reads a class attribute for its guards through ``eval`` of a string, in globals without a
    module name: that is torch's code (in error mode, a warning there would fail the compile), whereas a user's
    ``eval`` of the same string is a use to report. Here a module named like torch's stands in for dynamo."""
    guards = type(torch)("torch._guards_stand_in")
    exec("def read(source, scope):\n    return eval(source, scope)\n", guards.__dict__)
    scope = {"_Backend": _Backend}  # no __name__, as dynamo's
    assert _recorded(lambda: guards.read("_Backend.accept_output_buffer", scope)) == []
    monkeypatch.setenv(deprecation.ENV_WARNINGS, "error")
    assert guards.read("_Backend.accept_output_buffer", scope) is True
    monkeypatch.delenv(deprecation.ENV_WARNINGS)
    records = _recorded(lambda: eval("_Backend.accept_output_buffer", scope))
    assert [r.filename for r in records] == ["<string>"] and "accept_output_buffer" in str(records[0].message)


def test_forwarder_op_decomposes_into_allocation_and_the_with_output_op(layers):
    from torch._inductor.utils import run_and_get_code

    layer = layers.attention(head_size_v=8)
    q, k, v = random_inputs(layer, 4)
    name = layer.layer_name

    def fn(q, k, v):
        return torch.ops.vllm_attn_compat.unified_attention(q, k, v, name) * 2

    torch._dynamo.reset()
    with layers.context([4]):
        result, (code,) = run_and_get_code(torch.compile(fn, fullgraph=True), q, k, v)
        torch.testing.assert_close(result, layer(q, k, v) * 2)
    body = code[code.find("def call(self") :]
    assert "vllm_attn_compat.unified_attention_with_output.default(" in body
    assert "vllm_attn_compat.unified_attention.default" not in body
    assert "copy" not in body and "clone" not in body
    # One buffer for the attention output [T, heads, head_size_v], one for the `* 2` result.
    assert body.count("empty_strided") == 2 and "empty_strided_cpu((4, 4, 8)" in body


def test_shown_by_default_from_library_code(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "fork_backend.py").write_text(
        "from vllm_attn_compat.backends import AttentionBackend\n"
        "def read():\n"
        "    return AttentionBackend.accept_output_buffer\n"
    )
    script = (
        "import vllm_attn_compat.compat as c, fork_backend; c.install_into_backends(); "
        "fork_backend.read(); fork_backend.read()"
    )
    root = str(Path(compat.__file__).resolve().parents[2])
    env = {"PYTHONPATH": f"{tmp_path}:{root}", "PATH": "/usr/bin:/bin"}

    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    # Python would hide a plain DeprecationWarning raised outside __main__; ours shows, once per call site.
    (shown,) = [line for line in run.stderr.splitlines() if "VllmAttnCompatDeprecationWarning" in line]
    assert shown.startswith(f"{tmp_path / 'fork_backend.py'}:3: ") and "(rule VAC005)" in shown
