"""The code of dataclasses' generated methods kept between imports: the classes made with it behave as those made
without, every code object kept is the one compiling its text makes, and a file that does not check out, a
folder that cannot be written, or ``sys.dont_write_bytecode`` never costs more than compiling."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_attn_compat.codemods.run import dataclass_code


@pytest.fixture
def writes_bytecode(monkeypatch):
    """As a Python that writes bytecode (this machine's tests may run with PYTHONDONTWRITEBYTECODE)."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)


# A dataclass: its options, and each field's name and whether it has a default.
_options = st.fixed_dictionaries(
    {"frozen": st.booleans(), "order": st.booleans(), "eq": st.booleans(), "unsafe_hash": st.booleans()}
).filter(lambda o: o["eq"] or not o["order"])
_fields = st.lists(
    st.tuples(st.sampled_from(["a", "b", "value", "output", "self_", "x1"]), st.booleans()),
    max_size=4,
    unique_by=lambda f: f[0],
).map(lambda fields: sorted(fields, key=lambda f: f[1]))  # fields without a default come first


def _make(fields, options):
    spec = [(name, int, dataclasses.field(default=7)) if default else (name, int) for name, default in fields]
    return dataclasses.make_dataclass("Made", spec, **options)


def _behaviour(cls, fields):
    """What the generated methods do, observed: construction, repr, equality, hash, order, assignment."""
    required = [index for index, (_, default) in enumerate(fields) if not default]
    first, again, second = cls(*range(len(required))), cls(*range(len(required))), cls(*range(1, len(required) + 1))
    seen: dict[str, object] = {"repr": repr(first), "eq": first == second, "self_eq": first == again}
    for name, operation in (("hash", lambda: hash(first) == hash(again)), ("lt", lambda: first < second)):
        try:
            seen[name] = operation()
        except TypeError as error:
            seen[name] = f"TypeError: {error}"
    if fields:
        try:
            setattr(first, fields[0][0], 99)
            seen["set"] = getattr(first, fields[0][0])
        except dataclasses.FrozenInstanceError as error:
            seen["set"] = f"frozen: {error}"
    try:
        cls(*range(len(required) + len(fields) + 1))
    except TypeError as error:
        seen["too_many"] = str(error)
    return seen


@settings(max_examples=60, deadline=None)
@given(fields=_fields, options=_options)
def test_classes_made_with_kept_code_behave_as_those_made_without(tmp_path_factory, fields, options):
    path = str(tmp_path_factory.mktemp("kept") / "code.bin")
    plain = _make(fields, options)
    sys.dont_write_bytecode, before = False, sys.dont_write_bytecode
    try:
        with dataclass_code.kept_code(path) as first:
            compiled = _make(fields, options)
        with dataclass_code.kept_code(path) as second:
            kept = _make(fields, options)
    finally:
        sys.dont_write_bytecode = before
    assert first.compiled == len(first.used) > 0
    assert second.compiled == 0 and second.used.keys() == first.used.keys()
    assert _behaviour(plain, fields) == _behaviour(compiled, fields) == _behaviour(kept, fields)
    # The oracle for every text: its kept code is what compiling it makes, as `exec` would have.
    for text, code in dataclass_code.load(path).items():
        assert code == compile(text, "<string>", "exec", dont_inherit=True) and code.co_filename == "<string>"


def test_the_builtin_exec_is_dataclasses_own_again_after_the_block_even_when_it_raises(tmp_path):
    with pytest.raises(RuntimeError), dataclass_code.kept_code(str(tmp_path / "code.bin")):
        assert "exec" in vars(dataclasses)
        raise RuntimeError
    assert "exec" not in vars(dataclasses)
    assert not os.path.exists(tmp_path / "code.bin")


def test_without_a_namespace_the_code_runs_in_the_callers_as_the_builtin_runs_it():
    kept = dataclass_code.KeptCode({})
    ran_in: list[str] = []

    def caller() -> None:
        local = "the caller's"
        kept.exec("ran_in.append(__name__ + ' ' + local)")
        kept.exec(compile("ran_in.append(local)", "<code>", "exec"))
        kept.exec("ran_in.append(local)", {"ran_in": ran_in}, {"local": "given"})
        assert local == "the caller's"

    caller()
    assert ran_in == [f"{__name__} the caller's", "the caller's", "given"]
    assert kept.compiled == 2


def test_the_file_keeps_what_the_last_import_used(tmp_path, writes_bytecode):
    path = str(tmp_path / "code.bin")
    with dataclass_code.kept_code(path):
        dataclasses.make_dataclass("Old", [("gone", int)])
    with dataclass_code.kept_code(path) as code:
        dataclasses.make_dataclass("New", [("kept", int)])
    assert code.compiled > 0
    kept = dataclass_code.load(path)
    assert kept.keys() == code.used.keys()
    assert not any("gone" in text for text in kept) and any("kept" in text for text in kept)


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: data[:-1] + bytes([data[-1] ^ 1]), id="a-flipped-bit"),
        pytest.param(lambda data: b"\0\0\0\0" + data[4:], id="another-interpreter"),
        pytest.param(lambda data: b"", id="empty"),
    ],
)
def test_a_file_that_does_not_check_out_is_compiled_again_and_written_anew(tmp_path, writes_bytecode, spoil):
    path = str(tmp_path / "code.bin")
    with dataclass_code.kept_code(path):
        dataclasses.make_dataclass("Made", [("value", int)])
    with open(path, "rb") as handle:
        data = handle.read()
    with open(path, "wb") as handle:
        handle.write(spoil(data))
    assert dataclass_code.load(path) == {}
    with dataclass_code.kept_code(path) as code:
        made = dataclasses.make_dataclass("Made", [("value", int)])
    assert code.compiled == len(code.used) > 0 and made(3).value == 3
    with open(path, "rb") as handle:
        assert handle.read() == data


