"""The cache (`run/cache.py`): a warm run reports and writes what a cold one does, without libcst; any change a
file's result depends on misses, and only that; a rerun over unchanged files replays the report without reading
a file; a cache file that cannot be trusted is ignored with a warning and rewritten, never a crash."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from vllm_attn_compat import manifest
from vllm_attn_compat.codemods.cli import main
from vllm_attn_compat.codemods.run import cache as cache_module
from vllm_attn_compat.codemods.run import runner, worker
from vllm_attn_compat.codemods.run.runner import Options, run_paths
from vllm_attn_compat.codemods.target_version import target_for

from runner_trees import BASE, IMPL, IMPL_MIGRATED, MANUAL, UNRELATED, write_tree

STUB_VLLM = {
    "vllm/__init__.py": "",
    "vllm/v1/__init__.py": "",
    "vllm/v1/attention/__init__.py": "",
    "vllm/v1/attention/backend.py": "class AttentionImpl:\n    pass\n",
}

# A method with a fallback VAC002/VAC003 remove as safe fixes, while no call omits `output`.
PREFILL = """\
import torch
from vllm.v1.attention.backend import AttentionImpl


class PrefillImpl(AttentionImpl):
    def prefill(self, query, output=None):
        if output is None:
            output = torch.empty_like(query)
        output.copy_(query)
        return output
