"""What a run asks of each file's bytes is kept by digest: asked again only of the files that changed, and only
ever answered as the bytes answer it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vllm_attn_compat.codemods.run import answers, stats
from vllm_attn_compat.codemods.run.answers import Answers, question
from vllm_attn_compat.codemods.run.runner import Options, run_paths
from vllm_attn_compat.codemods.run.scan import TokenScan

from runner_trees import BASE, IMPL, MANUAL, UNRELATED, write_tree

CODE = b"this package's code"


def _asked(folder: Path, digest: str, asked: str, value: bool, code: bytes = CODE) -> tuple[bool, int]:
    """The answer of a run over ``folder``'s cache, and how many times it had to be computed."""
    calls = []

    def compute() -> bool:
        calls.append(1)
        return value

    kept = Answers(str(folder), code)
    found = kept.ask(digest, asked, compute)
    kept.save()
    return found, len(calls)


def test_an_answer_is_computed_once_then_kept_for_the_next_run(tmp_path):
    asked = question("words", ["MyImpl", "PluginImplBase"])
    assert _asked(tmp_path, "d1", asked, True) == (True, 1)
    assert _asked(tmp_path, "d1", asked, False) == (True, 0)  # kept: the bytes of d1 answer True
    assert _asked(tmp_path, "d2", asked, False) == (False, 1)  # other bytes
    assert _asked(tmp_path, "d1", question("words", ["MyImpl"]), False) == (False, 1)  # other terms
    assert _asked(tmp_path, "d1", asked, False, code=b"another version") == (False, 1)


def test_terms_are_a_set_and_spelled_in_full():
    assert question("uses", ["b", "a"]) == question("uses", {"a", "b"}) == question("uses", [b"a", b"b"])
    assert question("uses", ["a", "b"]) != question("uses", ["a,b"]) != question("words", ["a", "b"])


def test_a_run_keeps_the_answers_of_the_files_it_saw(tmp_path):
    first = Answers(str(tmp_path), CODE)
    for digest in ("old", "kept"):
        first.ask(digest, "q", lambda: True)
    first.save()
    second = Answers(str(tmp_path), CODE)
    second.ask("kept", "q", lambda: False)
    second.save()
    written = json.loads((tmp_path / "vllm-attn-compat" / "answers.json").read_text())
    assert written["files"] == {"kept": {"q": True}}


def test_answers_found_before_the_digest_was_known_are_kept_beside_those_of_the_same_bytes(tmp_path):
    kept = Answers(str(tmp_path), CODE)
    kept.keep("d1", {"q1": True})
    kept.keep("d1", {"q1": False, "q2": False})  # other files of the same bytes: the first answer stays
    kept.keep("d2", {"q1": False})
    assert kept.ask("d1", "q1", lambda: False) is True and kept.ask("d1", "q2", lambda: True) is False
    kept.save()
    written = json.loads((tmp_path / "vllm-attn-compat" / "answers.json").read_text())
    assert written["files"] == {"d1": {"q1": True, "q2": False}, "d2": {"q1": False}}


@pytest.mark.parametrize(
    "spoil",
    [
        lambda path: path.write_bytes(b"\x80 not json"),
        lambda path: path.write_text("[]"),
        lambda path: path.write_text(json.dumps({**json.loads(path.read_text()), "files": {"d1": {"q": "yes"}}})),
        lambda path: path.write_text(json.dumps({**json.loads(path.read_text()), "format": "other/9"})),
    ],
    ids=["not-json", "not-an-object", "not-a-boolean", "other-format"],
)
def test_answers_not_trusted_are_asked_again(tmp_path, spoil):
    assert _asked(tmp_path, "d1", "q", True) == (True, 1)
    spoil(tmp_path / "vllm-attn-compat" / "answers.json")
    assert _asked(tmp_path, "d1", "q", False) == (False, 1)


