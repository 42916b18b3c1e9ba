"""Read one source by its format: text becomes prefiltered chunks for the scanner, a document becomes rows.

Run by the reader (ncclforensics.ingest.reader). Text (UTF-8, UTF-16, CR-only, gzip'd) goes
to the scanner as prefiltered chunks and a tail; a Flight Recorder dump (pickle or JSON) and a
torchrun error.json become rows here; another JSON document is not a log.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from ncclforensics.errors import UnsafeInputError
from ncclforensics.ingest import archive, decode
from ncclforensics.ingest.discover import Source
from ncclforensics.ingest.items import ChunkRead, Item, TailRead
from ncclforensics.ingest.shares import Slice
from ncclforensics.parse import flight_recorder
from ncclforensics.parse.lines import TAIL_CHARS, FileContext, LineScanner
from ncclforensics.parse.prefilter import count_newlines
from ncclforensics.parse.torchrun_error import error_file_rows, is_error_file

MAX_JSON_BYTES = 64 << 20
NOT_A_LOG_JSON = "JSON document, not a log (neither error.json nor a Flight Recorder dump)"

Put = Callable[[Item], None]
Defer = Callable[[Source, FileContext, bytes, BaseException | None], None]


def read_source(src: Source, ctx: FileContext, scanner: LineScanner, put: Put, defer: Defer | None = None,
                ) -> int | None:
    """Read one source; hands its ChunkRead and TailRead items to `put` and returns the bytes read,
    or hands a small text file read whole to `defer` (whose items follow later, in order) and
    returns None. Raises UnsafeInputError, decode.BinaryContent or OSError for a source that
    cannot be read (to its end)."""
    stream = src.stream
    # A file of known size below a chunk is read at once (no copy to join a sniffed head to the
    # rest); its start tells what the file is. Bigger ones start with a head (a whole first chunk
    # was slower: bench/README.md, "Figures the code's comments rest on").
    small = src.size is not None and src.size < decode.CHUNK_SIZE
    first = stream.read(src.size + 1 if small else decode.HEAD_SIZE)
    head = first[: decode.HEAD_SIZE]
    kind = decode.sniff(head)
    if kind == "gzip" and archive.compression_of(src.name) is None:
        stream = archive.decompressing(decode.Chained(first, stream), "gz", src.size, src.name)
        first = stream.read(decode.HEAD_SIZE)
        head = first
        kind = decode.sniff(head)
    if kind == "empty":
        return 0
    leaf = src.name.rsplit("/", 1)[-1]
    if kind == "pickle":
        return read_dump(first + stream.read(flight_recorder.MAX_DUMP_BYTES + 1), ctx, is_pickle=True)
    if leaf.endswith(".json") and head.lstrip().startswith(b"{"):
        data = first + stream.read(MAX_JSON_BYTES)
        if read_json(data, ctx):
            return len(data)
        stream, first = decode.Chained(data, stream), b""  # JSON lines, or a log named .json
    if kind == "utf-16":
        chunks = decode.utf16_chunks(stream, first)
    elif decode.cr_only(head):
        chunks = decode.iter_chunks(decode.CrToLf(stream), first.replace(b"\r", b"\n"))
    else:
        if defer is not None and small and first:
            # the whole file is in hand: its prefilter can run together with other small files'
            err = None
            try:
                more = stream.read(decode.CHUNK_SIZE)
                if not more:
                    stream.read(1)  # confirm the end: a truncated compressed stream raises here
            except (UnsafeInputError, OSError) as exc:
                more, err = b"", exc
            if not more:
                defer(src, ctx, decode.clean(first), err)
                return None
            first += more  # the file grew while it was read
        chunks = decode.iter_chunks(stream, first)
    nbytes = _put_chunks(chunks, ctx, scanner, put, tail=True)
    stream.read(1)  # confirm the end: a truncated compressed stream raises UnsafeInputError here
    return nbytes


def read_slice(src: Source, ctx: FileContext, scanner: LineScanner, put: Put, sl: Slice) -> int:
    """Read one slice of a plain text file (ingest.shares): its chunks as ChunkRead items with lines
    numbered from 1, and the file's tail when it is the last slice; returns the bytes read."""
    stream = src.stream
    stream.seek(sl.start)
    head = stream.read(sl.grid - sl.start)
    rest = stream if sl.end is None else _Capped(stream, sl.end - sl.grid)
    return _put_chunks(decode.iter_chunks(rest, head, keep_tail=sl.end is None), ctx, scanner, put,
                       tail=sl.end is None)


