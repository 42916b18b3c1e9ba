"""Sources -> the one event table of a run (DESIGN.md §2): the stages of ingestion, tied together.

build_events ties the stages together: the reader thread (ingest.reader) reads and prefilters the
sources, this thread scans their lines (parse.lines.LineScanner) and books each file (_Books), and
ingest.table makes the table of every file's rows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from ncclforensics.errors import UnsafeInputError
from ncclforensics.ingest import decode
from ncclforensics.ingest.discover import STDIN_NAME, roots_of, run_name
from ncclforensics.ingest.items import ChunkRead, Note, Skip, SourceEnd, TailRead
from ncclforensics.ingest.reader import Reader
from ncclforensics.ingest.table import event_table
from ncclforensics.model import EVENT_SCHEMA, Skipped
from ncclforensics.parse.lines import FileContext, LineScanner
from ncclforensics.parse.signatures import load_signatures


@dataclass
class IngestResult:
    """The event table of a run and what reading it took."""

    run: str
    events: pl.DataFrame
    files: int = 0
    lines: int = 0
    bytes: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    year_source: str = ""


def build_events(path: str | Path | Sequence[str | Path], *,
                 progress: Callable[[str, int], None] | None = None) -> IngestResult:
    """Read every source under `path` (or under each of several paths of one run, discover.roots_of;
    "-" is standard input) into the event table. Raises NoInputError for a missing path.
    `progress(file, nbytes)` is called as each piece of a file reaches the scanner.

    A reader thread walks the sources, reads and decompresses them and runs the block prefilter
    (polars, which releases the GIL) one chunk or file ahead; this thread does the tail check and
    the line-level Python work on the hits, in file order (the split that keeps both threads
    about equally busy), batched over many files (LineScanner.flush). Memory stays flat: at most
    READ_AHEAD_BYTES of prepared chunks, BATCH_BYTES of small files (ingest.reader) and the
    scanner's FLUSH_BYTES wait.
    """
    roots = roots_of(path)
    run = ", ".join(STDIN_NAME if r.path is None else run_name(r.path) for r in roots)
    books = _Books(IngestResult(run=run, events=pl.DataFrame(schema=EVENT_SCHEMA)))
    scanner = LineScanner(load_signatures())
    with Reader(roots, scanner) as reader:
        for item in reader:
            match item:
                case ChunkRead(ctx=ctx, prep=prep, first_line=first_line):
                    scanner.add_chunk(prep, first_line, ctx)
                    if progress is not None:
                        progress(ctx.name, len(prep.data))
                case TailRead(ctx=ctx, data=data, first_line=first_line, last=last):
                    scanner.add_tail(data, first_line, ctx, last)
                case Skip() | Note() | SourceEnd():
                    # booked after the lines queued before it are scanned (a file's rows are complete)
                    scanner.add_call(functools.partial(books.book, item))
        scanner.flush()
    return books.finish()


@dataclass
class _Books:
    """What was read: the result's counts, skips and notes, the files whose rows go into the table,
    and their modification times (the year of year-less stamps, when no line has one)."""

    result: IngestResult
    files: list[FileContext] = field(default_factory=list)
    mtimes: list[float] = field(default_factory=list)

    def book(self, item: Skip | Note | SourceEnd) -> None:
        match item:
            case Skip(name=name, reason=reason):
                self.result.skipped.append(Skipped(name, reason))
            case Note(text=text):
                self.result.notes.append(text)
            case SourceEnd():
                self._source_done(item)

    def _source_done(self, end: SourceEnd) -> None:
        """Book a source that was read to its end (or to the error that stopped it)."""
        src, ctx, exc, result = end.src, end.ctx, end.error, self.result
        if isinstance(exc, UnsafeInputError):
            result.skipped.append(Skipped(src.name, str(exc)))
            if ctx.rows or ctx.lines:
                result.notes.append(f"{src.name}: read only in part ({exc})")
                self.files.append(ctx)
            return
        if isinstance(exc, decode.BinaryContent):
            result.skipped.append(Skipped(src.name, str(exc)))
            return
        if isinstance(exc, OSError):
            result.skipped.append(Skipped(src.name, f"unreadable ({exc.strerror or exc})"))
            return
        if end.nbytes == 0 and not ctx.rows:
            result.skipped.append(Skipped(src.name, "empty file"))
            return
        result.files += 1
        result.bytes += end.nbytes
        result.lines += ctx.lines
        self.files.append(ctx)
        if src.mtime:
            self.mtimes.append(src.mtime)

    def finish(self) -> IngestResult:
        """The result, with the event table of every booked file's rows."""
        rows = [r for c in self.files for r in c.rows + [p for ps in c.progress.values() for p in ps]]
        self.result.events, self.result.year_source = event_table(rows, self.result.run, self.mtimes)
        return self.result
