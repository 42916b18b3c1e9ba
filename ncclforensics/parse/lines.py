"""Turn text chunks into event rows: block prefilter in polars, full signatures on candidate lines."""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from ncclforensics.ingest.envelope import ANSI, Envelope, peel, peel_all
from ncclforensics.model import EVENT_SCHEMA, MEANING_COLUMNS, TEXT_LIMIT
from ncclforensics.parse import blocks
from ncclforensics.parse.signatures import SignatureSet

BLOCK_SIZE = 64 << 10
LOOKAHEAD_CHARS = 128 << 10  # continuation lines of a block may run into the next block
LOOKAHEAD_STEP = 16 << 10  # decoded a piece at a time, when a line there is asked for
MAX_LINE = 1 << 20  # characters of one physical line examined at all
KEEP_PROGRESS = 2  # step_progress rows kept per file and rank (the last ones): progress lines are many
TAIL_CHARS = 1 << 20  # a file's last characters, where weak signatures always run
TAIL_PER_WRITER = 3  # weak-signature lines kept per rank from the tail (its last news)
TAIL_QUIET = 64  # stop walking back after this many tail hits in a row from known writers
# Rust regex keeps a literal alternation on its SIMD path (Teddy) up to 64 literals: ~2.5 GB/s a pass
# at 48 anchors, ~0.6 GB/s at 74 (measured, 1 GB). Groups are evaluated as separate columns, which
# polars runs on all cores; an any_horizontal over them would run them one after another.
ANCHOR_GROUP = 48
WEAK_GROUP = 20  # the weak literals include short words ("nan", "step") that hit often: smaller groups
SMALL_CHUNK = 256 << 10  # below this, Python substring checks of the anchors beat a polars round trip
FLUSH_LINES = 1 << 16  # queued lines that start the batched line selection
FLUSH_BYTES = 16 << 20  # queued chunk data (held by tails) that starts it


@dataclass
class FileContext:
    """What the path says about a file, and the rows found in it."""

    name: str
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    node: str = ""
    attempt: int | None = None  # torchrun --log-dir attempt_<n> (restarts of the worker group)
    rows: list[dict] = field(default_factory=list)
    progress: dict = field(default_factory=dict)  # rank -> its last step_progress rows
    lines: int = 0
    seen: set = field(default_factory=set)  # (line, kind, rank) already emitted


@dataclass
class Chunk:
    """A byte chunk after the block prefilter: hits are (block index, newlines before that block)."""

    data: bytes
    spans: list[tuple[int, int]]
    frame: pl.DataFrame | None
    hits: list[tuple[int, int]]
    newlines: int
    counts: list[int] | None = None  # newlines per block, when the prefilter counted them


class _Lines(list):
    """A hit block's lines, and the lines after it up to LOOKAHEAD_CHARS past its end, which a
    traceback or wrapped line running on may need: decoded when asked for (has)."""

    def __init__(self, data: bytes, a: int, b: int) -> None:
        self._data = data
        limit = data.find(b"\n", min(len(data), b + LOOKAHEAD_CHARS))
        self._limit = len(data) if limit < 0 else limit
        self._end = self._cut(b)
        super().__init__(data[a : self._end].decode("utf-8", "replace").split("\n"))

    def _cut(self, at: int) -> int:
        """The end of the line running at `at` (its newline's index), at most the limit."""
        end = self._data.find(b"\n", min(len(self._data), at))
        return self._limit if end < 0 else min(end, self._limit)

    def has(self, i: int) -> bool:
        """Whether line i exists (decoding more of the lookahead for it)."""
        while i >= len(self) and self._end < self._limit:
            end = self._cut(self._end + 1 + LOOKAHEAD_STEP)
            self.extend(self._data[self._end + 1 : end].decode("utf-8", "replace").split("\n"))
            self._end = end
        return i < len(self)


@dataclass
class _BlockWork:
    """A hit block's lines (running on past its end) waiting for the line selection."""

    ctx: FileContext
    lines: _Lines
    n_own: int  # lines that belong to the block; selection looks at these only
    line0: int  # line number of lines[0]


