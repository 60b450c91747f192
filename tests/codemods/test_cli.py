"""The command line, through `main()` and as a real process: modes, formats, config and exit codes."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import pytest
import yaml

from vllm_attn_compat import manifest
from vllm_attn_compat.codemods import cli
from vllm_attn_compat.codemods.cli import main

from runner_trees import BASE, IMPL, IMPL_MIGRATED, MANUAL, UNRELATED, write_tree

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(
    *args: str, stdin: bytes = b"", cwd: str | None = None, buffered: bool = False
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO}
    if buffered:  # as Python writes to pipes by default (this machine's environment may say otherwise)
        env.pop("PYTHONUNBUFFERED", None)
    return subprocess.run(
        [sys.executable, "-m", "vllm_attn_compat", *args], input=stdin, capture_output=True, env=env, cwd=cwd
    )


def test_migrate_applies_safe_fixes_and_exits_0_when_nothing_is_left(plugin, capsys):
    assert main(["migrate", str(plugin)]) == 0
    assert (plugin / "plugin/impl.py").read_text() == IMPL_MIGRATED
    assert (plugin / "plugin/helpers.py").read_text() == UNRELATED
    out = capsys.readouterr().out
    assert f"{plugin / 'plugin/impl.py'}:7:9: VAC001 [*] " in out
    assert "Scanned 4 files: 2 parsed, 1 changed." in out
    assert main(["migrate", "--check", str(plugin)]) == 0  # a second run has nothing to do


def test_check_writes_nothing_and_exits_1_when_a_file_would_change(plugin, capsys):
    assert main(["migrate", "--check", str(plugin)]) == 1
    assert (plugin / "plugin/impl.py").read_text() == IMPL
    assert "1 would change" in capsys.readouterr().out


def test_diff_prints_a_unified_diff_on_stdout_and_the_report_on_stderr(plugin, capsys):
    assert main(["migrate", "--diff", str(plugin)]) == 1
    assert (plugin / "plugin/impl.py").read_text() == IMPL
    captured = capsys.readouterr()
    name = str(plugin / "plugin/impl.py").lstrip("/")
    assert captured.out.splitlines()[:2] == [f"--- a/{name}", f"+++ b/{name}"]
    assert '-        assert output is not None, "Output tensor must be provided."' in captured.out.splitlines()
    assert "VAC001 [*]" in captured.err and "VAC001" not in captured.out


def test_the_summary_of_a_diff_names_the_command_that_applies_what_it_showed(plugin, capsys):
    # A call passing None withholds VAC001's fix: only `--unsafe-fixes` takes it, so the hint must not say to run
    # `migrate` alone.
    caller = (
        "from plugin.impl import MyImpl\n\n\ndef run(impl: MyImpl):\n    return impl.forward(1, 2, 3, 4, 5, 6, None)\n"
    )
    (plugin / "plugin/caller.py").write_text(caller)
    assert main(["migrate", "--diff", "--unsafe-fixes", str(plugin)]) == 1
    hint = "Run the same command without --check/--diff to apply the fixes marked [*]."
    assert hint in capsys.readouterr().err.splitlines()
    assert main(["migrate", str(plugin)]) == 1  # without the flag, nothing is applied
    assert (plugin / "plugin/impl.py").read_text() == IMPL
    assert main(["migrate", "--unsafe-fixes", str(plugin)]) == 0
    assert (plugin / "plugin/impl.py").read_text() == IMPL_MIGRATED
    taken = [line for line in capsys.readouterr().out.splitlines() if " VAC001 [*] " in line]
    assert len(taken) == 1 and "withheld" not in taken[0]
    assert taken[0].endswith("; taken with --unsafe-fixes, though `impl.forward(...)` at "
                             f"{plugin / 'plugin/caller.py'}:5 passes `output=None`")  # fmt: skip


def test_a_finding_without_fix_exits_1_and_is_counted(tmp_path, capsys):
    write_tree(tmp_path, {"manual.py": MANUAL})
    assert main(["migrate", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "manual.py:6:9: VAC001 " in out and "[*]" not in out
    assert "Left by rule: VAC001 1" in out


def test_noqa_suppresses_the_fix_and_the_site_is_counted(tmp_path, capsys):
    source = IMPL.replace('provided."', 'provided."  # noqa: VAC001')
    write_tree(tmp_path, {"plugin/__init__.py": "", "plugin/base.py": BASE, "plugin/impl.py": source})
    assert main(["migrate", str(tmp_path)]) == 0
    assert (tmp_path / "plugin/impl.py").read_text() == source
    assert "1 suppressed by noqa" in capsys.readouterr().out


def test_an_unparsable_file_exits_2_and_the_run_goes_on(plugin, capsys):
    bad = "from vllm.v1.attention.backend import AttentionImpl\nclass X(AttentionImpl):\n    x = (\n"
    write_tree(plugin, {"plugin/broken.py": bad, "plugin/latin.py": b"x = '\xe9'\n"})
    assert main(["migrate", str(plugin)]) == 2
    out = capsys.readouterr().out
    assert f"{plugin / 'plugin/broken.py'}:3:" in out and "could not parse" in out
    assert f"{plugin / 'plugin/latin.py'}:1:6: cannot decode byte" in out
    assert (plugin / "plugin/impl.py").read_text() == IMPL_MIGRATED  # the others were still processed


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["migrate", "--select", "VAC9", "."], "unknown rule code 'VAC9'"),
        (["migrate", "--check", "--diff", "."], "not allowed with argument"),
        (["migrate", "--jobs", "0", "."], "expected a positive number of processes"),
        (["migrate", "-", "x.py"], "'-' (standard input) cannot be combined with other paths"),
        (["rules", "VAC999"], "unknown rule 'VAC999'"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2_with_a_message(arguments, message, capsys):
    assert main(arguments) == 2
    assert message in capsys.readouterr().err


def test_a_missing_path_is_an_error_naming_it_and_creates_nothing(plugin, monkeypatch, capsys):
    monkeypatch.delenv("VLLM_ATTN_COMPAT_NO_CACHE", raising=False)  # the cache on, at the project's root
    monkeypatch.chdir(plugin)
    before = sorted(path.relative_to(plugin) for path in plugin.rglob("*"))
    assert main(["migrate", "plugin", "nope.py"]) == 2
    captured = capsys.readouterr()
    assert (
        captured.err
        == "vllm-attn-compat: error: nope.py: no such file or directory (expected a file or folder to migrate)\n"
    )
    assert captured.out == ""
    assert sorted(path.relative_to(plugin) for path in plugin.rglob("*")) == before  # no cache folder, nothing


def test_configuration_is_read_and_command_line_flags_win(plugin, capsys):
    (plugin / "pyproject.toml").write_text('[tool.vllm-attn-compat]\nignore = ["VAC001"]\n')
    assert main(["migrate", "--check", str(plugin)]) == 0  # VAC001 ignored by the configuration
    assert main(["migrate", "--check", "--select", "VAC001", str(plugin)]) == 1  # the flag wins
    (plugin / "pyproject.toml").write_text('[tool.vllm-attn-compat]\nexclude = ["plugin/impl.py"]\n')
    assert main(["migrate", "--check", str(plugin)]) == 0
    assert main(["migrate", "--check", "--exclude", "nothing", str(plugin)]) == 1
    capsys.readouterr()


def test_a_wrong_configuration_exits_2_naming_key_and_value(plugin, capsys):
    (plugin / "pyproject.toml").write_text('[tool.vllm-attn-compat]\nunsafe-fixes = "yes"\n')
    assert main(["migrate", str(plugin)]) == 2
    assert "unsafe-fixes: expected a boolean (true or false), found 'yes' (str)" in capsys.readouterr().err
    assert (plugin / "plugin/impl.py").read_text() == IMPL


@pytest.mark.parametrize("mode", ["--check", "--diff"])
def test_json_report_under_check_or_diff_says_what_would_be_fixed_and_writes_nothing(plugin, capsys, mode):
    write_tree(plugin, {"plugin/manual.py": MANUAL})
    assert main(["migrate", mode, "--format", "json", str(plugin)]) == 1
    captured = capsys.readouterr()
    document = json.loads(captured.out if mode == "--check" else captured.err)  # (--diff: the diff on stdout)
    assert document["version"] == 2 and document["mode"] == mode[2:]
    assert [(os.path.basename(f["file"]), f["code"], f["status"]) for f in document["findings"]] == [
        ("impl.py", "VAC001", "fixable"),
        ("manual.py", "VAC001", "manual"),
    ]
    summary = document["summary"]
    assert (summary["files_changed"], summary["files_would_change"], summary["exit_code"]) == (0, 1, 1)
    assert summary["findings"] == {"fixed": 0, "fixable": 1, "unsafe-fix-available": 0, "manual": 1, "suppressed": 0}
    assert (plugin / "plugin/impl.py").read_text() == IMPL


def test_json_report_of_a_run_that_writes_says_what_it_fixed(plugin, capsys):
    write_tree(plugin, {"plugin/manual.py": MANUAL})
    assert main(["migrate", "--format", "json", str(plugin)]) == 1
    document = json.loads(capsys.readouterr().out)
    assert [f["status"] for f in document["findings"]] == ["fixed", "manual"]
    summary = document["summary"]
    assert (summary["files_changed"], summary["files_would_change"], summary["exit_code"]) == (1, 0, 1)
    assert (plugin / "plugin/impl.py").read_text() == IMPL_MIGRATED


def test_the_help_names_where_the_json_report_is_described(capsys):
    assert main(["migrate", "--help"]) == 0
    assert "docs/json-report.md" in capsys.readouterr().out.replace("\n", " ").replace("  ", " ")
    assert os.path.isfile(os.path.join(REPO, "docs", "json-report.md"))


@pytest.mark.parametrize(
    ("args", "code"), [(["rules", "VAC004"], 0), (["rules"], 0), (["migrate", "--diff", "{plugin}"], 1)]
)
def test_a_reader_that_goes_away_ends_the_command_quietly_with_its_own_code(plugin, args, code):
    """``vllm-attn-compat rules VAC004 | head``: once the pipe's reader is gone, the command exits as it would have
    (0 for ``rules``; a ``--diff`` that would change a file, 1), saying nothing of the pipe."""
    command = [sys.executable, "-m", "vllm_attn_compat", *(arg.format(plugin=plugin) for arg in args)]
    env = {**os.environ, "PYTHONPATH": REPO}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()  # the reader is gone before the command writes anything: a real pipe, broken
        errors = process.stderr.read().decode()
        assert process.wait(timeout=120) == code
    assert "Broken" not in errors and "Traceback" not in errors and "Exception ignored" not in errors
    if args[0] == "rules":
        assert errors == ""
    shell = f"{subprocess.list2cmdline(command)} | head -c 1 >/dev/null; exit ${{PIPESTATUS[0]}}"
    piped = subprocess.run(["bash", "-c", shell], capture_output=True, env=env, timeout=120)
    assert piped.returncode == code and b"Traceback" not in piped.stderr


def test_github_format_annotates_each_site(plugin, capsys):
    assert main(["migrate", "--check", "--format", "github", "--quiet", str(plugin)]) == 1
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("::error file=") and ",line=7,col=9,title=VAC001::" in line


def test_progress_only_on_a_terminal_outside_ci_and_not_quiet(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    parse = cli.build_parser().parse_args
    assert cli._options(parse(["migrate", "."])).progress is True
    assert cli._options(parse(["migrate", "-q", "."])).progress is False
    monkeypatch.setenv("CI", "true")
    assert cli._options(parse(["migrate", "."])).progress is False


def test_rules_lists_every_rule(capsys):
    assert main(["rules"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("VAC001  assert-output-not-none") and "safe" in first


def test_stdin_is_migrated_to_stdout_as_a_real_process(plugin):
    source = (plugin / "plugin/impl.py").read_bytes()
    source = source.replace(b"plugin.base", b"vllm.v1.attention.backend").replace(b"PluginImplBase", b"AttentionImpl")
    # (the impl, alone, has no `__init__`: VAC013's, left aside here)
    written = run_cli("migrate", "--stdin-filename", "impl.py", "--ignore", "VAC013", "-", stdin=source)
    assert written.returncode == 0, written.stderr
    assert b"assert output is not None" not in written.stdout and b"output.copy_(query)" in written.stdout
    assert b"impl.py:7:9: VAC001 [*]" in written.stderr
    checked = run_cli("migrate", "--check", "-", stdin=b"x = 1\n")
    assert (checked.returncode, checked.stdout) == (0, b"")
    broken = run_cli("migrate", "-", stdin=b"from vllm.v1.attention.backend import AttentionImpl\nx = (\n")
    assert broken.returncode == 2 and broken.stdout == b"from vllm.v1.attention.backend import AttentionImpl\nx = (\n"


def test_no_libcst_import_when_no_file_is_a_candidate(tmp_path):
    write_tree(tmp_path, {f"m{n}.py": "def f(output):\n    return output\n" for n in range(5)})
    probe = (
        "import sys\nfrom vllm_attn_compat.codemods.cli import main\n"
        f"code = main(['migrate', '--check', '-q', {str(tmp_path)!r}])\n"
        "print(code, 'libcst' in sys.modules, 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    assert result.stdout.split() == ["0", "False", "False"], result.stderr


@pytest.mark.parametrize("configuration", ["", '[tool.vllm-attn-compat]\nignore = ["VAC006"]\n'])
def test_a_rerun_the_cache_replays_imports_no_rule_runner_or_heavy_module(tmp_path, configuration):
    # What a rerun imports is most of its time: the rules' modules, the index and the engine, libcst, dataclasses
    # (with inspect), OpenSSL (hashlib's SHA-256 of files' bytes) and, outside git, subprocess are for runs that
    # read files. (Rule codes in the configuration were checked by the run that made the entry.)
    layout = {"plugin/base.py": BASE, "plugin/impl.py": IMPL, "plugin/util.py": UNRELATED}
    tree = write_tree(tmp_path / "tree", layout | ({"pyproject.toml": configuration} if configuration else {}))
    probe = (
        "import sys\nfrom vllm_attn_compat.codemods.cli import main\nfrom vllm_attn_compat.codemods.run import cache\n"
        "cache.RACY_NS = 0\n"  # the files were written just now: trusted by their status at once all the same
        f"code = main(['migrate', '--check', '-q', '--cache-dir', {str(tmp_path / 'cache')!r}, {str(tree)!r}])\n"
        "heavy = ['vllm_attn_compat.codemods.engine.migrate', 'vllm_attn_compat.codemods.rules.vac001_assert_output',\n"
        "         'vllm_attn_compat.codemods.index.hierarchy', 'dataclasses', 'subprocess', 'libcst', '_hashlib']\n"
        "print(code, *[name for name in heavy if name in sys.modules])\n"
    )
    runs = [subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO) for _ in range(2)]
    first, second = (run.stdout.splitlines()[-1].split() for run in runs)
    assert first[:4] == [
        "1",
        "vllm_attn_compat.codemods.engine.migrate",
        "vllm_attn_compat.codemods.rules.vac001_assert_output",
        "vllm_attn_compat.codemods.index.hierarchy",
    ], runs[0].stderr
    assert second == ["1"], runs[1].stderr


OLD_OP_CALL = """\
import torch


