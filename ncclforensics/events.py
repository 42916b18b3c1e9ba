"""Sources -> the one event table of a run (DESIGN.md §2), with rank, host and time filled in."""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from ncclforensics.bounded import BytesQueue
from ncclforensics.errors import UnsafeInputError
from ncclforensics.ingest import archive, decode
from ncclforensics.ingest.discover import STDIN_NAME, Root, Source, iter_sources, roots_of, run_name
from ncclforensics.ingest.envelope import UNKNOWN_YEAR, peel
from ncclforensics.model import EVENT_SCHEMA, TEXT_LIMIT, Skipped
from ncclforensics.parse import blocks, flight_recorder
from ncclforensics.parse.lines import MAX_LINE, TAIL_CHARS, FileContext, LineScanner, emit_row
from ncclforensics.parse.signatures import load_signatures
from ncclforensics.vocabulary import vocabulary

MAX_JSON_BYTES = 64 << 20
# Files beside the logs in a run folder that are not logs: scripts, configs, notes, tensors, images.
# Their text (`torch.save(...)` in a training script) would pass for evidence. Named explicitly, a
# file is always read.
NOT_LOG_SUFFIXES = (
    ".py", ".pyc", ".ipynb", ".md", ".rst", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".sh", ".sbatch",
    ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".so", ".o", ".a", ".whl", ".pt", ".pth", ".ckpt", ".bin",
    ".safetensors", ".npy", ".npz", ".parquet", ".png", ".jpg", ".jpeg", ".gif", ".svg", ".pdf",
    ".html", ".htm", ".css", ".js", ".lock",
)

NOT_A_LOG = "not a log (script, config, document or data file)"
# Documents among them that may be pasted console output (an issue body saved as issue.md): read when
# a folder holds nothing else.
DOC_SUFFIXES = (".md", ".rst")

_TORCHRUN_TREE = re.compile(r"(?:^|/)(?P<node>(?:[^/]+/)*?[^/]+)/attempt_(?P<attempt>\d+)/(?P<lr>\d+)/(?P<leaf>[^/]+)$")
_RANK_NAME = re.compile(r"(?:^|[^a-z])rank[_\-]?(?P<r>\d{1,6})(?![\d])", re.I)
# node05, gpu-q17, ip-10-0-0-1, worker12.cluster: letters, then a number that ends the short name
_HOSTISH = re.compile(r"^[A-Za-z][A-Za-z\-_]{0,40}\d[\d\-]{0,20}(?:\.[A-Za-z][\w\-]{0,62}){0,6}$")
_DMESG_HOST = re.compile(r"^(?:dmesg|kern|syslog|messages)[-_.](?P<host>[A-Za-z][\w.\-]+?)(?:\.(?:log|txt|out))?$")
_KERNEL_DIR = re.compile(r"^(?:dmesg|kern|kernel|syslog|messages)(?:[-_.]?logs?)?$", re.I)
_STEM = re.compile(r"(?:\.(?:log|txt|out))+$", re.I)
_EXTENSIONS = frozenset({"txt", "log", "out", "err", "gz", "bz2", "zst", "xz", "json"})
_NOT_HOST_DIRS = re.compile(
    r"^(?:attempt_\d+|\d+|logs?|torchrun_logs|fr_trace\w*|run\w*|job\w*|step\w*|output\w*|tmp|rank\w*|"
    r"epoch\w*|case\w*|test\w*|exp\w*|v\d+)$", re.I)


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


def path_hints(name: str) -> FileContext:
    """Rank, local rank, host and node key a file's path suggests (FORMATS.md §2.2)."""
    ctx = FileContext(name=name)
    parts = name.split("!")[-1].split("/")
    leaf = parts[-1]
    m = _TORCHRUN_TREE.search(name)
    if m is not None and m.group("leaf") in ("stdout.log", "stderr.log", "error.json"):
        ctx.local_rank = int(m.group("lr"))
        ctx.attempt = int(m.group("attempt"))
        ctx.node = m.group("node")
        dirs = m.group("node").split("/")[:-1]  # the part before <run_id>_<random>
    else:
        dirs = parts[:-1]
        rm = _RANK_NAME.search(leaf)
        if rm is not None:
            ctx.rank = int(rm.group("r"))
    dm = _DMESG_HOST.match(leaf)
    if dm is not None and dm.group("host").lower() not in _EXTENSIONS:  # dmesg.txt names no host
        ctx.host = dm.group("host")
    elif len(parts) > 1 and _KERNEL_DIR.match(parts[-2]):
        stem = _STEM.sub("", leaf)  # dmesg/gpu-b27.txt: one kernel log per host, named by the host
        if _HOSTISH.match(stem) and not _RANK_NAME.search(stem):
            ctx.host = stem
    for d in reversed(dirs):
        if _HOSTISH.match(d) and not _NOT_HOST_DIRS.match(d):
            ctx.host = ctx.host or d
            break
    if not ctx.node:
        ctx.node = ctx.host or ""
    return ctx


