"""A rerun after edits of files that took no part in the run: the report of the run before, found without
reading any other file.

Most commits to a fork change files that are neither attention code nor name it nor call into it: an entry
point, a cache manager, a model without attention layers, a test. The run over the tree before the edit read such a file only to ask it the
questions of `scans` (does it hold a rule's token, name vLLM, read the flag, name an attention class found so
far, may it use a method whose fix the call-site analysis decides, does it need libcst), and no answer gave it
a part: it was not indexed, scanned for classes, parsed or reported. Every other use the run makes of a file
goes through its path, which an edit keeps.

So when the edited bytes answer every question the run asked of the old bytes as they did, a run over the new
tree asks every file the same questions, in the same order, gets the same answers, builds the same class
hierarchy and reports the same findings: its report is the run before's. The run before's `cache.RunBasis`
says which files took part and which questions it asked, and holds the answers of the bytes of files edited
since the run that wrote the answers file (`answers`, which holds the others' and names that run: written by
another run since, it cannot serve). Anything else, an edited file that took part first of all, is the
runner's.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.run import answers as answers_module
from vllm_attn_compat.codemods.run import scans

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.findings import Finding
    from vllm_attn_compat.codemods.run.cache import Cache


def derive(
    cache: Cache,
    run_key: str,
    digests: Mapping[str, str],
    edited: Mapping[str, tuple[str, bytes]],
    excluded: Set[str],
    mode: str,
) -> tuple[list[tuple[str, Finding]], list[str], int] | None:
    """The report of the run ``run_key`` over the files of ``digests`` (path as given -> digest of the bytes
    now), of which those of ``edited`` (path -> the digest of their bytes in the run before, their bytes now)
    changed, found from that run; kept under ``run_key``, with its basis and answers, so that the next edit
    finds it too. None when the run before is not kept, or an edited file may take part."""
    before = {**digests, **{path: old for path, (old, _) in edited.items()}}
    old_key = cache.run_key(before, excluded, mode)
    basis = cache.load_basis(old_key)
    if basis is None or not basis.involved.isdisjoint(edited):
        return None
    run = cache.load_run(old_key)
    if run is None:
        return None
    answers: answers_module.Answers | None = None  # the answers file, read for bytes the basis has none of
    tests: dict[tuple[str, tuple[str, ...]], scans.Test] = {}
    found: dict[str, dict[str, bool]] = {}
    for path, (old, source) in edited.items():
        kept: Mapping[str, object]
        if old in basis.answers:
            kept = basis.answers[old]
        else:
            answers = answers or answers_module.Answers(cache.root, cache.prefix)
            if answers.run != basis.answered:
                return None
            kept = answers.kept(old)
        found[digests[path]] = now = {}
        for kind, terms in basis.asked:
            asked = answers_module.question(kind, terms)
            if asked not in kept:
                # The run asked the old bytes only what their earlier answers led to: with each answer the
                # same, the new bytes are asked just what the old ones were.
                continue
            if (kind, terms) not in tests:
                try:
                    tests[kind, terms] = scans.test(kind, terms, once=True)
                except scans.UnknownQuestion:
                    return None
            now[asked] = tests[kind, terms](source)
            if now[asked] is not kept[asked]:
                return None
    cache.store_run(run_key, *run)
    # The answers of files edited since the answers file was written, kept with the basis of the run over them.
    present = set(digests.values())
    carried = {digest: kept for digest, kept in basis.answers.items() if digest in present}
    cache.store_basis(run_key, basis._replace(answers={**carried, **found}))
    return run