def attend(query, key, value, layer_name):
    return torch.ops.vllm.unified_attention(query, key, value, layer_name)
"""
FLAG_READ = """\
import vllm


def f(layer, q):
    return q.view(-1, 8) if layer.use_output else q
"""


def test_unsafe_fixes_are_withheld_unless_asked_for_by_flag_or_configuration(tmp_path, capsys):
    write_tree(tmp_path, {"layer.py": FLAG_READ})
    assert main(["migrate", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "VAC005 [unsafe] " in out and "1 unsafe fix available with --unsafe-fixes" in out
    assert (tmp_path / "layer.py").read_text() == FLAG_READ
    (tmp_path / "pyproject.toml").write_text("[tool.vllm-attn-compat]\nunsafe-fixes = true\n")
    assert main(["migrate", "--check", "--no-unsafe-fixes", str(tmp_path)]) == 1
    assert "[unsafe]" in capsys.readouterr().out
    assert main(["migrate", str(tmp_path)]) == 0
    assert "    return q.view(-1, 8)\n" in (tmp_path / "layer.py").read_text()
    assert "VAC005 [*] " in capsys.readouterr().out


def test_the_forwarder_route_for_old_op_calls_is_opt_in_by_flag_or_configuration(tmp_path, capsys):
    write_tree(tmp_path, {"ops.py": OLD_OP_CALL})
    # No layer shape here: by default the call is left for a person, even with --unsafe-fixes.
    assert main(["migrate", "--unsafe-fixes", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "VAC007 " in out and "[unsafe]" not in out and "the layer's shape is unknown here" in out
    assert (tmp_path / "ops.py").read_text() == OLD_OP_CALL
    assert main(["migrate", "--unsafe-fixes", "--old-op-calls=forwarder", "--jobs", "1", str(tmp_path)]) == 0
    assert "vllm_attn_compat.compat.unified_attention(query" in (tmp_path / "ops.py").read_text()
    capsys.readouterr()
    write_tree(tmp_path, {"ops.py": OLD_OP_CALL})
    (tmp_path / "pyproject.toml").write_text('[tool.vllm-attn-compat]\nold-op-calls = "forwarder"\n')
    # The setting travels to worker processes: enough files for the early worker and a pool.
    names = ["ops.py"] + [f"more_{index}.py" for index in range(19)]
    write_tree(tmp_path, {name: OLD_OP_CALL for name in names})
    assert main(["migrate", "--unsafe-fixes", "--jobs", "2", str(tmp_path)]) == 0
    for name in names:
        assert "vllm_attn_compat.compat.unified_attention(query" in (tmp_path / name).read_text()
    capsys.readouterr()
    assert main(["migrate", "--old-op-calls=forwards", str(tmp_path)]) == 2
    assert "invalid choice: 'forwards'" in capsys.readouterr().err


def test_pre_commit_hooks_run_the_real_command_on_the_whole_repository(plugin, capsys, monkeypatch):
    with open(os.path.join(REPO, ".pre-commit-hooks.yaml")) as handle:
        hooks = {hook["id"]: hook for hook in yaml.safe_load(handle)}
    assert set(hooks) == {"vllm-attn-compat", "vllm-attn-compat-check"}
    assert all(hook["require_serial"] and hook["language"] == "python" for hook in hooks.values())
    # The files of a commit are not enough to tell a safe fix (`index/test_callsites_execution.py`): no hook
    # takes them, each runs on the repository, from its root as pre-commit does, whatever the commit holds.
    assert not any(hook.get("pass_filenames", True) for hook in hooks.values())
    monkeypatch.chdir(plugin)
    program, *check_args = hooks["vllm-attn-compat-check"]["entry"].split()
    assert program == "vllm-attn-compat"  # the console script declared in pyproject.toml
    assert main(check_args) == 1
    assert (plugin / "plugin/impl.py").read_text() == IMPL
    _, *fix_args = hooks["vllm-attn-compat"]["entry"].split()
    assert main(fix_args) == 0  # the base class is in a file the commit may not hold: found all the same
    assert (plugin / "plugin/impl.py").read_text() == IMPL_MIGRATED
    assert main([*fix_args, "--cache-dir", str(plugin.parent / "cache")]) == 0  # the entry, with --cache-dir
    capsys.readouterr()


def test_rules_explains_one_rule_with_its_examples(capsys):
    from vllm_attn_compat.codemods.registry import all_rules

    rule = next(rule for rule in all_rules() if rule.code == "VAC004")
    assert main(["rules", "vac004"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("## VAC004") and rule.summary in text
    assert all(example.title in text for example in rule.examples)
    assert main(["rules", rule.name]) == 0 and capsys.readouterr().out == text


def test_diffs_come_out_in_path_order_whatever_order_workers_finish(tmp_path, capsys):
    layout = {"plugin/__init__.py": "", "plugin/base.py": BASE} | {f"plugin/impl{n:02}.py": IMPL for n in range(12)}
    write_tree(tmp_path, layout)
    assert main(["migrate", "--diff", "--jobs", "2", str(tmp_path)]) == 1
    headers = [line for line in capsys.readouterr().out.splitlines() if line.startswith("--- a/")]
    assert len(headers) == 12 and headers == sorted(headers)


def test_help_lists_every_rule_from_the_rules_themselves(capsys):
    from vllm_attn_compat.codemods.registry import all_rules

    assert main(["migrate", "--help"]) == 0
    text = capsys.readouterr().out
    assert all(f"{rule.code} ({rule.fix_safety.value}) {rule.summary}" in text for rule in all_rules())
    assert "exit codes: 0 nothing left to do" in text


def test_an_unknown_rule_code_in_the_configuration_names_the_file_and_key(plugin, capsys):
    (plugin / "pyproject.toml").write_text('[tool.vllm-attn-compat]\nignore = ["VAC0X"]\n')
    assert main(["migrate", str(plugin)]) == 2
    err = capsys.readouterr().err
    assert f"{plugin / 'pyproject.toml'}: [tool.vllm-attn-compat] ignore: unknown rule code 'VAC0X'" in err
    assert main(["migrate", "--check", "--ignore", "VAC001", str(plugin)]) == 0  # the flag replaces it
    assert main(["migrate", "--stdin-filename", str(plugin / "impl.py"), "-"]) == 2  # standard input too
    assert "ignore: unknown rule code 'VAC0X'" in capsys.readouterr().err


def test_the_process_exits_with_main_s_code_after_all_its_output(tmp_path, capsys):
    # The console script leaves without the interpreter's shutdown (cli.run): what main() printed must
    # all arrive anyway, here far more than a pipe holds, and the exit code must be main()'s.
    write_tree(tmp_path, {"plugin/__init__.py": "", "plugin/base.py": BASE})
    write_tree(tmp_path, {f"plugin/impl{n:03}.py": IMPL for n in range(150)})
    assert main(["migrate", "--diff", str(tmp_path)]) == 1
    expected = capsys.readouterr()
    completed = run_cli("migrate", "--diff", str(tmp_path), buffered=True)
    assert completed.returncode == 1
    assert len(completed.stdout) > 1 << 16 and completed.stdout.decode() == expected.out
    assert completed.stderr.decode() == expected.err
    assert run_cli("migrate", "--check", str(tmp_path / "plugin/base.py")).returncode == 0


def test_the_console_script_collects_cycles_less_often_in_its_process_and_its_workers():
    # cli.run owns its process: main() and the workers it forks run at the slower pace; a caller of main()
    # (this test session) keeps its own collector.
    probe = (
        "import gc\n"
        "from vllm_attn_compat.codemods import cli\n"
        "from vllm_attn_compat.codemods.run import parallel\n"
        "def main(argv=None):\n"
        "    tasks = [(n, ()) for n in range(parallel.IN_PROCESS_BELOW)]\n"
        "    pool = parallel.Pool(2)\n"
        "    found = list(pool.map(gc.get_threshold, tasks))\n"
        "    pool.close()\n"
        "    print(gc.get_threshold(), *sorted({str(threshold) for _, threshold in found}))\n"
        "    return 3\n"
        "cli.main = main\n"
        "cli.run()\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO}
    )
    assert completed.returncode == 3, completed.stderr
    young, middle, oldest = gc.get_threshold()
    slower = (cli.YOUNG_COLLECTION_THRESHOLD, middle, oldest)
    assert completed.stdout.split("\n")[0] == f"{slower} {slower}"
    assert main(["rules"]) == 0
    assert gc.get_threshold() == (young, middle, oldest)


def _caches(root) -> list[str]:
    """The cache folders under ``root`` (each holds the tool's own folder of entries)."""
    return sorted(str(path.parent.relative_to(root)) for path in root.rglob("vllm-attn-compat") if path.is_dir())


def test_the_cache_is_on_by_default_at_the_project_root_and_off_with_no_cache(plugin, monkeypatch, capsys):
    monkeypatch.delenv("VLLM_ATTN_COMPAT_NO_CACHE", raising=False)
    (plugin / "pyproject.toml").write_text("[project]\nname = 'plugin'\n")
    monkeypatch.chdir(plugin / "plugin")  # below the project's root
    assert main(["migrate", "--check", "--no-cache", "."]) == 1
    assert _caches(plugin) == []
    uncached = capsys.readouterr().out
    assert main(["migrate", "--check", "."]) == 1
    assert _caches(plugin) == [".vllm-attn-compat-cache"]
    assert (plugin / ".vllm-attn-compat-cache" / "CACHEDIR.TAG").is_file()
    assert capsys.readouterr().out == uncached
    assert main(["migrate", "--check", "."]) == 1  # warm
    assert capsys.readouterr().out == uncached


def test_the_configured_cache_folder_and_the_environment_variable(plugin, monkeypatch):
    (plugin / "pyproject.toml").write_text('[tool.vllm-attn-compat]\ncache-dir = "build/vac"\n')
    monkeypatch.chdir(plugin)
    monkeypatch.setenv("VLLM_ATTN_COMPAT_NO_CACHE", "1")
    assert main(["migrate", "--check", "plugin"]) == 1
    assert _caches(plugin) == []  # the variable turns the configured cache off too
    monkeypatch.delenv("VLLM_ATTN_COMPAT_NO_CACHE")
    assert main(["migrate", "--check", "plugin"]) == 1
    assert _caches(plugin) == ["build/vac"]
    monkeypatch.setenv("VLLM_ATTN_COMPAT_NO_CACHE", "1")
    assert main(["migrate", "--check", "--cache-dir", "elsewhere", "plugin"]) == 1  # the flag wins
    assert _caches(plugin) == ["build/vac", "elsewhere"]


def test_no_cache_and_cache_dir_exclude_each_other(plugin, capsys):
    assert main(["migrate", "--no-cache", "--cache-dir", "x", str(plugin)]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_target_comes_from_the_flag_the_configuration_or_the_project_s_requirement(plugin, capsys):
    def target_line(*args: str) -> str:
        main(["migrate", "--check", "--no-cache", *args, str(plugin)])
        return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("Target: "))

    newest = manifest.newest()
    assert (
        target_line()
        == f"Target: vLLM {newest}, no vLLM requirement found (--target-version X.Y sets one): the newest release the "
        f"manifest knows, {newest}."
    )
    (plugin / "requirements.txt").write_text("torch\nvllm>=0.27,<0.31\n")
    assert target_line() == (
        "Target: vLLM 0.30.0, from requirements.txt: vllm>=0.27,<0.31; fixes must hold from vLLM 0.27.0 on."
    )
    (plugin / "pyproject.toml").write_text('[tool.vllm-attn-compat]\ntarget-version = "0.33"\n')
    assert target_line() == 'Target: vLLM 0.33.0, from [tool.vllm-attn-compat] target-version = "0.33".'
    assert target_line("--target-version", "0.34") == "Target: vLLM 0.34.0, from --target-version 0.34."


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        (("--target-version", "0.18"), "--target-version: vLLM '0.18' is not a release the manifest knows; it knows"),
        (("--target-version", "newest"), "--target-version: 'newest' is not a version (expected something like 0.34"),
    ],
)
def test_a_target_the_manifest_does_not_know_is_a_usage_error(plugin, capsys, setting, complaint):
    assert main(["migrate", *setting, str(plugin)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vllm-attn-compat: error: {complaint}") and "0.19.0" in err and manifest.newest() in err
    assert (plugin / "plugin/impl.py").read_text() == IMPL  # nothing written


def test_below_0_20_the_0_20_fixes_are_withheld_as_unsafe_saying_why(plugin, capsys):
    (plugin / "requirements.txt").write_text("vllm>=0.19,<0.21\n")
    assert main(["migrate", str(plugin)]) == 1
    out = capsys.readouterr().out
    assert (plugin / "plugin/impl.py").read_text() == IMPL  # vLLM 0.19 may still pass no buffer: nothing changed
    assert "VAC001 [unsafe] " in out and "(unsafe: the fix needs vLLM >= 0.20.0, and the target allows 0.19.0)" in out
    assert main(["migrate", "--target-version", "0.20", str(plugin)]) == 0  # the code is to run on 0.20
    assert (plugin / "plugin/impl.py").read_text() == IMPL_MIGRATED
