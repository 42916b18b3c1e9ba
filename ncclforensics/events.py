"""Sources -> the one event table of a run (DESIGN.md §2): the stages of ingestion, tied together.

build_events ties the stages together: the reader thread (ingest.reader) reads and prefilters the
sources, this thread scans their lines (parse.lines.LineScanner) and books each file (_Books), and
ingest.table makes the table of every file's rows.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from ncclforensics.errors import NoInputError, UnsafeInputError
from ncclforensics.ingest import decode
from ncclforensics.ingest.discover import STDIN_NAME, Root, entry_sizes, roots_of, run_name
from ncclforensics.ingest.items import ChunkRead, Note, RootStart, Skip, SourceEnd, TailRead
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
                 progress: Callable[[str, int], None] | None = None, jobs: int = 1) -> IngestResult:
    """Read every source under `path` (or under each of several paths of one run, discover.roots_of;
    "-" is standard input) into the event table. Raises NoInputError for a missing path.
    `progress(file, nbytes)` is called as each piece of a file reaches the scanner.

    A reader thread walks the sources, reads and decompresses them and runs the block prefilter
    (Hyperscan, which releases the GIL) one chunk or file ahead; this thread does the tail check
    and the line-level Python work on the hits, in file order. Memory stays flat: at most
    READ_AHEAD_BYTES of prepared chunks and BATCH_BYTES of small files (ingest.reader) wait.

    `jobs` > 1: a run of many files, large enough, is read by up to that many processes (CPUs),
    each reading its share of the files (_shares); the shares' rows join in walk order, so the
    table is the one a single process makes.
    """
    roots = roots_of(path)
    run = ", ".join(STDIN_NAME if r.path is None else run_name(r.path) for r in roots)
    owner = _shares(roots, jobs) if jobs > 1 else None
    if owner is not None:
        books = _read_shared(roots, run, owner, progress)
        if books is not None:
            return books.finish()
    return _read(roots, run, progress).finish()


def _read(roots: list[Root], run: str, progress: Callable[[str, int], None] | None,
          owned: Callable[[int, int], bool] | None = None) -> _Books:
    """The sources of `roots` (those `owned`, ingest.reader.Reader) read and booked."""
    books = _Books(IngestResult(run=run, events=pl.DataFrame(schema=EVENT_SCHEMA)))
    scanner = LineScanner(load_signatures())
    with Reader(roots, scanner, owned) as reader:
        for item in reader:
            match item:
                case ChunkRead(ctx=ctx, prep=prep, first_line=first_line):
                    scanner.add_chunk(prep, first_line, ctx)
                    if progress is not None:
                        progress(ctx.name, len(prep.data))
                case TailRead(ctx=ctx, data=data, first_line=first_line, last=last):
                    scanner.add_tail(data, first_line, ctx, last)
                case Skip() | Note() | SourceEnd() | RootStart():
                    # booked after the lines queued before it are scanned (a file's rows are complete)
                    scanner.add_call(functools.partial(books.book, item))
        scanner.flush()
    return books


# A run is shared between processes only when each gets at least this much to read: a process
# costs ~10-30 ms to fork and its rows a pickle back (bench/README.md, "Several processes").
SHARE_MIN_BYTES = 48 << 20


def _shares(roots: list[Root], jobs: int) -> dict[tuple[int, int], int] | None:
    """Which process reads each entry (root index, entry index: discover.entry_sizes) of the run:
    contiguous runs of entries of about equal bytes, one per process; None when one process
    should read it all (standard input, few or small entries, one CPU)."""
    if any(r.path is None for r in roots):
        return None
    try:
        entries = [(ri, ei, size) for ri, r in enumerate(roots)
                   for ei, (size, _) in enumerate(entry_sizes(r.path))]  # type: ignore[arg-type]
    except (NoInputError, OSError):
        return None  # the single reader says what is wrong
    total = sum(size for _, _, size in entries)
    n = min(jobs, cpus(), len(entries), total // SHARE_MIN_BYTES)
    if n < 2:
        return None
    owner: dict[tuple[int, int], int] = {}
    done = 0
    for ri, ei, size in entries:
        owner[(ri, ei)] = min(n - 1, int((done + size / 2) * n / total))
        done += size
    return owner


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _read_shared(roots: list[Root], run: str, owner: dict[tuple[int, int], int],
                 progress: Callable[[str, int], None] | None) -> _Books | None:
    """Read the run in len(set(owner.values())) processes: this one reads share 0, forked ones the
    others and send their books back. A share whose process fails is read here. None when the
    shares read no file (the run may be documents only: one reader decides how to read those)."""
    shares = sorted(set(owner.values()))
    try:
        mp = multiprocessing.get_context("fork")
    except ValueError:
        return None  # no fork on this platform
    workers = []
    for k in shares[1:]:
        recv, send = mp.Pipe(duplex=False)
        proc = mp.Process(target=_share_worker, args=(roots, run, owner, k, send), daemon=True,
                          name=f"ncclforensics-share-{k}")
        try:
            proc.start()
        except OSError:
            recv.close()
            workers.append((k, None, None))
            continue
        send.close()
        workers.append((k, proc, recv))
    try:
        books = _read(roots, run, progress, _owned_by(owner, 0))
        for k, proc, recv in workers:
            part = None
            if proc is not None:
                try:
                    part = recv.recv()
                except (EOFError, OSError, pickle.UnpicklingError):
                    part = None
                recv.close()
                proc.join()
            if not isinstance(part, _Books):
                part = _read(roots, run, None, _owned_by(owner, k))
            books.merge(part, progress)
    finally:
        for _, proc, _ in workers:
            if proc is not None and proc.is_alive():
                proc.kill()
                proc.join()
    return books if books.files else None


def _owned_by(owner: dict[tuple[int, int], int], k: int) -> Callable[[int, int], bool]:
    return lambda ri, ei: owner.get((ri, ei)) == k


def _share_worker(roots: list[Root], run: str, owner: dict[tuple[int, int], int], k: int, conn) -> None:
    """A forked process: read share k and send its books (or None when reading failed: the parent
    then reads the share itself and reports what goes wrong)."""
    try:
        books = _read(roots, run, None, _owned_by(owner, k))
        for ctx in books.files:
            ctx.seen = set()  # needed only while scanning: not worth its pickle
    except BaseException:  # anything: the parent reads the share again
        books = None
    try:
        conn.send(books)
    except (OSError, pickle.PicklingError, TypeError):
        pass
    conn.close()


@dataclass
class _Books:
    """What was read: the result's counts, skips and notes, the files whose rows go into the table,
    and their modification times (the year of year-less stamps, when no line has one).

    Skips are kept by (path of the run, whether a document): a path's documents are named after its
    other skips (ingest.reader.Reader._walk), also when shares of it were read apart (merge)."""

    result: IngestResult
    files: list[FileContext] = field(default_factory=list)
    mtimes: list[float] = field(default_factory=list)
    skips: dict[tuple[int, bool], list[Skipped]] = field(default_factory=dict)
    root: int = 0

    def book(self, item: Skip | Note | SourceEnd | RootStart) -> None:
        match item:
            case RootStart(index=index):
                self.root = index
            case Skip(name=name, reason=reason, doc=doc):
                self._skip(Skipped(name, reason), doc)
            case Note(text=text):
                self.result.notes.append(text)
            case SourceEnd():
                self._source_done(item)

    def _skip(self, skipped: Skipped, doc: bool = False) -> None:
        self.skips.setdefault((self.root, doc), []).append(skipped)

    def _source_done(self, end: SourceEnd) -> None:
        """Book a source that was read to its end (or to the error that stopped it)."""
        src, ctx, exc, result = end.src, end.ctx, end.error, self.result
        if isinstance(exc, UnsafeInputError):
            self._skip(Skipped(src.name, str(exc)))
            if ctx.rows or ctx.lines:
                result.notes.append(f"{src.name}: read only in part ({exc})")
                self.files.append(ctx)
            return
        if isinstance(exc, decode.BinaryContent):
            self._skip(Skipped(src.name, str(exc)))
            return
        if isinstance(exc, OSError):
            self._skip(Skipped(src.name, f"unreadable ({exc.strerror or exc})"))
            return
        if end.nbytes == 0 and not ctx.rows:
            self._skip(Skipped(src.name, "empty file"))
            return
        result.files += 1
        result.bytes += end.nbytes
        result.lines += ctx.lines
        self.files.append(ctx)
        if src.mtime:
            self.mtimes.append(src.mtime)

    def merge(self, other: _Books, progress: Callable[[str, int], None] | None) -> None:
        """Append the books of the share read after this one."""
        res, more = self.result, other.result
        res.files += more.files
        res.lines += more.lines
        res.bytes += more.bytes
        res.notes += more.notes
        for key, skipped in other.skips.items():
            self.skips.setdefault(key, []).extend(skipped)
        self.files += other.files
        self.mtimes += other.mtimes
        if progress is not None and other.files:
            progress(other.files[-1].name, more.bytes)

    def finish(self) -> IngestResult:
        """The result, with the event table of every booked file's rows."""
        self.result.skipped = [s for key in sorted(self.skips) for s in self.skips[key]]
        rows = [r for c in self.files for r in c.rows + [p for ps in c.progress.values() for p in ps]]
        self.result.events, self.result.year_source = event_table(rows, self.result.run, self.mtimes)
        return self.result
