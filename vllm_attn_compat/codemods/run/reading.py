"""How a run reads its files: each once, as bytes checked to be decodable text, and what the run asks of its bytes,
kept with the file's results in the cache.

A file the cache vouches for (its status is the one recorded: `cache.Cache.trusts`) is not read until something asks
for its bytes, and most questions do not: their answers are kept. Should its status have changed by then (an edit
during the run), :class:`Changed` is raised, and the run starts again reading every file. A file whose status
changed is read at once, and keeps its results when its bytes are those the cache recorded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from vllm_attn_compat.codemods.run import cache as cache_module
from vllm_attn_compat.codemods.run import files, sources

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.run.cache import Cache

Answer = TypeVar("Answer")


class Changed(Exception):
    """A file the cache vouched for changed during the run: the run reads every file again (`runner.run_paths`)."""


class RunFile:
    """A file of the run: where it is, its status, its bytes (read once), and the results the cache kept of those
    bytes (``kept``) and those this run keeps (``results``)."""

    def __init__(self, source_file: files.SourceFile, stat: os.stat_result, source: bytes | None) -> None:
        self.source_file = source_file
        self.path = source_file.path
        self.stat = stat
        self.trusted = source is None  # vouched for by its status: read only if its bytes are asked for
        self._source = source
        self._encoding: str | None = None
        self.kept: dict[str, Any] = {}
        self.results: dict[str, Any] = {"answers": {}}

    @property
    def module(self) -> str:
        """The module name the file's folders give it (`names.guess_module_name`), which its class index and the
        class scan's answer depend on, with the path it was given as: kept results made for another serve
        neither."""
        if "where" not in self.results:
            from vllm_attn_compat.codemods.index.names import guess_module_name

            self.results["where"] = [self.path, guess_module_name(self.path)]
        return str(self.results["where"][1])

    def kept_for_module(self) -> dict[str, Any]:
        """The kept results where they were made for the file as it is given now (path and module), else none (the
        results this run keeps say how it was given either way)."""
        self.module  # noqa: B018 - made, and kept with the results
        return self.kept if self.kept.get("where") == self.results["where"] else {}

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
        *,
        by_module: bool = False,
    ) -> Answer:
        """The answer of ``test`` (the question ``question``, `asking`) for the file's bytes: the one kept, else
        ``test(source)``; ``by_module``: an answer that depends on the file's module name too. ``decode`` raises
        ``ValueError`` or ``TypeError`` for data it did not make: asked again."""
        answers = self.results["answers"]
        if question in answers:
            return decode(answers[question])
        kept = (self.kept_for_module() if by_module else self.kept).get("answers", {})
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
    return kind + " " + hashlib.sha256(b"\0".join(spelled)).hexdigest()[:16]


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


class Kept:
    """The files of ``files`` for which ``test`` holds, found as they are iterated, each file tested once: a caller
    acts on the first kept while the others are still tested (the first round indexes files as the prefilter keeps
    them). Iterated again, it gives the same files in the same order."""

    def __init__(self, files: Iterable[RunFile], test: Callable[[RunFile], bool]) -> None:
        self._untested = iter(files)
        self._test = test
        self._kept: list[RunFile] = []

    def __iter__(self) -> Iterator[RunFile]:
        at = 0
        while True:
            if at < len(self._kept):
                yield self._kept[at]
                at += 1
                continue
            f = next(self._untested, None)
            if f is None:
                return
            if self._test(f):
                self._kept.append(f)

    def __bool__(self) -> bool:
        return next(iter(self), None) is not None


def read(source_file: files.SourceFile, cache: Cache | None, started: int, trusting: bool) -> RunFile:
    """The file, read unless ``trusting`` and the cache vouches for it by its status, with the results the cache
    kept of its bytes; its status and digest recorded in the cache (the digest where the cache knew the file, or
    the file is racy: `cache`). Raises `sources.SourceError` for a file that cannot be read as source."""
    real_path = source_file.real_path
    if cache is not None and trusting and cache.knows(real_path):
        stat = source_file.status or cache.seen.get(real_path) or _stat(source_file)
        if stat is not None and cache.trusts(real_path, stat):
            return _kept(RunFile(source_file, stat, None), cache)
    source, stat = cache.read.pop(real_path) if cache is not None and real_path in cache.read else (None, None)
    if source is None or stat is None:
        source, stat = sources.read_source(real_path)
    run_file = RunFile(source_file, stat, source)
    run_file._encoding = sources.source_encoding(source)
    if cache is None:
        return run_file
    recorded = cache.recorded(real_path)  # of the bytes the kept results were made of
    racy = cache_module.racy(stat, started)
    digest = cache_module.digest(source) if racy or recorded is not None or cache.knows(real_path) else None
    cache.record(real_path, stat, digest, racy)
    return _kept(run_file, cache) if recorded is not None and recorded == digest else run_file


def _stat(source_file: files.SourceFile) -> os.stat_result | None:
    try:
        return os.stat(source_file.real_path)
    except OSError:
        return None  # read below, which says why it cannot be


def _kept(run_file: RunFile, cache: Cache) -> RunFile:
    """The file, with the results the cache kept of its bytes."""
    run_file.kept = cache.results(run_file.source_file.real_path) or {}
    return run_file
