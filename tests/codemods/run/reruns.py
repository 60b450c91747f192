"""What the rerun tests (test_rerun, test_bystanders) share: vLLM's stub, a cached run's options, and a report
as they compare it."""

from __future__ import annotations

from pathlib import Path

from vllm_attn_compat.codemods.run.runner import Options

STUB_VLLM = {"vllm/__init__.py": "", "vllm/v1/attention/backend.py": "class AttentionImpl:\n    pass\n"}


def cached(tmp_path: Path, **more) -> Options:
    """``--check`` in one process with a cache in ``tmp_path`` (``more`` overrides)."""
    return Options(**{"mode": "check", "jobs": 1, "cache_dir": str(tmp_path / "cache"), **more})


def outcome(report):
    """Everything a run reports, in an order that does not depend on the run's."""
    return sorted(report.findings), sorted(report.changed), sorted(report.errors), report.scanned, report.parsed
