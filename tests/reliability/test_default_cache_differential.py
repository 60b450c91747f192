"""The command line at its defaults (the cache at the project's root, files trusted by their status) against
``--no-cache``: after any edit, the same report, exit code and files.

The cache (`codemods/run/cache.py`) trusts a file whose size, inode, ``mtime_ns`` and ``ctime_ns`` are
those recorded. Its "racy" margin (a file modified shortly before a run read it is hashed again next time) is
set to zero here: files written by a test are trusted at once, the worst case for staleness. The edits are
those a status could hide: the same size within the same second, the ``mtime_ns`` restored to the
nanosecond, a ``git checkout`` between branches.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from vllm_attn_compat.codemods.cli import main
from vllm_attn_compat.codemods.run import cache, cachedir

from .cli_run import LEGACY, PLAIN
from .legacy_callers import METHOD_NAMES, STUBS, GeneratedPlugin, plugins_with_callers
from .profile import reliability_settings

EDITABLE = ("plugin/backend.py", "plugin/callers.py")


def _write(root: Path, files: dict[str, str | bytes]) -> None:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)


def _migrate(tree: Path, *args: str) -> tuple[int, str, dict[str, bytes]]:
    """``migrate --format json`` run in ``tree`` (the project's root, there being no pyproject.toml above it
    that a test would write), at the command line's defaults but for ``args``: exit code, output, files."""
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(tree)
    try:
        with contextlib.redirect_stdout(out), mock.patch.dict(os.environ), mock.patch.object(cache, "RACY_NS", 0):
            os.environ.pop(cachedir.NO_CACHE_VARIABLE, None)
            code = main(["migrate", "--format", "json", "--jobs", "1", *args, "."])
    finally:
        os.chdir(cwd)
    files = {
        path.relative_to(tree).as_posix(): path.read_bytes()
        for path in sorted(tree.rglob("*"))
        if path.is_file() and cachedir.DEFAULT_NAME not in path.parts and ".git" not in path.parts
    }
    return code, out.getvalue(), files


def _same_as_uncached(tree: Path, *args: str) -> tuple[int, str, dict[str, bytes]]:
    """The default run in ``tree`` (``args`` added), checked against ``--no-cache`` on a copy of the tree."""
    copy = tree.parent / (tree.name + "-uncached")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(tree, copy, ignore=shutil.ignore_patterns(cachedir.DEFAULT_NAME))
    cached = _migrate(tree, *args)
    assert (tree / cachedir.DEFAULT_NAME / "CACHEDIR.TAG").is_file()  # the default cache was used
    assert cached == _migrate(copy, "--no-cache", *args)
    shutil.rmtree(copy)
    return cached


@reliability_settings(ci=10, long=400)
@given(
    before=plugins_with_callers(),
    after=plugins_with_callers(),
    edited=st.sets(st.sampled_from(EDITABLE), min_size=1),
    # The run before the edit and the one after: a `--diff` between two `--check`s leaves the cache's indexes and
    # answers to the one after (they depend on neither).
    modes=st.tuples(st.sampled_from(["--check", "--diff"]), st.sampled_from(["--check", "--diff"])),
    restore_mtime=st.booleans(),
)
def test_after_an_edit_the_default_cache_reports_what_no_cache_does(
    before: GeneratedPlugin, after: GeneratedPlugin, edited: set[str], modes: tuple[str, str], restore_mtime: bool,
    tmp_path_factory,
) -> None:  # fmt: skip
    root = tmp_path_factory.mktemp("default")
    tree = root / "tree"
    _write(tree, {**STUBS, **before.files})
    _same_as_uncached(tree, modes[0])
    for path in sorted(edited):
        target = tree / path
        old = os.stat(target)
        target.write_text(after.files[path])
        if restore_mtime:  # only ctime, which no user can set, still moves
            os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns))
        note(f"--- {path}\n{after.files[path]}")
    _same_as_uncached(tree, modes[1])
    shutil.rmtree(root)


