"""Sources -> the one event table of a run (DESIGN.md §2): the stages of ingestion, tied together.

build_events ties the stages together: the reader (ingest.reader) reads and prefilters the sources,
the scanner scans their lines (parse.lines.LineScanner) as each piece is ready, _Books books each
file, and ingest.table makes the table of every file's rows.
"""

from __future__ import annotations

import functools
import importlib
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ncclforensics.errors import UnsafeInputError
from ncclforensics.ingest import decode, shares
from ncclforensics.ingest.discover import STDIN_NAME, Root, roots_of, run_name
from ncclforensics.ingest.items import ChunkRead, Note, RootStart, Skip, SourceEnd, TailRead, UnitStart
from ncclforensics.ingest.reader import Reader
from ncclforensics.model import Skipped
from ncclforensics.parse.lines import KEEP_PROGRESS, FileContext, LineScanner
from ncclforensics.parse.prefilter import NUMPY_MIN, NUMPY_RUN_BYTES, numpy_module
from ncclforensics.parse.signatures import load_signatures

if TYPE_CHECKING:
    import polars as pl


@dataclass
class IngestResult:
    """The event table of a run and what reading it took (`events` is None only while it is read:
    the reading processes make rows, never a table, and never import polars)."""

    run: str
    events: pl.DataFrame
    files: int = 0
    lines: int = 0
    bytes: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    year_source: str = ""
    # build_events(aside=…): the work done beside the reading; its value comes from `aside.result()`
    aside: Aside | None = field(default=None, repr=False, compare=False)


def build_events(path: str | Path | Sequence[str | Path], *,
                 progress: Callable[[str, int], None] | None = None, jobs: int = 1,
                 aside: Callable[[], object] | None = None) -> IngestResult:
    """Read every source under `path` (or under each of several paths of one run, discover.roots_of;
    "-" is standard input) into the event table. Raises NoInputError for a missing path.
    `progress(file, nbytes)` is called as each piece of a file reaches the scanner.

    The reader walks the sources, reads and decompresses them and runs the block prefilter
    (Hyperscan); the scanner does the tail check and the line-level Python work on the hits, a
    piece at a time, in file order, in this thread. Memory stays flat: one chunk (16 MiB) and at
    most BATCH_BYTES of small files (ingest.reader) are held at a time.

    `jobs` > 1: a run large enough is read by up to that many processes, each reading the units
    of files and slices of big ones that it claims as its walk reaches them (ingest.shares); the
    units' rows join in walk order, so the table is the one a single process makes.

    `aside`: work that needs no event (a function of no argument; its value must pickle), whose value
    `result.aside.result()` gives. In a shared reading the last forked process does it once its books
    are sent (its core would idle while this one makes the table); with `jobs` > 1 and a run too small
    to share, a process forked for it alone; else this one, when asked.
    """
    roots = roots_of(path)
    run = ", ".join(STDIN_NAME if r.path is None else run_name(r.path) for r in roots)
    plan = shares.plan(roots, jobs, SHARE_MIN_BYTES, shares.UNITS_PER_PROCESS) if jobs > 1 else None
    beside = Aside(aside) if aside is not None else None
    if plan is not None:
        try:
            books = _read_shared(roots, run, plan, progress, beside)
        except BaseException:
            if beside is not None:
                beside.close()
            raise
        if books is not None:
            return _with_aside(books.finish(), beside)
        if beside is not None:
            beside.close()  # the shares read nothing: its process, if any, is not waited for
    elif beside is not None and jobs > 1:
        beside.start()  # a run too small to share: a process of its own does the work meanwhile
    return _with_aside(_read(roots, run, progress).finish(), beside)


def _with_aside(res: IngestResult, beside: Aside | None) -> IngestResult:
    res.aside = beside
    return res


_UNSET = object()


