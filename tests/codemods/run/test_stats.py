"""The status table: a file is trusted unread only while its size, inode and both timestamps are those recorded
after it was old enough (git's "racy" rule); every other file is hashed again."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_attn_compat.codemods.run import stats

HOUR_NS = 3600 * 10**9


def _recorded(tmp_path: Path, path: Path, started: int) -> stats.StatTable:
    """A table that recorded ``path`` as read by a run that started at ``started``, saved and loaded again."""
    table = stats.StatTable(str(tmp_path / "cache"))
    table.record(str(path), os.stat(path), stats.digest(path.read_bytes()), started)
    table.save()
    return stats.StatTable(str(tmp_path / "cache"))


def _lookup(table: stats.StatTable, path: Path) -> str | None:
    return table.digest(str(path), stats.status_of(os.stat(path)))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "backend.py"
    path.write_bytes(b"assert output is not None\n")
    return path


def test_an_unchanged_file_is_known_by_its_status_and_a_changed_one_is_not(tmp_path, source):
    later = time.time_ns() + HOUR_NS  # the file is old enough for a run started an hour from now
    table = _recorded(tmp_path, source, later)
    assert _lookup(table, source) == stats.digest(b"assert output is not None\n")
    source.write_bytes(b"assert output is not Nope\n")  # the same size
    assert _lookup(table, source) is None


def test_an_edit_restoring_the_mtime_to_the_nanosecond_is_still_seen_by_its_ctime(tmp_path, source):
    before = os.stat(source)
    table = _recorded(tmp_path, source, time.time_ns() + HOUR_NS)
    time.sleep(0.02)  # past the granularity of the kernel's clock for ctime
    source.write_bytes(b"assert output is not Nope\n")
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(source)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    if after.st_ctime_ns == before.st_ctime_ns:
        pytest.skip("this filesystem's ctime did not move")
    assert _lookup(table, source) is None


def test_a_file_modified_just_before_the_run_read_it_is_not_trusted_next_time(tmp_path, source):
    # Within `RACY_NS` of the run's start, an edit after the read may keep the timestamps (their granularity):
    # the next run hashes the file. What the run read is still known: what an edit since changed.
    table = _recorded(tmp_path, source, time.time_ns())
    assert _lookup(table, source) is None
    assert table.last_digest(str(source)) == stats.digest(b"assert output is not None\n")
    # Once old enough (the run that reads it starts later), it is trusted.
    assert _lookup(_recorded(tmp_path, source, time.time_ns() + stats.RACY_NS + HOUR_NS), source) is not None


def test_a_file_that_became_racy_loses_the_trust_of_its_status(tmp_path, source):
    table = _recorded(tmp_path, source, time.time_ns() + HOUR_NS)
    table.record(str(source), os.stat(source), stats.digest(source.read_bytes()), time.time_ns())
    table.save()
    reloaded = stats.StatTable(str(tmp_path / "cache"))
    assert _lookup(reloaded, source) is None
    assert reloaded.last_digest(str(source)) == stats.digest(source.read_bytes())


@pytest.mark.parametrize(
    "content",
    [b"not json", b"[]", b'{"format": "other/1", "rows": {}}', b'{"format": "vllm-attn-compat-stats/1", "rows": 3}',
     b'{"format": "vllm-attn-compat-stats/1", "rows": {"/a.py": [1, 2, 3, 4, "abc"]}}',
     b'{"format": "vllm-attn-compat-stats/1", "rows": {"/a.py": ["1", 2, 3, 4, "' + b"0" * 64 + b'"]}}'],
    ids=["not-json", "not-a-table", "other-format", "rows-not-a-map", "short-digest", "size-not-a-number"],
)  # fmt: skip
def test_a_table_that_cannot_be_trusted_is_ignored_whole(tmp_path, source, content):
    table = _recorded(tmp_path, source, time.time_ns() + HOUR_NS)
    Path(table.path).write_bytes(content)
    assert stats.StatTable(str(tmp_path / "cache")).rows == {}


def test_the_table_is_written_only_when_it_changed_and_in_a_tagged_folder(tmp_path, source):
    table = _recorded(tmp_path, source, time.time_ns() + HOUR_NS)
    written = os.stat(table.path).st_mtime_ns
    table.record(str(source), os.stat(source), stats.digest(source.read_bytes()), time.time_ns() + HOUR_NS)
    table.save()
    assert os.stat(table.path).st_mtime_ns == written
    assert (tmp_path / "cache" / "CACHEDIR.TAG").is_file()
    assert json.loads(Path(table.path).read_bytes())["rows"] == {
        str(source): [*stats.status_of(os.stat(source)), stats.digest(source.read_bytes())]
    }


def test_an_unwritable_folder_costs_the_table_only(tmp_path, source):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    table = stats.StatTable(str(blocked))
    table.record(str(source), os.stat(source), stats.digest(source.read_bytes()), time.time_ns() + HOUR_NS)
    table.save()  # no exception
    assert stats.StatTable(str(blocked)).rows == {}


@pytest.mark.parametrize("given", ["backend.py", "./pkg/../backend.py", "pkg//m.py", "ABSOLUTE"])
def test_rows_are_by_the_absolute_path_of_the_working_directory_the_table_was_made_in(tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)
    given = str(tmp_path / "x.py") if given == "ABSOLUTE" else given
    table = stats.StatTable(str(tmp_path / "cache"))
    table.record(given, os.stat(tmp_path), "0" * 64, 0)
    assert list(table.rows) == [os.path.abspath(given)]
    monkeypatch.chdir("/")  # a later change of directory changes nothing
    assert table.last_digest(given) == "0" * 64


@given(
    folders=st.lists(st.sampled_from([".", "..", "pkg", "sub", "", "/"]), max_size=5),
    name=st.sampled_from(["m.py", "..m.py", "x"]),
)
def test_a_row_s_path_is_the_absolute_path_whatever_the_folders_spelled(tmp_path_factory, folders, name):
    # The table makes each folder absolute once: the same path as making the whole of it absolute.
    cwd = os.getcwd()
    table = stats.StatTable(str(tmp_path_factory.getbasetemp() / "cache"))
    for spelled in ["/".join([*folders, name]), "/".join([*folders[:1], name])]:
        assert table._absolute(spelled) == os.path.normpath(os.path.join(cwd, spelled))