# Pieces of a file that takes no part in the run, or is added: code that gives it none, and code that may give it
# one (a rule's token, vLLM named, the flag read, an attention class or a method of the plugin named, `getattr`,
# the body of a deleted op, a syntax error, bytes that are no text). Successive edits are checked against
# --no-cache each time.
BYSTANDER_PIECES = [
    "def pop(queue):\n    return queue.pop()\n",
    "# a comment naming nothing\n",
    "import vllm\n",
    "from vllm.v1.attention.backend import AttentionImpl\n",
    "from plugin.backend import GenImpl\n",
    "class Local(GenImpl):\n    pass\n",
    "class Other(AttentionImpl):\n    def forward(self, q, output=None):\n        assert output is not None\n",
    "def legacy(backend):\n    return backend.accept_output_buffer\n",
    *(f"def go(impl):\n    return impl.{name}([1, 2, 3])\n" for name in METHOD_NAMES),
    *(f'def go_by_name(impl):\n    return getattr(impl, "{name}")([1, 2, 3])\n' for name in METHOD_NAMES),
    "splitting_ops = ['vllm::unified_attention']\n",
    # The body of a deleted op: the advice at a call in it depends on whether the module registers it as an op.
    *(f"def unified_attention(impl):\n    return impl.{name}([1, 2, 3])\n" for name in METHOD_NAMES),
    'direct_register_custom_op(op_name="unified_attention", op_func=unified_attention)\n',
    "def broken(:\n",
]
bystander_texts = st.lists(st.sampled_from(BYSTANDER_PIECES), max_size=3).map("\n".join) | st.just(
    b"\xff\xfe not text\n"
)
# The file edited (it exists from the start) or added: a module of its own, a package marker, or a module named
# like a class the run may look for by path (the plugin's own base of a flag-declaring class).
bystander_paths = st.sampled_from(["engine/scheduler.py", "engine/limits.py", "engine/__init__.py", "common.py"])


@reliability_settings(ci=30, long=300)
@given(
    plugin=plugins_with_callers(),
    flagged=st.booleans(),
    edits=st.lists(st.tuples(bystander_paths, bystander_texts), min_size=1, max_size=3),
    restore_mtime=st.booleans(),
)
def test_edits_of_files_that_took_no_part_report_what_no_cache_does(
    plugin: GeneratedPlugin, flagged: bool, edits: list[tuple[str, str | bytes]], restore_mtime: bool,
    tmp_path_factory,
) -> None:  # fmt: skip
    root = tmp_path_factory.mktemp("bystander")
    tree = root / "tree"
    files = {**STUBS, **plugin.files, "engine/scheduler.py": BYSTANDER_PIECES[0]}
    if flagged:  # a backend declaring the flag on a base no file defines: the run looks for `common` modules
        files["plugin/flagged.py"] = (
            "from plugin.common import CommonBackend\n\n\n"
            "class Flagged(CommonBackend):\n    accept_output_buffer = True\n"
        )
    _write(tree, files)
    _same_as_uncached(tree, "--check")
    for path, text in edits:
        target = tree / path
        old = os.stat(target) if target.exists() else None
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text.encode() if isinstance(text, str) else text)
        if restore_mtime and old is not None:
            os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns))
        note(f"--- {path}\n{text!r}")
        _same_as_uncached(tree, "--check")
    shutil.rmtree(root)


def test_an_edit_keeping_the_size_within_the_same_second_is_seen(tmp_path):
    tree = tmp_path / "tree"
    _write(tree, {"plugin/backend.py": LEGACY, "plugin/plain.py": PLAIN})
    backend = tree / "plugin/backend.py"
    second = (os.stat(backend).st_mtime_ns // 10**9 - 60) * 10**9  # a whole second, a minute ago
    os.utime(backend, ns=(second, second + 1))
    first = _same_as_uncached(tree, "--check")
    backend.write_bytes(LEGACY.replace(b"assert output is not None", b"assert output is not Nope"))
    os.utime(backend, ns=(second, second + 2))  # the same second, the same size: only the nanoseconds differ
    assert os.stat(backend).st_size == len(LEGACY)
    assert _same_as_uncached(tree, "--check") != first  # the edit matters: VAC001's finding is gone
    # And back: the bytes of the first run (the cache holds that run) with yet another status.
    backend.write_bytes(LEGACY)
    os.utime(backend, ns=(second, second + 3))
    assert _same_as_uncached(tree, "--check") == first


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_checkout_between_branches_reports_each_branch_as_no_cache_does(tmp_path):
    tree = tmp_path / "repo"

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True)

    _write(tree, {**STUBS, "plugin/backend.py": LEGACY, "plugin/plain.py": PLAIN})
    git("init", "-q", "-b", "legacy")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "legacy")
    git("checkout", "-q", "-b", "migrated")
    migrated = _same_as_uncached(tree)  # write mode: the safe fixes
    assert migrated[2]["plugin/backend.py"] != LEGACY
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "migrated")
    outcomes = {}
    for branch in ["legacy", "migrated", "legacy", "migrated"]:
        git("checkout", "-q", branch)
        outcome = _same_as_uncached(tree, "--check")
        assert outcomes.setdefault(branch, outcome) == outcome
    assert outcomes["legacy"][0] == 1 and outcomes["migrated"] != outcomes["legacy"]
    status = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert status.stdout == ""  # the cache folder ignores itself