# Prepared chunk bytes the reader thread may hold ahead of the scanner (a chunk counts twice: its bytes
# and its polars column). Always at least one chunk; many small files' chunks fit, which smooths the
# scanner's bursts (it works in batches, LineScanner.flush).
READ_AHEAD_BYTES = 32 << 20
# Small files read whole share one prefilter query (a query per file costs ~1-2 ms of overhead) up to
# this many bytes.
BATCH_BYTES = 8 << 20


def build_events(path: str | Path | Sequence[str | Path], *,
                 progress: Callable[[str, int], None] | None = None) -> IngestResult:
    """Read every source under `path` (or under each of several paths of one run, discover.roots_of;
    "-" is standard input) into the event table. Raises NoInputError for a missing path.
    `progress(file, nbytes)` is called as each piece of a file reaches the scanner.

    A reader thread walks the sources, reads and decompresses them and runs the block prefilter
    (polars, which releases the GIL) one chunk or file ahead; this thread does the tail check and
    the line-level Python work on the hits, in file order (the split that keeps both threads
    about equally busy), batched over many files (LineScanner.flush). Memory stays flat: at most
    READ_AHEAD_BYTES of prepared chunks, BATCH_BYTES of small files and the scanner's FLUSH_BYTES wait.
    """
    roots = roots_of(path)
    run = ", ".join(STDIN_NAME if r.path is None else run_name(r.path) for r in roots)
    result = IngestResult(run=run, events=pl.DataFrame(schema=EVENT_SCHEMA))
    scanner = LineScanner(load_signatures())
    contexts: list[FileContext] = []
    mtimes: list[float] = []
    with _Reader(roots, scanner) as reader:
        for item in reader:
            match item:
                case ("skip", name, reason):
                    scanner.add_call(functools.partial(result.skipped.append, Skipped(name, reason)))
                case ("note", text):
                    scanner.add_call(functools.partial(result.notes.append, text))
                case ("chunk", ctx, prep, first_line):
                    scanner.add_chunk(prep, first_line, ctx)
                    if progress is not None:
                        progress(ctx.name, len(prep.data))
                case ("tail", ctx, (data, first, chunk)):
                    scanner.add_tail(data, first, ctx, chunk)
                case ("end", src, ctx, nbytes, exc):
                    scanner.add_call(functools.partial(_file_done, result, contexts, mtimes, src, ctx, nbytes,
                                                       exc))
        scanner.flush()
    rows = [r for c in contexts for r in c.rows + [p for ps in c.progress.values() for p in ps]]
    result.events, result.year_source = _table(rows, result.run, mtimes)
    return result


def _file_done(result: IngestResult, contexts: list[FileContext], mtimes: list[float], src: Source,
               ctx: FileContext, nbytes: int, exc: BaseException | None) -> None:
    """Book a source that was read to its end (or to the error that stopped it)."""
    if isinstance(exc, UnsafeInputError):
        result.skipped.append(Skipped(src.name, str(exc)))
        if ctx.rows or ctx.lines:
            result.notes.append(f"{src.name}: read only in part ({exc})")
            contexts.append(ctx)
        return
    if isinstance(exc, decode.BinaryContent):
        result.skipped.append(Skipped(src.name, str(exc)))
        return
    if isinstance(exc, OSError):
        result.skipped.append(Skipped(src.name, f"unreadable ({exc.strerror or exc})"))
        return
    if nbytes == 0 and not ctx.rows:
        result.skipped.append(Skipped(src.name, "empty file"))
        return
    result.files += 1
    result.bytes += nbytes
    result.lines += ctx.lines
    contexts.append(ctx)
    if src.mtime:
        mtimes.append(src.mtime)