class Aside:
    """Work done beside a run's reading (build_events' `aside`): in a reading process, which sends
    its value after its books, in a process of its own (start), or here at the first `result()`. A
    process that fails or sends no value only costs the time it took: the work is then done here, so
    its errors are this process's."""

    def __init__(self, task: Callable[[], object]) -> None:
        self.task = task
        self._value: object = _UNSET
        self._proc = None
        self._conn = None

    def start(self) -> None:
        """Do the work in a process forked now (before the reading), if one can be."""
        mp = _fork_context()
        if mp is None or not forked_may_use_polars():
            return
        # the work uses polars (the several-runs check reads identities with it), and so does this
        # process's table: imported once, before forking, rather than by both
        importlib.import_module(_TABLE_MODULE)
        recv, send = mp.Pipe(duplex=False)
        proc = mp.Process(target=_aside_worker, args=(self.task, send), daemon=True, name="ncclforensics-aside")
        try:
            proc.start()
        except (OSError, AssertionError):  # no process left, or this one is a daemon (a pool's worker)
            recv.close()
            send.close()
            return
        send.close()
        self.give(proc, recv)

    def give(self, proc, conn) -> None:
        """The reading process doing the work, and the pipe its value comes by."""
        self._proc, self._conn = proc, conn

    def owns(self, proc) -> bool:
        return proc is self._proc

    def result(self) -> object:
        """The work's value: the reading process's, else done here (once)."""
        if self._value is _UNSET and self._conn is not None:
            try:
                sent = self._conn.recv()
            except (EOFError, OSError, pickle.UnpicklingError):
                sent = None
            self.close()
            if isinstance(sent, tuple) and len(sent) == 2 and sent[0] == "aside":
                self._value = sent[1]
        if self._value is _UNSET:
            self._value = self.task()
        return self._value

    def close(self) -> None:
        """Stop waiting for the reading process (ended, or killed when it still works)."""
        conn, proc, self._conn, self._proc = self._conn, self._proc, None, None
        if conn is not None:
            conn.close()
        if proc is not None:
            if proc.is_alive():
                proc.kill()
            proc.join()


def _read(roots: list[Root], run: str, progress: Callable[[str, int], None] | None,
          share: shares.Share | None = None) -> _Books:
    """The sources of `roots` (those of `share`, ingest.reader.Reader) read and booked."""
    books = _new_books(run)
    scanner = LineScanner(load_signatures())
    Reader(roots, scanner, share).run_into(_taker(scanner, lambda: books, progress))
    scanner.flush()
    return books


def _read_claimed(roots: list[Root], run: str, progress: Callable[[str, int], None] | None,
                  claims: shares.Claims) -> dict[int, _Books]:
    """The units this process claims as its walk reaches them (ingest.shares.Claims), read and
    booked: unit -> its books."""
    units: dict[int, _Books] = {}
    scanner = LineScanner(load_signatures())
    current: list[_Books | None] = [None]
    take = _taker(scanner, lambda: current[0], progress)

    def route(item) -> None:
        if isinstance(item, UnitStart):
            books = units.get(item.index)
            if books is None:
                books = units[item.index] = _new_books(run)
                books.root = item.root
            current[0] = books
        elif not isinstance(item, RootStart):  # each unit's books know their path (UnitStart)
            take(item)

    Reader(roots, scanner, claims).run_into(route)
    scanner.flush()
    return units


def _new_books(run: str) -> _Books:
    return _Books(IngestResult(run=run, events=None))  # type: ignore[arg-type]  # made by finish()


def _taker(scanner: LineScanner, books: Callable[[], _Books | None], progress: Callable[[str, int], None] | None):
    """The reader's sink: chunks and tails to the scanner, the rest booked (in `books()`) once the
    lines before it are scanned."""

    def take(item) -> None:
        match item:
            case ChunkRead(ctx=ctx, prep=prep, first_line=first_line):
                scanner.add_chunk(prep, first_line, ctx)
                if progress is not None:
                    progress(ctx.name, len(prep.data))
            case TailRead(ctx=ctx, data=data, first_line=first_line, last=last):
                scanner.add_tail(data, first_line, ctx, last)
            case Skip() | Note() | SourceEnd() | RootStart():
                # booked after the lines queued before it are scanned (a file's rows are complete)
                scanner.add_call(functools.partial(books().book, item))

    return take


SHARE_MIN_BYTES = shares.SHARE_MIN_BYTES  # tests lower it
_TABLE_MODULE = "ncclforensics.ingest.table"  # the event table's (polars): only where the table is made


