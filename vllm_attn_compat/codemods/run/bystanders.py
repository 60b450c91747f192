"""A rerun after edits of files that took no part in the run: the report of the run before, found without
reading any other file.

Most commits to a fork change files that are neither attention code nor name it nor call into it: an entry
point, a cache manager, a model without attention layers, a test. The run over the tree before the edit read
such a file only to ask it the questions of `scans` (does it hold a rule's token, name vLLM, read the flag,
name an attention class found so far, may it use a method whose fix the call-site analysis decides, does it
need libcst), and no answer gave it a part: it was not indexed, scanned for classes, parsed or reported.
Every other use the run makes of a file goes through its path, which an edit keeps.

So when the edited bytes answer every question the run asked of the old bytes as they did, a run over the new
tree asks every file the same questions, in the same order, gets the same answers, builds the same class
hierarchy and reports the same findings: its report is the run before's. The run before's `cache.RunBasis`
says which files took part and which questions it asked, and holds the answers of the bytes of files edited
since the run that wrote the answers file (`answers`, which holds the others' and names that run: written by
another run since, it cannot serve).

A file added since takes no part either when it answers no to every question a run asks of every file
(a rule's token, the flag, each round's attention classes, each set of methods), is no ``__init__.py``
(which would change the module names of its folder's files) and no module where the run looked for a
class's definition by its files' paths. Anything else, an edited file that took part first of all, a file
deleted, is the runner's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Set
from typing import TYPE_CHECKING, NamedTuple

from vllm_attn_compat.codemods.run import answers as answers_module
from vllm_attn_compat.codemods.run import scans

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.findings import Finding
    from vllm_attn_compat.codemods.run.cache import Cache


# What a file added since the run is asked to tell that it takes no part: a run over the tree with it would
# ask it these, each round's and each set of methods' (if it held no rule's token, nothing else), and any
# answer yes would give it a part. (More than a run asks it: a yes to one it would not ask only costs a run.)
_ASKED_OF_A_NEW_FILE = frozenset({"prefilter", "flag", "words", "uses", "names"})


class Edits(NamedTuple):
    """The files whose bytes changed since the run (path -> the digest then, the bytes now), and the files new
    since (path -> bytes)."""

    edited: Mapping[str, tuple[str, bytes]]
    added: Mapping[str, bytes]


def derive(
    cache: Cache,
    run_key: str,
    digests: Mapping[str, str],
    edits: Edits,
    excluded: Set[str],
    mode: str,
) -> tuple[list[tuple[str, Finding]], list[str], int] | None:
    """The report of the run ``run_key`` over the files of ``digests`` (path as given -> digest of the bytes
    now), found from the run before ``edits``; kept under ``run_key``, with its basis, so that the next edit
    finds it too. None when the run before is not kept, or a file edited or added may take part."""
    before = {path: digest for path, digest in digests.items() if path not in edits.added}
    before.update((path, old) for path, (old, _) in edits.edited.items())
    old_key = cache.run_key(before, excluded, mode)
    basis = cache.load_basis(old_key)
    if basis is None or not basis.involved.isdisjoint(edits.edited):
        return None
    run = cache.load_run(old_key)
    if run is None:
        return None
    tests = _Tests()
    found: dict[str, dict[str, bool]] = {}
    answers: answers_module.Answers | None = None  # the answers file, read for bytes the basis has none of
    for path, (old, source) in edits.edited.items():
        kept: Mapping[str, object]
        if old in basis.answers:
            kept = basis.answers[old]
        else:
            answers = answers or answers_module.Answers(cache.root, cache.code)
            if answers.run != basis.answered:
                return None
            kept = answers.kept(old)
        # The run asked the old bytes only what their earlier answers led to: with each answer the same, the
        # new bytes are asked just what the old ones were.
        asked = [(kind, terms) for kind, terms in basis.asked if tests.question(kind, terms) in kept]
        now = tests.answers(asked, source)
        if now is None or any(answer is not kept[question] for question, answer in now.items()):
            return None
        found[digests[path]] = now
    for path, source in edits.added.items():
        if not _may_take_no_part(path, basis.looked_for):
            return None
        now = tests.answers([(kind, terms) for kind, terms in basis.asked if kind in _ASKED_OF_A_NEW_FILE], source)
        if now is None or any(now.values()):
            return None
        found[digests[path]] = now
    cache.store_run(run_key, *run)
    # The answers of files edited or added since the answers file was written, kept with the basis of the run.
    present = set(digests.values())
    carried = {digest: kept for digest, kept in basis.answers.items() if digest in present}
    cache.store_basis(run_key, basis._replace(answers={**carried, **found}))
    return run


def _may_take_no_part(path: str, looked_for: Set[str]) -> bool:
    """Whether a file new since the run may take no part in it for what its path says: no ``__init__.py`` (which
    makes the modules of the folder's files a package's, and so their names), and no module where the run
    looked for a class by its name (`rounds._defining_files`)."""
    from vllm_attn_compat.codemods.index.names import guess_module_name, may_define

    if os.path.basename(path) == "__init__.py":
        return False
    module = guess_module_name(path)
    return not any(may_define(module, name) for name in looked_for)


class _Tests:
    """The tests of the questions asked, and the questions as `answers` keeps them, each made once (`scans.test`,
    for a file or two)."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, tuple[str, ...]], scans.Test] = {}
        self._spelled: dict[tuple[str, tuple[str, ...]], str] = {}

    def question(self, kind: str, terms: tuple[str, ...]) -> str:
        """`answers.question` of ``kind`` and ``terms``."""
        if (kind, terms) not in self._spelled:
            self._spelled[kind, terms] = answers_module.question(kind, terms)
        return self._spelled[kind, terms]

    def answers(self, asked: Iterable[tuple[str, tuple[str, ...]]], source: bytes) -> dict[str, bool] | None:
        """The answer of ``source`` to each question (as `answers` keeps them); None for a question of a kind this
        version cannot ask (the run was another's)."""
        found = {}
        for kind, terms in asked:
            if (kind, terms) not in self._made:
                try:
                    self._made[kind, terms] = scans.test(kind, terms, once=True)
                except scans.UnknownQuestion:
                    return None
            found[self.question(kind, terms)] = self._made[kind, terms](source)
        return found
