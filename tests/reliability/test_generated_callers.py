"""Generated old-API plugins with code that calls them: the safe fixes break no call that worked.

The oracle runs both versions: every caller is called before and after `migrate` (the real runner,
over the plugin's tree with the stub vLLM outside it), each version in its own interpreter, and
every call that returned before must return the same value after. A caller that raised before may
do anything after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import example, given, note

from vllm_attn_compat.codemods.run.runner import Options, run_paths

from .legacy_callers import ELSEWHERE_EXAMPLE, PROBE, STUBS, GeneratedPlugin, plugins_with_callers
from .profile import reliability_settings


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _probe(root: Path, callers: tuple[str, ...]) -> dict[str, list]:
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    completed = subprocess.run(
        [sys.executable, "-c", PROBE, str(root / "tree"), str(root / "stubs"), *callers],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


@reliability_settings(ci=12, long=600)
@given(plugin=plugins_with_callers())
@example(plugin=ELSEWHERE_EXAMPLE)
def test_no_call_that_returned_raises_after_the_safe_fixes(plugin: GeneratedPlugin, tmp_path_factory) -> None:
    root = tmp_path_factory.mktemp("plugin")
    _write(root / "stubs", STUBS)
    _write(root / "tree", plugin.files)
    for relative, text in plugin.files.items():
        note(f"--- {relative} ---\n{text}")
    before = _probe(root, plugin.callers)

    report = run_paths([str(root / "tree")], Options(jobs=1))
    assert report.errors == []
    for relative in plugin.files:
        note(f"--- {relative} after ---\n{(root / 'tree' / relative).read_text()}")
    after = _probe(root, plugin.callers)
    for name, (outcome, value) in before.items():
        if outcome == "returned":
            assert after[name] == ["returned", value], f"{name}: {before[name]} before, {after[name]} after"
