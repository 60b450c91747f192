"""File discovery, decoding and atomic writes, on real files and real git work trees."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_attn_compat.codemods.run import files, sources
from vllm_attn_compat.codemods.run.files import discover, is_excluded
from vllm_attn_compat.codemods.run.sources import SourceError, source_encoding, write_atomic

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def make_tree(root, layout: dict[str, str]) -> None:
    for relative, text in layout.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def relative_paths(found, root) -> list[str]:
    return sorted(os.path.relpath(f.path, root).replace(os.sep, "/") for f in found)


def test_walk_finds_python_files_and_skips_environments_and_caches(tmp_path):
    make_tree(
        tmp_path,
        {
            "pkg/a.py": "",
            "pkg/stub.pyi": "",
            "pkg/data.txt": "",
            "pkg/__pycache__/a.py": "",
            ".venv/lib/x.py": "",
            "env2/pyvenv.cfg": "",
            "env2/lib/y.py": "",
            "node_modules/z.py": "",
            "thing.egg-info/w.py": "",
        },
    )
    found, skipped, unreadable, _ = discover([str(tmp_path)], base=str(tmp_path))
    assert relative_paths(found, tmp_path) == ["pkg/a.py", "pkg/stub.pyi"]
    assert skipped == [] and unreadable == []


@needs_git
def test_gitignore_is_honoured_in_a_git_work_tree(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    make_tree(
        tmp_path,
        {
            ".gitignore": "generated/\n*_pb2.py\n!keep_pb2.py\n",
            "src/a.py": "",
            "src/b_pb2.py": "",
            "src/keep_pb2.py": "",
            "generated/c.py": "",
            "sub/.gitignore": "local.py\n",
            "sub/local.py": "",
            "sub/other.py": "",
            ".venv/lib/x.py": "",
        },
    )
    found, _, _, _ = discover([str(tmp_path)], base=str(tmp_path))
    assert relative_paths(found, tmp_path) == ["src/a.py", "src/keep_pb2.py", "sub/other.py"]


def test_git_s_listing_keeps_each_regular_file_s_status_for_the_rerun(tmp_path):
    # The listing looks at every file git lists (a link? a submodule?); a rerun then asks none a second time.
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    make_tree(tmp_path, {"pkg/a.py": "x = 1\n", "pkg/b.py": ""})
    found = discover([str(tmp_path)], base=str(tmp_path)).files
    assert relative_paths(found, tmp_path) == ["pkg/a.py", "pkg/b.py"]
    for source_file in found:
        kept, now = source_file.status, os.stat(source_file.real_path)
        assert kept is not None
        assert (kept.st_ino, kept.st_size, kept.st_mtime_ns) == (now.st_ino, now.st_size, now.st_mtime_ns)
    (tmp_path / ".git").rename(tmp_path / "not-git")
    assert [f.status for f in discover([str(tmp_path / "pkg")], base=str(tmp_path)).files] == [None, None]  # walked


def test_a_work_tree_is_walked_where_git_cannot_be_started(tmp_path, monkeypatch):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    make_tree(tmp_path, {".gitignore": "generated/\n", "generated/c.py": "", "a.py": ""})
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs-here"))
    found, _, _, _ = discover([str(tmp_path)], base=str(tmp_path))
    assert relative_paths(found, tmp_path) == ["a.py", "generated/c.py"]


def test_outside_git_every_file_is_walked(tmp_path):
    make_tree(tmp_path, {".gitignore": "generated/\n", "generated/c.py": "", "a.py": ""})
    found, _, _, _ = discover([str(tmp_path)], base=str(tmp_path))
    assert relative_paths(found, tmp_path) == ["a.py", "generated/c.py"]


def test_outside_git_no_git_process_is_started(tmp_path, monkeypatch):
    # Starting git to learn that there is no repository costs as much as the rest of a rerun the cache replays.
    monkeypatch.delenv("GIT_DIR", raising=False)
    started: list[tuple[str, ...]] = []
    original = files._git

    def recording(folder: str, *arguments: str):
        started.append(arguments)
        return original(folder, *arguments)

    monkeypatch.setattr(files, "_git", recording)
    make_tree(tmp_path, {"pkg/a.py": ""})
    if any(os.path.lexists(os.path.join(folder, ".git")) for folder in [str(tmp_path), *map(str, tmp_path.parents)]):
        pytest.skip("the temporary folder lies in a git work tree")
    assert relative_paths(discover([str(tmp_path / "pkg")], base=str(tmp_path))[0], tmp_path) == ["pkg/a.py"]
    assert started == []
    # A work tree found by a `.git` file above (a linked work tree, a submodule), or by GIT_DIR, is git's to list.
    (tmp_path / ".git").write_text("gitdir: /nonexistent\n")
    discover([str(tmp_path / "pkg")], base=str(tmp_path))
    assert started == [("ls-files", "-z", "--cached", "--others", "--exclude-standard")]
    (tmp_path / ".git").unlink()
    # A folder reached through a link: git looks from where it really is.
    repository = tmp_path / "repository"
    subprocess.run(["git", "init", "-q", str(repository)], check=True)
    make_tree(repository, {".gitignore": "ignored.py\n", "pkg/a.py": "", "pkg/ignored.py": ""})
    (tmp_path / "linked").symlink_to(repository / "pkg")
    assert relative_paths(discover([str(tmp_path / "linked")], base=str(tmp_path))[0], tmp_path) == ["linked/a.py"]
    assert len(started) == 2
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "nowhere"))
    discover([str(tmp_path / "pkg")], base=str(tmp_path))
    assert len(started) == 3


@pytest.mark.parametrize(
    ("path", "patterns", "expected"),
    [
        ("pkg/tests/test_a.py", ["tests"], True),
        ("pkg/tests_util.py", ["tests"], False),
        ("pkg/a_pb2.py", ["*_pb2.py"], True),
        ("vendor/x/legacy/a.py", ["vendor/*/legacy"], True),
        ("src/vendor/x/legacy/a.py", ["vendor/*/legacy"], False),
        ("pkg/a.py", ["./pkg/"], True),
        ("pkg/a.py", [], False),
    ],
)
def test_exclude_globs(path, patterns, expected):
    assert is_excluded(path, patterns) is expected


def test_exclude_applies_to_walked_and_named_files_relative_to_base(tmp_path):
    make_tree(tmp_path, {"pkg/a.py": "", "pkg/gen/b.py": "", "c.py": ""})
    found, _, _, excluded = discover(
        [str(tmp_path / "pkg"), str(tmp_path / "c.py")], exclude=["pkg/gen", "c.py"], base=str(tmp_path)
    )
    assert relative_paths(found, tmp_path) == ["pkg/a.py"]
    # Returned apart: the run reads them for what decides the other files' fixes, and changes nothing there.
    assert relative_paths(excluded, tmp_path) == ["c.py", "pkg/gen/b.py"]


def test_excluded_files_of_a_git_work_tree_are_returned_apart_and_ignored_ones_not_at_all(tmp_path):
    make_tree(tmp_path, {"src/a.py": "", "tests/test_a.py": "", "build/gen.py": "", ".gitignore": "build/\n"})
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    found, _, _, excluded = discover([str(tmp_path)], exclude=["tests"], base=str(tmp_path))
    assert relative_paths(found, tmp_path) == ["src/a.py"]
    assert relative_paths(excluded, tmp_path) == ["tests/test_a.py"]


def test_named_file_is_used_whatever_its_suffix_and_missing_paths_are_returned(tmp_path):
    make_tree(tmp_path, {"script": "x = 1\n"})
    found, _, unreadable, _ = discover([str(tmp_path / "script"), str(tmp_path / "nope.py")])
    assert [f.path for f in found] == [str(tmp_path / "script")]
    assert [(u.path, u.reason) for u in unreadable] == [(str(tmp_path / "nope.py"), "no such file or directory")]


def test_symlinks_are_not_followed_out_of_the_given_paths(tmp_path):
    outside, project = tmp_path / "outside", tmp_path / "project"
    make_tree(tmp_path, {"outside/secret.py": "", "outside/lib/deep.py": "", "project/a.py": ""})
    (project / "link_file.py").symlink_to(outside / "secret.py")
    (project / "link_dir").symlink_to(outside / "lib")
    (project / "alias.py").symlink_to(project / "a.py")  # inside: the real file is visited once
    found, skipped, _, _ = discover([str(project)], base=str(project))
    assert [f.real_path for f in found] == [os.path.realpath(project / "a.py")]
    assert sorted(os.path.basename(s.path) for s in skipped) == ["link_dir", "link_file.py"]
    assert all("outside the given paths" in s.reason for s in skipped)


def test_a_symlink_given_by_name_still_may_not_lead_outside(tmp_path):
    make_tree(tmp_path, {"outside/secret.py": "", "project/a.py": ""})
    (tmp_path / "project" / "link.py").symlink_to(tmp_path / "outside" / "secret.py")
    found, skipped, _, _ = discover([str(tmp_path / "project" / "link.py")])
    assert found == [] and len(skipped) == 1


def test_source_encoding_honours_bom_and_coding_declaration():
    assert source_encoding(b"x = 1\n") == "utf-8"
    assert source_encoding(b"\xef\xbb\xbfx = 1\n") == "utf-8-sig"
    assert source_encoding(b"#!/usr/bin/env python\n# -*- coding: latin-1 -*-\ns = '\xe9'\n") == "iso-8859-1"


@pytest.mark.parametrize(
    ("source", "expected_message", "position"),
    [
        (b"x = 1\ns = '\xe9'\n", "cannot decode byte b'\\xe9': expected UTF-8 (no coding declaration) text", (2, 6)),
        (b"# coding: ascii\ns = '\xe9'\n", "expected ascii text", (2, 6)),
        (b"x = 1\n\x00\x01\x02", "binary file (contains a NUL byte)", (2, 1)),
        (b"# coding: klingon\nx = 1\n", "invalid encoding declaration", (1, 1)),
    ],
)
def test_undecodable_sources_are_errors_with_positions(source, expected_message, position):
    with pytest.raises(SourceError) as caught:
        source_encoding(source)
    assert expected_message in caught.value.message
    assert (caught.value.line, caught.value.column) == position


def test_read_source_reports_unreadable_files(tmp_path):
    with pytest.raises(SourceError, match="could not read the file"):
        sources.read_source(str(tmp_path / "missing.py"))


def test_read_source_reads_whole_files_of_every_size(tmp_path):
    for size in (0, 1, 4096, 1 << 20):
        path = tmp_path / f"f{size}.py"
        path.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        source, status = sources.read_source(str(path))
        assert source == path.read_bytes() and status.st_size == size


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
def test_read_source_reads_past_the_size_the_file_had_when_opened():
    # /proc files report a size of 0 and then hold text: what a file growing after fstat looks like.
    source, status = sources.read_source("/proc/self/status")
    assert status.st_size == 0 and source.startswith(b"Name:") and source.endswith(b"\n")


def test_write_atomic_replaces_content_and_keeps_permissions(tmp_path):
    target = tmp_path / "a.py"
    target.write_bytes(b"old\r\n")
    target.chmod(0o754)
    before = os.stat(target)
    write_atomic(str(target), b"new\r\n", expected_stat=before)
    assert target.read_bytes() == b"new\r\n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o754
    assert os.listdir(tmp_path) == ["a.py"]  # no temporary file left behind


def test_write_atomic_refuses_a_file_changed_since_it_was_read(tmp_path):
    target = tmp_path / "a.py"
    target.write_bytes(b"old\n")
    before = os.stat(target)
    target.write_bytes(b"edited by someone else\n")
    with pytest.raises(SourceError, match="changed on disk"):
        write_atomic(str(target), b"new\n", expected_stat=before)
    assert target.read_bytes() == b"edited by someone else\n"


def test_write_atomic_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "a.py"
    target.write_bytes(b"old\n")

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sources.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(str(target), b"new\n")
    assert target.read_bytes() == b"old\n"
    assert os.listdir(tmp_path) == ["a.py"]


def _unnamed_files_possible(folder) -> bool:
    try:
        os.close(os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o600))
    except (AttributeError, OSError):
        return False
    return os.path.isdir("/proc/self/fd")


KILLED_WHILE_WRITING = """
import os, signal, sys
from vllm_attn_compat.codemods.run import sources

