"""VAC006 beyond its examples."""

from __future__ import annotations

from vllm_attn_compat.codemods.findings import Status

from rule_testing import run, source, statuses


def test_dotted_forms_tuples_sets_and_quotes():
    text = source(
        """
        a_ops = ('vllm.unified_attention', "vllm::unified_mla_attention")
        config.splitting_ops = {"vllm::unified_attention", "vllm.unified_attention_with_output"}
        SPLITTING_OPS = ("vllm::unified_attention", "vllm::unified_attention_with_output")
        """
    )
    result = run(text, ["VAC006"])
    assert result.source.decode() == source(
        """
        a_ops = ('vllm.unified_attention_with_output', "vllm::unified_mla_attention_with_output")
        config.splitting_ops = {"vllm.unified_attention_with_output"}
        SPLITTING_OPS = ("vllm::unified_attention_with_output",)
        """
    )


def test_the_op_lists_vllm_reads_are_renamed_wherever_they_stand():
    text = source(
        """
        compilation = CompilationConfig(splitting_ops=["vllm::unified_attention"])
        settings = {"splitting_ops": ["vllm::unified_mla_attention"]}
        config.splitting_ops.extend(["vllm.unified_attention"])
        config.splitting_ops.append("vllm::unified_mla_attention")
        """
    )
    result = run(text, ["VAC006"])
    assert result.source.decode() == source(
        """
        compilation = CompilationConfig(splitting_ops=["vllm::unified_attention_with_output"])
        settings = {"splitting_ops": ["vllm::unified_mla_attention_with_output"]}
        config.splitting_ops.extend(["vllm.unified_attention_with_output"])
        config.splitting_ops.append("vllm::unified_mla_attention_with_output")
        """
    )


def test_a_pair_of_old_and_new_names_stays_a_pair_and_withholds_the_renaming_elsewhere():
    """Issue #50: a list of (old, new) pairs became a list of one-element tuples (`dict()` of it raises), and a tuple
    of removed names used to reject them was renamed into the new names. Both are reported, and both may be compared
    with what an op list holds: the op list's renaming is withheld, naming them."""
    text = source(
        """
        RENAMES = [("vllm::unified_attention", "vllm::unified_attention_with_output")]
        REMOVED = ("vllm::unified_attention", "vllm::unified_mla_attention")
        other.append("vllm::unified_attention")
        """
    )
    others = [("config.py", 'splitting_ops = ["vllm::unified_attention", "vllm::unified_mla_attention"]\n')]
    result = run(text, ["VAC006"], others=others)
    assert result.source.decode() == text
    assert [f.line for f in result.findings if f.status is Status.MANUAL] == [1, 2, 2, 3]
    listed = run(others[0][1], ["VAC006"], path="config.py", others=[("plugin_mod.py", text)])
    assert listed.source.decode() == others[0][1]
    assert [f.status for f in listed.findings] == [Status.UNSAFE_FIX_AVAILABLE] * 2
    assert "withheld: 'vllm::unified_attention' at plugin_mod.py:1 may be compared" in listed.findings[0].message
    assert "withheld: 'vllm::unified_mla_attention' at plugin_mod.py:2 may be compared" in listed.findings[1].message


def test_prefix_colliding_names_and_other_strings_stay():
    text = source(
        """
        ops = ["vllm::unified_attention_with_output", "vllm::unified_attention2", "my::unified_attention"]
        doc = "see vllm::unified_attention for details"
        raw = b"vllm::unified_attention"
        """
    )
    result = run(text, ["VAC006"])
    assert result.findings == [] and result.source.decode() == text


def test_comparison_argument_and_dict_key_are_reported_only():
    text = source(
        """
        if name == "vllm::unified_attention":
            destroy(name)
        register("vllm::unified_mla_attention")
        table = {"vllm::unified_attention": 1}
        nested = [f("vllm::unified_attention")]
        """
    )
    result = run(text, ["VAC006"])
    assert result.source.decode() == text
    assert statuses(result) == [Status.MANUAL] * 4


def test_comments_around_dropped_elements_stay_in_the_literal():
    text = source(
        """
        splitting_ops = [  # the ops
            # old first
            "vllm::unified_attention",  # legacy path
            "vllm::mamba_mixer2",  # keeps the mamba mixer split
            # the attention op:
            "vllm::unified_attention_with_output",
            "vllm::unified_attention"  # trailing, without a comma
        ]
        """
    )
    result = run(text, ["VAC006"])
    assert result.source.decode() == source(
        """
        splitting_ops = [  # the ops
            # old first
            # legacy path
            "vllm::mamba_mixer2",  # keeps the mamba mixer split
            # the attention op:
            "vllm::unified_attention_with_output"
            # trailing, without a comma
        ]
        """
    )
    assert result.removed_comments == ()


def test_noqa_keeps_a_string():
    text = 'ops = ["vllm::unified_attention"]  # noqa: VAC006\n'
    result = run(text, ["VAC006"])
    assert result.source.decode() == text and statuses(result) == [Status.SUPPRESSED]


def test_in_a_fork_that_still_declares_the_flag_the_rename_is_unsafe(tmp_path, capsys):
    """A vLLM <= 0.19 fork still runs the old op for backends without the flag: its op list must keep the name
    until that path goes, so the rename waits for --unsafe-fixes; without the fork's base it is safe."""
    from vllm_attn_compat.codemods.cli import main

    base = "from abc import ABC\n\n\nclass AttentionBackend(ABC):\n    accept_output_buffer: bool = False\n"
    ops = 'OPS = ["vllm::unified_attention", "vllm::mamba_mixer"]\n'
    for folder in ("vllm", "vllm/v1", "vllm/v1/attention", "vllm/config"):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "vllm/v1/attention/backend.py").write_text(base)
    compilation = tmp_path / "vllm/config/compilation.py"
    compilation.write_text(ops)
    # All rules: the class hierarchy (which finds the fork's base) is built for the rules scoped to it.
    assert main(["migrate", str(tmp_path / "vllm")]) == 1
    assert compilation.read_text() == ops
    assert "VAC006 [unsafe]" in capsys.readouterr().out
    # Selected alone, the rule still sees the fork's base: the hierarchy's files take part for it.
    assert main(["migrate", "--select", "VAC006", str(tmp_path / "vllm")]) == 1
    assert compilation.read_text() == ops and "VAC006 [unsafe]" in capsys.readouterr().out
    main(["migrate", "--unsafe-fixes", str(tmp_path / "vllm")])
    assert compilation.read_text() == 'OPS = ["vllm::unified_attention_with_output", "vllm::mamba_mixer"]\n'
    # The same list without the fork's base: a plugin's list for vLLM >= 0.20, renamed by the safe fix.
    (tmp_path / "vllm/v1/attention/backend.py").unlink()
    compilation.write_text(ops)
    assert main(["migrate", "--select", "VAC006", str(tmp_path / "vllm")]) == 0
    assert "unified_attention_with_output" in compilation.read_text()