class _Reader:
    """The reader thread: sources -> ("skip" | "chunk" | "tail" | "end", ...) items, in file order.

    It owns the source streams (a tar member's stream is valid only until the next member) and
    touches a FileContext only before handing it over (Flight Recorder dumps, error.json): the
    scanner thread writes the rest. An exception outside any one file ends the walk and is raised
    again in the scanner thread.
    """

    _DONE = object()

    def __init__(self, roots: list[Root], scanner: LineScanner) -> None:
        self.roots = roots
        self.scanner = scanner
        self.queue = BytesQueue(READ_AHEAD_BYTES)  # sized by the prepared chunks' bytes
        self.pending: list[tuple] = []  # small files read whole, waiting for one shared prefilter query
        self.pending_bytes = 0
        self.thread = threading.Thread(target=self._run, name="ncclforensics-reader", daemon=True)

    def __enter__(self) -> _Reader:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.queue.stop.set()  # the scanner is done (or failed): let the reader leave a blocked put()
        self.thread.join()

    def __iter__(self):
        while True:
            item = self.queue.get()
            if item is self._DONE:
                return
            if isinstance(item, tuple) and item[0] == "fatal":
                raise item[1]
            yield item

    def _put(self, item: object) -> None:
        if self.pending:
            self._prepare_pending()  # the small files read before this item come first
        self._put_now(item)

    def _defer(self, src: Source, ctx: FileContext, data: bytes, exc: BaseException | None) -> None:
        self.pending.append((src, ctx, data, exc))
        self.pending_bytes += len(data)
        if self.pending_bytes >= BATCH_BYTES:
            self._prepare_pending()

    def _prepare_pending(self) -> None:
        """One prefilter query for the small files read whole so far, then their items in order."""
        pending, self.pending, self.pending_bytes = self.pending, [], 0
        preps = self.scanner.prepare_chunks([data for _, _, data, _ in pending])
        for (src, ctx, data, exc), prep in zip(pending, preps, strict=True):
            ctx.lines = prep.newlines + (1 if data and not data.endswith(b"\n") else 0)
            self._put_now(("chunk", ctx, prep, 1))
            self._put_now(("tail", ctx, (data, 1, prep)))
            self._put_now(("end", src, ctx, len(data), exc))

    def _put_now(self, item: object) -> None:
        # a prepared chunk holds its bytes twice: as bytes and as a polars column
        size = 2 * len(item[2].data) if isinstance(item, tuple) and item[0] == "chunk" else 0
        if not self.queue.put(item, size):
            raise _Stopped

    def _run(self) -> None:
        try:
            for root in self.roots:
                self._walk(root)
            self._put(self._DONE)
        except _Stopped:
            return
        except BaseException as err:  # re-raised in the scanner thread, which reports it
            try:
                self._put_now(("fatal", err))  # not _put: the pending files' query may be what failed
            except _Stopped:
                return

    def _walk(self, root: Root) -> None:
        path = root.path
        is_dir = path is not None and path.is_dir()
        walking = is_dir or (path is not None and archive.is_archive(path.name))
        docs: list[str] = []
        read_any = False
        for src in iter_sources(path):
            src.name = root.prefix + src.name
            if src.skipped:
                self._put(("skip", src.name, src.skipped))
                continue
            if walking and src.name.lower().endswith(NOT_LOG_SUFFIXES):
                if is_dir and src.name.lower().endswith(DOC_SUFFIXES):
                    docs.append(src.name)  # read only if the folder holds no log at all
                else:
                    self._put(("skip", src.name, NOT_A_LOG))
                continue
            read_any = self._source(src) or read_any
        if docs and not read_any:
            # a folder of pasted output saved as documents (an issue body as issue.md): read them
            self._put(("note", f"no log files beside {', '.join(docs[:3])}{' …' if len(docs) > 3 else ''}: "
                               "read as logs"))
            for name in docs:
                for src in iter_sources(path / name.removeprefix(root.prefix)):
                    src.name = name
                    self._source(src)
        else:
            for name in docs:
                self._put(("skip", name, NOT_A_LOG))

    def _source(self, src: Source) -> bool:
        """Read one source; whether it held any bytes."""
        if src.skipped:
            self._put(("skip", src.name, src.skipped))
            return False
        ctx = path_hints(src.name)
        nbytes, exc = 0, None
        try:
            nbytes = _read_source(src, ctx, self.scanner, self._put, self._defer)
        except (UnsafeInputError, decode.BinaryContent, OSError) as err:
            exc = err
        if nbytes is None:  # deferred: a small file read whole
            return True
        self._put(("end", src, ctx, nbytes, exc))
        return nbytes > 0 and exc is None


