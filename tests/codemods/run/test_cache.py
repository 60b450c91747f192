"""The opt-in result cache: a warm run reports and writes what a cold one does, without libcst; any change
a file's result depends on misses, and only that; an entry not trusted is ignored with a warning."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from vllm_attn_compat.codemods.cli import main
from vllm_attn_compat.codemods.run import cache as cache_module
from vllm_attn_compat.codemods.run import worker
from vllm_attn_compat.codemods.run.runner import Options, run_paths

from runner_trees import BASE, IMPL, IMPL_MIGRATED, MANUAL, write_tree

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
    assert set(migrations) == {"impl.py", "manual.py", "prefill.py"}
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
    assert set(migrations) == {"impl.py", "manual.py", "prefill.py"} and not errors and len(changed) == 2
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
    assert set(migrations) == {"impl.py", "manual.py", "prefill.py"}


def _entries(cache: Path) -> list[Path]:
    """The entries (named by their key), not the status table, the pruning marker nor the folder's tags."""
    return sorted(path for path in cache.rglob("*") if path.is_file() and re.fullmatch("[0-9a-f]{64}", path.name))


def _spoil_shape(path: Path) -> None:
    """A well-formed entry of its kind with one value of the wrong shape."""
    entry = json.loads(path.read_text())
    if entry["kind"] == "index":
        entry["index"]["uses"] = [[1, "x"]]
    elif entry["kind"] == "file":
        entry["migrations"][0]["answers"] = [["is_attention_class", "plugin.impl.MyImpl", True]]  # no list
    else:
        entry["findings"] = [[1, "x"]]
    path.write_text(json.dumps(entry))


@pytest.mark.parametrize(
    "spoil",
    [
        lambda path: path.write_bytes(b"\x80\x00 not json"),
        lambda path: path.write_text("[]"),
        lambda path: path.write_text(json.dumps({**json.loads(path.read_text()), "key": "0" * 64})),  # foreign
        _spoil_shape,
        lambda path: path.write_text(json.dumps({**json.loads(path.read_text()), "format": "other/9"})),
    ],
    ids=["not-json", "not-an-entry", "foreign-key", "malformed", "other-format"],
)
def test_an_entry_not_trusted_is_ignored_with_a_warning(tree, tmp_path, migrations, indexed, capsys, spoil):
    cache = tmp_path / "cache"
    cold = _run(tree, cache)
    entries = _entries(cache)
    kinds = {entry: json.loads(entry.read_text())["kind"] for entry in entries}
    # The files migrated and indexed (three mentioning vLLM, then two naming an attention class), the run and
    # what it rests on (read by a rerun after an edit: `test_bystanders`).
    assert sorted(kinds.values()) == ["basis"] + ["file"] * 3 + ["index"] * 5 + ["run"]
    entries = [entry for entry in entries if kinds[entry] != "basis"]
    for entry in entries:
        spoil(entry)
    capsys.readouterr()
    migrations.clear()
    indexed.clear()
    assert _run(tree, cache) == cold
    assert set(migrations) == {"impl.py", "manual.py", "prefill.py"} and len(indexed) == 5
    assert capsys.readouterr().err.count("warning: ignoring the cache entry") == len(entries)
    migrations.clear()
    indexed.clear()
    assert _run(tree, cache) == cold and migrations == indexed == []  # rewritten


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


def test_an_edit_giving_a_method_output_reads_its_calls_from_the_indexes_kept(tree, tmp_path, indexed):
    """An index kept in the cache holds ready only the uses of the methods the run before read (`records`): once
    an edit gives another method `output`, its calls in the files not edited come from the rest of their
    indexes, and withhold its fixes as in a run without the cache."""
    (tree / "plugin/warm.py").write_text(WARM.format(body="impl.decode(q)"))
    cache = tmp_path / "cache"
    before = _run(tree, cache)
    assert not [finding for name, finding in before[0] if "warm.py:" in finding.message]  # no `output` yet
    (tree / "plugin/prefill.py").write_text(PREFILL + DECODE)
    expected = _uncached(tree)
    indexed.clear()
    assert _run(tree, cache) == expected
    assert indexed == ["prefill.py"]  # the caller's index came from the cache
    named = [finding for name, finding in expected[0] if "warm.py:" in finding.message]
    assert named and all("`impl.decode(...)` at " in finding.message for finding in named)


def _index_path(entry: Path) -> str:
    """The path of the file whose index the entry keeps, if it keeps one."""
    return json.loads(entry.read_text()).get("index", {}).get("path", "")


def test_uses_kept_that_turn_out_not_to_be_valid_stop_the_run_before_it_writes(tree, tmp_path, capsys):
    """Read only once a run asks for them, after the entry was taken: the run stops, naming the file, and writes
    nothing (the analysis comes before any write)."""
    (tree / "plugin/warm.py").write_text(WARM.format(body="impl.decode(q)"))
    cache = tmp_path / "cache"
    command = ["migrate", "--cache-dir", str(cache), str(tree / "plugin")]
    assert main(command) == 1  # (a run that writes keeps entries apart from `--check`'s: it verifies its fixes)
    [entry] = [path for path in _entries(cache) if _index_path(path).endswith("/warm.py")]
    spoiled = json.loads(entry.read_text())
    spoiled["index"]["other_uses"] = '[[0], ["decode"]]'  # a column, where there are 19
    entry.write_text(json.dumps(spoiled))
    (tree / "plugin/prefill.py").write_text(PREFILL + DECODE)
    files = {path: path.read_bytes() for path in tree.rglob("*.py")}
    capsys.readouterr()
    assert main(command) == 2
    error = capsys.readouterr().err
    assert f"error: the class index kept in {entry} is not valid (expected 21 columns of Use values" in error
    assert "delete the file, or run with --no-cache" in error
    assert {path: path.read_bytes() for path in tree.rglob("*.py")} == files


