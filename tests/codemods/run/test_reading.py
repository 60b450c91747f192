"""How a run reads its files (`run/reading.py`): once, lazily where a rerun knew them, and never two versions."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from vllm_attn_compat.codemods.run import answers as answers_module
from vllm_attn_compat.codemods.run import files, rerun, stats
from vllm_attn_compat.codemods.run.answers import Answers
from vllm_attn_compat.codemods.run.reading import Changed, Reading, digest_of
from vllm_attn_compat.codemods.run.sources import SourceError


def _source_file(path):
    return files.SourceFile(str(path), str(path))


def _known(path):
    source = path.read_bytes()
    return rerun.Known(os.stat(path), stats.digest(source), None)


def test_a_file_read_has_its_bytes_encoding_and_digest(tmp_path):
    path = tmp_path / "a.py"
    path.write_bytes(b"# -*- coding: latin-1 -*-\nx = '\xe9'\n")
    scanned = Reading(Answers(None, b"")).read(_source_file(path))
    assert scanned.source == path.read_bytes() and scanned.encoding == "iso-8859-1"
    assert scanned.digest is None and digest_of(scanned) == stats.digest(path.read_bytes())  # no cache: made when asked


def test_a_file_that_is_no_text_is_refused_when_read(tmp_path):
    path = tmp_path / "a.py"
    path.write_bytes(b"x = '\xff'\n")
    with pytest.raises(SourceError):
        Reading(Answers(None, b"")).read(_source_file(path))


def test_a_file_the_rerun_knew_is_read_only_for_its_bytes_and_as_it_was(tmp_path):
    path = tmp_path / "a.py"
    path.write_bytes(b"x = 1\n")
    known = _known(path)
    scanned = Reading(Answers(None, b""), known={str(path): known}).read(_source_file(path))
    assert scanned.digest == known.digest and scanned._source is None  # not read yet
    assert scanned.source == b"x = 1\n" and scanned.encoding == "utf-8"


@pytest.mark.parametrize(
    "change",
    [
        lambda path: path.write_bytes(b"x = 22\n"),  # another size
        lambda path: path.unlink(),  # gone
        lambda path: path.write_bytes(b"x = '\xff'\n"),  # no text any more
    ],
)
def test_a_file_the_rerun_knew_that_changed_since_is_never_read_as_its_new_bytes(tmp_path, change):
    path = tmp_path / "a.py"
    path.write_bytes(b"x = 1\n")
    scanned = Reading(Answers(None, b""), known={str(path): _known(path)}).read(_source_file(path))
    change(path)
    with pytest.raises(Changed):
        scanned.source  # noqa: B018 - the read is the point


# --- a first run whose files a process hashes apart (`hasher`): `Reading.settle` ---


class _Hashed:
    """A hasher's hand-over, as given: path -> `hasher.Record` (a path it did not reach: none)."""

    def __init__(self, rows):
        self.rows = {path: row for path, row in rows.items() if row is not None}

    def records(self):
        return self.rows


def _settled(tmp_path, rows_of, racy_ns=0, monkeypatch=None):
    """Three files read by a first run, then settled with the hasher's rows ``rows_of(path)``: their digests, the
    table's rows, and the answers kept of them."""
    monkeypatch.setattr(stats, "RACY_NS", racy_ns)
    paths = []
    for name in ("a.py", "b.py", "c.py"):
        path = tmp_path / name
        path.write_bytes(f"import vllm  # {name}\n".encode())
        paths.append(str(path))
    cache = str(tmp_path / "cache")
    answers, table = Answers(cache, b"code"), stats.StatTable(cache)
    reading = Reading(answers, table, started=time.time_ns(), hasher=_Hashed({p: rows_of(p) for p in paths}))
    names_vllm = reading.asking("vllm", [])
    read = [reading.read(_source_file(path)) for path in paths]
    assert all(s.digest is None and names_vllm(s) for s in read)  # nothing settled yet: the answer waits
    reading.settle()
    digests = [s.digest for s in read]
    assert [table.rows[path][4] for path in paths] == digests
    assert [answers._used[digest] for digest in digests] == [{answers_module.question("vllm", []): True}] * 3
    return digests, paths


def test_settling_takes_the_hasher_s_digest_of_a_file_read_with_the_same_status(tmp_path, monkeypatch):
    # What the status cannot tell is trusted, as the table trusts it: here a digest of other bytes shows it is taken.
    digests, _ = _settled(
        tmp_path, lambda path: (*stats.status_of(os.stat(path)), b"\xff" * 32), monkeypatch=monkeypatch
    )
    assert digests == ["f" * 64] * 3


@pytest.mark.parametrize(
    "rows_of",
    [
        lambda path: None,  # not reached
        lambda path: (-1, 0, 0, 0, bytes(32)),  # not read as source
        lambda path: (1, 2, 3, 4, b"\xff" * 32),  # read with another status: edited between the two reads
    ],
)
def test_settling_hashes_the_bytes_read_where_the_hasher_s_status_is_not_the_run_s(tmp_path, rows_of, monkeypatch):
    digests, paths = _settled(tmp_path, rows_of, monkeypatch=monkeypatch)
    assert digests == [stats.digest(Path(path).read_bytes()) for path in paths]


def test_settling_hashes_the_bytes_read_of_a_racy_file_whatever_its_status(tmp_path, monkeypatch):
    digests, paths = _settled(
        tmp_path,
        lambda path: (*stats.status_of(os.stat(path)), b"\xff" * 32),
        racy_ns=3600 * 10**9,
        monkeypatch=monkeypatch,
    )
    assert digests == [stats.digest(Path(path).read_bytes()) for path in paths]
