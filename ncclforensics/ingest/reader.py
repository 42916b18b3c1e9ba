"""The reader: a run's sources -> items (ingest.items) for the scanner, in file order.

It reads and decompresses the sources and runs the block prefilter (Hyperscan) on each chunk, and
hands each item to the scanner as soon as it is ready (events._read), in the same thread. It owns the
source streams (a tar member's stream is valid only until the next member) and touches a FileContext
only before handing it over (Flight Recorder dumps, error.json): the scanner writes the rest.

It once ran in a thread of its own, one chunk or file ahead of the scanner. On two cores that thread
only contended for the GIL: every short native call that releases it (a Hyperscan scan, a newline
count) waited to take it back from the scanner's Python, and the scanner waited for the reader's
Python; reading in the scanner's thread is faster and holds less (bench/README.md, "Issue 14, seventh
round"). Several processes (ingest.shares) keep several cores busy; a compressed archive is still
decompressed ahead by a thread of its own (ingest.archive), which releases the GIL for long stretches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ncclforensics.errors import UnsafeInputError
from ncclforensics.ingest import archive, decode
from ncclforensics.ingest.attribution import path_hints
from ncclforensics.ingest.discover import Root, Source, iter_sources
from ncclforensics.ingest.filekinds import DOC_SUFFIXES, NOT_A_LOG, NOT_LOG_SUFFIXES
from ncclforensics.ingest.formats import read_slice, read_source
from ncclforensics.ingest.items import ChunkRead, Item, Note, RootStart, Skip, SourceEnd, TailRead, UnitStart
from ncclforensics.ingest.shares import Claims, Share, Slice
from ncclforensics.parse.lines import FileContext, LineScanner

# Small files read whole share one prefilter query (a query has a fixed cost: bench/README.md) up to
# this many bytes.
BATCH_BYTES = 8 << 20


class Reader:
    """`run_into(sink)`: the items of every source under `roots`, each handed to `sink` in walk order."""

    def __init__(self, roots: list[Root], scanner: LineScanner, share: Share | Claims | None = None) -> None:
        """`share`: what this reader reads when several processes share a run (ingest.shares,
        events.build_events): whole entries and slices of files, given (a Share) or claimed as the
        walk reaches them (Claims: each unit's items follow a UnitStart); such a reader reads no
        document as a log (a share may hold only documents)."""
        self.roots = roots
        self.scanner = scanner
        self.share = share
        self.root_index = 0
        self.unit: int | None = None  # the unit of Claims whose items are handed now
        self.pending: list[SourceEnd] = []  # small files read whole, waiting for one shared prefilter query
        self.pending_data: list[bytes] = []
        self.pending_bytes = 0
        self._sink: Callable[[Item], None] = lambda _item: None

    def run_into(self, sink: Callable[[Item], None]) -> None:
        """Read everything, handing each item to `sink` in order; an exception (the walk's or the
        sink's) is raised here."""
        self._sink = sink
        for i, root in enumerate(self.roots):
            self.root_index = i
            self._put(RootStart(i))
            self._walk(root, None if self.share is None else functools.partial(self._owns, i))
        if self.pending:
            self._prepare_pending()

    def _put(self, item: Item) -> None:
        if self.pending:
            self._prepare_pending()  # the small files read before this item come first
        self._sink(item)

    def _owns(self, root: int, entry: int) -> bool:
        if not self.share.owns(root, entry):  # type: ignore[union-attr]
            return False
        self._enter()
        return True

    def _enter(self, unit: int | None = None) -> None:
        """Items from here on are of `unit` (else the unit Claims claimed last): the small files read
        before are handed first, with the unit they were read in."""
        unit = getattr(self.share, "current", None) if unit is None else unit
        if unit is None or unit == self.unit:
            return
        if self.pending:
            self._prepare_pending()
        self.unit = unit
        self._sink(UnitStart(unit, self.root_index))

    def _defer(self, src: Source, ctx: FileContext, data: bytes, exc: BaseException | None) -> None:
        self.pending.append(SourceEnd(src, ctx, len(data), exc))
        self.pending_data.append(data)
        self.pending_bytes += len(data)
        if self.pending_bytes >= BATCH_BYTES:
            self._prepare_pending()

    def _prepare_pending(self) -> None:
        """One prefilter query for the small files read whole so far, then their items in order."""
        pending, datas = self.pending, self.pending_data
        self.pending, self.pending_data, self.pending_bytes = [], [], 0
        preps = self.scanner.prepare_chunks(datas)
        for end, data, prep in zip(pending, datas, preps, strict=True):
            end.ctx.lines = prep.newlines + (1 if data and not data.endswith(b"\n") else 0)
            self._sink(ChunkRead(end.ctx, prep, 1))
            self._sink(TailRead(end.ctx, data, 1, prep))
            self._sink(end)

    def _walk(self, root: Root, owned: Callable[[int], bool] | None) -> None:
        path = root.path
        is_dir = path is not None and path.is_dir()
        walking = is_dir or (path is not None and archive.is_archive(path.name))
        docs: list[tuple[str, int | None]] = []
        read_any = False
        for src in iter_sources(path, owned):
            src.name = root.prefix + src.name
            if (src.skipped or (walking and src.name.lower().endswith(NOT_LOG_SUFFIXES))) and not (
                    self.share is None or self.share.books_entry(self.root_index, src.entry)):
                continue  # a file cut into slices: the reader of its last one names it
            self._enter()
            if src.skipped:
                self._put(Skip(src.name, src.skipped))
                continue
            if walking and src.name.lower().endswith(NOT_LOG_SUFFIXES):
                if is_dir and src.name.lower().endswith(DOC_SUFFIXES):
                    docs.append((src.name, self.unit))  # read only if the folder holds no log at all
                else:
                    self._put(Skip(src.name, NOT_A_LOG))
                continue
            read_any = self._source(src) or read_any
        if docs and not read_any and owned is None:
            # a folder of pasted output saved as documents (an issue body as issue.md): read them
            names = [name for name, _ in docs]
            self._put(Note(f"no log files beside {', '.join(names[:3])}{' …' if len(names) > 3 else ''}: "
                           "read as logs"))
            for name in names:
                for src in iter_sources(path / name.removeprefix(root.prefix)):
                    src.name = name
                    self._source(src)
        else:
            for name, unit in docs:
                self._enter(unit)  # booked with the unit it was met in
                self._put(Skip(name, NOT_A_LOG, doc=True))

    def _source(self, src: Source) -> bool:
        """Read one source; whether it held any bytes."""
        if src.skipped:
            self._put(Skip(src.name, src.skipped))
            return False
        slices = None if self.share is None else self.share.slices_of(self.root_index, src.entry)
        if slices is not None:
            for sl in slices:
                self._enter()
                self._slice(src, sl)
            return True
        ctx = path_hints(src.name)
        nbytes, exc = 0, None
        try:
            nbytes = read_source(src, ctx, self.scanner, self._put, self._defer)
        except (UnsafeInputError, decode.BinaryContent, OSError) as err:
            exc = err
        if nbytes is None:  # deferred: a small file read whole
            return True
        self._put(SourceEnd(src, ctx, nbytes, exc))
        return nbytes > 0 and exc is None

    def _slice(self, src: Source, sl: Slice) -> None:
        ctx = path_hints(src.name)
        nbytes, exc = 0, None
        try:
            nbytes = read_slice(src, ctx, self.scanner, self._put, sl)
        except (UnsafeInputError, OSError) as err:
            exc = err
        self._put(SourceEnd(src, ctx, nbytes, exc, (sl.k, sl.n)))
