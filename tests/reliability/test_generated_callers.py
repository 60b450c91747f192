"""Generated old-API plugins with code that calls them: the safe fixes break no call that worked.

The oracle runs both versions: every caller is called before and after `migrate` (the real runner,
over the plugin's tree with the stub vLLM outside it), each version in its own interpreter, and
every call that returned before must return the same value after, and every call that failed at the
method's ``assert output is not None`` must fail there after (deleting the assert would let it run on to
fail elsewhere, or not at all). A caller that raised otherwise may do anything after.
"""

from __future__ import annotations

from hypothesis import example, given

from .legacy_callers import (
    ELSEWHERE_EXAMPLE,
    RELAY_EXAMPLE,
    STUBS,
    GeneratedPlugin,
    plugins_with_callers,
    probe_around_migrate,
)
from .profile import reliability_settings


@reliability_settings(ci=12, long=600)
@given(plugin=plugins_with_callers())
@example(plugin=ELSEWHERE_EXAMPLE)
@example(plugin=RELAY_EXAMPLE)
def test_no_call_that_returned_raises_after_the_safe_fixes(plugin: GeneratedPlugin, tmp_path_factory) -> None:
    root = tmp_path_factory.mktemp("plugin")
    before, after = probe_around_migrate(root, plugin.files, STUBS, plugin.callers)
    for name, (outcome, value) in before.items():
        if outcome == "returned" or value == "AssertionError":
            assert after[name] == [outcome, value], f"{name}: {before[name]} before, {after[name]} after"