def _read_shared(roots: list[Root], run: str, plan: shares.Plan,
                 progress: Callable[[str, int], None] | None, beside: Aside | None = None) -> _Books | None:
    """Read the run's units in plan.procs processes: this one and forked ones each read the units
    they claim (ingest.shares.Claims), the forked ones send their books back (the last one then does
    `beside`'s work). A unit whose process failed is read here. None when the units read no file
    (the run may be documents only: one reader decides how to read those)."""
    mp = _fork_context()
    if mp is None:
        return None  # no fork on this platform
    if plan.bytes >= NUMPY_RUN_BYTES or any(sh.largest >= NUMPY_MIN for sh in plan):
        numpy_module()  # imported now (it will be used), never by a thread while a child forks

    # the work beside goes to the last process only where a forked process may run it
    aside_there = beside is not None and forked_may_use_polars()
    if aside_there:
        # the work beside needs polars too (the several-runs check reads identities with it): imported
        # once here, before forking, rather than by both processes
        importlib.import_module(_TABLE_MODULE)
    table = mp.Array("i", [-1] * len(plan))  # unit -> the process that claimed it
    units = list(plan)

    workers = []
    for me in range(1, plan.procs):
        task = beside.task if aside_there and me == plan.procs - 1 else None  # type: ignore[union-attr]
        recv, send = mp.Pipe(duplex=False)
        proc = mp.Process(target=_share_worker, args=(roots, run, units, table, me, send, task), daemon=True,
                          name=f"ncclforensics-share-{me}")
        try:
            proc.start()
        except (OSError, AssertionError):  # no process left, or this one is a daemon (a pool's worker)
            recv.close()
            send.close()
            continue
        send.close()
        workers.append((proc, recv, task))
    try:
        # what only this process needs (the table's modules, polars among them: ~0.2 s), imported while
        # the forked readers read: they claim the units this one would have read meanwhile
        importlib.import_module(_TABLE_MODULE)

        read = _read_claimed(roots, run, progress, shares.Claims(units, table, 0))
        mine = set(read)  # their bytes were shown as they were read
        for proc, recv, task in workers:
            try:
                part = recv.recv()
            except (EOFError, OSError, pickle.UnpicklingError):
                part = None
            if beside is not None and task is not None and isinstance(part, dict):
                beside.give(proc, recv)  # its value comes after the books: it still works
            else:
                recv.close()
                if task is not None and proc.is_alive():
                    proc.kill()  # it failed its units: not waited for while it does the work
                proc.join()
            if isinstance(part, dict):
                read.update(part)
        books = _new_books(run)
        for u, unit in enumerate(units):
            part = read.get(u)
            if part is None:  # its process failed (or none reached it): read here
                part = _read(roots, run, None, unit)
            books.merge(part, None if u in mine else progress)
    finally:
        for proc, _, _ in workers:
            if proc.is_alive() and (beside is None or not beside.owns(proc)):
                proc.kill()
                proc.join()
    return books if books.files else None


def _fork_context():
    """multiprocessing's fork context, None where processes cannot fork."""
    import multiprocessing  # here: a run read by one process with nothing beside it never needs it

    try:
        return multiprocessing.get_context("fork")
    except ValueError:
        return None


