"""How a run reads its files (steps 1 and 2 of `runner`'s funnel): each once, as bytes checked to be decodable text,
its digest taken from the `stats` table where its status is the one recorded, and what the run asks of its bytes
(`scans`) from `answers`. A rerun that missed
(`rerun.Prepared.known`) hands over what it found of each file: such a file is read only once something asks for its
bytes, and one whose status changed since raises :class:`Changed` (the run starts again, reading every file).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from vllm_attn_compat.codemods.run import answers as answers_module
from vllm_attn_compat.codemods.run import files, rerun, scans, sources, stats
from vllm_attn_compat.codemods.run.report import FileError, RunReport

Answer = TypeVar("Answer")


class Changed(Exception):
    """A file whose status changed since the rerun took it (`rerun.Prepared.known`), read at last: the run reads
    every file again (`runner.run_paths`)."""


@dataclass(eq=False)
class Scanned:
    """A file of the run: its status, its bytes, how they decode, and their digest (`stats.digest`, known with a
    cache: the run's key, and what its answers are kept by). A file whose digest the rerun knew by its status
    (`rerun.Prepared.known`) is read only once something asks for its bytes: a rerun keeps most answers."""

    source_file: files.SourceFile
    stat: os.stat_result
    digest: str | None = None
    _source: bytes | None = None
    _encoding: str | None = None
    # Its digest is the `stats` table's, by a status unchanged since: its bytes are those a run before read.
    by_status: bool = False

    @property
    def source(self) -> bytes:
        if self._source is None:
            try:
                source, stat = sources.read_source(self.source_file.real_path)
            except sources.SourceError:
                raise Changed(self.source_file.path) from None
            if stats.status_of(stat) != stats.status_of(self.stat):
                raise Changed(self.source_file.path)
            self._source = source
        return self._source

    @property
    def encoding(self) -> str:
        if self._encoding is None:
            try:
                self._encoding = sources.source_encoding(self.source)
            except sources.SourceError:  # (the table only knows files that decode)
                raise Changed(self.source_file.path) from None
        return self._encoding


def digest_of(s: Scanned) -> str:
    """The digest of a file's bytes: the one read with them, else (a run without a cache, or a first run before
    `Reading.settle`) made now."""
    if s.digest is None:
        s.digest = stats.digest(s.source)
    return s.digest


@dataclass(eq=False)
class Reading:
    """How a run reads its files: with a cache, each file's digest comes from the `stats` table where its status
    is the one recorded (else from its bytes, recorded), and what the run asks of its bytes from `answers`."""

    answers: answers_module.Answers
    table: stats.StatTable | None = None
    started: int = 0
    # What the rerun found of each file it took the status of (`rerun.Prepared.known`): none is read again for that.
    known: Mapping[str, rerun.Known] = field(default_factory=dict)
    # Every question of `scans` the run asked (of some file): what a rerun asks an edited file (`bystanders`).
    asked: set[tuple[str, tuple[str, ...]]] = field(default_factory=set)
    # The classes whose module the run looked for among the files, by their paths (`_defining_files`).
    looked_for: set[str] = field(default_factory=set)

    def read(self, source_file: files.SourceFile) -> Scanned:
        """The file read once, as bytes, and checked to be decodable (`sources.SourceError` if not); one the rerun
        knew is read when first asked for its bytes."""
        seen = self.known.get(source_file.path)
        if seen is not None:
            return Scanned(source_file, seen.stat, seen.digest, seen.source, by_status=seen.source is None)
        source, stat = sources.read_source(source_file.real_path)
        scanned = Scanned(source_file, stat, _source=source, _encoding=sources.source_encoding(source))
        if self.table is not None:
            known = self.table.digest(source_file.real_path, stats.status_of(stat))
            scanned.digest = known if known is not None else stats.digest(source)
            scanned.by_status = known is not None
            self.table.record(source_file.real_path, stat, scanned.digest, self.started)
        return scanned

    def recall(
        self,
        s: Scanned,
        asked: str,
        answer: Callable[[], Answer],
        encode: Callable[[Answer], object],
        decode: Callable[[object], Answer],
    ) -> Answer:
        """`answers.Answers.recall` of the file ``s``."""
        return self.answers.recall(s.digest, asked, answer, encode, decode)

    def asking(self, kind: str, terms: Iterable[str | bytes]) -> Callable[[Scanned], bool]:
        """The question ``kind`` with ``terms`` (`scans.test`) of a file, its answer kept; the question is one
        of those the run asked (`asked`)."""
        spelled = answers_module.spell(terms)
        self.asked.add((kind, spelled))
        asked = answers_module.question(kind, spelled)
        made: list[scans.Test] = []  # the test, made once a file's answer is not kept (a rerun keeps most)

        def test(s: Scanned) -> bool:
            if not made:
                made.append(scans.test(kind, spelled))
            return made[0](s.source)

        return lambda s: self.recall(s, asked, lambda: test(s), bool, answers_module.boolean)


def read_and_filter(
    source_files: Sequence[files.SourceFile],
    prefilter: Sequence[bytes],
    report: RunReport,
    reading: Reading,
) -> tuple[list[Scanned], list[Scanned]]:
    """Read every file once; returns them all, and those worth parsing."""
    worth_parsing = reading.asking("prefilter", prefilter)
    scanned: list[Scanned] = []
    worth: list[Scanned] = []
    for source_file in source_files:
        try:
            item = reading.read(source_file)
        except sources.SourceError as error:
            report.errors.append(FileError(source_file.path, error.line, error.column, error.message))
            continue
        scanned.append(item)
        if worth_parsing(item):
            worth.append(item)
    report.scanned = len(source_files)
    return scanned, worth


def read_context(
    excluded: Sequence[files.SourceFile], prefilter: Sequence[bytes], reading: Reading
) -> tuple[list[Scanned], list[Scanned]]:
    """The excluded files that can be read as source, and those of them the ``prefilter`` keeps: what they
    define and call still decides the fixes of the others. One that cannot be read is left out silently:
    nothing is reported in excluded files."""
    context = []
    for source_file in excluded:
        try:
            context.append(reading.read(source_file))
        except sources.SourceError:
            continue
    worth_parsing = reading.asking("prefilter", prefilter)
    return context, [s for s in context if worth_parsing(s)]