def test_an_index_kept_holds_ready_the_uses_of_the_methods_the_run_read(tree, tmp_path):
    """What a rerun reads of a kept index at once: the uses of the run's methods taking `output`, no other."""
    (tree / "plugin/warm.py").write_text(WARM.format(body="impl.prefill(q).view(-1)"))
    cache = tmp_path / "cache"
    _run(tree, cache)
    [entry] = [path for path in _entries(cache) if _index_path(path).endswith("/warm.py")]
    kept = json.loads(entry.read_text())["index"]
    assert kept["uses"][1] == ["prefill"] and kept["other_names"] == ["view"]


def test_an_index_entry_serves_only_the_module_its_folders_make_of_the_file(tree, tmp_path, indexed):
    cache = tmp_path / "cache"
    _run(tree, cache)
    (tree / "plugin/__init__.py").unlink()  # `plugin.impl` is now the module `impl` (the next run asks afresh)
    indexed.clear()
    warm = _run(tree, cache)
    assert sorted(indexed) == ["base.py", "impl.py", "manual.py", "prefill.py", "warm.py"]
    assert warm == _uncached(tree)


def test_the_command_line_option(tree, tmp_path, capsys):
    cache = tmp_path / "cache"
    assert main(["migrate", "--check", "--cache-dir", str(cache), str(tree / "plugin")]) == 1
    cold = capsys.readouterr().out
    assert _entries(cache)
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


def test_a_cache_folder_that_cannot_be_used_costs_the_cache_and_two_warnings(tree, tmp_path, capsys):
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "vllm-attn-compat").write_text("a file where the cache's folder should be")
    assert _run(tree, blocked) == _uncached(tree)
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 2, warnings  # not one per entry: a run looks up and writes dozens
    assert "cannot be read" in warnings[0] and "ignored without another warning" in warnings[0]
    assert "cannot be written" in warnings[1] and "this run writes no more entries" in warnings[1]


def test_trees_that_alternate_each_find_their_migration_of_a_file_they_share(tree, tmp_path, migrations):
    """Two branches share `prefill.py`, but in one a caller withholds its safe fixes. Once each has run,
    switching back and forth never migrates it again (each switch edits `manual.py` too, so that no run is
    replayed whole)."""
    cache = tmp_path / "cache"
    callers = {"main": WARM.format(body="q"), "feature": WARM.format(body="impl.prefill(q)")}
    for switch, branch in enumerate(["main", "feature", "main", "feature", "main"]):
        (tree / "plugin/warm.py").write_text(callers[branch])
        (tree / "plugin/manual.py").write_text(f"# switch {switch}\n" + MANUAL)
        expected = _uncached(tree)
        migrations.clear()
        findings, changed, errors = _run(tree, cache)
        assert (findings, changed, errors) == expected
        fixed = any(name == "prefill.py" and f.status.value == "fixed" for name, f in findings)
        assert fixed == (branch == "main")
        assert ("prefill.py" in migrations) == (switch < 2)


def _age(path: Path, days: float) -> None:
    then = time.time() - days * 24 * 3600
    os.utime(path, (then, then))


def test_entries_no_run_used_for_a_month_are_deleted_once_a_day_and_nothing_else(tree, tmp_path):
    cache = tmp_path / "cache"
    _run(tree, cache)
    folder = cache / "vllm-attn-compat"
    marker = folder / ".pruned"
    entries = _entries(cache)
    assert marker.is_file() and entries
    assert {entry.parent for entry in entries} == {folder}  # one folder, none made per entry
    leftover = folder / ("1" * 64 + ".4242.tmp")  # the write of a run that was killed
    leftover.write_text("{")
    (folder / "ff").mkdir()
    foreign = [folder / "notes.txt", folder / "README", folder / ("2" * 63), folder / "ff" / ("ff" + "3" * 62)]
    for path in foreign:
        path.write_text("kept")
    for path in [*entries, leftover, *foreign]:
        _age(path, cache_module.KEEP_DAYS + 1)
    # No replay: the run reads the entries of the other files, and those of `manual.py` and of the run go unused.
    (tree / "plugin/manual.py").write_text("# edited\n" + MANUAL)
    _run(tree, cache)  # the marker is fresh: nothing is deleted
    month = time.time() - cache_module.KEEP_DAYS * 24 * 3600
    used = {path for path in _entries(cache) if path.stat().st_mtime > month}
    unused = set(entries) - used
    assert unused and used & set(entries) and leftover.exists()
    _age(marker, 2)
    assert _run(tree, cache) == _uncached(tree)  # a replay of the last run, then the pruning
    assert not any(path.exists() for path in unused) and not leftover.exists()
    assert all(path.exists() for path in used) and all(path.exists() for path in foreign)
    assert time.time() - marker.stat().st_mtime < 3600
