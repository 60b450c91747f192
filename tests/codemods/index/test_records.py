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

    def get_impl_cls(self):
        return MyImpl

    def get_attn_backend_cls(self):
        return "plugin.attention.MyBackend"

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

from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

register_backend(AttentionBackendEnum.CUSTOM, "plugin.attention.Registered")
"""


def _trip(data: object) -> object:
    return json.loads(json.dumps(data))


def _names(index):
    return sorted({use.name for use in index.calls.uses})


@pytest.mark.parametrize("name", sorted(corpus()))
def test_every_index_of_the_corpus_comes_back_the_same_after_json(name):
    source = corpus()[name]
    path = "pkg/" + name.split("/")[-1].replace(" ", "_")
    try:
        index = index_module(source, path)
    except SyntaxError:
        pytest.skip("newer syntax than this Python parses")
    for names in (None, frozenset(), frozenset(_names(index)[::2])):  # every use recorded; none; every other name's
        recorded = index_module(source, path, names=names)
        assert records.from_data(_trip(records.to_data(recorded))) == recorded


@functools.cache
def _sources_with_uses():
    sources = []
    for name in sorted(corpus()):
        try:
            index = index_module(corpus()[name], "pkg/m.py")
        except SyntaxError:
            continue
        if index.calls.uses:
            sources.append((corpus()[name], index))
    return sources


@st.composite
def _recorded_and_asked(draw):
    """A source of the corpus with its full index, the names whose uses an index records, and names asked for."""
    source, index = draw(st.sampled_from(_sources_with_uses()))
    names = st.sampled_from([*_names(index), "not_a_name_used"])
    return source, index, draw(st.frozensets(names)), draw(st.lists(st.frozensets(names), min_size=1, max_size=3))


@settings(max_examples=60, deadline=None)
@given(_recorded_and_asked())
def test_an_index_recording_some_names_holds_their_uses_and_says_what_it_lacks(drawn):
    """A run indexes a file recording the uses of the names its analysis reads so far, and again where the file
    uses a name that joined them since (`CallIndex.lacks`): the uses recorded are the full index's of those names
    (and of the module's own methods taking ``output``), and an index lacks a name exactly where the module uses
    it and its uses were not recorded; kept and read back, it says the same."""
    source, full, recorded, asks = drawn
    index = index_module(source, "pkg/m.py", names=recorded)
    own = {method.name for method in full.calls.methods}
    assert index.calls.names is not None and index.calls.names >= recorded | own
    assert index.calls.uses == tuple(use for use in full.calls.uses if use.name in index.calls.names)
    assert index.calls.attributes == full.calls.attributes >= set(_names(full))
    back = records.from_data(_trip(records.to_data(index)))
    for asked in asks:
        expected = bool((asked & full.calls.attributes) - recorded - index.calls.names)
        assert index.calls.lacks(asked) is back.calls.lacks(asked) is expected
        if not expected:
            assert index.calls.uses_named(asked) == full.calls.uses_named(asked)
    assert not full.calls.lacks(frozenset(_names(full)))


def test_an_index_with_every_kind_of_record_comes_back_the_same():
    index = index_module(BACKEND, "plugin/backend.py")
    assert index.classes and index.patches and index.calls.methods and index.calls.uses  # all present
    hooks = ("get_name", "get_impl_cls", "get_attn_backend_cls")
    assert set(index.calls.signatures) == {Signature("MyImpl", hook, "") for hook in hooks}
    assert index.backends == ("plugin.attention.MyBackend", "plugin.attention.Registered")
    assert index.classes[0].impls == ("backend.MyImpl",)
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
    data = _trip(records.to_data(index))
    change(data)
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda data: data.pop("uses"), "expected the fields"),
        (lambda data: data.update(path=1), "path and module must be strings"),
        (lambda data: data.update(uses={}), "expected 21 columns of Use values"),
        (lambda data: data["uses"].pop(), "expected 21 columns of Use values"),
        (lambda data: data["uses"][1].append(1), "no lists of one length"),
        (lambda data: data["uses"][1].__setitem__(0, True), "Use values holds a value of the wrong type"),  # a line
        (lambda data: data.update(names="forward"), "names must be null or a list of strings"),
        (lambda data: data.update(attributes=[1]), "attributes and backends lists of strings"),
        (lambda data: data.update(backends="plugin.Backend"), "attributes and backends lists of strings"),
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
        "bool-for-line",
        "names-text",
        "attributes-numbers",
        "backends-text",
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
