"""How a run goes: the options the command line and the configuration decide (`runner.run_paths` takes them).

A module of its own, so that the command line can decide them, and replay a rerun (`rerun`), without
importing the runner and what it imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from vllm_attn_compat.codemods.run import parallel

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.target_version import Target


class Options(NamedTuple):
    """How to run; ``mode`` is ``write`` (apply fixes), ``check`` or ``diff`` (write nothing)."""

    mode: str = "write"
    unsafe_fixes: bool = False
    old_op_calls: str = "with-output"  # or "forwarder": see VAC007
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    base: str = "."
    jobs: int = parallel.available_cores()
    progress: bool = False
    cache_dir: str | None = None  # see cache.py
    target: Target | None = None  # the vLLM release the run targets (`target_version`); None: the newest

    @property
    def verifies(self) -> bool:
        """Whether rewritten sources go through the safety checks: wherever one may be written or shown as a
        diff; ``--check`` only reports that a file would change (a rewrite failing a check is a bug either way)."""
        return self.mode != "check"