"""


WARM = "from plugin.prefill import PrefillImpl\n\n\ndef run(impl: PrefillImpl, q):\n    return {body}\n"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    write_tree(
        root,
        {
            **STUB_VLLM,
            "plugin/__init__.py": "",
            "plugin/base.py": BASE,
            "plugin/impl.py": IMPL,
            "plugin/manual.py": MANUAL,
            "plugin/prefill.py": PREFILL,
            "plugin/warm.py": WARM.format(body="q"),
        },
    )
    return root


# The files libcst migrates: not base.py, whose base class holds no rule's token and, completed by `MyImpl`, lacks
# nothing vLLM requires of a concrete class (VAC013 narrows its `class ` token: `Rule.narrows`).
MIGRATED = {"impl.py", "manual.py", "prefill.py"}


@pytest.fixture
def migrations(monkeypatch):
    """The paths libcst migrated in this process (jobs=1 runs everything here)."""
    done: list[str] = []
    real = worker.migrate_file

    def counted(source: bytes, path: str):
        done.append(os.path.basename(path))
        return real(source, path)

    monkeypatch.setattr(worker, "migrate_file", counted)
    return done


def _run(tree: Path, cache: Path, mode: str = "check", **options):
    report = run_paths([str(tree / "plugin")], Options(mode=mode, jobs=1, cache_dir=str(cache), **options))
    findings = sorted((os.path.basename(path), f) for path, f in report.findings)
    return findings, sorted(report.changed), report.errors


def test_a_warm_run_reports_what_the_cold_one_did_without_migrating_again(tree, tmp_path, migrations):
    cache = tmp_path / "cache"
    uncached = run_paths([str(tree / "plugin")], Options(mode="check", jobs=1))
    cold = _run(tree, cache)
    assert cold[0] == sorted((os.path.basename(p), f) for p, f in uncached.findings)
    assert cold[1] == sorted(uncached.changed)
    assert set(migrations) == MIGRATED
    migrations.clear()
    assert _run(tree, cache) == cold
    assert migrations == []


def test_write_mode_from_the_cache_writes_the_migrated_file(tree, tmp_path, migrations):
    cache = tmp_path / "cache"
    _run(tree, cache, mode="diff")  # diff mode fills the cache with rewrites that passed the safety checks
    migrations.clear()
    _, changed, errors = _run(tree, cache, mode="write")
    assert migrations == [] and not errors and len(changed) == 2
    assert (tree / "plugin/impl.py").read_text() == IMPL_MIGRATED


def test_write_mode_does_not_take_check_mode_s_unchecked_rewrites_from_the_cache(tree, tmp_path, migrations):
    cache = tmp_path / "cache"
    _run(tree, cache)  # `--check` writes nothing, so it skips the safety checks
    migrations.clear()
    _, changed, errors = _run(tree, cache, mode="write")
    assert set(migrations) == MIGRATED and not errors and len(changed) == 2
    assert (tree / "plugin/impl.py").read_text() == IMPL_MIGRATED


def test_a_changed_file_misses(tree, tmp_path, migrations):
    cache = tmp_path / "cache"
    cold, _, _ = _run(tree, cache)
    migrations.clear()
    (tree / "plugin/impl.py").write_text("# one more line\n" + IMPL)
    warm, _, _ = _run(tree, cache)
    assert "impl.py" in migrations
    lines = sorted(f.line for name, f in cold if name == "impl.py")
    assert sorted(f.line for name, f in warm if name == "impl.py") == [line + 1 for line in lines] != []


def test_a_change_in_another_file_that_withholds_a_fix_misses(tree, tmp_path, migrations):
    """The call-site analysis: a caller omitting `output` appears in another file; the cached safe fixes
    of `prefill` must not be replayed."""
    cache = tmp_path / "cache"
    cold, _, _ = _run(tree, cache)
    assert any(name == "prefill.py" and f.status.value == "fixed" for name, f in cold)
    (tree / "plugin/warm.py").write_text(WARM.format(body="impl.prefill(q)"))
    migrations.clear()
    warm, _, _ = _run(tree, cache)
    assert "prefill.py" in migrations
    assert not any(name == "prefill.py" and f.status.value == "fixed" for name, f in warm)
    assert any(name == "prefill.py" and "warm.py:" in f.message for name, f in warm)  # the caller, named


def test_a_change_in_an_excluded_caller_misses_too(tree, tmp_path, migrations):
    """An excluded file is read for its calls: its edit must reach the cached fixes it withholds."""
    cache = tmp_path / "cache"
    excluded = {"exclude": ("warm.py",), "base": str(tree)}
    cold, _, _ = _run(tree, cache, **excluded)
    assert any(name == "prefill.py" and f.status.value == "fixed" for name, f in cold)
    (tree / "plugin/warm.py").write_text(WARM.format(body="impl.prefill(q)"))
    migrations.clear()
    warm, _, _ = _run(tree, cache, **excluded)
    assert "prefill.py" in migrations and "warm.py" not in migrations
    assert not any(name == "prefill.py" and f.status.value == "fixed" for name, f in warm)
    assert not any(name == "warm.py" for name, _ in warm)  # excluded: nothing reported there


@pytest.mark.parametrize("excluded", [False, True])
def test_a_change_in_a_caller_importing_nothing_misses_too(tree, tmp_path, migrations, excluded):
    """A file naming neither vLLM nor the class (``engine.impl.prefill(q)``) is read for its calls, cached
    indexes or not: its edit must reach the cached fixes it withholds."""
    cache = tmp_path / "cache"
    options = {"exclude": ("engine.py",), "base": str(tree)} if excluded else {}
    write_tree(tree, {"plugin/engine.py": "def run(engine, q):\n    return q\n"})
    cold, _, _ = _run(tree, cache, **options)
    assert any(name == "prefill.py" and f.status.value == "fixed" for name, f in cold)
    write_tree(tree, {"plugin/engine.py": "def run(engine, q):\n    return engine.impl.prefill(q)\n"})
    migrations.clear()
    warm, _, _ = _run(tree, cache, **options)
    assert "prefill.py" in migrations and "engine.py" not in migrations
    assert not any(name == "prefill.py" and f.status.value == "fixed" for name, f in warm)
    assert [f.line for name, f in warm if name == "engine.py"] == []  # named by the fixes' findings
    assert any(name == "prefill.py" and "engine.py:2" in f.message for name, f in warm)


@pytest.mark.parametrize("options", [{"unsafe_fixes": True}, {"ignore": ("VAC003",)}, {"old_op_calls": "forwarder"}])
def test_other_rules_or_options_miss(tree, tmp_path, migrations, options):
    cache = tmp_path / "cache"
    _run(tree, cache)
    migrations.clear()
    _run(tree, cache, **options)
    assert set(migrations) == MIGRATED


def _cache_file(cache: Path) -> Path:
    [found] = (cache / "vllm-attn-compat").glob("*.json")
    return found


def _lines(cache: Path) -> tuple[dict, dict]:
    """The cache file's two lines: the key, statuses and report; the files' results."""
    first, second = _cache_file(cache).read_text().splitlines()
    return json.loads(first), json.loads(second)


def _without_report(path: Path, results: str) -> None:
    """The cache file with no report to replay (the results are read) and ``results`` as its second line."""
    head = json.loads(path.read_text().splitlines()[0])
    path.write_text(json.dumps({**head, "run": None}) + "\n" + results + "\n")


def _spoil_results(path: Path) -> None:
    """A well-formed file whose results hold a value of the wrong shape."""
    results = json.loads(path.read_text().splitlines()[1])
    for entry in results.values():
        if "index" in entry:
            entry["index"]["classes"] = [[1, "x"]]
        if "migration" in entry:
            entry["migration"]["answers"] = [["is_attention_class", "plugin.impl.MyImpl", True]]  # no list
    _without_report(path, json.dumps(results))


@pytest.mark.parametrize(
    ("spoil", "warned"),
    [
        (lambda path: path.write_bytes(b"\x80\x00 not json"), True),
        (lambda path: path.write_text("[]"), True),
        (lambda path: path.write_text(path.read_text().replace('"statuses":{', '"statuses":{"x":1,', 1)), True),
        (lambda path: _without_report(path, "{not json"), True),
        (_spoil_results, True),
        (lambda path: path.write_text(path.read_text().replace("vllm-attn-compat-cache/", "other/", 1)), True),
        # Made by another version of this package or for another project: not ours to read, said nothing of.
        (lambda path: path.write_text(path.read_text().replace('"root":"', '"root":"/elsewhere', 1)), False),
    ],
    ids=["not-json", "not-a-cache", "malformed-status", "results-not-json", "malformed-results", "other-format",
         "foreign-key"],
)  # fmt: skip
def test_a_cache_file_not_trusted_is_ignored_and_rewritten(tree, tmp_path, migrations, indexed, capsys, spoil, warned):
    cache = tmp_path / "cache"
    cold = _run(tree, cache)
    spoil(_cache_file(cache))
    capsys.readouterr()
    migrations.clear()
    indexed.clear()
    assert _run(tree, cache) == cold
    assert set(migrations) == MIGRATED and len(indexed) == 5
    assert capsys.readouterr().err.count("warning: the cache file") == warned
    migrations.clear()
    indexed.clear()
    assert _run(tree, cache) == cold and migrations == indexed == []  # rewritten
    assert not capsys.readouterr().err


def test_the_cache_is_one_json_file_of_the_project_keyed_by_the_code_and_settings(tree, tmp_path):
    cache = tmp_path / "cache"
    _run(tree, cache)
    [folder] = [path for path in cache.iterdir() if path.is_dir()]
    assert sorted(path.name for path in cache.iterdir()) == [".gitignore", "CACHEDIR.TAG", "vllm-attn-compat"]
    assert len(list(folder.iterdir())) == 1
    head, results = _lines(cache)
    assert head["key"]["root"] == os.path.abspath(".")
    assert head["key"]["settings"] == [[], [], False, "with-output", [manifest.newest(), None]]
    code = {row[0] for row in head["key"]["code"][4]}
    assert code >= {os.path.join("codemods", "cli.py"), os.path.join("codemods", "run", "cache.py")}
    assert code >= {os.path.join("manifest", "attention_api.json"), os.path.join("manifest", "releases.txt")}
    impl = str((tree / "plugin/impl.py").resolve())
    assert results[impl]["where"] == [str(tree / "plugin/impl.py"), "plugin.impl"]  # what its index was made for
    assert {"answers", "index", "migration"} <= set(results[impl])


def test_a_change_of_this_package_s_code_is_a_change_of_key(tree, tmp_path, migrations, monkeypatch):
    cache = tmp_path / "cache"
    _run(tree, cache)
    real = cache_module.code_key
    monkeypatch.setattr(cache_module, "code_key", lambda: [*real()[:4], [["cli.py", 1, 2]]])
    migrations.clear()
    _run(tree, cache)
    assert set(migrations) == MIGRATED


def test_a_change_of_target_is_a_change_of_key(tree, tmp_path, migrations):
    # The rules' findings depend on the release targeted: another target replays nothing of the last one.
    cache = tmp_path / "cache"
    options = Options(mode="check", jobs=1, cache_dir=str(cache))
    run_paths([str(tree / "plugin")], options._replace(target=target_for(str(tree), explicit="0.34")))
    migrations.clear()
    run_paths([str(tree / "plugin")], options._replace(target=target_for(str(tree), explicit="0.27")))
    assert set(migrations) == MIGRATED
    migrations.clear()
    run_paths([str(tree / "plugin")], options._replace(target=target_for(str(tree), explicit="0.27")))
    assert migrations == []


def _uncached(tree: Path):
    report = run_paths([str(tree / "plugin")], Options(mode="check", jobs=1))
    return sorted((os.path.basename(path), f) for path, f in report.findings), sorted(report.changed), report.errors


# Edits of one file, each with the files indexed again after it and those libcst migrates again (the
# others' entries serve).
EDITS = {
    # Lines shift in a file whose classes and calls no other file's migration asks about.
    "manual-moved": ("plugin/manual.py", "# moved down\n" + MANUAL, ["manual.py"], {"manual.py"}),
    # A caller omitting `output` appears: `prefill`'s safe fixes are withheld from now on.
    "caller-added": ("plugin/warm.py", WARM.format(body="impl.prefill(q)"), ["warm.py"], {"prefill.py"}),
    # The base class no longer derives from vLLM's (nor mentions it: no index): `MyImpl` is no attention class.
    "base-unrelated": ("plugin/base.py", "class PluginImplBase:\n    pass\n", [], set()),
    # A comment in the base: its index changes nothing anyone asks.
    "base-comment": ("plugin/base.py", "# the plugin's base\n" + BASE, ["base.py"], set()),
}


@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
def test_after_an_edit_a_warm_run_reports_what_an_uncached_one_does_and_migrates_only_what_it_changed(
    tree, tmp_path, migrations, indexed, edit
):
    cache = tmp_path / "cache"
    _run(tree, cache)
    relative, text, indexed_again, migrated_again = EDITS[edit]
    (tree / relative).write_text(text)
    expected = _uncached(tree)
    migrations.clear()
    indexed.clear()
    assert _run(tree, cache) == expected
    assert indexed == indexed_again  # every other file's index came from the cache
    assert set(migrations) == migrated_again


DECODE = """

    def decode(self, query, output=None):
        if output is None:
            output = torch.empty_like(query)
        output.copy_(query)
        return output
