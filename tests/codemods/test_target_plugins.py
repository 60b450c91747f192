"""`migrate --check --target-version X.Y` on trees shaped as real plugins are (`plugin_shapes`): every override of
a hook the release no longer has or calls, at its `def`, and every import of a name it removed, nothing else; none
in a tree whose classes derive from no vLLM class. Through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_attn_compat import manifest
from vllm_attn_compat.codemods.cli import main

from plugin_shapes import OWN_ABCS, PLUGINS, expected


def _write(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip("\n"))
    return root


def _findings(root: Path, target: str, capsys: pytest.CaptureFixture[str], *rules: str) -> tuple[int, dict]:
    selected = ["--select", ",".join(rules)] if rules else []
    code = main(["migrate", "--check", "--target-version", target, "--format", "json", *selected, str(root)])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("target", ["0.27", "0.29", "0.32", "0.34"])
@pytest.mark.parametrize("plugin", list(PLUGINS))
def test_every_dead_override_and_removed_import_and_nothing_else(tmp_path, capsys, plugin, target):
    files = PLUGINS[plugin]
    root = _write(tmp_path / plugin, files)
    code, report = _findings(root, target, capsys, "VAC010", "VAC011")
    release = manifest.resolve(target)
    found = {(str(Path(f["file"]).relative_to(root)), f["line"], f["code"]) for f in report["findings"]}
    assert found == expected(files, manifest.version_key(release), manifest.version_key)
    assert all(f["status"] == "manual" for f in report["findings"])
    assert code == (1 if found else 0)
    assert report["target"] == {"release": release, "oldest": release, "reason": f"from --target-version {target}"}


def test_build_for_drafting_is_alive_in_0_27_and_dead_in_0_34(tmp_path, capsys):
    root = _write(tmp_path, PLUGINS["vllm-ascend"])
    _, before = _findings(root, "0.27", capsys, "VAC010")
    _, after = _findings(root, "0.34", capsys, "VAC010")
    assert not any("build_for_drafting" in f["message"] for f in before["findings"])
    drafting = [f for f in after["findings"] if f["message"].startswith("`build_for_drafting` is dead")]
    assert len(drafting) == 2 and {f["release"] for f in drafting} == {"0.34.0"}
    assert after["summary"]["left_by_release"] == {"0.29.0": {"VAC010": 2}, "0.34.0": {"VAC010": 3}}


def test_a_tree_whose_classes_derive_from_no_vllm_class_gets_no_finding(tmp_path, capsys):
    code, report = _findings(_write(tmp_path, OWN_ABCS), "0.34", capsys)
    assert (code, report["findings"]) == (0, [])


def test_the_text_summary_groups_what_is_left_by_the_release_that_caused_it(tmp_path, capsys):
    root = _write(tmp_path, PLUGINS["MetaX"])
    assert main(["migrate", "--check", "--target-version", "0.34", "--select", "VAC010,VAC011", str(root)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "Target: vLLM 0.34.0, from --target-version 0.34." in lines
    assert (
        "Left by the vLLM release that caused them: vLLM 0.26.0: 1 (VAC011 1); vLLM 0.29.0: 3 (VAC010 3); "
        "vLLM 0.32.0: 1 (VAC010 1)." in lines
    )
