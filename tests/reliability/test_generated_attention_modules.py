"""Generated old-API attention modules through every rule: the safe fixes do exactly what issue 3 says.

Per example: the output parses and is the expected program (every statement the rules must keep
is kept, every one they must remove is gone); a module that needs no change comes out byte for
byte; a second run changes nothing; no comment is lost except those documenting a removed
``accept_output_buffer``, and those are declared in ``removed_comments``; BOM, coding declaration,
line endings and final newline survive; no removal lengthens a run of blank lines; old-API code
under a ``# noqa`` comment is kept and counted as suppressed.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, note

from .engine_api import RULES_0_20, Status, comments, has_bom, line_endings, longest_blank_run, program
from .engine_api import migrate as migrate_with_every_rule
from .legacy_source import GeneratedModule, legacy_modules
from .profile import reliability_settings


def migrate(source: bytes, *, unsafe_fixes: bool = False):
    """The generated modules are written for vLLM <= 0.19: their oracle is the 0.20 rules' changes."""
    return migrate_with_every_rule(source, unsafe_fixes=unsafe_fixes, rules=RULES_0_20)


def _show(module: GeneratedModule, new: bytes) -> None:
    note("--- old ---\n" + module.source.decode(module.encoding))
    note("--- new ---\n" + new.decode(module.encoding))


def _check_layout(module: GeneratedModule, new: bytes) -> None:
    assert has_bom(new) == has_bom(module.source), "the BOM was added or removed"
    if module.encoding == "latin-1":
        assert new.splitlines()[0] == module.source.splitlines()[0], "the coding declaration changed"
    if module.newline != "mixed":
        assert line_endings(new) <= {module.newline.encode()}, f"line endings changed: {line_endings(new)}"
    assert new.endswith((b"\n", b"\r")) == module.source.endswith((b"\n", b"\r")), "the final newline changed"


def _check_comments(module: GeneratedModule, new: bytes, removed: tuple[str, ...], removable: frozenset[str]) -> None:
    before, after = comments(module.source), comments(new)
    assert not after - before, f"comments appeared: {sorted((after - before).elements())}"
    lost = before - after
    declared = Counter(text.rstrip() for text in removed)
    assert lost == declared, f"lost {sorted(lost.elements())}, declared removed {sorted(declared.elements())}"
    assert set(lost) <= removable, (
        f"removed comments that document no removed attribute: {sorted(set(lost) - removable)}"
    )


@reliability_settings(ci=40, long=4000)
@given(module=legacy_modules())
def test_safe_fixes_keep_everything_else(module: GeneratedModule) -> None:
    result = migrate(module.source)
    new = result.source
    _show(module, new)

    assert program(new) == program(module.expected), "the migrated module is not the expected program"
    if not module.changes_expected:
        assert new == module.source, "a module needing no change was changed"
    assert migrate(new).source == new, "a second run changed the migrated module"
    _check_comments(module, new, result.removed_comments, module.removable_comments)
    _check_layout(module, new)
    assert longest_blank_run(new) <= longest_blank_run(module.source), "a removal left a longer run of blank lines"

    suppressed = [f for f in result.findings if f.status is Status.SUPPRESSED]
    assert len(suppressed) >= module.suppressed, (
        f"{module.suppressed} `# noqa` lines, {len(suppressed)} suppressed findings"
    )
    fixed = [f for f in result.findings if f.status is Status.FIXED]
    assert bool(fixed) == (new != module.source), f"FIXED findings {fixed} do not match whether the source changed"
    assert not [f for f in migrate(new).findings if f.status is Status.FIXED], "the second run still found fixes"


@reliability_settings(ci=15, long=1500)
@given(module=legacy_modules())
def test_unsafe_fixes_keep_the_module_valid(module: GeneratedModule) -> None:
    result = migrate(module.source, unsafe_fixes=True)
    new = result.source
    _show(module, new)

    program(new)  # parses
    again = migrate(new, unsafe_fixes=True)
    assert again.source == new, "a second run with unsafe fixes changed the module again"
    _check_comments(module, new, result.removed_comments, module.unsafe_removable_comments)
    _check_layout(module, new)
    assert not [f for f in again.findings if f.status in (Status.FIXED, Status.UNSAFE_FIX_AVAILABLE)], (
        "fixes remain after applying every fix"
    )


# Found by the property above, and fixed by the owner: dropping an old op name from a multi-line
# literal also dropped the comments next to it, though issue 3 lets a rule remove only the comments
# documenting a removed attribute.
DROPPED_ELEMENT_COMMENTS = b"""SPLITTING_OPS = [
    "vllm::mamba_mixer2",  # keeps the mamba mixer split
    # the attention op:
    "vllm::unified_attention",  # the old name
    # the new name:
    "vllm::unified_attention_with_output",
]
"""


def test_dropping_an_op_name_keeps_the_comments_around_it() -> None:
    result = migrate(DROPPED_ELEMENT_COMMENTS)
    assert b'"vllm::unified_attention",' not in result.source
    lost = comments(DROPPED_ELEMENT_COMMENTS) - comments(result.source)
    assert not lost, f"comments lost: {sorted(lost)}"


# Found by the long mode (a random comment ending in "\\" on the last line): libcst 1.9's
# parse_module(source).bytes drops the final newline after such a comment, so every fix to such a
# file loses it; the runner's safety check refuses to write the result (exit 2), so nothing is corrupted,
# but the file cannot be migrated.
LAST_COMMENT_BACKSLASH = b"""from vllm.v1.attention.backend import AttentionBackend


class PluginBackend(AttentionBackend):
    accept_output_buffer = True
    name = "plugin"
# see C:\\
"""


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
def test_a_last_comment_ending_in_a_backslash_keeps_the_final_newline(newline: bytes) -> None:
    source = LAST_COMMENT_BACKSLASH.replace(b"\n", newline)
    new = migrate(source).source
    assert b"accept_output_buffer" not in new
    assert new.endswith(b"# see C:\\" + newline), f"the file now ends with {new[-12:]!r}"
