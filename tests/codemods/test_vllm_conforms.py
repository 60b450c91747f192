"""The installed vLLM's own attention code, checked against its own release: vLLM calls its backends, impls and
builders as its interface says, so an override VAC012 says cannot take vLLM's call, or a class VAC013 says lacks an
abstract member, is a false report. The oracle the rules' call shapes (`vac012_signature_drift.PASSED_BY_NAME`)
and abstract members are held to, on every release CI installs (0.20.0 here; 0.30.0 and the newest in its matrix)."""

from __future__ import annotations

import importlib.util
import json
import os
from importlib.metadata import version

import pytest

from vllm_attn_compat import manifest
from vllm_attn_compat.codemods.cli import main

pytestmark = pytest.mark.vllm

SPEC = importlib.util.find_spec("vllm")
if SPEC is None or not SPEC.submodule_search_locations:
    pytest.skip("the real vLLM package is not installed (run scripts/install-vllm-tier.sh)", allow_module_level=True)


def test_vllm_s_own_attention_code_takes_the_calls_of_its_own_release(capsys: pytest.CaptureFixture[str]) -> None:
    assert SPEC is not None and SPEC.submodule_search_locations
    root = SPEC.submodule_search_locations[0]
    release = manifest.resolve(version("vllm"))
    folders = [os.path.join(root, "v1", "attention"), os.path.join(root, "model_executor", "layers", "attention")]
    folders = [folder for folder in folders if os.path.isdir(folder)]
    assert folders
    options = ["--check", "--no-cache", "--target-version", release, "--select", "VAC012,VAC013", "--format", "json"]
    code = main(["migrate", *options, *folders])
    report = json.loads(capsys.readouterr().out)
    assert report["target"]["release"] == release
    assert [(f["file"], f["line"], f["message"]) for f in report["findings"]] == []
    assert code == 0
    assert report["summary"]["files_parsed"] > 20  # the backends were read, not passed over
