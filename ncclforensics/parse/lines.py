"""Turn text chunks into event rows: block prefilter in polars, full signatures on candidate lines."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import polars as pl

from ncclforensics.ingest.envelope import ANSI, Envelope, peel, peel_all
from ncclforensics.model import EVENT_SCHEMA, TEXT_LIMIT
from ncclforensics.parse import blocks
from ncclforensics.parse.signatures import SignatureSet

BLOCK_SIZE = 64 << 10
LOOKAHEAD_CHARS = 128 << 10  # continuation lines of a block may run into the next block
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


@dataclass
class FileContext:
    """What the path says about a file, and the rows found in it."""

    name: str
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    node: str = ""
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


@dataclass
class Tail:
    """A file's last bytes and which of their blocks hold a weak literal."""

    data: bytes
    spans: list[tuple[int, int]]
    hit_blocks: list[int]
    first_line: int


def _column_value(name: str, value: object) -> bool:
    return name in EVENT_SCHEMA and name not in ("file", "line", "text", "source", "kind", "run", "extra")


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

    # Each scan has two steps: prepare_* (bytes and polars prefilters, no FileContext: any thread may
    # run it; events.build_events runs prepare_chunk in its reader thread, ahead of the scanner) and
    # finish_* (Python, line by line, on the FileContext).

    def scan_chunk(self, data: bytes, first_line: int, ctx: FileContext) -> int:
        """Scan one byte chunk; returns the number of newlines in it."""
        prep = self.prepare_chunk(data)
        self.finish_chunk(prep, first_line, ctx)
        return prep.newlines

    def scan_tail(self, data: bytes, first_line: int, ctx: FileContext, chunk: Chunk | None = None) -> None:
        """Weak signatures over a file's last TAIL_CHARS bytes (see finish_tail)."""
        self.finish_tail(self.prepare_tail(data, first_line, chunk), ctx)

    # -- block level -------------------------------------------------------------------
    def prepare_chunk(self, data: bytes) -> Chunk:
        """Which ~64 KiB blocks of the chunk hold an anchor (or a colour code), and its newlines."""
        spans = _block_spans(data)
        if not spans:
            return Chunk(data, spans, None, [], 0)
        if len(data) <= SMALL_CHUNK and not any(a in data for a in self.anchor_bytes):
            # a small file with nothing of interest: no polars round trip
            return Chunk(data, spans, None, [], data.count(b"\n"))
        frame = pl.DataFrame([_utf8_blocks(data, spans)])
        # colour codes can sit inside a literal: such blocks go to Python, which strips them
        groups = {f"g{i}": e for i, e in enumerate(self.block_exprs)}
        res = frame.select(**groups, ansi=pl.col("b").str.contains("\x1b[", literal=True),
                           nl=pl.col("b").str.count_matches("\n", literal=True).fill_null(-1))
        counts = [c if c >= 0 else data.count(b"\n", *spans[k]) for k, c in enumerate(res["nl"].to_list())]
        hits = res.select(pl.any_horizontal(pl.exclude("nl"))).to_series().arg_true().to_list()
        before = []
        line_at = 0
        done = 0
        for bi in hits:
            line_at += sum(counts[done:bi])
            done = bi
            before.append(line_at)
        return Chunk(data, spans, frame, list(zip(hits, before, strict=True)), sum(counts))

    def finish_chunk(self, prep: Chunk, first_line: int, ctx: FileContext) -> None:
        """Signatures and blocks on the lines of the chunk's hit blocks."""
        data = prep.data
        for bi, before in prep.hits:
            a, b = prep.spans[bi]
            ext_end = data.find(b"\n", min(len(data), b + LOOKAHEAD_CHARS))
            ext_end = len(data) if ext_end < 0 else ext_end
            n_own = data.count(b"\n", a, b) + (1 if b == len(data) and not data.endswith(b"\n") else 0)
            text = data[a:ext_end].decode("utf-8", "replace")
            self._scan_block(text.split("\n"), n_own or 1, first_line + before, ctx)

    def prepare_tail(self, data: bytes, first_line: int, chunk: Chunk | None = None) -> Tail:
        """The tail's blocks that hold a weak literal. `data` is the file's last chunk (`chunk`, whose
        polars frame is reused, when it is that chunk) or its last bytes; `first_line` numbers its
        first line."""
        if not self.weak_exprs or not data:
            return Tail(data, [], [], first_line)
        if chunk is not None and chunk.data is data and chunk.frame is not None:
            spans, frame = chunk.spans, chunk.frame
        else:
            spans = _block_spans(data)
            frame = pl.DataFrame([_utf8_blocks(data, spans)])
        start = max(0, len(data) - TAIL_CHARS)
        k0 = next((k for k, (_, b) in enumerate(spans) if b > start), len(spans))
        hit_blocks = [k0 + k for k in _any_hit(frame.slice(k0), self.weak_exprs)]
        return Tail(data, spans, hit_blocks, first_line)

    def finish_tail(self, tail: Tail, ctx: FileContext) -> None:
        """Weak signatures (progress, side work) over the tail's hit blocks: each rank's last news.

        Walks back from the end, keeping the last TAIL_PER_WRITER hits of each writer (rank), and
        stops once TAIL_QUIET hits in a row brought no new writer: a per-rank file stops after a
        few lines, a console shared by hundreds of ranks goes back until it has seen them all.
        """
        lines: list[str] = []
        line_at: list[int] = []
        for bi in tail.hit_blocks:
            a, b = tail.spans[bi]
            base = tail.first_line + tail.data.count(b"\n", 0, a)
            block_lines = tail.data[a:b].decode("utf-8", "replace").split("\n")
            if block_lines and block_lines[-1] == "":
                block_lines.pop()
            lines += block_lines
            line_at += range(base, base + len(block_lines))
        if not lines:
            return
        idx = _any_hit(pl.DataFrame({"b": lines}, schema={"b": pl.Utf8}), self.weak_exprs)
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
                    self._emit(ctx, sig.source, sig.event, fields, env, line_at[i], clean)

    # -- line level --------------------------------------------------------------------
    def _scan_block(self, lines: list[str], n_own: int, line0: int, ctx: FileContext) -> None:
        own = lines[:n_own]
        idx = _any_hit(pl.DataFrame({"b": own}, schema={"b": pl.Utf8}),
                       [*self.block_exprs, *self.weak_exprs, pl.col("b").str.contains("\x1b", literal=True)])
        consumed_until = -1
        cache: dict[int, Envelope] = {}

        def env_at(i: int) -> Envelope | None:
            if i >= len(lines):
                return None
            e = cache.get(i)
            if e is None:
                raw = lines[i][:MAX_LINE]
                e = peel(ANSI.sub("", raw.replace("\r", "")) if ("\x1b" in raw or "[" in raw) else raw)
                cache[i] = e
            return e

        for i in idx:
            if i <= consumed_until:
                continue
            raw = lines[i][:MAX_LINE]
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
                if not found and i + 1 < len(lines):
                    found, body = self._rejoin(lines, i, body)
                for sig, fields in found:
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

    def _rejoin(self, lines: list[str], i: int, body: str) -> tuple[list, str]:
        """A hard-wrapped line: join the following unenveloped lines and try again (§1.8)."""
        joined = body
        for k in range(1, 3):
            if i + k >= len(lines):
                break
            nxt = ANSI.sub("", lines[i + k])
            e = peel(nxt)
            if e.key or e.ts is not None or e.sev is not None or not nxt.strip():
                break
            joined += nxt
            found = self.sigset.match_all(joined)
            if found:
                return found, joined
        return [], body

    # -- rows --------------------------------------------------------------------------
    def _emit(self, ctx: FileContext, source: str, kind: str, fields: dict, env: Envelope,
              line_no: int, text: str) -> None:
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

    def _emit_block(self, ctx: FileContext, blk: blocks.Block, env: Envelope, line_no: int,
                    text: str) -> None:
        fields = dict(blk.fields)
        if blk.detail:
            fields["detail"] = blk.detail
        fields.update(blk.extra)
        source = "torchrun" if blk.kind == "child_failed" else "python"
        self._emit(ctx, source, blk.kind, fields, env, line_no, text)


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


def _utf8_blocks(data: bytes, spans: list[tuple[int, int]]) -> pl.Series:
    """The blocks as a polars string column (invalid UTF-8 replaced)."""
    try:
        return pl.Series("b", [data[a:b] for a, b in spans], dtype=pl.Binary).cast(pl.Utf8)
    except pl.exceptions.ComputeError:
        # invalid UTF-8 somewhere (latin-1 logs, garbage): Python's decoder with replacement
        return pl.Series("b", [data[a:b].decode("utf-8", "replace") for a, b in spans], dtype=pl.Utf8)