def test_without_a_cache_or_a_digest_every_question_is_answered_by_the_bytes(tmp_path):
    for kept, digest in ((Answers(None, CODE), "d1"), (Answers(str(tmp_path), CODE), None)):
        assert kept.ask(digest, "q", lambda: True) and not kept.ask(digest, "q", lambda: False)
        kept.save()
    assert not (tmp_path / "vllm-attn-compat").exists()


def test_after_an_edit_the_run_scans_the_edited_file_alone_and_reports_what_an_uncached_run_does(tmp_path, monkeypatch):
    monkeypatch.setattr(stats, "RACY_NS", 0)
    stub = {"vllm/__init__.py": "", "vllm/v1/attention/backend.py": "class AttentionImpl:\n    pass\n"}
    layout = {"plugin/base.py": BASE, "plugin/impl.py": IMPL, "plugin/manual.py": MANUAL}
    tree = write_tree(tmp_path / "tree", stub | layout | {f"plugin/util{n}.py": UNRELATED for n in range(5)})
    options = Options(mode="check", jobs=1, cache_dir=str(tmp_path / "cache"))
    run_paths([str(tree)], options)
    scanned: list[bytes] = []
    original = TokenScan.__call__

    def recording(self: TokenScan, source: bytes) -> bool:
        scanned.append(source)
        return original(self, source)

    monkeypatch.setattr(TokenScan, "__call__", recording)
    edited = "# edited\n" + MANUAL
    (tree / "plugin/manual.py").write_text(edited)
    warm = run_paths([str(tree)], options)
    assert scanned and set(scanned) == {edited.encode()}
    uncached = run_paths([str(tree)], Options(mode="check", jobs=1))

    def outcome(report):
        return sorted(report.findings), sorted(report.changed), report.errors, report.parsed

    assert outcome(warm) == outcome(uncached)
    assert answers._NAME in os.listdir(tmp_path / "cache" / "vllm-attn-compat")


def test_data_kept_is_read_back_by_its_decoder_and_asked_again_if_it_does_not_decode(tmp_path):
    def run(compute: dict[str, list[str]], decode) -> tuple[object, int]:
        calls = []

        def answer() -> dict[str, list[str]]:
            calls.append(1)
            return compute

        kept = Answers(str(tmp_path), CODE)
        found = kept.recall("d1", "scan x", answer, lambda data: data, decode)
        kept.save()
        return found, len(calls)

    def names(data: object) -> dict[str, list[str]]:
        if not (isinstance(data, dict) and all(isinstance(v, list) for v in data.values())):
            raise ValueError(f"not names: {data!r}")
        return data

    assert run({"words": ["A"]}, names) == ({"words": ["A"]}, 1)
    assert run({"words": ["B"]}, names) == ({"words": ["A"]}, 0)

    def refuses(data: object) -> dict[str, list[str]]:
        raise ValueError("another shape")

    assert run({"words": ["B"]}, lambda data: names(data) if data == {"words": ["B"]} else refuses(data)) == (
        {"words": ["B"]},
        1,
    )


@pytest.mark.parametrize("run", [None, "a-run-key"])
def test_answers_encoded_ahead_are_saved_as_the_save_would_encode_them(tmp_path, run):
    """A run encodes its answers while its workers migrate (`Answers.prepare`); an answer used after that is
    saved all the same."""
    written = {}
    for prepared in (False, True):
        folder = tmp_path / str(prepared)
        kept = Answers(str(folder), CODE)
        kept.ask("d1", "q1", lambda: True)
        kept.ask("d2", "q1", lambda: False)
        if prepared:
            kept.prepare()
        kept.ask("d2", "q2", lambda: True)  # after the encoding: it must not be lost
        kept.save(run)
        written[prepared] = (folder / "vllm-attn-compat" / "answers.json").read_bytes()
    assert written[True] == written[False]
    data = json.loads(written[True])
    assert data["run"] == run and data["files"] == {"d1": {"q1": True}, "d2": {"q1": False, "q2": True}}
    reread = Answers(str(tmp_path / "True"), CODE)
    assert reread.run == run and reread.ask("d2", "q2", lambda: False)