"""


def test_an_edit_giving_a_method_output_indexes_the_files_calling_it_again(tree, tmp_path, indexed):
    """An index records the uses of the methods the run reads alone (`calls.CallIndex.names`): once an edit gives
    another method `output`, the files not edited that call it are indexed again, and their calls withhold its
    fixes as in a run without the cache; the others' indexes come from the cache."""
    (tree / "plugin/warm.py").write_text(WARM.format(body="impl.decode(q)"))
    cache = tmp_path / "cache"
    before = _run(tree, cache)
    assert not [finding for name, finding in before[0] if "warm.py:" in finding.message]  # no `output` yet
    (tree / "plugin/prefill.py").write_text(PREFILL + DECODE)
    expected = _uncached(tree)
    indexed.clear()
    assert _run(tree, cache) == expected
    assert sorted(indexed) == ["prefill.py", "warm.py"]  # the caller's index did not record `decode`
    named = [finding for name, finding in expected[0] if "warm.py:" in finding.message]
    assert named and all("`impl.decode(...)` at " in finding.message for finding in named)


def test_an_index_kept_records_the_uses_of_the_methods_the_run_reads_alone(tree, tmp_path):
    """What a run keeps of a file's attribute uses: those of the run's methods taking `output` (and the members
    whose parameters some release changed), with the names of all it uses, to index it again if one joins them."""
    (tree / "plugin/warm.py").write_text(WARM.format(body="impl.prefill(q).view(-1)"))
    cache = tmp_path / "cache"
    _run(tree, cache)
    kept = _lines(cache)[1][str((tree / "plugin/warm.py").resolve())]["index"]
    assert kept["uses"][0] == ["prefill"] and "prefill" in kept["names"] and "view" not in kept["names"]
    assert {"prefill", "view"} <= set(kept["attributes"])


