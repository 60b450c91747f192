"""Generate the manifest of vLLM's attention interface from every vLLM release since 0.19.0; ``--check``: compare.

It writes vllm_attn_compat/manifest/attention_api.json, the release list beside it (releases.txt) and the docs
(docs/attention-api.md).

Usage::

    python scripts/attention_manifest.py                          # every release, wheels from the registries
    python scripts/attention_manifest.py --sources /work/vllm-src # DIR/<version>/vllm/ for each release
    python scripts/attention_manifest.py --check                  # exit 1 when the committed files differ
    python scripts/attention_manifest.py --releases 0.33.0 0.34.0 --sources DIR --output m.json --docs d.md

Standard library and this package's ``codemods.index.names``; nothing of vLLM is imported: each release's sources
are read with ``ast`` (scripts/manifest_gen/). Without ``--sources``, each wheel is fetched with ``pip download
--no-deps``, read out of the zip and deleted (``--cache DIR`` keeps the extracted sources for the next run).
Releases are read ``--jobs`` at a time, in separate processes.
"""

from __future__ import annotations

import argparse
import difflib
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # this package, where it is not installed

from manifest_gen import docs, history, release, successors, wheels

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "vllm_attn_compat" / "manifest" / "attention_api.json"
DOC = ROOT / "docs" / "attention-api.md"


def read_release(version: str, sources: Path | None, cache: Path | None) -> tuple[str, release.Snapshot]:
    """(version, its snapshot), from ``sources/<version>`` or from the registries."""
    if sources is not None:
        return version, release.snapshot(release.FolderSources(sources / version))
    return version, wheels.read(version, cache)


def releases_in(sources: Path) -> list[str]:
    """The final releases from 0.19.0 on that ``sources`` holds a ``vllm/`` folder of."""
    return wheels.final_releases(p.name for p in sources.iterdir() if (p / "vllm").is_dir())


def generate(versions: list[str], sources: Path | None, cache: Path | None, jobs: int) -> dict[str, Any]:
    """The manifest of ``versions`` (oldest first)."""
    if jobs <= 1 or len(versions) == 1:
        snapshots = [read_release(v, sources, cache) for v in versions]
    else:
        # fork where it is safe (Linux): the children need no re-import of this script.
        context = multiprocessing.get_context("fork" if sys.platform == "linux" else None)
        with ProcessPoolExecutor(jobs, mp_context=context) as pool:
            snapshots = list(pool.map(read_release, versions, [sources] * len(versions), [cache] * len(versions)))
    manifest = history.build(snapshots, {})
    manifest["successors"] = successors.successors(manifest)
    return manifest


def differences(committed: str, generated: str, limit: int = 40) -> list[str]:
    """What differs between the committed data and the regenerated, release by release, then the text's diff."""
    lines: list[str] = []
    try:
        old, new = json.loads(committed), json.loads(generated)
    except ValueError as error:
        return [f"the committed data is no JSON ({error})"]
    for version in new["releases"]:
        if version not in old.get("releases", []):
            lines.append(f"release {version}: new (the committed data lacks it)")
    for version in old.get("releases", []):
        if version not in new["releases"]:
            lines.append(f"release {version}: in the committed data, not regenerated")
    for version in (v for v in new["releases"] if v in old.get("releases", [])):
        before, after = history.snapshot_at(old, version), history.snapshot_at(new, version)
        sections = (("modules", "module"), ("classes", "class"), ("functions", "function"), ("ops", "op"))
        for section, what in (*sections, ("module_files", "module file")):
            for key in sorted(set(before[section]) | set(after[section])):
                if before[section].get(key) != after[section].get(key):
                    lines.append(f"release {version}: {what} {key} differs")
    if old.get("successors") != new["successors"]:
        lines.append("the successors differ")
    if not lines:
        lines.append("the same data, written differently")
    diff = list(
        difflib.unified_diff(
            committed.splitlines(), generated.splitlines(), "committed", "regenerated", n=0, lineterm=""
        )
    )
    shown = lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit else [])
    return shown + diff[: limit // 2] + ([f"... ({len(diff)} diff lines in all)"] if len(diff) > limit // 2 else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=Path, help="read DIR/<version>/vllm/ instead of downloading wheels")
    parser.add_argument("--releases", nargs="+", metavar="VERSION", help="these releases (default: every one)")
    parser.add_argument("--check", action="store_true", help="compare with the committed files; write nothing")
    parser.add_argument("--cache", type=Path, help="keep the downloaded releases' sources in DIR, reuse them")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="releases read at once")
    parser.add_argument("--output", type=Path, default=DATA, help=f"the data file (default: {DATA.relative_to(ROOT)})")
    parser.add_argument("--docs", type=Path, default=DOC, help=f"the docs page (default: {DOC.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    start = time.monotonic()
    try:
        if args.releases:
            versions = wheels.final_releases(args.releases)
            unknown = sorted(set(args.releases) - set(versions))
            if unknown:
                parser.error(f"--releases: expected final releases X.Y.Z from 0.19.0 on, found {', '.join(unknown)}")
        elif args.sources is not None:
            versions = releases_in(args.sources)
        elif args.check:
            # The releases the committed data holds: a release published since is news, not a difference.
            listed = args.output.with_name("releases.txt")
            versions = listed.read_text(encoding="utf-8").split() if listed.exists() else wheels.published()
            newer = [version for version in wheels.published() if version not in versions]
            if newer:
                print(f"attention_manifest: published since the data was made: {', '.join(newer)} (regenerate to add)")
        else:
            versions = wheels.published()
        if not versions:
            parser.error(f"no vLLM release from 0.19.0 on found in {args.sources or 'the registries'}")
        manifest = generate(versions, args.sources, args.cache, args.jobs)
    except (RuntimeError, OSError, ValueError) as error:
        print(f"attention_manifest: {error}", file=sys.stderr)
        return 2
    text, page = history.dumps(manifest), docs.render(manifest)
    # The release list beside the data: what resolving a version reads (vllm_attn_compat/manifest/releases.py).
    listing = args.output.with_name("releases.txt")
    outputs = ((args.output, text), (listing, "".join(f"{v}\n" for v in manifest["releases"])), (args.docs, page))
    where = f"{len(versions)} releases ({versions[0]} to {versions[-1]}) in {time.monotonic() - start:.0f}s"
    if args.check:
        stale = []
        for path, expected in outputs:
            current = path.read_text(encoding="utf-8") if path.exists() else ""
            if current != expected:
                stale.append(path)
                print(f"{path} differs from what {where} give:", file=sys.stderr)
                if path == args.output:
                    for line in differences(current, expected):
                        print(f"  {line}", file=sys.stderr)
        if stale:
            print("regenerate with: python scripts/attention_manifest.py", file=sys.stderr)
            return 1
        print(f"attention_manifest: the data and the docs match {where}")
        return 0
    for path, content in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(content, encoding="utf-8")
        partial.replace(path)
    size = len(text.encode())
    print(f"attention_manifest: wrote {args.output} ({size:,} bytes), {listing} and {args.docs} from {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
