"""The progress bar (`run/progress.py`)."""

from __future__ import annotations

from vllm_attn_compat.codemods.run import progress


def test_progress_is_drawn_by_tqdm_for_long_stages_only_when_enabled(capsys):
    import time

    def slow_outcomes():
        for n in range(8):
            time.sleep(0.1)  # past tqdm's delay: short runs never show a bar
            yield f"file{n}.py", n

    assert [n for _, n in progress.bar(slow_outcomes(), 8, False, "migrate")] == list(range(8))
    assert capsys.readouterr().err == ""
    assert [n for _, n in progress.bar(slow_outcomes(), 8, True, "migrate")] == list(range(8))
    assert "migrate:" in capsys.readouterr().err