class _Stopped(Exception):
    """The scanner thread stopped listening."""


def _read_source(src: Source, ctx: FileContext, scanner: LineScanner, put: Callable[[object], None],
                 defer: Callable[[Source, FileContext, bytes, BaseException | None], None] | None = None,
                 ) -> int | None:
    """Read one source in the reader thread; hands ("chunk", ...) and ("tail", ...) items to `put`
    and returns the bytes read, or hands a small text file read whole to `defer` (whose items
    follow later, in order) and returns None."""
    stream = src.stream
    # A file of known size below a chunk is read at once (no copy to join a sniffed head to the
    # rest); its start tells what the file is. Bigger ones start with a head (measured: a first
    # read of a whole chunk makes the 1 GB console 8 % slower).
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
        n = _read_dump(first + stream.read(flight_recorder.MAX_DUMP_BYTES + 1), ctx, is_pickle=True)
        return n
    if leaf.endswith(".json") and head.lstrip().startswith(b"{"):
        data = first + stream.read(MAX_JSON_BYTES)
        used = _read_json(data, ctx)
        if used is True:
            return len(data)
        if used == "document":
            raise decode.BinaryContent("JSON document, not a log (neither error.json nor a Flight Recorder dump)")
        stream, first = decode.Chained(data, stream), b""
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
    nbytes = 0
    line_no = 1
    prev = last = None
    try:
        for data in chunks:
            nbytes += len(data)
            prep = scanner.prepare_chunk(data)
            if last is not None:
                last[2].frame = None  # only the last chunk's frame is kept (prepare_tail reuses it)
            put(("chunk", ctx, prep, line_no))
            # of the chunk before the last, only its end may be needed (_tail): not the whole chunk
            prev, last = (None if last is None else (last[0][-TAIL_CHARS:],)), (data, line_no, prep)
            line_no += prep.newlines
    finally:  # what was read counts, also when the stream broke off
        ctx.lines = line_no - 1 + (1 if last is not None and not last[0].endswith(b"\n") else 0)
    if last is not None:
        data, first = _tail(prev, last, line_no)
        put(("tail", ctx, (data, first, last[2])))  # the scanner's thread checks it (balance)
    stream.read(1)  # confirm the end: a truncated compressed stream raises UnsafeInputError here
    return nbytes


def _tail(prev: tuple | None, last: tuple, next_line: int) -> tuple[bytes, int]:
    """The bytes whose end scan_tail reads (the last chunk, or the end of the one before and the
    last, when the last is shorter than TAIL_CHARS) and the number of their first line."""
    data, first = last[0], last[1]
    if len(data) < TAIL_CHARS and prev is not None:
        pdata = prev[0]
        cut = pdata.find(b"\n", max(0, len(pdata) - (TAIL_CHARS - len(data))))
        if cut >= 0:
            data = pdata[cut + 1 :] + data
            first = next_line - data.count(b"\n")
    return data, first


def _read_dump(data: bytes, ctx: FileContext, *, is_pickle: bool) -> int:
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
        ctx.rows.append(_valid_text(row))
    return len(data)


def _valid_text(row: dict) -> dict:
    """Lone UTF-16 surrogates (a pickle or a JSON `\\ud800` can carry them) become U+FFFD:
    a str holding one cannot be written out as UTF-8."""
    for k, v in row.items():
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                row[k] = v.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return row