@dataclass
class _TailWork:
    """A file's end waiting for the weak-literal check: its blocks from the one that reaches into
    the last TAIL_CHARS on (`frame` holds them as a polars column until the flush)."""

    ctx: FileContext
    data: bytes  # the chunk the blocks are in
    spans: list[tuple[int, int]]  # the blocks, in data
    first_line: int  # line number of the first block's first line
    frame: pl.DataFrame | None
    counts: list[int] | None  # newlines per block, when known
    lines: list[str] = field(default_factory=list)
    line_at: list[int] = field(default_factory=list)


def _column_value(name: str, value: object) -> bool:
    return name in EVENT_SCHEMA and name not in ("file", "line", "text", "source", "kind", "run", "extra",
                                                 *MEANING_COLUMNS)


class LineScanner:
    """Scans chunks of one file; rows accumulate in the FileContext."""

    def __init__(self, sigset: SignatureSet) -> None:
        self.sigset = sigset
        self.literals = list(sigset.literals) + list(blocks.BLOCK_LITERALS)
        self.block_literals = list(sigset.strong_literals) + list(blocks.BLOCK_LITERALS)
        anchors = list(sigset.anchors) + [a for a in blocks.BLOCK_LITERALS if a not in sigset.anchors]
        # Rust regex alternations stay on their fast literal path up to ~16-24 alternatives
        # (measured: 16 -> ~2 GB/s, 64 -> ~0.7 GB/s, 128 -> ~0.3 GB/s): several small ones, OR-ed.
        self.anchor_bytes = [a.encode() for a in anchors] + [b"\x1b"]
        self.weak_literals = sorted({lit for sig in sigset.weak_signatures for lit in sig.prefilter})
        # Line selection inside a hit block: the same anchors (a superset of the literals' lines,
        # which candidates() checks exactly), the weak literals, and colour codes. Regex alternations
        # run several times faster than polars' contains_any (Aho-Corasick) over the same literals.
        self.weak_exprs = _literal_groups(self.weak_literals, WEAK_GROUP)
        self.block_exprs = _literal_groups(anchors, ANCHOR_GROUP)
        self._pending: list = []
        self._pending_lines = 0
        self._pending_bytes = 0

    # Each scan has two steps: prepare_chunk(s) (bytes and the polars block prefilter, no FileContext:
    # any thread may run it; events.build_events runs it in its reader thread, ahead of the scanner)
    # and add_* + flush (line selection and the Python work on the FileContext, batched).

    def scan_chunk(self, data: bytes, first_line: int, ctx: FileContext) -> int:
        """Scan one byte chunk now; returns the number of newlines in it."""
        prep = self.prepare_chunk(data)
        self.add_chunk(prep, first_line, ctx)
        self.flush()
        return prep.newlines

    def scan_tail(self, data: bytes, first_line: int, ctx: FileContext, chunk: Chunk | None = None) -> None:
        """Weak signatures over a file's last TAIL_CHARS bytes now (see add_tail)."""
        self.add_tail(data, first_line, ctx, chunk)
        self.flush()

    # -- block level -------------------------------------------------------------------
    def prepare_chunk(self, data: bytes) -> Chunk:
        """Which ~64 KiB blocks of the chunk hold an anchor (or a colour code), and its newlines."""
        return self.prepare_chunks([data])[0]

    def prepare_chunks(self, datas: list[bytes]) -> list[Chunk]:
        """prepare_chunk for several chunks (small files) in one polars query."""
        out: list[Chunk | None] = []
        todo: list[tuple[int, bytes, list[tuple[int, int]]]] = []
        for data in datas:
            spans = _block_spans(data)
            if not spans:
                out.append(Chunk(data, spans, None, [], 0, []))
            elif len(data) <= SMALL_CHUNK and not any(a in data for a in self.anchor_bytes):
                # a small file with nothing of interest: no polars round trip
                out.append(Chunk(data, spans, None, [], data.count(b"\n")))
            else:
                out.append(None)
                todo.append((len(out) - 1, data, spans))
        if not todo:
            return out  # type: ignore[return-value]
        frame = pl.DataFrame([_utf8_blocks([data[a:b] for _, data, spans in todo for a, b in spans])])
        # colour codes can sit inside a literal: such blocks go to Python, which strips them
        groups = {f"g{i}": e for i, e in enumerate(self.block_exprs)}
        res = frame.select(**groups, ansi=pl.col("b").str.contains("\x1b[", literal=True),
                           nl=pl.col("b").str.count_matches("\n", literal=True).fill_null(-1))
        all_hits = res.select(pl.any_horizontal(pl.exclude("nl"))).to_series().arg_true().to_list()
        all_counts = res["nl"].to_list()
        at = 0
        for i, data, spans in todo:
            n = len(spans)
            counts = [c if c >= 0 else data.count(b"\n", *spans[k])
                      for k, c in enumerate(all_counts[at : at + n])]
            hits = [h - at for h in all_hits[bisect_left(all_hits, at) : bisect_left(all_hits, at + n)]]
            before = []
            line_at = 0
            done = 0
            for bi in hits:
                line_at += sum(counts[done:bi])
                done = bi
                before.append(line_at)
            out[i] = Chunk(data, spans, frame.slice(at, n) if len(todo) > 1 else frame,
                           list(zip(hits, before, strict=True)), sum(counts), counts)
            at += n
        return out  # type: ignore[return-value]

    # The line-level work is batched: add_chunk / add_tail / add_call queue it, and flush() runs the
    # line selection of everything queued as one polars query (a query per block waited for the
    # pool threads the reader's prefilter keeps busy: 1.3 ms a call, ~1.7 s on the 1 GB bench run),
    # then the Python work in the order it was added. The queue is flushed when it holds
    # FLUSH_LINES lines or FLUSH_BYTES of retained chunk data, and must be flushed at the end.

    def add_chunk(self, prep: Chunk, first_line: int, ctx: FileContext) -> None:
        """Queue the lines of the chunk's hit blocks for signatures and blocks."""
        data = prep.data
        for k, (bi, before) in enumerate(prep.hits):
            a, b = prep.spans[bi]
            n_own = prep.counts[bi] if prep.counts else data.count(b"\n", a, b)
            n_own += 1 if b == len(data) and not data.endswith(b"\n") else 0
            lines = _Lines(data, a, b)
            # the lines hold on to the chunk (for their lookahead) until the flush
            self._queue(_BlockWork(ctx, lines, n_own or 1, first_line + before), len(lines),
                        len(data) if k == 0 else 0)

    def add_tail(self, data: bytes, first_line: int, ctx: FileContext, chunk: Chunk | None = None) -> None:
        """Queue the weak-signature scan of a file's end: `data` is the file's last chunk (`chunk`,
        whose polars frame is reused, when it is that chunk) or its last bytes; `first_line` numbers
        its first line. See _finish_tail."""
        if not self.weak_exprs or not data:
            return
        counts = None
        if chunk is not None and chunk.data is data and chunk.frame is not None:
            spans, frame, counts = chunk.spans, chunk.frame, chunk.counts
        else:
            spans = _block_spans(data)
            frame = pl.DataFrame([_utf8_blocks([data[a:b] for a, b in spans])])
        start = max(0, len(data) - TAIL_CHARS)
        k0 = next((k for k, (_, b) in enumerate(spans) if b > start), len(spans))
        if k0 == len(spans):
            return
        a0 = spans[k0][0]
        if counts:
            before, counts = sum(counts[:k0]), counts[k0:]
        else:
            before, counts = data.count(b"\n", 0, a0), None
        work = _TailWork(ctx, data, spans[k0:], first_line + before, frame.slice(k0), counts)
        self._queue(work, 0, 2 * len(data))  # the slice holds the chunk's frame until the flush

    def add_call(self, fn: Callable[[], object]) -> None:
        """Queue a call that must run after the work queued so far (a file's bookkeeping)."""
        self._queue(fn, 0, 0)

    def _queue(self, work: object, n_lines: int, n_bytes: int) -> None:
        self._pending.append(work)
        self._pending_lines += n_lines
        self._pending_bytes += n_bytes
        if self._pending_lines >= FLUSH_LINES or self._pending_bytes >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Run the queued work: tail block checks, then one line selection, then the Python part."""
        pending, self._pending = self._pending, []
        self._pending_lines = self._pending_bytes = 0
        tails = [w for w in pending if isinstance(w, _TailWork)]
        if tails:
            hit = _any_hit(pl.concat([t.frame for t in tails]), self.weak_exprs)
            first = 0
            for t in tails:
                n = len(t.spans)
                lo, hi = bisect_left(hit, first), bisect_left(hit, first + n)
                t.lines, t.line_at = _tail_lines(t, [k - first for k in hit[lo:hi]])
                t.frame = None
                first += n
        texts: list[str] = []
        for w in pending:
            if isinstance(w, _BlockWork):
                texts += w.lines[: w.n_own]
            elif isinstance(w, _TailWork):
                texts += w.lines
        strong, weak, weak_only = self._select(texts)
        at = 0
        for w in pending:
            if isinstance(w, _BlockWork):
                n = min(w.n_own, len(w.lines))
                idx = strong[bisect_left(strong, at) : bisect_left(strong, at + n)]
                only = weak_only[bisect_left(weak_only, at) : bisect_left(weak_only, at + n)]
                self._scan_block(w.lines, [i - at for i in idx], w.line0, w.ctx, {i - at for i in only})
                at += n
            elif isinstance(w, _TailWork):
                n = len(w.lines)
                idx = weak[bisect_left(weak, at) : bisect_left(weak, at + n)]
                self._finish_tail(w, [i - at for i in idx])
                at += n
            else:
                w()

    def _select(self, texts: list[str]) -> tuple[list[int], list[int], list[int]]:
        """Indices of the lines holding an anchor, weak literal or colour code; of those holding a
        weak literal; and of those holding a weak literal only."""
        if not texts:
            return [], [], []
        frame = pl.DataFrame({"b": texts}, schema={"b": pl.Utf8})
        strong = {f"s{i}": e for i, e in enumerate(self.block_exprs)}
        strong["ansi"] = pl.col("b").str.contains("\x1b", literal=True)
        weak = {f"w{i}": e for i, e in enumerate(self.weak_exprs)}
        res = frame.select(**strong, **weak)
        w_any = pl.any_horizontal(*weak) if weak else pl.lit(False)
        s_any = pl.any_horizontal(*strong)
        both = res.select(any=s_any | w_any, weak=w_any, only=w_any & ~s_any)
        return (both["any"].arg_true().to_list(), both["weak"].arg_true().to_list(),
                both["only"].arg_true().to_list())

    def _finish_tail(self, tail: _TailWork, idx: list[int]) -> None:
        """Weak signatures (progress, side work) on the tail's selected lines: each rank's last news.

        Walks back from the end, keeping the last TAIL_PER_WRITER hits of each writer (rank), and
        stops once TAIL_QUIET hits in a row brought no new writer: a per-rank file stops after a
        few lines, a console shared by hundreds of ranks goes back until it has seen them all.
        """
        lines, line_at = tail.lines, tail.line_at
        kept: dict[object, int] = {}
        quiet = 0
        for i in reversed(idx):
            if quiet > TAIL_QUIET:
                break
            clean = ANSI.sub("", lines[i][:MAX_LINE])
            for env in peel_all(clean):
                who = env.rank if env.rank is not None else (env.local_rank, env.key)
                n = kept.get(who, 0)
                quiet = 0 if n == 0 else quiet + 1
                kept[who] = n + 1
                if n >= TAIL_PER_WRITER:
                    continue
                for sig, fields in self.sigset.match_all(env.body, weak_only=True):
                    self._emit(tail.ctx, sig.source, sig.event, fields, env, line_at[i], clean)

    # -- line level --------------------------------------------------------------------
    def _scan_block(self, lines: _Lines, idx: list[int], line0: int, ctx: FileContext,
                    weak_only: set[int] | frozenset[int] = frozenset()) -> None:
        """Signatures and blocks from the selected lines `idx` of a hit block's lines (which run on
        into the next block, for continuation lines)."""
        consumed_until = -1
        cache: dict[int, Envelope] = {}

        def env_at(i: int) -> Envelope | None:
            if not lines.has(i):
                return None
            e = cache.get(i)
            if e is None:
                raw = lines[i][:MAX_LINE]
                e = peel(ANSI.sub("", raw.replace("\r", "")) if ("\x1b" in raw or "[" in raw) else raw)
                cache[i] = e
            return e

        progress: list[int] = []  # lines whose only candidate is a progress signature
        for i in idx:
            if i <= consumed_until:
                continue
            raw = lines[i][:MAX_LINE]
            if i in weak_only and self._progress_only(raw):
                progress.append(i)
                continue
            clean = ANSI.sub("", raw)
            envs = peel_all(clean)
            matched = False
            for env in envs:
                key = env.key

                def same_writer(j: int, _key: str = key) -> str | None:
                    e = env_at(j)
                    if e is None:
                        return None
                    if _key and e.key != _key:
                        # an interleaved line of another writer ends nothing: skip it
                        return "" if e.key else None
                    return e.body

                body = env.body
                if blocks.TRACEBACK_START in body:
                    view = _writer_view(same_writer, i)
                    blk, _ = blocks.parse_traceback(view, 0)
                    if blk is not None:
                        at = view.raw(blk.line_offset)
                        self._emit_block(ctx, blk, env, line0 + at, ANSI.sub("", lines[at]))
                        matched = True
                    continue
                if blocks.CHILD_FAILED in body:
                    view = _writer_view(same_writer, i)
                    blks, used = blocks.parse_child_failed(view, 0)
                    for blk in blks:
                        at = view.raw(blk.line_offset)
                        self._emit_block(ctx, blk, env, line0 + at, ANSI.sub("", lines[at]))
                    consumed_until = view.raw(max(0, used - 1))
                    matched = True
                    continue
                if body.endswith(blocks.FAULT_STACK):
                    blk, _ = blocks.parse_fault_stack(_writer_view(same_writer, i), 0)
                    if blk is not None:
                        self._emit_block(ctx, blk, env, line0 + i, clean)
                        matched = True
                    continue
                found = self.sigset.match_all(body)
                if not found and lines.has(i + 1):
                    found, body = self._rejoin(lines, i, body)
                for sig, fields in found:
                    if sig.event == "cpp_terminate" and "what" not in fields:
                        # `  what():  <message>` follows on the next line (FORMATS.md §1.3): the
                        # message tells a watchdog's teardown (a symptom) from a crash of its own
                        nb = same_writer(i + 1)
                        if nb is not None and nb.lstrip().startswith(blocks.CPP_WHAT):
                            fields = dict(fields, what=nb.lstrip()[len(blocks.CPP_WHAT):].strip()[:500])
                    if sig.event == "nccl_error":
                        for k in range(1, 6):
                            nb = same_writer(i + k)
                            if nb is not None and nb.strip() == blocks.LAST_ERROR:
                                last = blocks.parse_last_error(_writer_view(same_writer, i + k), 0)
                                if last:
                                    fields = dict(fields, last_error=last)
                                break
                    self._emit(ctx, sig.source, sig.event, fields, env, line0 + i, clean)
                    matched = True
            del matched
        self._scan_progress(lines, progress, line0, ctx)

    def _progress_only(self, raw: str) -> bool:
        """Whether the only signatures a line could match are progress ones (the body is part of the
        raw line, so its candidates are among the raw line's)."""
        cands = self.sigset.candidates(raw)
        return bool(cands) and all(sig.event == "step_progress" for sig in cands)

    def _scan_progress(self, lines: _Lines, idx: list[int], line0: int, ctx: FileContext) -> None:
        """Progress lines of a block, last first, until each writer has KEEP_PROGRESS rows: only a
        rank's last ones are kept (_emit), and a log may print one every step."""
        kept: dict[object, int] = {}
        for i in reversed(idx):
            clean = ANSI.sub("", lines[i][:MAX_LINE])
            for env in peel_all(clean):
                who = (env.key, env.rank, env.local_rank)
                if kept.get(who, 0) >= KEEP_PROGRESS:
                    continue
                for sig, fields in self.sigset.match_all(env.body):
                    self._emit(ctx, sig.source, sig.event, fields, env, line0 + i, clean)
                    if sig.event == "step_progress":
                        kept[who] = kept.get(who, 0) + 1

    def _rejoin(self, lines: _Lines, i: int, body: str) -> tuple[list, str]:
        """A hard-wrapped line: join the following unenveloped lines and try again (§1.8).

        A continuation starts mid-text: an indented line (a traceback's frame or code) is no
        continuation. A signature that the continuation matches by itself is left to that line, so
        one event is not emitted twice at two line numbers."""
        joined = body
        alone: list[str] = []
        for k in range(1, 3):
            if not lines.has(i + k):
                break
            nxt = ANSI.sub("", lines[i + k])
            e = peel(nxt)
            if e.key or e.ts is not None or e.sev is not None or not nxt.strip() or nxt[:1].isspace():
                break
            joined += nxt
            alone.append(nxt)
            found = [(sig, f) for sig, f in self.sigset.match_all(joined)
                     if not any(sig.match(a) is not None for a in alone)]
            if found:
                return found, joined
        return [], body

    # -- rows --------------------------------------------------------------------------
    def _emit(self, ctx: FileContext, source: str, kind: str, fields: dict, env: Envelope,
              line_no: int, text: str) -> None:
        emit_row(ctx, source, kind, fields, env, line_no, text)

    def _emit_block(self, ctx: FileContext, blk: blocks.Block, env: Envelope, line_no: int,
                    text: str) -> None:
        fields = dict(blk.fields)
        if blk.detail:
            fields["detail"] = blk.detail
        fields.update(blk.extra)
        source = "torchrun" if blk.kind == "child_failed" else "python"
        self._emit(ctx, source, blk.kind, fields, env, line_no, text)


def emit_row(ctx: FileContext, source: str, kind: str, fields: dict, env: Envelope, line_no: int,
         text: str) -> None:
    """Add one event row to the file's rows: typed fields into their columns (the rest into `extra`),
    rank/host/pid/time from the envelope, else from the path; each (line, kind, rank) once."""
    row: dict = {"file": ctx.name, "line": line_no, "source": source, "kind": kind,
                 "text": text[:TEXT_LIMIT]}
    extra = {}
    for k, v in fields.items():
        if _column_value(k, v):
            row[k] = v
        else:
            extra[k] = v
    if env.task is not None:
        extra["srun_task"] = env.task
    if env.world is not None:
        extra["world_size"] = env.world
    if env.uptime is not None:
        extra["uptime"] = env.uptime
    if env.nccl_dev is not None:
        extra["cuda_dev"] = env.nccl_dev
    if env.agent:
        extra["agent"] = True
    if ctx.attempt is not None:
        extra["attempt"] = ctx.attempt
    if extra:
        row["extra"] = json.dumps(extra, default=str)
    row.setdefault("ts", env.ts)
    if row.get("rank") is None:
        row["rank"] = env.rank if env.rank is not None else (None if env.agent else ctx.rank)
    if row.get("local_rank") is None and not env.agent:
        row["local_rank"] = env.local_rank if env.local_rank is not None else ctx.local_rank
    if row.get("host") is None:
        row["host"] = env.host or ctx.host
    if row.get("pid") is None and not env.agent:
        row["pid"] = env.pid
    if row.get("rank") is None and row.get("group_rank") is not None and row.get("pg") in (None, "0", "default_pg"):
        row["rank"] = row["group_rank"]
    row["node"] = ctx.node
    key = (line_no, kind, row.get("rank"))
    if key in ctx.seen:
        return  # the file's tail is scanned again for weak signatures
    ctx.seen.add(key)
    if kind == "step_progress":
        mine = ctx.progress.setdefault(row.get("rank"), [])  # per rank: consoles interleave them
        mine.append(row)
        if len(mine) > KEEP_PROGRESS:
            mine.sort(key=lambda r: r["line"])
            del mine[0]
        return
    ctx.rows.append(row)


def _writer_view(same_writer, base: int):
    """bodies(k) for k = 0, 1, …: the lines of one writer from `base` on, skipping interleaved ones."""
    mapping: list[int] = []
    j = base

    def bodies(k: int) -> str | None:
        nonlocal j
        while len(mapping) <= k:
            if j - base > blocks.MAX_BLOCK_LINES * 4:
                return None
            b = same_writer(j)
            if b is None:
                return None
            if b == "" and j != base:
                j += 1
                continue
            mapping.append(j)
            j += 1
        return same_writer(mapping[k])

    def raw(k: int) -> int:
        """The index into the block's lines of writer line k."""
        return mapping[k] if bodies(k) is not None or k < len(mapping) else base + k

    bodies.raw = raw  # type: ignore[attr-defined]
    return bodies


def _block_spans(data: bytes) -> list[tuple[int, int]]:
    """Cut `data` into ~BLOCK_SIZE spans that end just after a newline."""
    spans = []
    a = 0
    n = len(data)
    while a < n:
        b = a + BLOCK_SIZE
        if b >= n:
            spans.append((a, n))
            break
        nl = data.find(b"\n", b)
        if nl < 0:
            spans.append((a, n))
            break
        spans.append((a, nl + 1))
        a = nl + 1
    return spans


def _literal_groups(literals: list[str], size: int) -> list[pl.Expr]:
    """`str.contains` expressions over balanced groups of at most `size` literals."""
    if not literals:
        return []
    n = -(-len(literals) // size)
    per = -(-len(literals) // n)
    return [pl.col("b").str.contains("|".join(re.escape(x) for x in literals[i : i + per]))
            for i in range(0, len(literals), per)]


def _any_hit(frame: pl.DataFrame, exprs: list[pl.Expr]) -> list[int]:
    """Row indices where any expression is true; the expressions run as parallel columns."""
    if not exprs or frame.height == 0:
        return []
    res = frame.select(**{f"e{i}": e for i, e in enumerate(exprs)})
    return res.select(pl.any_horizontal(pl.all())).to_series().arg_true().to_list()


def _tail_lines(tail: _TailWork, hit_blocks: list[int]) -> tuple[list[str], list[int]]:
    """The lines of a tail's hit blocks and their line numbers."""
    lines: list[str] = []
    line_at: list[int] = []
    for bi in hit_blocks:
        a, b = tail.spans[bi]
        before = sum(tail.counts[:bi]) if tail.counts else tail.data.count(b"\n", tail.spans[0][0], a)
        base = tail.first_line + before
        block_lines = tail.data[a:b].decode("utf-8", "replace").split("\n")
        if block_lines and block_lines[-1] == "":
            block_lines.pop()
        lines += block_lines
        line_at += range(base, base + len(block_lines))
    return lines, line_at


def _utf8_blocks(pieces: list[bytes]) -> pl.Series:
    """Byte blocks as a polars string column (invalid UTF-8 replaced)."""
    try:
        return pl.Series("b", pieces, dtype=pl.Binary).cast(pl.Utf8)
    except pl.exceptions.ComputeError:
        # invalid UTF-8 somewhere (latin-1 logs, garbage): Python's decoder with replacement
        return pl.Series("b", [p.decode("utf-8", "replace") for p in pieces], dtype=pl.Utf8)