os.fsync = lambda descriptor: os.kill(os.getpid(), signal.SIGKILL)  # killed with the new bytes written
sources.write_atomic(sys.argv[1], b"new\\n")
"""


def test_a_run_killed_while_writing_leaves_the_old_file_and_nothing_else(tmp_path):
    if not _unnamed_files_possible(tmp_path):
        pytest.skip("this system cannot create unnamed files (O_TMPFILE) here: a temporary file may remain")
    import subprocess
    import sys

    target = tmp_path / "a.py"
    target.write_bytes(b"old\n")
    killed = subprocess.run([sys.executable, "-c", KILLED_WHILE_WRITING, str(target)], capture_output=True)
    assert killed.returncode == -9, killed.stderr
    assert target.read_bytes() == b"old\n" and os.listdir(tmp_path) == ["a.py"]


@pytest.mark.parametrize("obstacle", ["no unnamed files", "no naming through /proc", "permissions set by name only"])
def test_write_atomic_falls_back_to_a_named_temporary_file(tmp_path, monkeypatch, obstacle):
    if obstacle != "no naming through /proc":
        monkeypatch.delattr(sources.os, "O_TMPFILE", raising=False)
        if obstacle == "permissions set by name only":  # as on Windows
            monkeypatch.delattr(sources.os, "fchmod", raising=False)
    else:

        def refused(*args, **kwargs):
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(sources, "_name", refused)
    named = []
    real_mkstemp = __import__("tempfile").mkstemp
    monkeypatch.setattr("tempfile.mkstemp", lambda **kw: named.append(kw) or real_mkstemp(**kw))
    target = tmp_path / "a.py"
    target.write_bytes(b"old\n")
    target.chmod(0o640)
    write_atomic(str(target), b"new\n")
    assert named and target.read_bytes() == b"new\n" and os.listdir(tmp_path) == ["a.py"]
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640


def test_broken_and_looping_symlinks_are_unreadable_not_silently_dropped(tmp_path):
    make_tree(tmp_path, {"a.py": ""})
    (tmp_path / "loop.py").symlink_to("loop.py")
    (tmp_path / "dangling.py").symlink_to("gone.py")
    (tmp_path / "cycle").mkdir()
    (tmp_path / "cycle" / "back").symlink_to("..")  # a folder loop inside the tree: visited once, quietly
    found, skipped, unreadable, _ = discover([str(tmp_path)], base=str(tmp_path))
    assert relative_paths(found, tmp_path) == ["a.py"] and skipped == []
    assert sorted(os.path.basename(u.path) for u in unreadable) == ["dangling.py", "loop.py"]
    assert all("broken symbolic link" in u.reason for u in unreadable)
    _, _, named, _ = discover([str(tmp_path / "loop.py")])
    assert [os.path.basename(u.path) for u in named] == ["loop.py"]


@given(
    folder=st.lists(st.sampled_from(["", ".", "..", "pkg", "/", "a b"]), max_size=4).map("/".join),
    relative=st.lists(st.sampled_from(["m.py", "sub", ".hidden", "x y.py"]), min_size=1, max_size=3).map("/".join),
)
def test_a_listed_path_joins_its_folder_as_os_path_join_does(folder, relative):
    # The listing makes each folder's prefix once (`files._under`): the same path as `os.path.join`.
    assert files._under(folder)(relative) == os.path.join(folder, relative)