def _read_json(data: bytes, ctx: FileContext) -> bool | str:
    """A torchrun error.json or a Flight Recorder JSON dump: True. Another JSON document:
    "document". Not one JSON document (JSON lines, a log): False."""
    try:
        obj = json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return False
    if flight_recorder.looks_like_dump(obj):
        _read_dump(data, ctx, is_pickle=False)
        return True
    if not isinstance(obj, dict) or "message" not in obj:
        return "document"
    msg = obj["message"]
    extra_info = {}
    if isinstance(msg, dict):
        extra_info = msg.get("extraInfo") or {}
        text = str(msg.get("message", ""))
    else:
        text = str(msg)
        extra_info = {"timestamp": obj.get("timestamp")}
    ts = None
    try:
        ts = dt.datetime.fromtimestamp(int(str(extra_info.get("timestamp"))), dt.UTC).replace(tzinfo=None)
    except (TypeError, ValueError, OverflowError, OSError):
        pass
    extra: dict = {"error_file": True}
    op = None
    stack = str(extra_info.get("py_callstack") or "")
    if stack:
        lines = stack.splitlines()
        blk, _ = blocks.parse_traceback(lambda k: lines[k] if k < len(lines) else None, 0)
        if blk is not None:
            for key in ("frames", "stack", "exc_type", "user_frames"):
                extra[key] = blk.extra.get(key)
            op = blk.fields.get("op")
    ctx.rows.append(_valid_text({
        "file": ctx.name, "line": 1, "ts": ts, "rank": ctx.rank, "local_rank": ctx.local_rank,
        "host": ctx.host, "node": ctx.node, "source": "torchrun", "kind": "error_file", "op": op,
        "detail": text[:TEXT_LIMIT], "extra": json.dumps(extra, default=str), "text": text[:TEXT_LIMIT],
    }))
    # the message is a log line too: the line signatures say what it means (a gloo timeout, a CUDA
    # OOM …), and the error_file row, a carrier, yields to them (patterns/signatures/torchrun/error_file.toml)
    for body in text.splitlines()[:50]:
        env = peel(body[:MAX_LINE])
        for sig, fields in load_signatures().match_all(env.body):
            before = len(ctx.rows)
            emit_row(ctx, sig.source, sig.event, fields, env, 1, body)
            for row in ctx.rows[before:]:
                if row.get("ts") is None:
                    row["ts"] = ts
                _valid_text(row)
    return True


def _nearest_year(t: dt.datetime, ref: dt.datetime, *, not_after: bool = False) -> dt.datetime | None:
    """`t` (its year unknown) in the year around `ref` that puts it nearest `ref`; with `not_after`
    (ref is the files' last write), never later than `ref`: a line cannot be newer than its file."""
    best = None
    for year in (ref.year - 1, ref.year, ref.year + 1):
        try:
            cand = t.replace(year=year)
        except ValueError:  # 29 February in a non-leap year
            continue
        gap = (cand.replace(tzinfo=None) - ref).total_seconds()
        if not_after and gap > 86_400:  # a day of slack for time zones: stamps are local, mtimes UTC
            continue
        gap = abs(gap)
        if best is None or gap < best[0]:
            best = (gap, cand)
    return best[1] if best else None


