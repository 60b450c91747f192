"""VAC008 beyond its examples: every way of reaching the deprecated names, and what it means for --check."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.cli import main
from vllm_attn_compat.codemods.findings import Status

from rule_testing import run, source, statuses

# (source, the deprecated names reported, in order)
_USES = {
    "module alias, attribute call": (
        """
        import vllm_attn_compat.compat as vc

        out = vc.unified_mla_attention(q, kv, pe, "layers.0.attn")
        """,
        ["vllm_attn_compat.compat.unified_mla_attention"],
    ),
    "the package imported whole, the adapter called": (
        """
        import vllm_attn_compat

        Impl = vllm_attn_compat.compat.adapt_legacy_impl(LegacyImpl)
        """,
        ["vllm_attn_compat.compat.adapt_legacy_impl"],
    ),
    "from the defining submodules, inside a function and a try": (
        """
        def attend(q, k, v, name):
            try:
                from vllm_attn_compat.compat.forwarders import unified_attention
            except ImportError:
                raise
            return unified_attention(q, k, v, name)


        def adapt(cls):
            from vllm_attn_compat.compat.legacy import adapt_legacy_impl as adapt_impl

            return adapt_impl(cls)
        """,
        [
            "vllm_attn_compat.compat.forwarders.unified_attention",
            "vllm_attn_compat.compat.forwarders.unified_attention",
            "vllm_attn_compat.compat.legacy.adapt_legacy_impl",
            "vllm_attn_compat.compat.legacy.adapt_legacy_impl",
        ],
    ),
    "a reference handed on, not called": (
        """
        from vllm_attn_compat import compat

        OPS = {"attention": compat.unified_attention, "mla": compat.unified_mla_attention}
        register(compat.adapt_legacy_impl)
        """,
        [
            "vllm_attn_compat.compat.unified_attention",
            "vllm_attn_compat.compat.unified_mla_attention",
            "vllm_attn_compat.compat.adapt_legacy_impl",
        ],
    ),
}


@pytest.mark.parametrize("case", list(_USES))
def test_every_use_is_reported_where_it_is_and_nothing_changes(case):
    text, names = _USES[case]
    text = source(text)
    for unsafe in (False, True):
        result = run(text, ["VAC008"], unsafe=unsafe)
        assert result.source.decode() == text
        assert statuses(result) == [Status.MANUAL] * len(names)
        assert [f.message.split("`")[1] for f in result.findings] == names


def test_messages_say_what_to_write_instead():
    text = source(
        """
        from vllm_attn_compat.compat import adapt_legacy_impl, unified_attention
        """
    )
    adapter, forwarder = run(text, ["VAC008"]).findings
    assert "write into `output`" in adapter.message and "0.3.0" in adapter.message
    assert "unified_attention_with_output" in forwarder.message and "allocate the output" in forwarder.message


def test_shadowing_names_and_other_modules_stay():
    text = source(
        """
        from mylib.compat import unified_attention
        from vllm_attn_compat.compat import RENAMED_OPS, normalize_splitting_ops


        def run(adapt_legacy_impl, unified_mla_attention=None):
            return adapt_legacy_impl(unified_attention(unified_mla_attention))
        """
    )
    result = run(text, ["VAC008"])
    assert result.findings == []


def test_noqa_silences_one_site():
    text = source(
        """
        from vllm_attn_compat.compat import unified_attention  # noqa: VAC008

        unified_attention(q, k, v, "layers.0.attn")
        """
    )
    assert statuses(run(text, ["VAC008"])) == [Status.SUPPRESSED, Status.MANUAL]


def test_check_fails_while_vac007s_forwarder_route_is_left(tmp_path, capsys):
    """After `--unsafe-fixes` routed the old op to the forwarder, a check still fails: the package is needed."""
    plugin = tmp_path / "ops.py"
    plugin.write_text(
        source(
            """
            import torch


            def attend(query, key, value, layer_name):
                return torch.ops.vllm.unified_attention(query, key, value, layer_name)
            """
        )
    )
    assert main(["migrate", "--unsafe-fixes", "--old-op-calls=forwarder", "--select", "VAC007", str(plugin)]) == 0
    assert "vllm_attn_compat.compat.unified_attention(" in plugin.read_text()
    capsys.readouterr()
    assert main(["migrate", "--check", str(plugin)]) == 1
    assert "VAC008" in capsys.readouterr().out
