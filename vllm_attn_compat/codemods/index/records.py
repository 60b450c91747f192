"""A module's index (and the class scan's) as JSON-ready data and back, for the cache (`run/cache.py`),
which holds no pickle: a cache folder is not trusted to hold code. Reading checks every field's type, so
an entry that was tampered with or written by another version raises ``ValueError`` instead of yielding
an index that is wrong in some corner."""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from vllm_attn_compat.codemods.index.calls import CallIndex, OutputMethod, Signature, Use
from vllm_attn_compat.codemods.index.classscan import ScannedIndex
from vllm_attn_compat.codemods.index.flags import FlagRead
from vllm_attn_compat.codemods.index.hierarchy import ClassEntry, ModuleIndex
from vllm_attn_compat.codemods.index.occurrences import ClassBodyName, NamedUse, Occurrences, OpString, Reflection
from vllm_attn_compat.codemods.index.old_ops import OldOpBody
from vllm_attn_compat.codemods.index.runtime_patches import PatchEntry

_NONE = type(None)


def _of_types(*types: type) -> Callable[[list[Any]], bool]:
    allowed = frozenset(types)
    return lambda column: set(map(type, column)) <= allowed  # exact types: a bool is no int here


def _lists_of(kind: type) -> Callable[[list[Any]], bool]:
    return lambda column: (
        set(map(type, column)) <= {list} and set(map(type, itertools.chain.from_iterable(column))) <= {kind}
    )


def _as_lists(column: list[Any]) -> list[Any]:
    return list(map(list, column))


def _as_sorted(column: list[Any]) -> list[Any]:
    return list(map(sorted, column))


# Per record type, per field: the check of a column of JSON values, how the column becomes field values, and
# how field values become the column (None: they are JSON values as they are). Records are stored by column:
# the checks and conversions run over a whole column at once, in C, and a fork's index holds tens of
# thousands of uses.
_Field = tuple[
    Callable[[list[Any]], bool], Callable[[list[Any]], Iterable[object]], Callable[[list[Any]], list[Any]] | None
]
_SCALAR: _Field = (_of_types(int), iter, None)
_TEXT: _Field = (_of_types(str), iter, None)
_FLAG: _Field = (_of_types(bool), iter, None)
_MAYBE_TEXT: _Field = (_of_types(str, _NONE), iter, None)
_NAMES: _Field = (_lists_of(str), lambda column: map(tuple, column), _as_lists)
_NAME_SET: _Field = (_lists_of(str), lambda column: map(frozenset, column), _as_sorted)
_NUMBERS: _Field = (_lists_of(int), lambda column: map(tuple, column), _as_lists)

_FIELDS: dict[type, tuple[_Field, ...]] = {
    ClassEntry: (_TEXT, _NAMES, _SCALAR, _FLAG, _FLAG, _FLAG, _NAMES, _FLAG, _FLAG, _NAMES, _NAMES, _NAMES, _NAMES),
    FlagRead: (_SCALAR, _MAYBE_TEXT, _TEXT, _TEXT),
    PatchEntry: (_TEXT, _TEXT, _NAMES, _SCALAR),
    OldOpBody: (_SCALAR, _SCALAR, _TEXT, _FLAG),
    OutputMethod: (
        *(_TEXT, _TEXT, _SCALAR, _TEXT, _NAMES, _NAME_SET, _NAME_SET, _FLAG, _FLAG, _FLAG, _MAYBE_TEXT, _FLAG),
        _NAMES,
    ),
    Signature: (_TEXT, _TEXT, _TEXT),
    Use: (
        *(_TEXT, _SCALAR, _SCALAR, _SCALAR, _TEXT, _TEXT, _MAYBE_TEXT, _MAYBE_TEXT, _TEXT),
        *(_SCALAR, _NUMBERS, _NAME_SET, _FLAG, _FLAG, _NUMBERS, _FLAG, _NUMBERS, _FLAG, _MAYBE_TEXT),
        *(_NUMBERS, _FLAG),
    ),
    ClassBodyName: (_TEXT, _TEXT, _SCALAR, _SCALAR),
    Reflection: (_SCALAR, _SCALAR, _TEXT, _TEXT, _MAYBE_TEXT, _NAMES, _TEXT),
    NamedUse: (_TEXT, _SCALAR, _SCALAR, _TEXT, _TEXT),
    OpString: (_SCALAR, _SCALAR, _TEXT, _TEXT, _TEXT),
}


# The records that are tuples (`typing.NamedTuple`): their columns are transposed, and their records made, in C.
_TUPLES = (Use, FlagRead, OldOpBody, Signature, ClassBodyName, Reflection, NamedUse, OpString)


def _columns(kind: type, records: Sequence[Any]) -> list[list[object]]:
    fields = _FIELDS[kind]
    if kind in _TUPLES:
        columns = list(map(list, zip(*records, strict=True))) if records else [[] for _ in fields]
    else:
        columns = [list(map(operator.attrgetter(field.name), records)) for field in dataclasses.fields(kind)]
    return [column if plain is None else plain(column) for (_, _, plain), column in zip(fields, columns, strict=True)]


