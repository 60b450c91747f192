"""How a run reads its files: each once, as bytes checked to be decodable text, and what the run asks of its bytes,
kept with the file's results in the cache.

A file the cache vouches for (its status is the one recorded: `cache.Cache.known`) is not read until something asks
for its bytes, and most questions do not: their answers are kept. Should its status have changed by then (an edit
during the run), :class:`Changed` is raised, and the run starts again reading every file. A file whose status
changed is read at once, and keeps its results when its bytes are those the cache recorded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from vllm_attn_compat.codemods.run import cache as cache_module
from vllm_attn_compat.codemods.run import files, sources

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.run.cache import Cache

Answer = TypeVar("Answer")


class Changed(Exception):
    """A file the cache vouched for changed during the run: the run reads every file again (`runner.run_paths`)."""


class RunFile:
    """A file of the run: where it is, its status, its bytes (read once), their digest (with a cache), and the
    results the cache kept of those bytes (``kept``) and those this run keeps (``results``)."""

    def __init__(
        self, source_file: files.SourceFile, stat: os.stat_result, source: bytes | None, digest: str | None
    ) -> None:
        self.source_file = source_file
        self.path = source_file.path
        self.stat = stat
        self.digest = digest
        self.trusted = source is None  # vouched for by its status: read only if its bytes are asked for
        self._source = source
        self._encoding: str | None = None
        self.kept: dict[str, Any] = {}
        self.results: dict[str, Any] = {"answers": {}}

    @property
    def source(self) -> bytes:
        if self._source is None:
            try:
                source, stat = sources.read_source(self.source_file.real_path)
            except sources.SourceError:
                raise Changed(self.path) from None
            if cache_module.status_of(stat) != cache_module.status_of(self.stat):
                raise Changed(self.path)
            self._source = source
        return self._source

    @property
    def encoding(self) -> str:
        if self._encoding is None:
            try:
                self._encoding = sources.source_encoding(self.source)
            except sources.SourceError:  # (a file the cache vouched for decoded when it was read)
                raise Changed(self.path) from None
        return self._encoding

    def ask(
        self,
        question: str,
        test: Callable[[bytes], Answer],
        encode: Callable[[Answer], object] = lambda answer: answer,
        decode: Callable[[Any], Answer] = lambda data: data,
    ) -> Answer:
        """The answer of ``test`` (the question ``question``, `Asking`) for the file's bytes: the one kept, else
        ``test(source)``. ``decode`` raises ``ValueError`` or ``TypeError`` for data it did not make: asked again."""
        answers = self.results["answers"]
        if question in answers:
            return decode(answers[question])
        kept = self.kept.get("answers", {})
        if question in kept:
            try:
                found = decode(kept[question])
            except (ValueError, TypeError):
                pass
            else:
                answers[question] = kept[question]
                return found
        found = test(self.source)
        answers[question] = encode(found)
        return found


def question(kind: str, terms: Iterable[str | bytes]) -> str:
    """A question's name as the answers are kept: its kind and a digest of its terms (a set)."""
    import hashlib

    spelled = sorted({t if isinstance(t, bytes) else t.encode("utf-8", "surrogateescape") for t in terms})
    return kind + " " + hashlib.sha256(b"\0".join(spelled)).hexdigest()[:32]


def asking(
    kind: str, terms: Iterable[str | bytes], make: Callable[[], Callable[[bytes], bool]]
) -> Callable[[RunFile], bool]:
    """The yes-or-no question ``kind`` with ``terms``, whose test of a file's bytes ``make()`` makes from them
    alone, once a file's answer is not kept (a rerun keeps most)."""
    named = question(kind, terms)
    made: list[Callable[[bytes], bool]] = []

    def test(source: bytes) -> bool:
        if not made:
            made.append(make())
        return made[0](source)

    return lambda run_file: run_file.ask(named, test, bool, _boolean)


def _boolean(data: object) -> bool:
    if type(data) is not bool:
        raise TypeError(f"expected a boolean answer, found {data!r:.40}")
    return data


def read(
    source_file: files.SourceFile, cache: Cache | None, started: int, trusting: bool, module: Callable[[str], str]
) -> RunFile:
    """The file, read unless ``trusting`` and the cache vouches for it by its status, with the results the cache
    kept of its bytes where it was given by the same path and is the same module (``module(path)``). Raises
    `sources.SourceError` for a file that cannot be read as source."""
    real_path = source_file.real_path
    if cache is not None and trusting:
        stat = source_file.status or _stat(source_file)
        known = cache.known(real_path, stat) if stat is not None else None
        if stat is not None and known is not None:
            run_file = RunFile(source_file, stat, None, known)
            _kept(run_file, cache, module)
            return run_file
    source, stat = cache.read.pop(real_path) if cache is not None and real_path in cache.read else (None, None)
    if source is None or stat is None:
        source, stat = sources.read_source(real_path)
    run_file = RunFile(source_file, stat, source, None)
    run_file._encoding = sources.source_encoding(source)
    if cache is not None:
        run_file.digest = cache_module.digest(source)
        cache.record(real_path, stat, run_file.digest, started)
        _kept(run_file, cache, module)
    return run_file


def _stat(source_file: files.SourceFile) -> os.stat_result | None:
    try:
        return os.stat(source_file.real_path)
    except OSError:
        return None  # read below, which says why it cannot be


def _kept(run_file: RunFile, cache: Cache, module: Callable[[str], str]) -> None:
    assert run_file.digest is not None
    kept = cache.results(run_file.source_file.real_path, run_file.digest)
    name = module(run_file.path)
    if kept is not None and kept.get("path") == run_file.path and kept.get("module") == name:
        run_file.kept = kept
    run_file.results.update(digest=run_file.digest, path=run_file.path, module=name)
