"""Generated plugins reached in dynamic ways (`legacy_dynamic`): the safe fixes change no behaviour, every fix they
withhold names the use that withheld it, and the clearly safe fixes are still made (issue #50).

The oracle runs both versions, each in its own interpreter on a stub of vLLM 0.20 (the vLLM the fixes target): every
caller that returned before returns the same after, and one that failed at the method's `assert output is not None`
fails there after. The program is whatever the generator drew; the oracle knows nothing of the shapes.
"""

from __future__ import annotations

import re

from hypothesis import event, example, given

from vllm_attn_compat.codemods.findings import Status

from .legacy_dynamic import DynamicPlugin, build_plugin, dynamic_plugins, migrate_and_probe
from .profile import reliability_settings

# A withheld fix's finding names where the use that withheld it is: a line of its own file, or another file's.
_NAMED = re.compile(r"withheld: .*(?:at line \d+|at \S+\.py:\d+|\S+\.py:\d+)")
# The fixes whose safety the accounting decides: a method's (VAC001-VAC003), the flag's deletion, an op's renaming.
_ACCOUNTED = ("VAC001", "VAC002", "VAC003", "VAC004", "VAC006")


def _check(plugin: DynamicPlugin, tmp_path_factory) -> None:
    root = tmp_path_factory.mktemp("dynamic")
    before, after, report = migrate_and_probe(root, plugin)
    for name, (outcome, value) in before.items():
        if outcome == "returned" or value == "AssertionError":
            assert after[name] == [outcome, value], f"{name}: {before[name]} before, {after[name]} after"
    withheld = [
        (path, finding)
        for path, finding in report.findings
        if finding.code in _ACCOUNTED and finding.status is Status.UNSAFE_FIX_AVAILABLE
    ]
    for path, finding in withheld:
        assert _NAMED.search(finding.message), f"{path}:{finding.line}: {finding.message}"
    fixed = {finding.code for _, finding in report.findings if finding.status is Status.FIXED}
    event(f"fixes made: {'some' if fixed else 'none'}; withheld: {'some' if withheld else 'none'}")


@reliability_settings(ci=20, long=1500)
@given(plugin=dynamic_plugins())
@example(plugin=build_plugin(("alias", "class-body-read"), method="fallback", flag=True, splitting_ops="old"))
@example(plugin=build_plugin(("metaclass", "op-pairs"), method="assert", flag=True, splitting_ops="old-and-new"))
@example(plugin=build_plugin(("broken-file", "op-removed"), method="fallback", flag=False, splitting_ops="old"))
@example(plugin=build_plugin(("none-attribute", "alias"), method="assert-required", flag=False, splitting_ops="old"))
def test_no_behaviour_changes_and_every_withheld_fix_names_its_use(plugin: DynamicPlugin, tmp_path_factory) -> None:
    _check(plugin, tmp_path_factory)


def test_the_clearly_safe_fixes_are_still_made(tmp_path_factory) -> None:
    """Every caller passes a fresh buffer, the flag is never read, the op names sit in `splitting_ops`: every fix is
    made, and every caller still works."""
    plugin = build_plugin(("buffer",), method="fallback", flag=True, splitting_ops="old-and-new")
    root = tmp_path_factory.mktemp("clean")
    before, after, report = migrate_and_probe(root, plugin)
    assert after == before
    fixed = sorted(finding.code for _, finding in report.findings if finding.status is Status.FIXED)
    assert fixed == ["VAC002", "VAC003", "VAC004", "VAC006"], report.findings
    config = (root / "tree/plugin/config.py").read_text()
    assert '"vllm::unified_attention"' not in config and "unified_attention_with_output" in config


def test_a_use_in_a_file_that_does_not_parse_withholds_the_fix_it_would_break(tmp_path_factory) -> None:
    """Once mended, `broken.py` calls `prefill` without `output`: the fixes stay withheld, naming that file."""
    plugin = build_plugin(("broken-file",), method="fallback", flag=False, splitting_ops="old")
    root = tmp_path_factory.mktemp("broken")
    _, _, report = migrate_and_probe(root, plugin)
    assert [error.path for error in report.errors] == [str(root / "tree/plugin/broken.py")]
    backend = (root / "tree/plugin/backend.py").read_text()
    assert "def prefill(self, query, output=None):" in backend and "if output is None:" in backend
    named = [f.message for path, f in report.findings if path.endswith("backend.py") and f.code in ("VAC002", "VAC003")]
    assert named and all("broken.py:2, in a file that does not parse" in message for message in named), named
