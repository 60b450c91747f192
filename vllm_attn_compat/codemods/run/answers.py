"""What a run asked of each file's bytes, kept by their digest: after an edit, a rerun scans again only the
files that changed.

A run that the cache cannot replay (one file edited: the commit pre-commit checks) still asks every file of
the tree the same questions as the run before: does it hold a rule's token, does it name vLLM, does it name
one of the attention classes found so far (each round of the class hierarchy), may it call a method whose
fix the call-site analysis decides. Each answer is a function of the file's bytes and of the question's own
terms alone, so it is kept under the file's digest (`stats.digest`, the SHA-256 that keys the run too) and
the question, spelled out with a hash of its terms in full (the tokens, the names, the rules). Scanning 22 MB
for each question is most of such a run; looking the answers up is not.

The answers live in one JSON file in the cache's folder, read once and written once a run, and tied to this
package's code (`cache.Cache.code`), not to the run's options: another version's answers are not read, and a
``--check`` and a ``--diff`` share them. A run keeps the answers of
the files it saw (another tree's or branch's are asked again when it returns). An answers file that cannot
be read or parsed is ignored, as if empty; an answer of the wrong shape is asked again.

The file names the run (its key in the cache) whose every question of every file it holds, when the run that
wrote it was one the cache keeps: `bystanders` compares an edited file's answers with its old bytes' only then.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable
from typing import TypeVar

from vllm_attn_compat.codemods.run import cachedir, keyhash

Answer = TypeVar("Answer")
_NAME = "answers.json"
_FORMAT = "vllm-attn-compat-answers/1"


def spell(terms: Iterable[str | bytes]) -> tuple[str, ...]:
    """A question's terms as kept: a set (their order does not matter), of strings (bytes decoded)."""
    spelled = {term.decode("utf-8", "surrogateescape") if isinstance(term, bytes) else term for term in terms}
    return tuple(sorted(spelled))


def question(kind: str, terms: Iterable[str | bytes]) -> str:
    """The question ``kind`` with its terms (`spell`), as the answers are kept."""
    spelled = spell(terms)
    return f"{kind} {keyhash.hexdigest(chr(0).join(spelled).encode('utf-8', 'surrogateescape'))[:32]}"


class Answers:
    """The answers kept for a cache folder (``root``) and this package's code (``code``, `cache.Cache.code`);
    ``root`` None keeps nothing (``--no-cache``): every question is answered from the bytes."""

    def __init__(self, root: str | None, code: bytes) -> None:
        self.root = root
        self.code = keyhash.hexdigest(code)
        self.path = os.path.join(cachedir.entries_folder(root), _NAME) if root is not None else None
        self._kept: dict[str, dict[str, object]] = {}
        self._used: dict[str, dict[str, object]] = {}
        self._changed = False
        self._encoded: str | None = None  # `_used` as JSON text (`prepare`), until another answer is used
        # The key of the run whose every question of each of its files these answers hold (`save`), if any.
        self.run: str | None = None
        if self.path is None:
            return
        try:
            with open(self.path, "rb") as handle:
                data = json.loads(handle.read())
            if data.get("format") == _FORMAT and data.get("code") == self.code and isinstance(data["files"], dict):
                self._kept = data["files"]
                run = data.get("run")
                self.run = run if isinstance(run, str) else None
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            self._kept = {}  # no answers, or answers this version cannot read: every question is asked

    def kept(self, digest: str) -> dict[str, object]:
        """The answers kept for the bytes of ``digest`` (question -> answer as kept), maybe none."""
        kept = self._kept.get(digest)
        return kept if isinstance(kept, dict) else {}

    def ask(self, digest: str | None, asked: str, answer: Callable[[], bool]) -> bool:
        """The answer to the question ``asked`` (`question`) of the file of ``digest``: the one kept, else
        ``answer()``, kept (a file without a digest, or a run without a cache, keeps nothing)."""
        return self.recall(digest, asked, answer, bool, boolean)

    def keep(self, digest: str, found: dict[str, object]) -> None:
        """Keep the answers ``found`` (question -> answer as :meth:`recall` keeps it) of the file of ``digest``, asked
        before its digest was known (`reading.Reading.settle`); the dict is this object's from now on."""
        used = self._used.get(digest)
        if used is None:  # (each file's first: a step per file, not per answer, at a first run's end)
            self._used[digest] = found
        elif found.keys() <= used.keys():
            return
        else:
            used.update({asked: answer for asked, answer in found.items() if asked not in used})
        self._changed = True
        self._encoded = None

    def recall(
        self,
        digest: str | None,
        asked: str,
        answer: Callable[[], Answer],
        encode: Callable[[Answer], object],
        decode: Callable[[object], Answer],
    ) -> Answer:
        """:meth:`ask` for an answer kept as JSON-ready data: ``encode`` makes the data, ``decode`` reads it back
        (raising ``ValueError`` or ``TypeError`` on data it did not make: the question is then asked again)."""
        if digest is None or self.path is None:
            return answer()
        used = self._used.setdefault(digest, {})
        if asked in used:
            return decode(used[asked])
        kept = self._kept.get(digest)
        if isinstance(kept, dict) and asked in kept:
            try:
                found = decode(kept[asked])
            except (ValueError, TypeError):
                pass
            else:
                used[asked] = kept[asked]
                self._encoded = None
                return found
        found = answer()
        used[asked] = encode(found)
        self._changed = True
        self._encoded = None
        return found

    def prepare(self) -> None:
        """Encode the answers used so far, which `save` writes unless another is used meanwhile: a run does it
        while its workers migrate, instead of after."""
        if self.path is not None and self._encoded is None:
            self._encoded = json.dumps(self._used, separators=(",", ":"))

    def save(self, run: str | None = None) -> None:
        """Write the answers this run used, when it asked a new question or left a file's answers out
        (atomically; one that cannot be written costs the next run its scans, silently: the cache's own
        writes warn about an unwritable folder). ``run``: the key of the run whose every question of its
        files they answer, if it is one the cache keeps."""
        if self.path is None or self.root is None:
            return
        if not self._changed and self._used.keys() == self._kept.keys() and run == self.run:
            return
        self.prepare()
        head = json.dumps({"format": _FORMAT, "code": self.code, "run": run}, separators=(",", ":"))
        text = f'{head[:-1]},"files":{self._encoded}}}'
        with contextlib.suppress(OSError):
            cachedir.write_text(self.root, self.path, text)


def boolean(value: object) -> bool:
    """An answer kept as a boolean: itself, checked."""
    if type(value) is not bool:
        raise TypeError(f"expected a boolean, found {value!r:.80}")
    return value
