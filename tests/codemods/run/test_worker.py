"""What a worker process runs for one file: its index (keeping the syntax tree for the migration to come)
and its migration, with the cyclic collector off meanwhile and as it was afterwards."""

from __future__ import annotations

import gc

import pytest

from vllm_attn_compat.codemods.engine import statements
from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy
from vllm_attn_compat.codemods.registry import all_rules
from vllm_attn_compat.codemods.run import worker
from vllm_attn_compat.codemods.run.report import FileError

SOURCE = b"""\
from vllm.v1.attention.backend import AttentionImpl


class MyImpl(AttentionImpl):
    def forward(self, layer, query, key, value, cache, metadata, output, output_scale=None, output_block_scale=None):
        assert output is not None
        return output.copy_(query)

    def __init__(self, *args):
        pass
"""


@pytest.fixture(autouse=True)
def _fresh_trees(monkeypatch):
    monkeypatch.setattr(statements, "_recent", type(statements._recent)())


@pytest.mark.parametrize("collecting", [True, False])
def test_the_collector_is_off_while_a_file_migrates_and_as_it_was_after(monkeypatch, collecting):
    index = worker.index_file(SOURCE, "plugin/impl.py")
    worker.setup(all_rules(), ClassHierarchy.build([index]), unsafe_fixes=False)
    seen = []
    real = worker._migrate

    def migrate(source, path, hierarchy, **options):
        seen.append(gc.isenabled())
        return real(source, path, hierarchy, **options)

    monkeypatch.setattr(worker, "_migrate", migrate)
    (gc.enable if collecting else gc.disable)()
    try:
        new, findings, _ = worker.migrate_file(SOURCE, "plugin/impl.py")
        assert b"assert output" not in new and [f.code for f in findings] == ["VAC001"]
        assert gc.isenabled() is collecting
        monkeypatch.setattr(worker, "_migrate", lambda *args, **kwargs: 1 / 0)  # a bug in a rule
        assert isinstance(worker.migrate_file(SOURCE, "plugin/impl.py"), FileError)
        assert gc.isenabled() is collecting and seen == [False, False]  # the file, then the safety re-run
    finally:
        gc.enable()
