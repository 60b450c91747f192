"""vLLM's releases on the package registries, and one release's sources out of its wheel.

``pip download --no-deps`` fetches the wheel (any x86-64 manylinux tag: the releases carry various ones,
0.20.x manylinux_2_35, 0.21.0 manylinux_2_24, the later ones manylinux_2_28), the ``vllm/**.py`` members are
read straight out of the zip, and the wheel is deleted; ``cache``, when given, keeps the extracted ``.py`` files
(``cache/<version>/vllm/``, the layout ``--sources`` reads) so that a rerun downloads nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import release as release_module

# Every glibc a manylinux wheel may name, so that the wheel picked does not depend on the machine's glibc.
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(17, 41)] + ["manylinux2014_x86_64"]
FIRST = (0, 19, 0)


def _env() -> dict[str, str]:
    return {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def published() -> list[str]:
    """vLLM's final releases from 0.19.0 on, oldest first, as ``pip index versions vllm`` lists them."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "vllm"],
        capture_output=True,
        text=True,
        check=False,
        env=_env(),
        timeout=300,
    )
    match = re.search(r"Available versions:\s*(.+)", out.stdout)
    if out.returncode != 0 or match is None:
        raise RuntimeError(f"pip index versions vllm failed: {_last_lines(out.stderr + out.stdout)}")
    return final_releases(v.strip() for v in match.group(1).split(","))


def final_releases(versions: Any) -> list[str]:
    """The final releases (X.Y.Z) from 0.19.0 on among ``versions``, oldest first."""
    keyed = []
    for version in versions:
        if re.fullmatch(r"\d+\.\d+\.\d+", version):
            key = tuple(int(p) for p in version.split("."))
            if key >= FIRST:
                keyed.append((key, version))
    return [version for _, version in sorted(keyed)]


def download(version: str, folder: Path) -> Path:
    """The wheel of ``vllm==version``, downloaded into ``folder``."""
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    command += ["--implementation", "cp", "--python-version", "3.12", "-d", str(folder), f"vllm=={version}"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    out = subprocess.run(command, capture_output=True, text=True, check=False, env=_env(), timeout=1800)
    wheels = sorted(folder.glob("vllm-*.whl"))
    if out.returncode != 0 or not wheels:
        raise RuntimeError(f"pip download vllm=={version} failed: {_last_lines(out.stderr + out.stdout)}")
    return wheels[0]


def read(version: str, cache: Path | None = None) -> release_module.Snapshot:
    """The snapshot of ``version``, from ``cache`` when it holds the release, else from its downloaded wheel."""
    if cache is not None and (cache / version / "vllm").is_dir():
        return release_module.snapshot(release_module.FolderSources(cache / version))
    with tempfile.TemporaryDirectory(prefix=f"vllm-{version}-") as folder:
        wheel = download(version, Path(folder))
        sources = release_module.WheelSources(wheel)
        try:
            result = release_module.snapshot(sources)
            if cache is not None:
                _keep(sources, cache / version)
        finally:
            sources.close()
    return result


def _keep(sources: release_module.WheelSources, target: Path) -> None:
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    for path in sources.paths():
        destination = partial / path
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(sources.zip.read(path))
    partial.rename(target)  # complete or absent: a rerun never reads half a release


def _last_lines(output: str, count: int = 3) -> str:
    lines = [line for line in output.splitlines() if line.strip() and "is ignored" not in line]
    return " / ".join(lines[-count:]) or "(no output)"
