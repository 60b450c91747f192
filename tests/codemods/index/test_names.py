"""Module names guessed from paths: each folder is asked once whether it is a package, and the names are those
that walking up from each file, folder by folder, gives."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_attn_compat.codemods.index import names


def _walked(path: str) -> str:
    """The name as walking up from the file gives it, asking each folder (the definition)."""
    head, name = os.path.split(names.normalize_path(path))
    stem = name.rsplit(".", 1)[0]
    parts = [] if stem == "__init__" else [stem]
    while head and os.path.isfile(os.path.join(head, "__init__.py")):
        head, package = os.path.split(head)
        parts.insert(0, package)
        if not package:
            break
    return ".".join(parts) or stem


# A tree: folders (paths of up to four names) and whether each holds an `__init__.py`, and files in them.
_folders = st.lists(
    st.tuples(st.lists(st.sampled_from(["a", "b", "pkg", "vllm"]), min_size=1, max_size=4), st.booleans()),
    max_size=8,
)
_files = st.lists(st.sampled_from(["mod.py", "__init__.py", "x.pyi", "noext"]), min_size=1, max_size=3)


@settings(max_examples=40, deadline=None)
@given(folders=_folders, files=_files)
def test_each_name_is_the_one_walking_up_gives(tmp_path_factory, folders, files):
    root = tmp_path_factory.mktemp("tree")
    paths = []
    for parts, package in folders:
        folder = root.joinpath(*parts)
        folder.mkdir(parents=True, exist_ok=True)
        if package:
            (folder / "__init__.py").write_text("")
        paths += [str(folder / name) for name in files]
    paths += [str(root / name) for name in files]
    for path in paths:
        assert names.guess_module_name(path) == _walked(path), path
    relative = os.path.relpath(paths[0])
    assert names.guess_module_name(relative) == _walked(relative)


def test_a_folder_is_asked_once_for_all_its_files(tmp_path, monkeypatch):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for folder in (tmp_path / "pkg", tmp_path / "pkg" / "sub"):
        (folder / "__init__.py").write_text("")
    asked: list[str] = []
    real = os.path.isfile
    monkeypatch.setattr(os.path, "isfile", lambda path: asked.append(path) or real(path))
    found = [names.guess_module_name(str(tmp_path / "pkg" / "sub" / f"m{n}.py")) for n in range(5)]
    assert found == [f"pkg.sub.m{n}" for n in range(5)]
    assert sorted(asked) == sorted(
        str(folder / "__init__.py") for folder in (tmp_path, tmp_path / "pkg", tmp_path / "pkg" / "sub")
    )


@given(st.lists(st.sampled_from([b"from", b"import", b"x", b"_", b"\xc3\xa9", b" ", b".", b"\n", b"9"]), max_size=12))
def test_a_starting_word_matches_where_the_look_behind_before_it_does(pieces):
    import re

    text = b"".join(pieces)
    for word in (b"from", b"import"):
        literal_first = [m.span() for m in re.finditer(names.starting_word(word), text)]
        assert literal_first == [m.span() for m in re.finditer(names.NOT_AFTER_IDENTIFIER + word, text)]
