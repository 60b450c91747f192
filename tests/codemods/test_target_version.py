"""The target version: read from real project files in a temporary folder, as a run would find them."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from vllm_attn_compat import manifest
from vllm_attn_compat.codemods.target_version import (
    Target,
    TargetVersionError,
    configured_target_version,
    find_requirements,
    parse_target_version,
    project_root,
    target_for,
)

NEWEST = manifest.newest()


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text).lstrip("\n"), encoding="utf-8")
    return root


def between(low: str, high: str) -> tuple[str, ...]:
    releases = manifest.releases()
    return releases[releases.index(low) : releases.index(high) + 1]


def test_pyproject_dependencies_bound_both_ways(tmp_path):
    write(tmp_path, {"pyproject.toml": '[project]\nname = "plugin"\ndependencies = ["torch", "vllm>=0.30,<0.35"]\n'})
    target = target_for(str(tmp_path))
    assert target == Target(
        "0.34.0",
        "0.30.0",
        between("0.30.0", "0.34.0"),
        "from pyproject.toml: vllm>=0.30,<0.35",
        str(tmp_path / "pyproject.toml"),
    )


def test_the_newest_allowed_release_is_the_target_the_oldest_comes_with_it(tmp_path):
    write(tmp_path, {"pyproject.toml": '[project]\nname = "p"\ndependencies = ["vllm>=0.20,<0.28"]\n'})
    target = target_for(str(tmp_path))
    assert (target.release, target.oldest) == ("0.27.1", "0.20.0")
    assert target.allowed == between("0.20.0", "0.27.1")


def test_a_pin(tmp_path):
    write(tmp_path, {"pyproject.toml": '[project]\nname = "p"\ndependencies = ["vllm==0.25.*"]\n'})
    target = target_for(str(tmp_path))
    assert (target.release, target.oldest, target.allowed) == ("0.25.1", "0.25.0", ("0.25.0", "0.25.1"))


def test_optional_dependencies_and_groups_when_the_dependencies_name_no_vllm(tmp_path):
    write(
        tmp_path,
        {
            "pyproject.toml": """
                [project]
                name = "p"
                dependencies = ["numpy"]
                [project.optional-dependencies]
                cuda = ["vllm>=0.27,<0.30"]
                cpu = ["vllm==0.33.0 ; platform_machine == 'x86_64'"]
            """
        },
    )
    target = target_for(str(tmp_path))
    # Either extra may be installed: the union of what they allow.
    assert target.allowed == (*between("0.27.0", "0.29.0"), "0.33.0")
    assert (target.release, target.oldest) == ("0.33.0", "0.27.0")
    assert target.reason == "from pyproject.toml: vllm>=0.27,<0.30, vllm==0.33.0 ; platform_machine == 'x86_64'"


def test_dependency_groups(tmp_path):
    write(
        tmp_path,
        {
            "pyproject.toml": """
                [project]
                name = "p"
                [dependency-groups]
                test = ["pytest", {include-group = "serve"}]
                serve = ["vllm~=0.31.0"]
            """
        },
    )
    assert target_for(str(tmp_path)).allowed == ("0.31.0",)


def test_the_dependencies_win_over_the_extras_and_the_requirements_files(tmp_path):
    write(
        tmp_path,
        {
            "pyproject.toml": """
                [project]
                name = "p"
                dependencies = ["vllm>=0.29"]
                [project.optional-dependencies]
                old = ["vllm==0.20.0"]
            """,
            "requirements.txt": "vllm==0.22.1\n",
        },
    )
    target = target_for(str(tmp_path))
    assert (target.release, target.oldest, target.reason) == (NEWEST, "0.29.0", "from pyproject.toml: vllm>=0.29")


def test_setup_cfg(tmp_path):
    write(
        tmp_path,
        {
            "setup.cfg": """
                [metadata]
                name = plugin
                [options]
                install_requires =
                    torch>=2.10
                    # the engine
                    vLLM >= 0.26, != 0.27.0  # not 0.27.0
            """
        },
    )
    target = target_for(str(tmp_path))
    assert target.oldest == "0.26.0" and "0.27.0" not in target.allowed and "0.27.1" in target.allowed
    assert target.source == str(tmp_path / "setup.cfg")
    assert target.reason == "from setup.cfg: vLLM >= 0.26, != 0.27.0"


def test_setup_cfg_extras(tmp_path):
    write(tmp_path, {"setup.cfg": "[options.extras_require]\nserve =\n    vllm<0.21\n"})
    assert target_for(str(tmp_path)).allowed == between("0.19.0", "0.20.2")


def test_a_literal_setup_py_is_read_never_run(tmp_path):
    marker = tmp_path / "ran"
    write(
        tmp_path,
        {
            "setup.py": f"""
                from pathlib import Path
                from setuptools import setup

                Path({str(marker)!r}).write_text("setup.py ran")
                REQUIRES = ["torch", "vllm>=0.28.0,<0.31"]
                setup(name="plugin", install_requires=REQUIRES, extras_require={{"dev": ["pytest"]}})
            """
        },
    )
    target = target_for(str(tmp_path))
    assert target.allowed == between("0.28.0", "0.30.0")
    assert target.reason == "from setup.py: vllm>=0.28.0,<0.31"
    assert not marker.exists()


def test_a_setup_py_whose_requirements_are_computed_names_none(tmp_path):
    write(
        tmp_path,
        {"setup.py": "import setuptools\nsetuptools.setup(install_requires=open('reqs.txt').read().split())\n"},
    )
    target = target_for(str(tmp_path))
    assert (target.release, target.oldest, target.source) == (NEWEST, None, None)


def test_requirements_files_and_their_includes(tmp_path):
    write(
        tmp_path,
        {
            "requirements.txt": """
                --index-url https://download.pytorch.org/whl/cpu
                -r requirements/base.txt
                numpy  # for the tests
            """,
            "requirements/base.txt": "-c ../constraints/vllm.txt\ntorch\n",
            "constraints/vllm.txt": "vllm==0.22.1 \\\n    --hash=sha256:0123\n",
        },
    )
    target = target_for(str(tmp_path))
    assert target.allowed == ("0.22.1",)
    # The file the line is in: the one reached through the includes.
    assert target.source == str(tmp_path / "requirements.txt")
    assert target.reason == "from requirements.txt: vllm==0.22.1"


def test_an_include_cycle_reads_each_file_once(tmp_path):
    write(
        tmp_path,
        {"requirements-a.txt": "-r requirements-b.txt\nvllm>=0.33\n", "requirements-b.txt": "-r requirements-a.txt\n"},
    )
    assert target_for(str(tmp_path)).allowed == between("0.33.0", NEWEST)


def test_no_requirement_means_the_newest_release(tmp_path):
    write(tmp_path, {"pyproject.toml": '[project]\nname = "p"\ndependencies = ["torch"]\n'})
    target = target_for(str(tmp_path))
    assert target == Target(
        NEWEST,
        None,
        manifest.releases(),
        f"no vLLM requirement found (--target-version X.Y sets one): the newest release the manifest knows, {NEWEST}",
        None,
    )


def test_a_requirement_without_a_version_or_from_a_url(tmp_path):
    write(tmp_path, {"requirements.txt": "vllm\n"})
    target = target_for(str(tmp_path))
    assert (target.release, target.oldest) == (NEWEST, None)
    assert (
        target.reason == f"from requirements.txt: vllm (any release): the newest release the manifest knows, {NEWEST}"
    )
    write(tmp_path, {"requirements.txt": "vllm @ git+https://github.com/vllm-project/vllm@main\n"})
    assert target_for(str(tmp_path)).oldest is None


def test_a_requirement_the_manifest_cannot_meet(tmp_path):
    write(tmp_path, {"requirements.txt": "vllm>=0.40\n"})
    newer = target_for(str(tmp_path))
    assert (newer.release, newer.allowed) == (NEWEST, (NEWEST,))
    assert "allows no release the manifest knows (0.19.0 to" in newer.reason
    write(tmp_path, {"requirements.txt": "vllm<0.19\n"})
    older = target_for(str(tmp_path))
    assert (older.release, older.oldest) == ("0.19.0", "0.19.0")


def test_a_pin_on_a_local_build_targets_the_release_it_was_built_from(tmp_path):
    # A platform's own wheel (`vllm==0.22.0+cpu`) has 0.22.0's attention interface, though by PEP 440 the pin
    # allows no release (none carries the label); excluding such a build leaves its release allowed.
    write(tmp_path, {"pyproject.toml": '[project]\nname = "p"\ndependencies = ["vllm==0.22.0+cpu"]\n'})
    target = target_for(str(tmp_path))
    assert (target.release, target.oldest, target.allowed) == ("0.22.0", "0.22.0", ("0.22.0",))
    assert target.reason == "from pyproject.toml: vllm==0.22.0+cpu; a local build has its release's interface"
    write(tmp_path, {"pyproject.toml": '[project]\nname = "p"\ndependencies = ["vllm!=0.22.0+cpu,<0.23"]\n'})
    target = target_for(str(tmp_path))
    assert (target.release, target.oldest) == ("0.22.1", "0.19.0")
    assert target.reason == "from pyproject.toml: vllm!=0.22.0+cpu,<0.23"


@pytest.mark.parametrize(
    ("requirement", "nearest"),
    [("vllm==0.22.5", "0.22.1"), ("vllm==0.40", NEWEST), ("vllm>=0.40,!=0.41", NEWEST), ("vllm==0.18.0", "0.19.0")],
)
def test_a_pin_the_manifest_does_not_know_targets_the_release_nearest_below(tmp_path, requirement, nearest):
    write(tmp_path, {"requirements.txt": requirement + "\n"})
    target = target_for(str(tmp_path))
    assert (target.release, target.oldest, target.allowed) == (nearest, nearest, (nearest,))
    assert target.reason.endswith(f"allows no release the manifest knows (0.19.0 to {NEWEST}): the nearest, {nearest}")


def test_an_explicit_or_configured_target_wins(tmp_path):
    write(tmp_path, {"pyproject.toml": '[project]\nname = "p"\ndependencies = ["vllm>=0.30"]\n'})
    explicit = target_for(str(tmp_path), explicit="0.27", configured="0.33")
    assert explicit == Target("0.27.1", "0.27.1", ("0.27.1",), "from --target-version 0.27", None)
    configured = target_for(str(tmp_path), configured="0.20")
    assert configured.release == "0.20.2"
    assert configured.reason == 'from [tool.vllm-attn-compat] target-version = "0.20"'
    with pytest.raises(TargetVersionError, match=r"--target-version: vLLM '0\.9' is not a release"):
        target_for(str(tmp_path), explicit="0.9")


def test_configured_target_version_from_the_tool_table(tmp_path):
    pyproject = (
        write(tmp_path, {"pyproject.toml": '[tool.vllm-attn-compat]\ntarget-version = "0.34"\n'}) / "pyproject.toml"
    )
    assert configured_target_version(str(pyproject)) == "0.34.0"
    pyproject.write_text('[tool.vllm-attn-compat]\nselect = ["VAC"]\n')
    assert configured_target_version(str(pyproject)) is None
    pyproject.write_text("[tool.vllm-attn-compat]\ntarget-version = 0.34\n")
    with pytest.raises(TargetVersionError) as raised:
        configured_target_version(str(pyproject))
    assert str(raised.value) == (
        f'{pyproject}: [tool.vllm-attn-compat] target-version: expected a vLLM release as a string (like "0.34"), '
        "found 0.34 (float)"
    )


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("0.18", r"vLLM '0\.18' is not a release the manifest knows; it knows \d+ releases from 0\.19\.0 to"),
        ("latest", r"'latest' is not a version \(expected something like 0\.34 or 0\.34\.0\)"),
        (" ", r"expected a vLLM release as a string \(like \"0\.34\"\), found ' ' \(str\)"),
        (["0.34"], r"expected a vLLM release as a string .*, found \['0\.34'\] \(list\)"),
    ],
)
def test_parse_target_version_names_what_is_wrong(value, complaint):
    with pytest.raises(TargetVersionError, match="^pyproject.toml: target-version: " + complaint):
        parse_target_version(value, "pyproject.toml: target-version")


@pytest.mark.parametrize(
    ("files", "complaint"),
    [
        ({"pyproject.toml": '[project\ndependencies = ["vllm"]\n'}, "pyproject.toml: cannot be read as TOML"),
        ({"pyproject.toml": '[project]\ndependencies = "vllm>=0.30"\n'}, "expected a list of requirement strings"),
        ({"pyproject.toml": '[project]\ndependencies = ["vllm>=banana"]\n'}, "'banana' is no version"),
        ({"setup.py": 'setup(install_requires=["vllm"]\n'}, "setup.py: cannot be read as Python"),
        ({"requirements.txt": "-r missing.txt\n"}, "missing.txt: cannot be read"),
    ],
)
def test_files_that_cannot_be_read_are_named(tmp_path, files, complaint):
    write(tmp_path, files)
    with pytest.raises(TargetVersionError, match=complaint):
        target_for(str(tmp_path))


def test_a_broken_file_that_never_names_vllm_is_not_read(tmp_path):
    # As the configuration's reader does with a pyproject.toml never naming the tool: not ours to validate.
    write(tmp_path, {"pyproject.toml": "[project\n", "setup.py": "setup(\n", "requirements.txt": "vllm==0.22.1\n"})
    assert target_for(str(tmp_path)).reason == "from requirements.txt: vllm==0.22.1"


def test_the_project_root_is_the_nearest_folder_stating_requirements(tmp_path):
    write(tmp_path, {"setup.cfg": "", "src/plugin/backend.py": "", "src/plugin/sub/__init__.py": ""})
    assert project_root(str(tmp_path / "src" / "plugin" / "sub")) == str(tmp_path)
    assert project_root(str(tmp_path / "src" / "plugin" / "backend.py")) == str(tmp_path)
    write(tmp_path, {"src/plugin/requirements.txt": ""})
    assert project_root(str(tmp_path / "src" / "plugin" / "sub")) == str(tmp_path / "src" / "plugin")


def test_another_projects_odd_requirement_is_passed_over(tmp_path):
    write(tmp_path, {"requirements.txt": "git+https://example.com/x.git#egg=x\n-e .\nvllm>=0.32\n"})
    found = find_requirements(str(tmp_path))
    assert found is not None and [r.text for r in found[1]] == ["vllm>=0.32"]
