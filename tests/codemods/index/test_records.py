"""A module's index as JSON-ready data and back (codemods/index/records.py): the same index after a trip
through JSON, whichever uses it keeps ready, and a ``ValueError`` naming what is wrong for anything that is not
such data."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_attn_compat.codemods.index import records
from vllm_attn_compat.codemods.index.calls import OutputMethod, Signature, Use
from vllm_attn_compat.codemods.index.classscan import ScannedIndex, quick_index
from vllm_attn_compat.codemods.index.flags import FlagRead
from vllm_attn_compat.codemods.index.hierarchy import ClassEntry, index_module
from vllm_attn_compat.codemods.index.old_ops import OldOpBody
from vllm_attn_compat.codemods.index.runtime_patches import PatchEntry

from libcst_corpus import corpus

# Every kind of record, with the values that take the other branches of the encoding (None, empty, sets).
BACKEND = b"""
import functools
import torch
from vllm.v1.attention.backend import AttentionImpl


class MyImpl(AttentionImpl):
    accept_output_buffer = True

    def get_name(self):
        return "MINE"

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None, *, scale=1.0, **extra):
        if output is None:
            output = torch.empty_like(query)
        return output

    @staticmethod
    def prefill(query, output):
        return output


def run(impl, query):
    assert impl.accept_output_buffer and MyImpl.accept_output_buffer
    impl.forward(None, query, query, query, None, None, output=None)
    impl.forward(*[query] * 6, **{})
    callback = functools.partial(impl.forward, None)
    return getattr(impl, "prefill"), callback


MyImpl.helper = run


def unified_attention(query, layer_name):
    return query