def test_an_index_kept_that_is_not_valid_is_made_again_with_a_warning(tree, tmp_path, capsys):
    """A spoiled entry (one column of uses short) costs the file its index, not the run: the file is indexed
    again, the run says once why, and reports what a run without the cache reports."""
    (tree / "plugin/warm.py").write_text(WARM.format(body="impl.prefill(q)"))
    cache = tmp_path / "cache"
    _run(tree, cache)
    path = _cache_file(cache)
    first, second = path.read_text().splitlines()
    results = json.loads(second)
    results[str((tree / "plugin/warm.py").resolve())]["index"]["uses"].pop()
    path.write_text(first + "\n" + json.dumps(results) + "\n")
    (tree / "plugin/prefill.py").write_text(PREFILL + DECODE)  # (a rerun that replays nothing)
    capsys.readouterr()
    assert _run(tree, cache) == _uncached(tree)
    error = capsys.readouterr().err
    assert f"warning: the cache file {path} holds an index that is not valid (expected 21 columns of Use" in error


def test_an_index_entry_serves_only_the_module_its_folders_make_of_the_file(tree, tmp_path, indexed):
    cache = tmp_path / "cache"
    _run(tree, cache)
    (tree / "plugin/__init__.py").unlink()  # `plugin.impl` is now the module `impl` (the next run asks afresh)
    indexed.clear()
    warm = _run(tree, cache)
    assert sorted(indexed) == ["base.py", "impl.py", "manual.py", "prefill.py", "warm.py"]
    assert warm == _uncached(tree)


