"""Running the real command line in a subprocess, and the small legacy files the CLI suites use."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120  # a hung run fails the test instead of hanging CI

# A plugin file every safe fix applies to; after `migrate` no finding is left in it.
LEGACY = b'''"""A plugin backend written against vLLM <= 0.19."""
from typing import Optional

import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl


class PluginBackend(AttentionBackend):
    # Tells vLLM to allocate the output buffer.
    accept_output_buffer = True

    @staticmethod
    def get_name() -> str:
        return "PLUGIN"

    @staticmethod
    def get_impl_cls():
        return PluginImpl

    @staticmethod
    def get_builder_cls():
        return None


class PluginImpl(AttentionImpl):
    def __init__(self, num_heads, head_size, scale):
        self.scale = scale

    def forward(
        self,
        layer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata,
        output: Optional[torch.Tensor] = None,  # written in place
        output_scale: Optional[torch.Tensor] = None,
        output_block_scale: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        assert output is not None, "Output tensor must be provided."
        output.copy_(query)
        return output


SPLITTING_OPS = ["vllm::unified_attention", "vllm::mamba_mixer2"]
'''

# The same file migrated (the exact bytes are the rules' tests' business; these suites compare programs).
MIGRATED_PROGRAM = (
    LEGACY.replace(b"    # Tells vLLM to allocate the output buffer.\n    accept_output_buffer = True\n\n", b"")
    .replace(b"output: Optional[torch.Tensor] = None,", b"output: torch.Tensor,")
    .replace(b'        assert output is not None, "Output tensor must be provided."\n', b"")
    .replace(b'"vllm::unified_attention"', b'"vllm::unified_attention_with_output"')
)

# Python code that no rule concerns (no token of any rule): the prefilter skips it unread by libcst.
PLAIN = b"def add(a, b):\n    return a + b\n"


def legacy_variant(index: int) -> bytes:
    """Distinct legacy files (class names, line endings, indentation) for trees of many files."""
    source = LEGACY.replace(b"Plugin", f"Plugin{index}".encode())
    if index % 3 == 1:
        source = source.replace(b"\n", b"\r\n")
    if index % 5 == 2:
        source = source.replace(b"    ", b"\t")
    return source


def cli_env(extra_pythonpath: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "VLLM_ATTN_COMPAT_WARNINGS")}
    paths = [str(REPO_ROOT)] + ([extra_pythonpath] if extra_pythonpath else [])
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "vllm_attn_compat", *args]


def _drop_file_permission_override() -> list[str]:
    """As root, permission bits are not enforced; drop the capabilities that bypass them, if possible."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return []
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"]


def permissions_enforced() -> bool:
    return os.geteuid() != 0 or shutil.which("setpriv") is not None


def run_cli(
    *args: str, cwd: Path, extra_pythonpath: str | None = None, timeout: float = TIMEOUT_S
) -> subprocess.CompletedProcess:
    return subprocess.run(
        _drop_file_permission_override() + cli_command(*args),
        cwd=cwd,
        env=cli_env(extra_pythonpath),
        capture_output=True,
        timeout=timeout,
    )


def snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (links not followed) by relative path."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found[path.relative_to(root).as_posix()] = path.read_bytes()
    return found
