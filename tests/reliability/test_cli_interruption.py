"""SIGKILL at random moments while `migrate` rewrites a tree: every file is entirely old or entirely new,
no temporary file is left where the next run would read it, and a second run finishes the job."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .cli_run import PLAIN, cli_command, cli_env, legacy_variant, run_cli, snapshot
from .profile import scaled

FILES = 40
SEED = 20260601


def _build(tree: Path) -> dict[str, bytes]:
    files = {f"pkg{i % 4}/backend_{i}.py": legacy_variant(i) for i in range(FILES)}
    files.update({f"pkg{i % 4}/plain_{i}.py": PLAIN for i in range(10)})
    for name, content in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(content)
    return files


def _write_window(tree: Path, originals: dict[str, bytes]) -> tuple[float, float, float]:
    """Run to completion while watching the tree: (first write, last write, end), seconds after start."""
    start = time.monotonic()
    process = subprocess.Popen(
        cli_command("migrate", ".", "--quiet"),
        cwd=tree,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    first = last = None
    changed: set[str] = set()
    while process.poll() is None:
        for name in originals:
            if name not in changed and (tree / name).read_bytes() != originals[name]:
                changed.add(name)
                now = time.monotonic() - start
                first = now if first is None else first
                last = now
        time.sleep(0.02)
    end = time.monotonic() - start
    assert process.returncode == 0
    return (first or 0.0), (last or end), end


def _until_half_migrated(process: subprocess.Popen[bytes], tree: Path, originals: dict[str, bytes]) -> float:
    """Seconds until some of the files are new and some old (or until the run ends, if that comes first)."""
    start = time.monotonic()
    while process.poll() is None:
        new = sum((tree / name).read_bytes() != old for name, old in originals.items())
        if 0 < new < FILES:
            break
        time.sleep(0.002)
    return time.monotonic() - start


def test_sigkill_leaves_each_file_old_or_new_and_a_rerun_finishes(tmp_path: Path) -> None:
    original = tmp_path / "original"
    originals = _build(original)
    reference = tmp_path / "reference"
    shutil.copytree(original, reference, symlinks=True)
    first, last, end = _write_window(reference, originals)
    migrated = snapshot(reference)
    assert set(migrated) == set(originals)
    assert sum(migrated[n] != originals[n] for n in originals) == FILES, (
        "the reference run did not migrate every legacy file"
    )

    rng = random.Random(SEED)
    partial_trials = stray_files = 0
    trials = scaled(3, 60)
    low, high = first, last  # narrowed towards the moments that catch the run mid-write
    trial = 0
    # At least `trials` kills, and more (up to 12) until one lands between two file writes: a kill before
    # the first or after the last write would prove nothing about atomicity.
    while trial < trials or (partial_trials == 0 and trial < 12):
        tree = tmp_path / f"trial{trial}"
        shutil.copytree(original, tree, symlinks=True)
        # Most kills inside the window of writes seen so far, every third anywhere in the run; once the timed
        # kills have missed that window a few times (its timing varies from run to run), a kill as soon as
        # the tree is seen half migrated.
        delay = rng.uniform(0.0, end) if trial % 3 == 2 else rng.uniform(low, high)
        watch = partial_trials == 0 and trial >= 5
        process = subprocess.Popen(
            cli_command("migrate", ".", "--quiet"), cwd=tree, env=cli_env(),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        if watch:
            delay = _until_half_migrated(process, tree, originals)
        else:
            time.sleep(delay)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the tool and its workers, as a power cut would
        process.wait()

        after = snapshot(tree)
        new_count = 0
        for name, old in originals.items():
            assert name in after, f"trial {trial} (kill after {delay:.3f}s): {name} is gone"
            assert after[name] in (old, migrated[name]), (
                f"trial {trial} (kill after {delay:.3f}s): {name} is half written"
            )
            new_count += after[name] != old
        stray = sorted(set(after) - set(originals))
        assert not [s for s in stray if s.endswith((".py", ".pyi"))], f"temporary files a rerun would read: {stray}"
        partial_trials += 0 < new_count < FILES
        if trial % 3 != 2 and not watch:
            low, high = (delay, high) if new_count == 0 else (low, delay) if new_count == FILES else (low, high)
        stray_files += len(stray)

        result = run_cli("migrate", ".", "--quiet", cwd=tree)
        assert result.returncode == 0, (result.stdout + result.stderr).decode()
        final = snapshot(tree)
        for name in originals:
            assert final[name] == migrated[name], f"trial {trial}: the rerun did not finish {name}"
        trial += 1
    print(
        f"{trial} kills (seed {SEED}), {partial_trials} between the first and last write, {stray_files} temporary "
        f"files left; writes from {first:.2f}s to {last:.2f}s of {end:.2f}s"
    )
    assert partial_trials >= 1, (
        f"no kill in {trial} landed between the first and the last write: the test proved nothing"
    )