def test_an_index_kept_serves_only_the_path_the_file_is_given_as(tree, tmp_path, indexed, monkeypatch):
    cache = tmp_path / "cache"
    _run(tree, cache)
    monkeypatch.chdir(tree)  # the same files, given by other paths: their indexes record the paths
    indexed.clear()
    report = run_paths(["plugin"], Options(mode="check", jobs=1, cache_dir=str(cache)))
    assert sorted(indexed) == ["base.py", "impl.py", "manual.py", "prefill.py", "warm.py"]
    uncached = run_paths(["plugin"], Options(mode="check", jobs=1))
    assert (sorted(report.findings), report.changed) == (sorted(uncached.findings), uncached.changed)


def test_the_command_line_option(tree, tmp_path, capsys):
    cache = tmp_path / "cache"
    assert main(["migrate", "--check", "--cache-dir", str(cache), str(tree / "plugin")]) == 1
    cold = capsys.readouterr().out
    assert _cache_file(cache).is_file()
    assert main(["migrate", "--check", "--cache-dir", str(cache), str(tree / "plugin")]) == 1
    assert capsys.readouterr().out == cold


def test_a_rerun_over_the_same_files_replays_the_run_without_any_parse(tree, tmp_path, migrations, indexed):
    cache = tmp_path / "cache"
    cold = _run(tree, cache)
    assert indexed and migrations
    indexed.clear()
    migrations.clear()
    assert _run(tree, cache) == cold
    assert indexed == [] and migrations == []


def test_a_run_given_the_paths_otherwise_or_in_another_mode_is_not_replayed(
    tree, tmp_path, migrations, indexed, monkeypatch
):
    cache = tmp_path / "cache"
    cold = _run(tree, cache)
    indexed.clear()
    monkeypatch.chdir(tree)  # the same files, reported by other paths
    report = run_paths(["plugin"], Options(mode="check", jobs=1, cache_dir=str(cache)))
    assert min(report.findings)[0].startswith("plugin" + os.sep)  # not replayed: reported by the new paths
    assert [f for _, f in sorted(report.findings)] == [f for _, f in sorted(cold[0])]
    indexed.clear()
    migrations.clear()
    _run(tree, cache, mode="diff")
    assert migrations  # check mode's entries are unchecked rewrites: they serve check runs only
    indexed.clear()
    migrations.clear()
    _run(tree, cache, mode="write")
    assert migrations == []  # diff mode's entries passed the safety checks: they serve writes too


def test_a_run_with_an_error_is_never_replayed(tree, tmp_path, indexed):
    cache = tmp_path / "cache"
    broken = "from vllm.v1.attention.backend import AttentionImpl\n\n\nclass Broken(AttentionImpl):\n    x = (\n"
    (tree / "plugin/broken.py").write_text(broken)
    for _ in range(2):
        _, _, errors = _run(tree, cache)
        assert [os.path.basename(error.path) for error in errors] == ["broken.py"]
    assert indexed.count("broken.py") == 2


def test_a_cache_folder_that_cannot_be_used_costs_the_cache_and_one_warning(tree, tmp_path, capsys):
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "vllm-attn-compat").write_text("a file where the cache's folder should be")
    assert _run(tree, blocked) == _uncached(tree)
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1, warnings  # (it cannot be read either: said once)
    assert "cannot be" in warnings[0] and "the run goes on without it" in warnings[0]