def test_a_payload_of_the_wrong_shape_is_ignored(tmp_path):
    import marshal
    import zlib

    path = tmp_path / "code.bin"
    shapes = (["a list"], {"text": "not code"}, {1: compile("", "", "exec")})
    for payload in map(marshal.dumps, shapes):
        path.write_bytes(importlib.util.MAGIC_NUMBER + zlib.crc32(payload).to_bytes(4, "little") + payload)
        assert dataclass_code.load(str(path)) == {}


def test_nothing_is_written_where_python_writes_no_bytecode(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    with dataclass_code.kept_code(str(tmp_path / "code.bin")) as code:
        dataclasses.make_dataclass("Made", [("value", int)])
    assert code.compiled > 0 and os.listdir(tmp_path) == []


def test_a_folder_that_cannot_be_written_keeps_nothing_and_raises_nothing(tmp_path, writes_bytecode):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would be")
    with dataclass_code.kept_code(str(blocked / "code.bin")) as code:
        made = dataclasses.make_dataclass("Made", [("value", int)])
    assert code.compiled > 0 and made(1) == made(1)
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_the_file_lives_with_this_package_bytecode():
    path = dataclass_code.store_path()
    assert os.path.dirname(path) == os.path.dirname(importlib.util.cache_from_source(dataclass_code.__file__))
    assert sys.implementation.cache_tag in os.path.basename(path)


# In a fresh interpreter, each block of kept code recorded (`made`, by path), kept in the files argv[1] (libcst's)
# and argv[1] + ".own" (this package's own).
_RECORDING = textwrap.dedent(
    """
    import contextlib, json, sys
    from vllm_attn_compat.codemods.run import dataclass_code, worker

    dataclass_code.store_path = lambda: sys.argv[1]
    dataclass_code.own_store_path = lambda: sys.argv[1] + ".own"
    made = {}
    original = dataclass_code.kept_code

    @contextlib.contextmanager
    def recording(path, **options):
        with original(path, **options) as code:
            made[path] = code
            yield code

    dataclass_code.kept_code = recording
    """
)
_WORKER = _RECORDING + textwrap.dedent(
    """
    if sys.argv[2] == "preload":  # a worker started before the run knows its settings
        worker.preload()
    else:  # a run migrating in its own process, or a pool's worker
        from vllm_attn_compat.codemods.registry import all_rules
        from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy

        worker.setup(all_rules(), ClassHierarchy.build([]), unsafe_fixes=False)
        assert worker.migrate_file(b"x = 1\\n", "x.py").findings == []
    import libcst

    code, own = made[sys.argv[1]], made.get(sys.argv[1] + ".own")
    same = all(
        kept == compile(text, "<string>", "exec", dont_inherit=True)
        for block in (code, own) if block is not None for text, kept in block.used.items()
    )
    module = libcst.parse_module("def f(x, output=None):\\n    assert output is not None  # c\\n")
    print(json.dumps({
        "compiled": code.compiled, "used": len(code.used), "same": same, "code": module.code,
        "own": None if own is None else [own.compiled, len(own.used)],
    }))
    """
)


def _recorded(script: str, *arguments: str) -> dict:
    """What ``script`` prints last (after a run's report), run in a Python that writes bytecode."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-c", script, *arguments], env=environment, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("entry", ["preload", "migrate"])
def test_a_worker_imports_libcst_with_the_code_the_previous_one_kept(tmp_path, entry):
    path = str(tmp_path / "code.bin")
    first, second = _recorded(_WORKER, path, entry), _recorded(_WORKER, path, entry)
    # The methods of libcst's node classes: a text each up to Python 3.12 (over 500), one text a class from 3.13.
    assert first["compiled"] == first["used"] > 100
    assert second["compiled"] == 0 and second["used"] == first["used"]
    assert first["same"] and second["same"]
    assert first["code"] == second["code"] == "def f(x, output=None):\n    assert output is not None  # c\n"
    if entry == "preload":  # the engine's and the rules' own dataclasses too, beside libcst's
        assert first["own"][0] == first["own"][1] > 20
        assert second["own"] == [0, first["own"][1]]
    else:  # (a run's process keeps them around the runner: `test_a_run_makes_its_own_dataclasses_...`)
        assert first["own"] is second["own"] is None


def test_the_file_of_own_code_keeps_the_texts_of_earlier_blocks_up_to_twice_those_used(tmp_path, writes_bytecode):
    # A run's process and its worker import different modules: each block keeps the other's texts.
    path = str(tmp_path / "own.bin")
    with dataclass_code.kept_code(path, keep_earlier=True):
        dataclasses.make_dataclass("InTheRun", [("run", int)])
    with dataclass_code.kept_code(path, keep_earlier=True) as worker:
        dataclasses.make_dataclass("InTheWorker", [("worker", int)])
    kept = dataclass_code.load(path)
    assert any("run" in text for text in kept) and kept.keys() > worker.used.keys()
    # Texts no block makes any more (this package upgraded in place, again and again) are dropped past twice.
    with dataclass_code.kept_code(path, keep_earlier=True):
        for number in range(8):
            dataclasses.make_dataclass(f"Old{number}", [(f"old{number}", int)])
    with dataclass_code.kept_code(path, keep_earlier=True) as small:
        dataclasses.make_dataclass("Now", [("now", int)])
    assert dataclass_code.load(path).keys() == small.used.keys()


_RUN = _RECORDING + textwrap.dedent(
    """
    from vllm_attn_compat.codemods import cli

    code = cli.main(["migrate", "--check", "--no-cache", "--jobs", "1", sys.argv[2]])
    own = made[sys.argv[1] + ".own"]
    print(json.dumps({"exit": code, "compiled": own.compiled, "used": len(own.used)}))
    """
)


def test_a_run_makes_its_own_dataclasses_with_the_code_the_run_before_kept(tmp_path):
    tree = tmp_path / "plugin"
    tree.mkdir()
    (tree / "impl.py").write_text(
        "from vllm.v1.attention.backend import AttentionImpl\n\n\nclass MyImpl(AttentionImpl):\n"
        "    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):\n"
        "        assert output is not None\n        return output.copy_(query)\n"
    )
    path = str(tmp_path / "code.bin")
    first, second = _recorded(_RUN, path, str(tree)), _recorded(_RUN, path, str(tree))
    assert first["exit"] == second["exit"] == 1  # the backend's findings, the same with the code kept
    assert first["compiled"] == first["used"] > 20  # the runner's modules, the engine's and the rules'
    assert second == {**first, "compiled": 0}