def _records(kind: type, columns: object) -> tuple[Any, ...]:
    fields = _FIELDS[kind]
    if type(columns) is not list or len(columns) != len(fields):
        raise ValueError(f"expected {len(fields)} columns of {kind.__name__} values, found {columns!r:.80}")
    if len({len(column) if type(column) is list else -1 for column in columns}) > 1:
        raise ValueError(f"the columns of {kind.__name__} values are no lists of one length")
    for (valid, _, _), column in zip(fields, columns, strict=True):
        if not valid(column):
            raise ValueError(f"a column of {kind.__name__} values holds a value of the wrong type: {column!r:.80}")
    values = [convert(column) for (_, convert, _), column in zip(fields, columns, strict=True)]
    if kind in _TUPLES:  # as `kind._make` does, without a call of Python code per record
        return tuple(map(tuple.__new__, itertools.repeat(kind), zip(*values, strict=True)))
    return tuple(map(kind, *values))


def to_data(index: ModuleIndex) -> dict[str, object]:
    """``index`` as JSON-ready data (:func:`from_data` reads it back)."""
    if type(index) is not ModuleIndex:  # a subclass (the class scan's) records more than this keeps
        raise TypeError(f"expected a ModuleIndex, found {type(index).__name__}")
    calls = index.calls
    return {
        "path": index.path,
        "module": index.module,
        "classes": _columns(ClassEntry, index.classes),
        "patches": _columns(PatchEntry, index.patches),
        "methods": _columns(OutputMethod, calls.methods),
        "signatures": _columns(Signature, calls.signatures),
        "uses": _columns(Use, calls.uses),
        "names": None if calls.names is None else sorted(calls.names),
        "attributes": sorted(calls.attributes),
        "flag_reads": _columns(FlagRead, index.flag_reads),
        "old_ops": _columns(OldOpBody, index.old_ops),
        "occurrences": _occurrences_to_data(index.occurrences),
        "backends": list(index.backends),
    }


def _occurrences_to_data(found: Occurrences) -> list[object]:
    return [
        _columns(ClassBodyName, found.class_names),
        _columns(Reflection, found.reflection),
        _columns(NamedUse, found.named),
        _columns(OpString, found.op_strings),
        list(found.stores),
    ]


def _occurrences_from_data(data: object) -> Occurrences:
    if not (type(data) is list and len(data) == 5 and type(data[4]) is list and _of_types(str)(data[4])):
        raise ValueError(f"expected the five kinds of occurrences, found {data!r:.80}")
    return Occurrences(
        _records(ClassBodyName, data[0]),
        _records(Reflection, data[1]),
        _records(NamedUse, data[2]),
        _records(OpString, data[3]),
        tuple(data[4]),
    )


_KEYS = (
    "path",
    "module",
    "classes",
    "patches",
    "methods",
    "signatures",
    "uses",
    "names",
    "attributes",
    "flag_reads",
    "old_ops",
    "occurrences",
    "backends",
)


def from_data(data: object) -> ModuleIndex:
    """The index :func:`to_data` made; ``ValueError`` on anything else."""
    if type(data) is not dict:
        raise ValueError(f"expected an object, found {type(data).__name__}")
    if sorted(data) != sorted(_KEYS):
        raise ValueError(f"expected the fields {', '.join(_KEYS)}, found {', '.join(sorted(map(str, data)))}")
    path, module = data["path"], data["module"]
    if not (type(path) is str and type(module) is str):
        raise ValueError("path and module must be strings")
    names, attributes, backends = data["names"], data["attributes"], data["backends"]
    if not ((names is None or _lists_of(str)([names])) and _lists_of(str)([attributes, backends])):
        raise ValueError("names must be null or a list of strings, attributes and backends lists of strings")
    calls = CallIndex(
        _records(OutputMethod, data["methods"]),
        _records(Use, data["uses"]),
        _records(Signature, data["signatures"]),
        None if names is None else frozenset(names),
        frozenset(attributes),
    )
    return ModuleIndex(
        path,
        module,
        _records(ClassEntry, data["classes"]),
        _records(PatchEntry, data["patches"]),
        calls,
        _records(FlagRead, data["flag_reads"]),
        _records(OldOpBody, data["old_ops"]),
        _occurrences_from_data(data["occurrences"]),
        tuple(backends),
    )


def scan_to_data(scanned: ScannedIndex) -> dict[str, object]:
    """The class scan's index of a file it spared (it records nothing but names)."""
    return {"path": scanned.path, "module": scanned.module, "base_words": sorted(scanned.base_words)}


def scan_from_data(data: object) -> ScannedIndex:
    """The index :func:`scan_to_data` made; ``ValueError`` on anything else."""
    if not (type(data) is dict and sorted(data) == ["base_words", "module", "path"]):
        raise ValueError(f"expected the fields base_words, module, path, found {data!r:.80}")
    path, module, words = data["path"], data["module"], data["base_words"]
    if not (type(path) is str and type(module) is str and type(words) is list and set(map(type, words)) <= {str}):
        raise ValueError("path and module must be strings, base_words a list of strings")
    return ScannedIndex(path, module, (), base_words=frozenset(words))