# --- the runs users repeat: a rerun over unchanged files replays the report without reading any ---


@pytest.fixture
def settled(monkeypatch) -> None:
    """Files written by a test are "racy" for `cache.RACY_NS`: trusted at once here, the worst case for staleness."""
    monkeypatch.setattr(cache_module, "RACY_NS", 0)


def _checked(cache: Path, **more) -> Options:
    return Options(**{"mode": "check", "jobs": 1, "cache_dir": str(cache), **more})


def _outcome(report):
    """Everything a run reports, in an order that does not depend on the run's."""
    return sorted(report.findings), sorted(report.changed), sorted(report.errors), report.scanned, report.parsed


def _replayed(tree: Path, options: Options, monkeypatch) -> bool:
    """Whether a run of ``options`` over ``tree`` replays the report (no run after the replay is tried)."""
    runs = []
    real = runner._run
    monkeypatch.setattr(runner, "_run", lambda *args, **kwargs: runs.append(1) or real(*args, **kwargs))
    run_paths([str(tree)], options)
    monkeypatch.setattr(runner, "_run", real)
    return not runs


def test_a_rerun_over_unchanged_files_reads_none_and_reports_the_same(tree, tmp_path, reads, settled):
    options = _checked(tmp_path / "cache")
    cold = _outcome(run_paths([str(tree)], options))
    assert reads
    reads.clear()
    assert _outcome(run_paths([str(tree)], options)) == cold
    assert reads == []


def test_a_tree_with_nothing_to_migrate_is_replayed_too(tmp_path, reads, settled, monkeypatch):
    tree = write_tree(tmp_path / "plain", {f"pkg/m{n}.py": UNRELATED for n in range(5)})
    options = _checked(tmp_path / "cache")
    assert _outcome(run_paths([str(tree)], options)) == ([], [], [], 5, 0)
    reads.clear()
    assert _replayed(tree, options, monkeypatch) and reads == []


def test_files_whose_status_changed_but_not_their_bytes_are_read_and_the_run_replayed(
    tree, tmp_path, reads, settled, monkeypatch
):
    options = _checked(tmp_path / "cache")
    run_paths([str(tree)], options)  # a first run hashes nothing: each file's next change is told by its status
    impl = tree / "plugin/impl.py"
    for hours in (1, 2):  # `touch`, or a checkout writing the same bytes back
        earlier = time.time_ns() - hours * 3600 * 10**9
        os.utime(impl, ns=(earlier, earlier))
        reads.clear()
        # The first time, the cache knows no digest of its bytes: the run reads it (alone), and takes its digest.
        assert _replayed(tree, options, monkeypatch) == (hours == 2)
        assert reads == ["impl.py"]
    reads.clear()
    assert _replayed(tree, options, monkeypatch) and reads == []  # its new status was recorded


