"""A round's files go to the early workers as the class scan finds them, once the round is worth it."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.index.hierarchy import ModuleIndex
from vllm_attn_compat.codemods.registry import all_rules
from vllm_attn_compat.codemods.run import parallel, prefork, worker
from vllm_attn_compat.codemods.run.handoff import Handoff
from vllm_attn_compat.codemods.run.indexing import RoundIndexing

from runner_trees import IMPL


def _indexed(handoff: Handoff, count: int) -> dict[str, int | None]:
    """Index ``count`` files: the early worker each went to (by its path), None for those indexed here."""
    went: dict[str, int | None] = {}
    real = prefork.PreforkedWorker.submit

    def submit(self, key, function, arguments):
        went[key] = handoff.workers.index(self)
        real(self, key, function, arguments)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(prefork.PreforkedWorker, "submit", submit)
        indexing = RoundIndexing(2, handoff)
        paths = [f"impl{n}.py" for n in range(count)]
        for path in paths:
            indexing.add(path, IMPL.encode())
        outcomes = dict(indexing.outcomes())
    assert sorted(outcomes) == sorted(paths) and all(isinstance(o, ModuleIndex) for o in outcomes.values())
    return {path: went.get(path) for path in paths}


@pytest.fixture
def handoff():
    early = Handoff([prefork.PreforkedWorker(worker.no_setup) for _ in range(2)], all_rules(), False, limit=None)
    yield early
    for process in early.workers:
        process.close()


def test_a_round_of_a_few_files_is_indexed_here(handoff):
    """A rerun's round often has one file to index: this process does it at once, while the workers import."""
    assert set(_indexed(handoff, parallel.IN_PROCESS_BELOW - 1).values()) == {None}


def test_a_round_worth_it_goes_to_both_early_workers(handoff):
    assert set(_indexed(handoff, parallel.IN_PROCESS_BELOW + 4).values()) == {0, 1}


def test_a_round_without_two_early_workers_that_are_all_the_jobs_is_indexed_in_a_pool_or_here(handoff):
    indexing = RoundIndexing(3, handoff)  # a third job: the round's files wait for a pool
    for n in range(parallel.IN_PROCESS_BELOW + 1):
        indexing.add(f"impl{n}.py", IMPL.encode())
    assert not any(process.used for process in handoff.workers)
    assert len(dict(indexing.outcomes())) == parallel.IN_PROCESS_BELOW + 1
