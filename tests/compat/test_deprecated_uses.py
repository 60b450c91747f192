"""The tally of deprecated uses: every call counted at the user's line, whatever the warning mode or filters."""

from __future__ import annotations

import inspect
import warnings

import pytest

from vllm_attn_compat import deprecated_uses
from vllm_attn_compat.backends import AttentionBackend
from vllm_attn_compat.compat import VllmAttnCompatDeprecationWarning, deprecation
from vllm_attn_compat.compat.deprecation import removed_api_message
from vllm_attn_compat.compat.flags import check_backend_flag
from vllm_attn_compat.deprecated_uses import Tally, Use


@pytest.fixture
def tally(monkeypatch):
    counting = Tally()
    monkeypatch.setattr(deprecated_uses, "tally", counting)
    return counting


class _Redundant(AttentionBackend):
    accept_output_buffer = True  # DECLARED

    @staticmethod
    def get_name():
        return "redundant"

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError


def _read_flag():
    return AttentionBackend.accept_output_buffer  # READ


def _line_of(marker: str) -> int:
    lines = inspect.getsource(inspect.getmodule(_line_of)).splitlines()
    return 1 + next(i for i, line in enumerate(lines) if line.rstrip().endswith(f"# {marker}"))


def _calls(count: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        for _ in range(count):
            _read_flag()


def test_every_call_counts_not_only_the_warned_one(tally):
    _calls(3)
    (use,) = tally.uses()
    assert (use.path, use.line, use.count, use.rule) == (__file__, _line_of("READ"), 3, "VAC005")
    assert use.old_api == "`AttentionBackend.accept_output_buffer`"
    assert use.message.startswith(use.old_api + " was removed in vLLM 0.20")


@pytest.mark.parametrize("mode", ["ignore", "error"])
def test_counted_when_silenced_or_raised_by_the_environment(tally, monkeypatch, mode):
    monkeypatch.setenv(deprecation.ENV_WARNINGS, mode)
    for _ in range(2):
        if mode == "error":
            with pytest.raises(VllmAttnCompatDeprecationWarning):
                _read_flag()
        else:
            _read_flag()
    assert [(use.line, use.count) for use in tally.uses()] == [(_line_of("READ"), 2)]


def test_counted_when_a_warning_filter_raises_it(tally):
    with warnings.catch_warnings():
        warnings.simplefilter("error", VllmAttnCompatDeprecationWarning)
        with pytest.raises(VllmAttnCompatDeprecationWarning):
            _read_flag()
        _read_flag()  # the call site has had its warning: no second one, but still a use
    assert [use.count for use in tally.uses()] == [2]


def test_a_class_is_reported_at_its_definition(tally):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VllmAttnCompatDeprecationWarning)
        check_backend_flag(_Redundant)
        check_backend_flag(_Redundant)
    (use,) = tally.uses()
    assert (use.path, use.line, use.count, use.rule) == (__file__, _line_of("DECLARED") - 1, 2, "VAC004")
    assert use.old_api == "`_Redundant.accept_output_buffer = True`"


def test_the_message_wording_reads_back():
    message = removed_api_message("`torch.ops.vllm.unified_attention` (a; b)", "call X instead (rule VAC001)", "VAC007")
    use = deprecated_uses._use(message, _read_flag.__code__, 1, 1)
    assert (use.old_api, use.rule) == ("`torch.ops.vllm.unified_attention` (a; b)", "VAC007")
    other = deprecated_uses._use("some other wording", _read_flag.__code__, 1, 1)
    assert (other.old_api, other.rule) == ("some other wording", None)


def test_merge_adds_up_the_same_use_from_several_processes():
    one = Use(old_api="`x`", rule="VAC005", path="b.py", line=3, count=2, message="m")
    other = Use(old_api="`y`", rule="VAC007", path="a.py", line=9, count=1, message="n")
    merged = deprecated_uses.merge([one, other, Use.from_json(one.as_json())])
    assert [(use.path, use.count) for use in merged] == [("a.py", 1), ("b.py", 4)]