def _edit(path: Path, text: str) -> None:
    """Write ``text`` with a status unlike the one before (a later ``mtime_ns``, whatever the clock's grain)."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    later = max(path.stat().st_mtime_ns, before + 10**9)
    os.utime(path, ns=(later, later))


@pytest.mark.parametrize(
    "change",
    [
        lambda tree: (tree / "plugin/impl.py").write_text(IMPL.replace("is not None", "is not Nope")),  # same size
        lambda tree: (tree / "plugin/new.py").write_text(IMPL),
        lambda tree: (tree / "plugin/manual.py").unlink(),
        lambda tree: (tree / "plugin/base.py").write_text("class PluginImplBase:\n    pass\n"),
    ],
    ids=["same-size-edit", "file-added", "file-removed", "base-edited"],
)
def test_any_change_misses_and_the_run_reports_what_an_uncached_run_does(tree, tmp_path, settled, monkeypatch, change):
    options = _checked(tmp_path / "cache")
    run_paths([str(tree)], options)
    change(tree)
    uncached = _outcome(run_paths([str(tree)], Options(mode="check", jobs=1)))
    assert not _replayed(tree, options, monkeypatch)
    assert _outcome(run_paths([str(tree)], options)) == uncached


def test_an_edit_restoring_the_mtime_to_the_nanosecond_is_seen_by_the_ctime(tree, tmp_path, settled, monkeypatch):
    options = _checked(tmp_path / "cache")
    run_paths([str(tree)], options)
    impl = tree / "plugin/impl.py"
    before = impl.stat()
    time.sleep(0.01)
    impl.write_text(IMPL.replace("is not None", "is not Nope"))  # the same size
    os.utime(impl, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert not _replayed(tree, options, monkeypatch)


def test_options_mode_and_excludes_key_the_run(tree, tmp_path, settled, monkeypatch):
    cache = tmp_path / "cache"
    run_paths([str(tree)], _checked(cache))
    assert _replayed(tree, _checked(cache), monkeypatch)
    assert not _replayed(tree, _checked(cache, mode="diff"), monkeypatch)
    for other in ({"select": ("VAC001",)}, {"unsafe_fixes": True}, {"exclude": ("impl.py",), "base": str(tree)}):
        run_paths([str(tree)], _checked(cache))
        assert not _replayed(tree, _checked(cache, **other), monkeypatch), other


def test_an_edit_of_an_excluded_file_misses(tree, tmp_path, settled, monkeypatch):
    options = _checked(tmp_path / "cache", exclude=("base.py",), base=str(tree))
    run_paths([str(tree)], options)
    assert _replayed(tree, options, monkeypatch)
    _edit(tree / "plugin/base.py", "class PluginImplBase:\n    pass\n")
    assert not _replayed(tree, options, monkeypatch)


def test_a_file_that_cannot_be_read_as_source_is_never_replayed_over(tree, tmp_path, settled, monkeypatch):
    (tree / "plugin/binary.py").write_bytes(b"x = 1\n\0")
    options = _checked(tmp_path / "cache")
    first = _outcome(run_paths([str(tree)], options))
    assert [error.path for error in first[2]] == [str(tree / "plugin/binary.py")]
    assert not _replayed(tree, options, monkeypatch)  # the run reads it, and reports it again
    assert _outcome(run_paths([str(tree)], options)) == first


def test_a_racy_file_is_not_trusted_by_its_status_next_time(tree, tmp_path, reads, monkeypatch):
    monkeypatch.setattr(cache_module, "RACY_NS", 3600 * 10**9)  # every file was modified "just now"
    options = _checked(tmp_path / "cache")
    cold = _outcome(run_paths([str(tree)], options))
    every = sorted(path.name for path in tree.rglob("*.py"))
    for _ in range(2):  # no status is trusted: each file is read and hashed again, and found to be the same
        reads.clear()
        assert _replayed(tree, options, monkeypatch) and sorted(reads) == every
    monkeypatch.setattr(cache_module, "RACY_NS", 0)  # old enough now: read, hashed, the statuses kept
    assert _outcome(run_paths([str(tree)], options)) == cold
    reads.clear()
    assert _replayed(tree, options, monkeypatch) and reads == []


@pytest.mark.parametrize("mode", ["check", "diff"])
def test_a_rerun_after_an_edit_reads_only_the_files_whose_bytes_it_needs(tree, tmp_path, reads, settled, mode):
    """A file that takes part edited: the others' answers and results are kept, so their bytes are not read again
    (a ``--diff`` reads those it shows a diff of); the report is an uncached run's."""
    options = _checked(tmp_path / "cache", mode=mode)
    run_paths([str(tree)], options)
    _edit(tree / "plugin/manual.py", "# edited\n" + MANUAL)
    reads.clear()
    report = run_paths([str(tree)], options)
    assert sorted(reads) == (["manual.py"] if mode == "check" else ["impl.py", "manual.py", "prefill.py"])
    assert _outcome(report) == _outcome(run_paths([str(tree)], Options(mode=mode, jobs=1)))


@pytest.mark.parametrize(("before", "after"), [("check", "diff"), ("diff", "check")])
def test_after_a_run_in_another_mode_a_rerun_indexes_only_the_file_edited(
    tree, tmp_path, indexed, settled, before, after
):
    """What a run asks of a file's bytes and its class index depend on neither mode nor options: a ``--check``
    in pre-commit after a ``--diff`` (and the other way round) indexes the edited file alone."""
    cache = tmp_path / "cache"
    run_paths([str(tree)], _checked(cache, mode=before))
    _edit(tree / "plugin/impl.py", IMPL.replace("# the buffer comes from the layer", "# edited"))
    indexed.clear()
    report = run_paths([str(tree)], _checked(cache, mode=after))
    assert indexed == ["impl.py"]
    assert _outcome(report) == _outcome(run_paths([str(tree)], Options(mode=after, jobs=1)))