def forked_may_use_polars() -> bool:
    """Whether a process forked now may run polars queries (the work beside a reading does: the
    several-runs check). Not once polars' thread pool has started here: fork copies no thread, so
    the child's first parallel query would wait for the pool's threads forever (a process that ran
    a query before: a test runner's, a scan worker's, a program calling build_events twice). The
    pool's threads are `polars-<n>`, its async runtime's `tokio-rt-worker` (Linux:
    /proc/self/task/<tid>/comm); where the threads cannot be listed, never."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if (name.startswith("polars-") and name[7:].isdigit()) or name.startswith("tokio-rt"):
            return False  # not polars-ooc-clea…, which `import polars` starts: the pool's threads are numbered
    return True


def _aside_worker(task: Callable[[], object], conn) -> None:
    """A forked process doing only the work beside a reading (Aside.start)."""
    try:
        conn.send(("aside", task()))
    except BaseException:  # anything: the parent does the work itself
        pass
    conn.close()


def _share_worker(roots: list[Root], run: str, units: list[shares.Share], table, me: int, conn,
                  task: Callable[[], object] | None = None) -> None:
    """A forked process: read the units it claims and send their books (unit -> books; None when
    reading failed: the parent then reads them itself and reports what goes wrong); then do `task`,
    if any, and send ("aside", its value) (nothing when it failed: the parent does it again)."""
    try:
        read = _read_claimed(roots, run, None, shares.Claims(units, table, me))
        for books in read.values():
            for ctx in books.files:
                ctx.seen = set()  # needed only while scanning: not worth its pickle
            for parts in books.parts.values():
                for end in parts:
                    end.src.stream = None  # an open file: not for a pickle, and read to its end
    except BaseException:  # anything: the parent reads the units again
        read = None
    try:
        conn.send(read)
    except (OSError, pickle.PicklingError, TypeError):
        pass
    del read
    if task is not None:
        try:
            conn.send(("aside", task()))
        except BaseException:  # anything (a broken pipe included): the parent does the work itself
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
    parts: dict[str, list[SourceEnd]] = field(default_factory=dict)  # slices of a file, until all are in

    def book(self, item: Skip | Note | SourceEnd | RootStart) -> None:
        match item:
            case RootStart(index=index):
                self.root = index
            case Skip(name=name, reason=reason, doc=doc):
                self._skip(Skipped(name, reason), doc)
            case Note(text=text):
                self.result.notes.append(text)
            case SourceEnd(part=None):
                self._source_done(item)
            case SourceEnd():
                self._part_done(item)

    def _part_done(self, end: SourceEnd) -> None:
        """A slice of a file: the file is booked once all its slices are in (this share's, or with
        the next shares', merge): where its last slice is, which is where reading it whole books it."""
        parts = self.parts.setdefault(end.src.name, [])
        parts.append(end)
        if len(parts) == end.part[1]:  # type: ignore[index]
            del self.parts[end.src.name]
            self._source_done(_joined(sorted(parts, key=lambda e: e.part)))

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
        # slices of a file cut between this share and the next join this share's first
        for parts in other.parts.values():
            for end in parts:
                self._part_done(end)
        self.files += other.files
        self.mtimes += other.mtimes
        if progress is not None and other.files:
            progress(other.files[-1].name, more.bytes)

    def finish(self) -> IngestResult:
        """The result, with the event table of every booked file's rows."""
        for parts in self.parts.values():  # never left over: every share is read (again, here)
            self._source_done(_joined(sorted(parts, key=lambda e: e.part)))
        self.parts.clear()
        self.result.skipped = [s for key in sorted(self.skips) for s in self.skips[key]]
        from ncclforensics.ingest.table import event_table

        forget_line_memos()  # their memory is the table's now

        rows = [r for c in self.files for r in c.rows + [p for ps in c.progress.values() for p in ps]]
        for c in self.files:  # the rows are the table's alone: it drops them once it holds them
            c.rows, c.progress = [], {}
        self.result.events, self.result.year_source = event_table(rows, self.result.run, self.mtimes)
        return self.result


def forget_line_memos() -> None:
    """What the line work remembers across lines (envelopes, signature matches, `extra` texts): dropped
    once a run is read, before its table is made (small_2048's peak memory is the table's making)."""
    from ncclforensics.ingest import envelope
    from ncclforensics.parse import lines

    envelope.forget()
    load_signatures().forget()
    lines.forget()


def _joined(parts: list[SourceEnd]) -> SourceEnd:
    """The slices of one file as one read of it: rows in order, line numbers shifted by the lines of
    the slices before, each rank's last progress rows; reading stops at the first slice that failed."""
    first = parts[0]
    ctx = first.ctx
    nbytes, error = first.nbytes, first.error
    offset = ctx.lines
    for end in parts[1:]:
        if error is not None:
            break
        for row in end.ctx.rows:
            row["line"] += offset
        ctx.rows += end.ctx.rows
        for rank, rows in end.ctx.progress.items():
            for row in rows:
                row["line"] += offset
            mine = ctx.progress.setdefault(rank, [])
            mine += rows
            if len(mine) > KEEP_PROGRESS:
                mine.sort(key=lambda r: r["line"])
                del mine[:-KEEP_PROGRESS]
        offset += end.ctx.lines
        nbytes += end.nbytes
        error = end.error
    ctx.lines = offset
    return SourceEnd(first.src, ctx, nbytes, error)
