"""``[tool.vllm-attn-compat]``: found upward from the first path, validated strictly."""

from __future__ import annotations

import os

import pytest

from vllm_attn_compat.codemods.config import Config, ConfigError, find_pyproject, load_config, parse_config


def test_nearest_pyproject_is_found_upward_from_a_file_or_folder(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    (nested / "m.py").write_text("")
    assert find_pyproject(str(nested / "m.py")) == str(tmp_path / "pyproject.toml")
    assert find_pyproject(str(nested)) == str(tmp_path / "pyproject.toml")
    (tmp_path / "a" / "pyproject.toml").write_text("")
    assert find_pyproject(str(nested)) == str(tmp_path / "a" / "pyproject.toml")


def test_all_keys_are_read_and_excludes_are_relative_to_the_file(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.vllm-attn-compat]\nselect = ["VAC00"]\nignore = ["VAC006"]\n'
        'exclude = ["tests/fixtures"]\nunsafe-fixes = true\nold-op-calls = "forwarder"\n'
    )
    config = load_config(str(tmp_path))
    assert config == Config(
        select=("VAC00",), ignore=("VAC006",), exclude=("tests/fixtures",), unsafe_fixes=True,
        old_op_calls="forwarder", base=str(tmp_path), source=str(tmp_path / "pyproject.toml"),
    )  # fmt: skip


def test_a_pyproject_without_the_table_gives_defaults_based_at_its_folder(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")
    assert load_config(str(tmp_path)) == Config(base=str(tmp_path), source=str(tmp_path / "pyproject.toml"))


def test_a_pyproject_that_never_names_the_tool_is_not_ours_to_validate(tmp_path):
    # Someone else's broken table cannot configure this tool; a run in their repository goes on.
    (tmp_path / "pyproject.toml").write_text("[tool.ruff\nline-length = 100\n")
    assert load_config(str(tmp_path)) == Config(base=str(tmp_path), source=str(tmp_path / "pyproject.toml"))
    (tmp_path / "pyproject.toml").write_text("[tool.ruff\n[tool.vllm-attn-compat]\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(str(tmp_path))


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (
            '[tool.vllm-attn-compat]\nselct = ["VAC001"]\n',
            "unknown key 'selct'; expected one of: cache-dir, exclude, ignore, old-op-calls, select, target-version, "
            "unsafe-fixes",
        ),
        (
            '[tool.vllm-attn-compat]\nselect = "VAC001"\n',
            "select: expected a list of rule codes or prefixes (strings), found 'VAC001' (str)",
        ),
        (
            "[tool.vllm-attn-compat]\nexclude = [1, 2]\n",
            "exclude: expected a list of glob patterns (strings), found [1, 2] (list)",
        ),
        (
            '[tool.vllm-attn-compat]\nunsafe-fixes = "yes"\n',
            "unsafe-fixes: expected a boolean (true or false), found 'yes' (str)",
        ),
        (
            '[tool.vllm-attn-compat]\nold-op-calls = "forward"\n',
            "old-op-calls: expected one of the strings 'with-output', 'forwarder', found 'forward' (str)",
        ),
        ("[tool.vllm-attn-compat]\nold-op-calls = true\n", "old-op-calls: expected one of the strings"),
        ("[tool.vllm-attn-compat]\ncache-dir = 3\n", "cache-dir: expected a folder (a non-empty string), found 3"),
        ('[tool.vllm-attn-compat]\ncache-dir = ""\n', "cache-dir: expected a folder (a non-empty string), found ''"),
        (
            "[tool.vllm-attn-compat]\ntarget-version = 0.34\n",
            'target-version: expected a vLLM release as a string (like "0.34"), found 0.34 (float)',
        ),
        (
            '[tool.vllm-attn-compat]\ntarget-version = "0.9"\n',
            "[tool.vllm-attn-compat] target-version: vLLM '0.9' is not a release the manifest knows; it knows",
        ),
        ("[tool]\nvllm-attn-compat = 3\n", "[tool.vllm-attn-compat] must be a table, found 3"),
        ("[tool.vllm-attn-compat\n", "invalid TOML"),
    ],
)
def test_wrong_keys_and_values_are_errors_naming_file_key_expectation_and_value(toml, expected):
    with pytest.raises(ConfigError) as caught:
        parse_config(toml, "proj/pyproject.toml")
    assert str(caught.value).startswith("proj/pyproject.toml: ")
    assert expected in str(caught.value)


def test_the_target_version_is_kept_as_written(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.vllm-attn-compat]\ntarget-version = "0.27"\n')
    assert load_config(str(tmp_path)).target_version == "0.27"


def test_no_pyproject_anywhere_means_defaults_at_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if find_pyproject(str(tmp_path)) is not None:
        pytest.skip("a pyproject.toml exists above the temporary folder")
    assert load_config(str(tmp_path)) == Config(base=str(tmp_path))


def test_the_cache_folder_is_relative_to_the_pyproject_folder(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.vllm-attn-compat]\ncache-dir = "build/cache"\n')
    (tmp_path / "src").mkdir()
    assert load_config(str(tmp_path / "src")).cache_dir == os.path.join(str(tmp_path), "build/cache")
    (tmp_path / "pyproject.toml").write_text("[tool.vllm-attn-compat]\n")
    assert load_config(str(tmp_path / "src")).cache_dir is None
