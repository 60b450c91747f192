"""How a run reads its files (`run/reading.py`): once, lazily where a rerun knew them, and never two versions."""

from __future__ import annotations

import os

import pytest

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