def test_a_run_that_writes_reads_every_file_before_writing_any(tree, tmp_path, reads, settled):
    cache = tmp_path / "cache"
    run_paths([str(tree)], _checked(cache))
    _edit(tree / "plugin/manual.py", MANUAL + "\n# edited\n")
    reads.clear()
    run_paths([str(tree)], _checked(cache, mode="write"))
    assert sorted(reads) == sorted(p.name for p in tree.rglob("*.py"))


def test_a_file_edited_during_a_rerun_has_the_run_start_again_reading_every_file(tree, tmp_path, settled, monkeypatch):
    """The run trusted a file by its status; it changes before the run asks for its bytes (to show its diff): what
    was asked of it may mix two versions, so the run reads every file anew (`reading.Changed`)."""
    from vllm_attn_compat.codemods.run import rounds

    options = _checked(tmp_path / "cache", mode="diff")
    first = run_paths([str(tree)], options)  # (a diff that shows changes is no report to replay)
    assert any(path.endswith("impl.py") for path in first.changed)
    real_build, real_run = rounds.build_hierarchy, runner._run
    runs = []

    def build(*args):
        if len(runs) == 1:
            _edit(
                tree / "plugin/impl.py",
                IMPL.replace('assert output is not None, "Output tensor must be provided."', ""),
            )
        return real_build(*args)

    def counted(*args, trusting):
        runs.append(trusting)
        return real_run(*args, trusting=trusting)

    monkeypatch.setattr(rounds, "build_hierarchy", build)
    monkeypatch.setattr(runner, "_run", counted)
    report = run_paths([str(tree)], options)
    assert runs == [True, False]
    assert _outcome(report) == _outcome(run_paths([str(tree)], Options(mode="diff", jobs=1)))
    assert not any(path.endswith("impl.py") for path in report.changed)  # its assert is gone: the new bytes


def test_after_an_edit_the_class_scan_reads_the_edited_file_alone(tree, tmp_path, settled, monkeypatch):
    """What the class scan made of a file is kept with its results, for the module the file is (it is asked again
    of a file whose module changed): after an edit that changes no attention class, only the edited file is
    scanned again."""
    from vllm_attn_compat.codemods.index import classscan

    options = _checked(tmp_path / "cache")
    scanned: list[str] = []
    real = classscan.quick_index

    def counted(source, path, known):
        scanned.append(os.path.basename(path))
        return real(source, path, known)

    monkeypatch.setattr(classscan, "quick_index", counted)
    spared = "from vllm.v1.attention.backend import AttentionImpl\n\n\nclass Plain:\n    pass\n"
    write_tree(tree, {"plugin/spared.py": spared})  # the scan spares its parse: it has a class, none of vLLM's
    run_paths([str(tree)], options)
    assert "spared.py" in scanned
    _edit(tree / "plugin/manual.py", "# edited\n" + MANUAL)
    scanned.clear()
    report = run_paths([str(tree)], options)
    assert scanned == ["manual.py"]
    assert _outcome(report) == _outcome(run_paths([str(tree)], Options(mode="check", jobs=1)))


def test_a_rerun_after_an_edit_asks_about_the_edited_file_first(tree, tmp_path, settled, monkeypatch):
    """The file the cache holds nothing of goes to the worker before the run looks at the files whose migrations it
    replays (a rerun's critical path), and the report is the one a run without the cache makes."""
    cache = tmp_path / "cache"
    run_paths([str(tree)], _checked(cache))
    _edit(tree / "plugin/prefill.py", PREFILL + "\n# edited\n")
    asked: list[str] = []
    real = runner._Migration._needs_libcst

    def asking(self, f, index, hierarchy):
        asked.append(os.path.basename(f.path))
        return real(self, f, index, hierarchy)

    monkeypatch.setattr(runner._Migration, "_needs_libcst", asking)
    report = run_paths([str(tree)], _checked(cache))
    assert asked[0] == "prefill.py" and {"impl.py", "manual.py"} <= set(asked)
    assert _outcome(report) == _outcome(run_paths([str(tree)], Options(mode="check", jobs=1)))