direct_register_custom_op(op_name="unified_attention", op_func=unified_attention)
"""


def _trip(data: object) -> object:
    return json.loads(json.dumps(data))


def _names(index):
    return sorted({use.name for use in index.calls.uses})


@pytest.mark.parametrize("name", sorted(corpus()))
def test_every_index_of_the_corpus_comes_back_the_same_after_json(name):
    source = corpus()[name]
    try:
        index = index_module(source, "pkg/" + name.split("/")[-1].replace(" ", "_"))
    except SyntaxError:
        pytest.skip("newer syntax than this Python parses")
    for read in (frozenset(), frozenset(_names(index)[::2])):  # none ready; every other name's
        back = records.from_data(_trip(records.to_data(index, read)))
        assert back == index
        assert back.calls.uses_named(frozenset(_names(index)[1::3])) == index.calls.uses_named(
            frozenset(_names(index)[1::3])
        )


@functools.cache
def _indexes_with_uses():
    indexes = []
    for name in sorted(corpus()):
        try:
            indexes.append(index_module(corpus()[name], "pkg/m.py"))
        except SyntaxError:
            continue
    return [index for index in indexes if index.calls.uses]


@st.composite
def _reads_and_asks(draw):
    """An index of the corpus, the names whose uses it keeps ready, and the names asked for after (in turn)."""
    index = draw(st.sampled_from(_indexes_with_uses()))
    names = st.sampled_from([*_names(index), "not_a_name_used"])
    return index, draw(st.frozensets(names)), draw(st.lists(st.frozensets(names), min_size=1, max_size=3))


@settings(max_examples=60, deadline=None)
@given(_reads_and_asks())
def test_the_uses_of_any_names_are_those_of_the_index_kept_whichever_it_kept_ready(drawn):
    """The call-site analysis asks a kept index for the uses of the run's methods' names, round after round:
    the same uses, in the same order, as the index made from the source, whichever names were kept ready."""
    index, read, asks = drawn
    back = records.from_data(_trip(records.to_data(index, read)))
    for asked in asks:
        assert back.calls.uses_named(asked) == index.calls.uses_named(asked)
    assert list(back.calls.uses) == list(index.calls.uses) and len(back.calls.uses) == len(index.calls.uses)


def test_uses_not_kept_ready_are_read_only_once_a_name_of_theirs_is_asked_for():
    index = index_module(BACKEND, "plugin/backend.py")
    data = _trip(records.to_data(index, {"forward"}))
    assert {use for use in data["uses"][1]} == {"forward"} and "forward" not in data["other_names"]
    data["other_uses"] = "[not json"  # as if spoiled: read only when asked for
    back = records.from_data(data, kept_in="cache/entry")
    assert back.calls.uses_named({"forward"}) == index.calls.uses_named({"forward"})
    with pytest.raises(ValueError, match=r"the class index kept in cache/entry is not valid \(.*\): delete the file"):
        back.calls.uses_named({"forward", "prefill"})


def test_an_index_with_every_kind_of_record_comes_back_the_same():
    index = index_module(BACKEND, "plugin/backend.py")
    assert index.classes and index.patches and index.calls.methods and index.calls.uses  # all present
    assert index.calls.signatures == (Signature("MyImpl", "get_name", ""),)
    assert any(use.none_at or use.output_none for use in index.calls.uses)
    assert {read.target for read in index.flag_reads} == {None, "backend.MyImpl"}  # both kinds of target
    first = BACKEND.splitlines().index(b"def unified_attention(query, layer_name):") + 1
    assert index.old_ops == (OldOpBody(first, first + 1, "unified_attention", True),)
    assert records.from_data(_trip(records.to_data(index))) == index


def test_the_encoding_has_a_check_for_every_field_of_every_record():
    for kind in (ClassEntry, PatchEntry, OutputMethod):
        assert len(records._FIELDS[kind]) == len(dataclasses.fields(kind)), kind
    assert len(records._FIELDS[Use]) == len(Use._fields)
    assert len(records._FIELDS[FlagRead]) == len(FlagRead._fields)
    assert len(records._FIELDS[OldOpBody]) == len(OldOpBody._fields)
    assert len(records._FIELDS[Signature]) == len(Signature._fields)


def test_a_scanned_index_comes_back_the_same():
    scanned = quick_index(b"import vllm\n\nclass Helper(Base):\n    pass\n", "pkg/helper.py", frozenset())
    assert isinstance(scanned, ScannedIndex) and scanned.base_words
    assert records.scan_from_data(_trip(records.scan_to_data(scanned))) == scanned


def _spoiled(change):
    index = index_module(BACKEND, "plugin/backend.py")
    data = _trip(records.to_data(index, frozenset(_names(index))))  # every use kept ready, checked at once
    change(data)
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda data: data.pop("uses"), "expected the fields"),
        (lambda data: data.update(path=1), "path and module must be strings"),
        (lambda data: data.update(uses={}), "expected the places of uses, then their columns"),
        (lambda data: data["uses"].pop(), "expected 21 columns of Use values"),
        (lambda data: data["uses"][1].append("x"), "no lists of one length"),
        (lambda data: data["uses"][0].append(99), "shorter"),  # a place more than there are uses
        (lambda data: data["uses"][2].__setitem__(0, True), "Use values holds a value of the wrong type"),  # a line
        (lambda data: data.update(other_uses=[]), "other_uses must be a string"),
        (lambda data: data.update(other_names=[1]), "other_names a list of strings"),
        (lambda data: data["classes"][1].__setitem__(0, "Base"), "ClassEntry values holds a value of the wrong type"),
        (lambda data: data["methods"][5].__setitem__(0, [1]), "OutputMethod values holds a value of the wrong type"),
        (lambda data: data["old_ops"][3].__setitem__(0, 1), "OldOpBody values holds a value of the wrong type"),
        (
            lambda data: data["signatures"][2].__setitem__(0, ["self"]),
            "Signature values holds a value of the wrong type",
        ),
    ],
    ids=[
        "field-missing",
        "path-number",
        "uses-no-columns",
        "uses-a-column-short",
        "ragged-columns",
        "places-ragged",
        "bool-for-line",
        "other-uses-no-text",
        "other-names-numbers",
        "bases-text",
        "set-of-numbers",
        "number-for-registered",
        "text-for-parameters",
    ],
)
def test_data_of_the_wrong_shape_raises_a_value_error_naming_it(change, message):
    with pytest.raises(ValueError, match=message):
        records.from_data(_spoiled(change))


def test_only_a_module_index_is_encoded_as_one():
    scanned = ScannedIndex("pkg/helper.py", "pkg.helper", (), base_words=frozenset({"Base"}))
    with pytest.raises(TypeError, match="expected a ModuleIndex, found ScannedIndex"):
        records.to_data(scanned)
    with pytest.raises(ValueError, match="base_words a list of strings"):
        records.scan_from_data({"path": "p", "module": "m", "base_words": [1]})