def _put_chunks(chunks, ctx: FileContext, scanner: LineScanner, put: Put, *, tail: bool) -> int:
    """Prefilter each chunk and hand it to `put` (lines numbered from 1); then, with `tail`, the
    file's end for the scanner's tail check. Sets ctx.lines; returns the bytes read."""
    nbytes = 0
    line_no = 1
    before_last = b""  # the end of the chunk before the last: the tail may need it
    last: ChunkRead | None = None
    try:
        for data in chunks:
            nbytes += len(data)
            prep = scanner.prepare_chunk(data)
            if last is not None:
                before_last = last.prep.data[-TAIL_CHARS:]
            last = ChunkRead(ctx, prep, line_no)
            put(last)
            line_no += prep.newlines
    finally:  # what was read counts, also when the stream broke off
        ctx.lines = line_no - 1 + (1 if last is not None and not last.prep.data.endswith(b"\n") else 0)
    if last is not None and tail:
        put(tail_of(last, before_last, line_no))  # the scanner's thread checks it (balance)
    return nbytes


class _Capped:
    """The next `left` bytes of a stream (a file: its reads fill what they are asked for, but at its end)."""

    fills_readinto = True  # decode.iter_chunks reads it into its buffer

    def __init__(self, stream, left: int) -> None:
        self._stream = stream
        self._left = left

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        data = self._stream.read(self._left if n < 0 else min(n, self._left))
        self._left -= len(data)
        return data

    def readinto(self, b) -> int:
        view = memoryview(b)[: max(0, min(len(b), self._left))]
        got = self._stream.readinto(view) if len(view) else 0
        self._left -= got
        return got


def tail_of(last: ChunkRead, before_last: bytes, next_line: int) -> TailRead:
    """The bytes whose end the scanner's tail check reads: the last chunk, with the end of the one
    before when the last is shorter than TAIL_CHARS."""
    data, first = last.prep.data, last.first_line
    if len(data) < TAIL_CHARS and before_last:
        cut = before_last.find(b"\n", max(0, len(before_last) - (TAIL_CHARS - len(data))))
        if cut >= 0:
            data = before_last[cut + 1 :] + data
            first = next_line - count_newlines(data)
    return TailRead(last.ctx, data, first, last.prep)


def read_dump(data: bytes, ctx: FileContext, *, is_pickle: bool) -> int:
    """A Flight Recorder dump's rows into `ctx.rows`; the bytes read."""
    try:
        obj = flight_recorder.parse_dump(data, is_pickle=is_pickle)
    except flight_recorder.UnsafePickle as exc:
        raise UnsafeInputError(f"pickle refused without running it: {exc}") from None
    except ValueError as exc:
        raise UnsafeInputError(str(exc)) from None
    rank = flight_recorder.rank_from_name(ctx.name)
    try:
        rows = flight_recorder.dump_rows(obj, file=ctx.name, rank=rank)
    except RecursionError:  # str()/json.dumps of a list nested thousands deep
        raise UnsafeInputError("Flight Recorder dump nested too deeply") from None
    for row in rows:
        row.setdefault("host", ctx.host)
        row["node"] = ctx.node
        ctx.rows.append(decode.writable_row(row))
    return len(data)


def read_json(data: bytes, ctx: FileContext) -> bool:
    """A Flight Recorder JSON dump or a torchrun error.json: its rows into `ctx.rows`, True. Not one
    JSON document (JSON lines, a log): False. Another JSON document: decode.BinaryContent."""
    try:
        obj = json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return False
    if flight_recorder.looks_like_dump(obj):
        read_dump(data, ctx, is_pickle=False)
        return True
    if not is_error_file(obj):
        raise decode.BinaryContent(NOT_A_LOG_JSON)
    error_file_rows(obj, ctx)
    return True