def _table(rows: list[dict], run: str, mtimes: list[float]) -> tuple[pl.DataFrame, str]:
    cols = list(EVENT_SCHEMA) + ["node"]
    data = {c: [r.get(c) for r in rows] for c in cols}
    data["run"] = [run] * len(rows)
    # year-less stamps (c10 header, torch logging, syslog) take the run's year (FORMATS.md §1.9): the
    # year that puts them nearest the run's dated stamps (or the files' modification time), so a run
    # across New Year keeps 31 December before 1 January
    full = sorted(t.replace(tzinfo=None) for t in data["ts"] if t is not None and t.year != UNKNOWN_YEAR)
    year_source = "log timestamps"
    if full:
        ref = full[len(full) // 2]
    elif mtimes:
        ref = dt.datetime.fromtimestamp(max(mtimes), dt.UTC).replace(tzinfo=None)
        year_source = "file modification time"
    else:
        ref, year_source = None, "unknown"
    fixed = []
    for t in data["ts"]:
        if t is not None and t.year == UNKNOWN_YEAR:
            t = _nearest_year(t, ref, not_after=year_source == "file modification time") if ref is not None else None
        fixed.append(t)
    data["ts"] = fixed
    schema = dict(EVENT_SCHEMA)
    schema["ts"] = pl.Datetime("us")
    schema["node"] = pl.Utf8
    schema["source"] = pl.Utf8
    schema["kind"] = pl.Utf8
    df = pl.DataFrame(data, schema=schema, strict=False)
    df = df.with_columns(pl.col("ts").dt.replace_time_zone("UTC"))
    # one host, one name: NCCL prints the name cut at the first dot, torchrun the FQDN (§10.1)
    df = df.with_columns(
        pl.when(pl.col("host").str.contains(r"^\d{1,3}(?:\.\d{1,3}){3}$|:|^\."))  # an IP; a redacted `...-48`
        .then(pl.col("host"))
        .otherwise(pl.col("host").str.split(".").list.first())
        .alias("host"))
    # the same Flight Recorder dump is often kept twice (pickle and JSON): one row per entry
    fr = pl.col("kind").is_in(["fr_entry", "fr_status", "fr_pg"])
    # the timeout line is repeated inside `... terminated with exception:` and `what():` (§3.4):
    # one timeout per (rank, PG, SeqNum, op) and file
    wd = (pl.col("kind") == "watchdog_timeout") & pl.col("rank").is_not_null()
    df = pl.concat([df.filter(~fr & ~wd),
                    df.filter(fr).unique(subset=["kind", "rank", "pg", "seq", "op", "line"], keep="first",
                                         maintain_order=True),
                    df.filter(wd).unique(subset=["file", "rank", "pg", "seq", "op"], keep="first",
                                         maintain_order=True)])
    df = _fill_ranks(df)
    df = df.sort(["ts", "rank", "file", "line"], nulls_last=True, maintain_order=True)
    df = vocabulary().annotate(vocabulary().drop_duplicates(df))
    df = df.with_columns(pl.col("source").cast(EVENT_SCHEMA["source"]), pl.col("kind").cast(pl.Categorical()))
    return df.select(list(EVENT_SCHEMA)), year_source


# A path naming one process (Slurm `-o %t` task files, `rank3.log`, `worker-3.err`: FORMATS.md §2.2)
_PER_PROCESS = re.compile(r"(?:^|[/_.\-])(?:task|worker|proc|rank)[_\-]?\d+(?:[/_.\-]|$)", re.I)


def _single_writer_files(df: pl.DataFrame) -> pl.DataFrame:
    """A file that one process wrote (srun -o %t, a job's task-N/output.txt): every line that names
    its rank names the same one, there is at most one local rank and one pid, and no launcher line
    (a console of several workers has torchrun's). Its lines without a rank are that rank's.

    One rank-bearing line in a console is not enough: a pasted excerpt often shows one rank's error
    beside the main process's unprefixed lines (MISSES G18). The file must name one process in its
    path, or carry that rank on two or more lines."""
    launcher = (pl.col("extra").str.contains('"agent": true').fill_null(False)
                | pl.col("kind").cast(pl.Utf8).is_in(list(vocabulary().kinds_from_launcher())))
    one = (df.group_by("file")
           .agg(pl.col("rank").drop_nulls().n_unique().alias("_nr"), pl.col("rank").drop_nulls().first().alias("_r1"),
                pl.col("line").filter(pl.col("rank").is_not_null()).n_unique().alias("_lines"),
                pl.col("local_rank").drop_nulls().n_unique().alias("_nl"),
                pl.col("pid").drop_nulls().n_unique().alias("_np"), launcher.any().alias("_launch"))
           .filter((pl.col("_nr") == 1) & (pl.col("_nl") <= 1) & (pl.col("_np") <= 1) & ~pl.col("_launch")
                   & ((pl.col("_lines") >= 2) | pl.col("file").str.contains(_PER_PROCESS.pattern)))
           .select("file", "_r1"))
    if one.is_empty():
        return df
    df = df.join(one, on="file", how="left", maintain_order="left")
    own = pl.col("source") != "kernel"
    return df.with_columns(pl.when(own).then(pl.coalesce("rank", "_r1")).otherwise(pl.col("rank"))
                           .alias("rank")).drop("_r1")


def _map_rank(df: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Fill `rank` from rows with the same `keys` that name exactly one rank."""
    known = (df.filter(pl.col("rank").is_not_null() & pl.all_horizontal(pl.col(k).is_not_null() for k in keys))
             .group_by(keys).agg(pl.col("rank").n_unique().alias("_n"), pl.col("rank").first().alias("_r"))
             .filter(pl.col("_n") == 1).drop("_n"))
    df = df.join(known, on=keys, how="left", maintain_order="left")
    return df.with_columns(pl.coalesce("rank", "_r").alias("rank")).drop("_r")


def _rank_from(df: pl.DataFrame, candidate: pl.Expr, *, allowed: bool = True,
               unchecked: bool = False) -> pl.DataFrame:
    """Fill `rank` from `candidate` where it is missing, if allowed and if every row that has both
    agrees (and at least one does, unless `unchecked`): a source of ranks is trusted only once it
    is seen to be right."""
    df = df.with_columns(candidate.alias("_cand"))
    both = df.filter(pl.col("rank").is_not_null() & pl.col("_cand").is_not_null())
    if allowed and (both.height or unchecked) and (both["rank"] == both["_cand"]).all():
        df = df.with_columns(pl.coalesce("rank", "_cand").alias("rank"))
    return df.drop("_cand")


def _srun_ranks(df: pl.DataFrame) -> pl.DataFrame:
    """Slurm task ids as global ranks, when Slurm started one task per GPU (FORMATS.md §1.7).

    Then no torchrun runs inside (no agent lines, no `[default<n>]:` local ranks) and every line that
    states its global rank agrees with its `srun --label` task id; with one torchrun per node the
    task id is the node index and this does nothing.
    """
    task = pl.coalesce(
        pl.col("extra").str.json_path_match("$.srun_task"),
        pl.when(pl.col("kind") == "srun_task_exit").then(pl.col("extra").str.json_path_match("$.task")),
    ).cast(pl.Int64, strict=False)
    launched = df.filter((pl.col("source") == "torchrun") | pl.col("local_rank").is_not_null()).height
    # with no torchrun line at all, srun started the workers themselves: the label is the rank even
    # where no line also states its rank to check it against
    return _rank_from(df, task, allowed=not launched, unchecked=True)


def _nccl_world_ranks(df: pl.DataFrame) -> pl.DataFrame:
    """NCCL init lines of the world communicator name global ranks (FORMATS.md §2.1, item 6).

    The world communicator is the largest one; its NCCL ranks are trusted as global ranks only when
    every such line that also states its global rank (a `[rank<n>]` prefix, a pid mapped to a rank)
    agrees, and when it is at least as large as the ranks seen.
    """
    nranks = pl.col("extra").str.json_path_match("$.nranks").cast(pl.Int64, strict=False)
    is_init = pl.col("kind") == "nccl_init"
    world = df.filter(is_init).select(nranks.max()).item() if df.height else None
    if world is None:
        return df
    nccl_rank = pl.col("extra").str.json_path_match("$.nccl_rank").cast(pl.Int64, strict=False)
    cand = pl.when(is_init & (nranks == world)).then(nccl_rank)
    # With no line to check them against (per-process NCCL_DEBUG_FILEs, no rank prefixes), they are
    # still trusted when each process has one world-sized communicator rank and no two processes
    # share one: a second communicator of that size with the ranks in another order would not pass.
    inits = (df.filter(is_init & (nranks == world) & pl.col("pid").is_not_null())
             .select("host", "pid", nccl_rank.alias("r")).drop_nulls("r").unique())
    unchecked = bool(inits.height) and (inits.group_by("host", "pid").len()["len"].max() == 1
                                        and inits["r"].n_unique() == inits.height)
    return _rank_from(df, cand, allowed=world >= df["rank"].drop_nulls().n_unique(), unchecked=unchecked)


def _line_ranks(df: pl.DataFrame) -> pl.DataFrame:
    """A line that names its rank names it for every event on it: `[Rank 2] NCCL watchdog thread
    terminated with exception: CUDA error: …` is rank 2's CUDA error too (FORMATS.md §3.8)."""
    named = (df.filter(pl.col("rank").is_not_null()).group_by("file", "line")
             .agg(pl.col("rank").n_unique().alias("_n"), pl.col("rank").first().alias("_lr"))
             .filter(pl.col("_n") == 1).drop("_n"))
    if named.is_empty():
        return df
    df = df.join(named, on=["file", "line"], how="left", maintain_order="left")
    return df.with_columns(pl.coalesce("rank", "_lr").alias("rank")).drop("_lr")


def _node_offsets(df: pl.DataFrame) -> pl.DataFrame:
    """torchrun gives a node's local ranks consecutive global ranks (`global_ranks=[8, …, 15]`,
    FORMATS.md §8.1): where every known (local rank, rank) pair of a torchrun node (a --log-dir
    tree's attempt_N/<local_rank>/ files) differs by one offset, a file of that node whose lines carry
    no rank prefix (a busy rank's stdout.log) gets local rank + offset."""
    tree = pl.col("extra").str.contains('"attempt"').fill_null(False)
    known = (df.filter(tree & pl.col("rank").is_not_null() & pl.col("local_rank").is_not_null())
             .group_by("_at").agg((pl.col("rank") - pl.col("local_rank")).unique().alias("_offs"))
             .filter(pl.col("_offs").list.len() == 1)
             .select("_at", pl.col("_offs").list.first().alias("_off")))
    if known.is_empty():
        return df
    df = df.join(known, on="_at", how="left", maintain_order="left")
    fill = tree & pl.col("rank").is_null() & pl.col("local_rank").is_not_null() & pl.col("_off").is_not_null()
    return df.with_columns(pl.when(fill).then(pl.col("local_rank") + pl.col("_off")).otherwise(pl.col("rank"))
                           .cast(pl.Int32).alias("rank")).drop("_off")


def _fill_ranks(df: pl.DataFrame) -> pl.DataFrame:
    """Global ranks from local ranks and pids (FORMATS.md §2.1): the map comes from rows having both."""
    if df.is_empty():
        return df
    df = _line_ranks(df)
    df = _srun_ranks(df)
    # Where a row ran: its node (torchrun log-dir tree, host folder), else its host, else the one host
    # its file names, else the file. Local ranks and pids mean something only within one such place.
    file_host = (df.filter(pl.col("host").is_not_null()).group_by("file")
                 .agg(pl.col("host").n_unique().alias("_nh"), pl.col("host").first().alias("_fh"))
                 .filter(pl.col("_nh") == 1).select("file", "_fh"))
    # An `srun --label` task id with torchrun inside is the node index (FORMATS.md §1.7): it names the
    # place of every line of that node's agent and workers, also those without a host.
    task = pl.col("extra").str.json_path_match("$.srun_task")
    df = df.join(file_host, on="file", how="left").with_columns(
        pl.when(task.is_not_null()).then(pl.concat_str([pl.col("file"), pl.lit("@task"), task]))
        .when(pl.col("node") != "").then(pl.col("node"))
        .otherwise(pl.coalesce("host", "_fh", "file")).alias("_at")
    ).drop("_fh")
    # (place, local_rank) -> rank, from rows that carry both (tee + rank prefix, ChildFailedError,
    # NCCL init); a pair that maps to more than one rank says nothing.
    df = _map_rank(df, ["_at", "local_rank"])
    df = _node_offsets(df)
    # a single-node run: local rank == global rank
    nodes = df.filter(pl.col("local_rank").is_not_null())["node"].unique().to_list()
    hosts = df["host"].drop_nulls().unique().to_list()
    if len(nodes) <= 1 and len(hosts) <= 1:
        df = df.with_columns(pl.coalesce("rank", "local_rank").alias("rank"))
    # worker pid -> rank (ChildFailedError, error.json, worker_failed lines carry pids)
    df = _map_rank(df, ["_at", "pid"])
    # NCCL's world-communicator ranks (checked against the ranks known so far), then pids again
    df = _map_rank(_nccl_world_ranks(df), ["_at", "pid"]).drop("_at")
    df = _single_writer_files(df)
    # and rank -> host, where some line of that rank named its host
    host_map = (df.filter(pl.col("rank").is_not_null() & pl.col("host").is_not_null())
                .group_by("rank").agg(pl.col("host").mode().first().alias("_h")))
    df = df.join(host_map, on="rank", how="left")
    return df.with_columns(pl.coalesce("host", "_h").alias("host")).drop("_h")
