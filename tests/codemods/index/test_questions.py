"""What a migration asks of the class hierarchy (codemods/index/questions.py): the record of every question
and answer, and whether another hierarchy gives the same answers."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.engine.migrate import migrate_source
from vllm_attn_compat.codemods.index import questions
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module
from vllm_attn_compat.codemods.registry import all_rules

BASE = b"from vllm.v1.attention.backend import AttentionImpl\n\n\nclass PluginBase(AttentionImpl):\n    pass\n"
IMPL = b"""\
from plugin.base import PluginBase


class MyImpl(PluginBase):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        assert output is not None
        return output
"""
CALLER = b"def warm_up(impl, q):\n    return impl.forward(None, q, q, q, None, None)\n"


def _hierarchy(**files: bytes) -> ClassHierarchy:
    return ClassHierarchy.build(index_module(source, f"plugin/{name}.py") for name, source in files.items())


def _migrated(hierarchy: questions.Questions) -> tuple[bytes, list[str]]:
    result = migrate_source(IMPL, path="plugin/impl.py", rules=all_rules(), hierarchy=hierarchy, unsafe_fixes=False)
    return result.source, [f"{f.code} {f.status.value}: {f.message}" for f in result.findings]


def test_a_recorded_migration_is_the_migration_and_records_each_question_once():
    hierarchy = _hierarchy(base=BASE, impl=IMPL)
    recorder = questions.Recorder(hierarchy)
    assert _migrated(recorder) == _migrated(hierarchy)
    answers = recorder.answers
    assert answers is not None
    asked = [question for question, _ in answers]
    assert len(asked) == len(set(asked))
    assert (("is_attention_class", ("impl.MyImpl",)), True) in answers
    assert (("calls.reason", ("impl.MyImpl", "forward", "VAC002", "plugin/impl.py")), None) in answers
    assert questions.still_holds(answers, hierarchy)


def test_a_hierarchy_answering_otherwise_does_not_hold_and_migrates_otherwise():
    recorder = questions.Recorder(_hierarchy(base=BASE, impl=IMPL))
    before = _migrated(recorder)
    assert recorder.answers is not None
    for other in (
        _hierarchy(base=BASE, impl=IMPL, caller=CALLER),  # a call withholds VAC002's fix
        _hierarchy(base=b"class PluginBase:\n    pass\n", impl=IMPL),  # no attention class any more
    ):
        assert not questions.still_holds(recorder.answers, other)
        assert _migrated(other) != before
    # An edit the migration asks nothing about: the same answers, the same migration.
    moved = _hierarchy(base=b"# moved\n" + BASE, impl=IMPL, caller=b"def unrelated(x):\n    return x.run()\n")
    assert questions.still_holds(recorder.answers, moved) and _migrated(moved) == before


def test_a_file_outside_the_hierarchy_has_no_record_to_replay():
    recorder = questions.Recorder(_hierarchy(base=BASE))  # impl.py is not in it: the migration extends it
    _migrated(recorder)
    assert recorder.answers is None


def test_a_recorder_offers_the_questions_and_nothing_else():
    recorder = questions.Recorder(_hierarchy(base=BASE))
    for attribute in ("bases", "patches", "attention_class_names", "_attention"):
        with pytest.raises(AttributeError):
            getattr(recorder, attribute)


@pytest.mark.parametrize(
    ("question", "arguments", "message"),
    [("bases", (), "no such question: 'bases'"), ("covers", ("a", "b"), "covers cannot take 2 arguments")],
)
def test_a_question_from_elsewhere_is_a_value_error(question, arguments, message):
    with pytest.raises(ValueError, match=message):
        questions.ask(_hierarchy(base=BASE), question, arguments)


def test_every_question_of_the_protocol_can_be_asked_again():
    asked_again = questions._QUESTIONS | {"calls", "extended"}  # `calls.reason`; `extended` ends the record
    assert asked_again == {name for name in dir(questions.Questions) if not name.startswith("_")}
    assert asked_again - {"calls"} <= set(dir(questions.Recorder))


def test_the_renaming_of_an_op_list_is_asked_recorded_and_holds_only_while_the_run_s_strings_allow_it():
    ops = b'splitting_ops = ["vllm::unified_attention"]\n'
    hierarchy = ClassHierarchy.build([index_module(ops, "plugin/ops.py")])
    recorder = questions.Recorder(hierarchy)
    migrate_source(ops, path="plugin/ops.py", rules=all_rules(), hierarchy=recorder, unsafe_fixes=False)
    assert recorder.answers is not None
    assert (("op_renaming_withheld", ("unified_attention", "plugin/ops.py")), None) in recorder.answers
    compared = b'def is_old(op):\n    return op == "vllm::unified_attention"\n'
    other = ClassHierarchy.build([index_module(ops, "plugin/ops.py"), index_module(compared, "plugin/check.py")])
    assert not questions.still_holds(recorder.answers, other)
