"""The cache's folder: made tagged (git and backup tools leave it alone), never tagging a folder that existed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from vllm_attn_compat.codemods.run import cachedir


def test_a_folder_made_for_the_cache_is_tagged(tmp_path):
    folder = tmp_path / "a" / cachedir.DEFAULT_NAME
    cachedir.make(str(folder))
    assert (folder / ".gitignore").read_text().splitlines()[-1] == "*"
    # https://bford.info/cachedir/: the tag starts with this exact signature.
    assert (folder / "CACHEDIR.TAG").read_bytes().startswith(b"Signature: 8a477f597d28d172789f06886806bc55")


def test_a_folder_that_existed_is_never_tagged(tmp_path):
    # `--cache-dir .` must not make git ignore the user's project.
    cachedir.make(str(tmp_path))
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_ignores_the_default_folder_without_an_entry_in_the_project(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    folder = Path(cachedir.default_folder(str(tmp_path)))
    cachedir.make(str(folder))
    (folder / "entry").write_text("{}")
    status = subprocess.run(["git", "-C", str(tmp_path), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert status.stdout == ""


@pytest.mark.parametrize(
    ("value", "disabled"), [(None, False), ("", False), ("0", False), ("false", False), ("1", True), ("yes", True)]
)
def test_the_environment_variable_turns_the_cache_off(monkeypatch, value, disabled):
    if value is None:
        monkeypatch.delenv(cachedir.NO_CACHE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(cachedir.NO_CACHE_VARIABLE, value)
    assert cachedir.disabled_by_environment() is disabled
