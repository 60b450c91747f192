"""The digest of the code every cache key starts from (`run/codekey.py`): kept by the files' statuses, and always
the digest a run without any kept would make of the same code."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path

import pytest

from vllm_attn_compat.codemods.run import cachedir, codekey, stats


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A stand-in for the codemods package (a few modules in two folders), whose files are old enough to be
    trusted by their status; yields its folder, and the calls that made the digest from the bytes."""
    folder = tmp_path / "codemods"
    (folder / "rules").mkdir(parents=True)
    for name in ("__init__.py", "engine.py", "rules/__init__.py", "rules/vac001.py"):
        (folder / name).write_text(f"# {name}\n")
    monkeypatch.setattr(codekey, "_CODEMODS", str(folder))
    monkeypatch.setattr(stats, "RACY_NS", 0)
    made = []
    real = codekey._made

    def spy(*args):
        made.append(args)
        return real(*args)

    monkeypatch.setattr(codekey, "_made", spy)
    return folder, made


def _fresh(tmp_path: Path) -> str:
    """The digest with no kept one: in a cache folder of its own."""
    folders = list(tmp_path.glob("fresh-*"))
    return codekey.digest(str(tmp_path / f"fresh-{len(folders)}"))


def test_every_module_of_the_codemods_keys_the_entries():
    """A change to a rule, the engine or the index changes every key (the code a result comes from)."""
    package = Path(codekey.__file__).resolve().parents[1]
    assert sorted(codekey.code_files()) == sorted(str(path) for path in package.rglob("*.py"))
    assert {Path(path).parent.name for path in codekey.code_files()} >= {"rules", "engine", "index", "run"}


def test_the_digest_is_kept_and_a_rerun_reads_no_module(package, tmp_path):
    _, made = package
    cache = str(tmp_path / "cache")
    first = codekey.digest(cache)
    assert len(made) == 1 and os.path.exists(os.path.join(cachedir.entries_folder(cache), "code.json"))
    assert codekey.digest(cache) == first
    assert len(made) == 1  # kept: no module read


def _edit(folder: Path, rng: random.Random) -> None:
    modules = sorted(folder.rglob("*.py"))
    action = rng.choice(["edit", "same size", "add", "remove", "touch", "none"])
    if action == "edit":
        path = rng.choice(modules)
        path.write_text(path.read_text() + f"x = {rng.randrange(100)}\n")
    elif action == "same size":  # other bytes of the same length, the timestamps set back to the old ones
        path = rng.choice(modules)
        old, text = path.stat(), path.read_text()
        path.write_text(text[:-2] + ("a" if text[-2] != "a" else "b") + "\n")
        os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    elif action == "add":
        (folder / "rules" / f"vac{rng.randrange(100, 999)}.py").write_text("# a new rule\n")
    elif action == "remove" and len(modules) > 1:
        rng.choice(modules).unlink()
    elif action == "touch":
        os.utime(rng.choice(modules))


def test_the_kept_digest_is_always_the_one_made_afresh_whatever_the_edits(package, tmp_path):
    folder, made = package
    cache = str(tmp_path / "cache")
    rng = random.Random(20261205)
    for _ in range(40):
        _edit(folder, rng)
        assert codekey.digest(cache) == _fresh(tmp_path)
    kept = len(made)
    codekey.digest(cache)
    assert len(made) == kept  # nothing changed since: kept


def test_another_python_or_version_makes_it_again(package, tmp_path, monkeypatch):
    _, made = package
    cache = str(tmp_path / "cache")
    first = codekey.digest(cache)
    monkeypatch.setattr(sys, "version", sys.version + " (another build)")
    assert codekey.digest(cache) != first and len(made) == 2


def test_a_module_modified_too_recently_is_not_trusted_by_its_status(package, tmp_path, monkeypatch):
    monkeypatch.setattr(stats, "RACY_NS", 3_600 * 10**9)
    cache = str(tmp_path / "cache")
    assert codekey.digest(cache) == _fresh(tmp_path)
    assert not os.path.exists(os.path.join(cachedir.entries_folder(cache), "code.json"))


def test_without_libcst_s_version_file_nothing_is_kept(package, tmp_path, monkeypatch):
    monkeypatch.setattr(codekey, "_libcst_version_file", lambda: "")  # its version from the installed metadata
    cache = str(tmp_path / "cache")
    assert codekey.digest(cache) == _fresh(tmp_path)
    assert not os.path.exists(os.path.join(cachedir.entries_folder(cache), "code.json"))


def _entry(data: dict, **changes) -> dict:
    """``data`` (a kept file, as JSON) with its one installation's entry changed."""
    (entry,) = data["installs"]
    return {**data, "installs": [{**entry, **changes}]}


@pytest.mark.parametrize(
    "spoil",
    [
        lambda data: b"\x80 not json",
        lambda data: b"[]",
        lambda data: json.dumps({**data, "format": "other/9"}).encode(),
        lambda data: json.dumps({**data, "installs": {}}).encode(),
        lambda data: json.dumps(_entry(data, digest=7)).encode(),
        lambda data: json.dumps(_entry(data, of={**data["installs"][0]["of"], "files": {}})).encode(),
    ],
    ids=["not-json", "not-an-object", "other-format", "not-a-list", "not-a-digest", "other-files"],
)
def test_a_kept_digest_that_does_not_check_out_is_made_again_and_kept_anew(package, tmp_path, spoil):
    _, made = package
    cache = str(tmp_path / "cache")
    first = codekey.digest(cache)
    path = Path(cachedir.entries_folder(cache)) / "code.json"
    path.write_bytes(spoil(json.loads(path.read_text())))
    assert codekey.digest(cache) == first and len(made) == 2
    assert codekey.digest(cache) == first and len(made) == 2  # kept anew


def test_installations_taking_turns_on_one_project_each_find_theirs(package, tmp_path, monkeypatch):
    folder, made = package
    others = []
    for number in range(codekey.INSTALLS_KEPT):  # the same modules, installed elsewhere
        other = tmp_path / f"install-{number}" / "codemods"
        shutil.copytree(folder, other)
        others.append(str(other))
    cache = str(tmp_path / "cache")

    def run_from(install: str) -> str:
        monkeypatch.setattr(codekey, "_CODEMODS", install)
        return codekey.digest(cache)

    installs = [str(folder), *others[: codekey.INSTALLS_KEPT - 1]]
    digests = [run_from(install) for install in installs]
    assert len(set(digests)) == 1 and len(made) == codekey.INSTALLS_KEPT  # the same code: the same digest
    assert [run_from(install) for install in reversed(installs)] == digests[::-1]
    assert len(made) == codekey.INSTALLS_KEPT  # each found its own
    run_from(others[-1])  # one installation more: the entry written longest ago (the first's) goes
    assert len(made) == codekey.INSTALLS_KEPT + 1
    run_from(installs[-1])  # still kept
    assert len(made) == codekey.INSTALLS_KEPT + 1
    run_from(installs[0])  # made again
    assert len(made) == codekey.INSTALLS_KEPT + 2
