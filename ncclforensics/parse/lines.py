"""Turn text chunks into event rows: a literal prefilter over blocks and lines, full signatures on candidate lines."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ncclforensics.ingest.envelope import ENVELOPE_CHARS, ENVELOPE_STARTS, Envelope, peel, peel_all, plain, strip_ansi
from ncclforensics.model import EVENT_COLUMNS, MEANING_COLUMNS, TEXT_LIMIT
from ncclforensics.parse import blocks
from ncclforensics.parse.prefilter import LiteralSet, count_newlines
from ncclforensics.parse.signatures import SignatureSet

BLOCK_SIZE = 64 << 10
LOOKAHEAD_CHARS = 128 << 10  # continuation lines of a block may run into the next block
LOOKAHEAD_STEP = 16 << 10  # decoded a piece at a time, when a line there is asked for
MAX_LINE = 1 << 20  # characters of one physical line examined at all
KEEP_PROGRESS = 2  # step_progress rows kept per file and rank (the last ones): progress lines are many
TAIL_CHARS = 1 << 20  # a file's last characters, where weak signatures always run
TAIL_PER_WRITER = 3  # weak-signature lines kept per rank from the tail (its last news)
TAIL_QUIET = 64  # stop walking back after this many tail hits in a row from known writers
TAIL_QUIET_ONE = 16  # the same in a file one process wrote (a launcher's per-worker file): its writers are one rank
WRAP_MIN = blocks.WRAP_MIN  # a matched physical line this long may have been hard-wrapped (_rewrapped)
MAX_MATCH_JOIN = 4000  # characters a hard-wrapped line is joined up to
# lines a hard-wrapped line runs on over: the first few whatever their length (the last piece of a wrap is
# short), then only while each line is as long as the first, the terminal's width (a DETAIL fingerprint
# mismatch, ~800 characters, is 8-11 lines at 80-100 columns: FORMATS.md §1.8, §7.1)
FEW_WRAP_LINES = 4
MAX_WRAP_LINES = 40
ESC = "\x1b"


@dataclass
class FileContext:
    """What the path says about a file, and the rows found in it."""

    name: str
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    node: str = ""
    attempt: int | None = None  # torchrun --log-dir attempt_<n> (restarts of the worker group)
    one_process: bool = False  # only one worker's output (torchrun --log-dir, mpirun --output-filename)
    rows: list[dict] = field(default_factory=list)
    progress: dict = field(default_factory=dict)  # rank -> its last step_progress rows
    lines: int = 0
    seen: set = field(default_factory=set)  # (line, kind, rank) already emitted


@dataclass
class Chunk:
    """A byte chunk after the block prefilter: `hits` are (block index, newlines before that block);
    `newlines` counts the chunk's newlines and `tail_at` = (block index, newlines before it) of the
    first block reaching into the chunk's last TAIL_CHARS bytes."""

    data: bytes
    spans: list[tuple[int, int]]
    hits: list[tuple[int, int]]
    newlines: int
    tail_at: tuple[int, int] = (0, 0)


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


# the columns a signature's typed field goes into (the others go into `extra`)
_FIELD_COLUMNS = frozenset(EVENT_COLUMNS) - {"file", "line", "text", "source", "kind", "run", "extra", *MEANING_COLUMNS}


class LineScanner:
    """Scans chunks of one file; rows accumulate in the FileContext.

    Three literal searches (parse/prefilter.py, Hyperscan) keep Python off the lines that repeat by
    the million (NCCL_DEBUG noise, a progress line per step): `blocks` finds the ~64 KiB blocks
    holding an anchor (every strong literal contains one) or a colour code; `lines` selects, in a
    hit block, the lines holding an anchor, a colour code or a weak literal; `weak` finds the
    lines of a file's end holding a weak literal, searched back from the end only as far as needed.
    """

    def __init__(self, sigset: SignatureSet) -> None:
        self.sigset = sigset
        self.literals = list(sigset.literals) + list(blocks.BLOCK_LITERALS)
        self.block_literals = list(sigset.strong_literals) + list(blocks.BLOCK_LITERALS)
        anchors = list(sigset.anchors) + [a for a in blocks.BLOCK_LITERALS if a not in sigset.anchors]
        self.weak_literals = sorted({lit for sig in sigset.weak_signatures for lit in sig.prefilter})
        # literals only progress signatures use: a line holding these and no other literal can only be
        # a progress line, and only each writer's last ones count (_scan_progress)
        progress = [lit for lit in self.weak_literals
                    if all(sig.event == "step_progress" for sig in sigset.by_literal[lit])]
        # colour codes can sit inside a literal: such blocks go to Python, which strips them
        self.block_set = LiteralSet({"strong": anchors + [ESC + "["]})
        # in a hit block: lines for the signatures, and progress lines that may carry an envelope
        # (a writer of their own); the plain ones (envelope.plain) are found from the end (progress_set)
        lits = "(?:" + "|".join(re.escape(x) for x in progress) + ")"
        hinted = [f"{lits}[^\\n]*{ENVELOPE_CHARS}", f"{ENVELOPE_CHARS}[^\\n]*{lits}",
                  f"{ENVELOPE_STARTS}[^\\n]*{lits}"] if progress else []
        self.line_set = LiteralSet({"strong": anchors + [ESC],
                                    "weak": [lit for lit in self.weak_literals if lit not in progress]},
                                   patterns={"hinted": hinted})
        self.progress_set = LiteralSet({"progress": progress})
        self.weak_set = LiteralSet({"weak": self.weak_literals})

    # Each scan has two steps: prepare_chunk (bytes and the block prefilter, no FileContext: the
    # reader runs it, ingest.reader) and add_* (the line-level Python work on the FileContext).

    def scan_chunk(self, data: bytes, first_line: int, ctx: FileContext) -> int:
        """Scan one byte chunk now; returns the number of newlines in it."""
        prep = self.prepare_chunk(data)
        self.add_chunk(prep, first_line, ctx)
        return prep.newlines

    def scan_tail(self, data: bytes, first_line: int, ctx: FileContext, chunk: Chunk | None = None) -> None:
        """Weak signatures over a file's last TAIL_CHARS bytes now (see add_tail)."""
        self.add_tail(data, first_line, ctx, chunk)

    # -- block level -------------------------------------------------------------------
    def prepare_chunk(self, data: bytes) -> Chunk:
        """Which ~64 KiB blocks of the chunk hold an anchor (or a colour code), and its newlines."""
        spans = _block_spans(data)
        if not spans:
            return Chunk(data, spans, [], 0)
        hit = self.block_set.blocks_with_any(data, spans)
        # newlines counted once, in pieces: up to each hit block and up to the tail's first block
        start = max(0, len(data) - TAIL_CHARS)
        k0 = next((k for k in range(max(0, len(spans) - (TAIL_CHARS // BLOCK_SIZE) - 2), len(spans))
                   if spans[k][1] > start), len(spans) - 1)
        marks = sorted(set(hit) | {k0})
        before = {}
        n = at = 0
        for k in marks:
            a = spans[k][0]
            n += count_newlines(data, at, a)
            at = a
            before[k] = n
        n += count_newlines(data, at)
        return Chunk(data, spans, [(k, before[k]) for k in hit], n, (k0, before[k0]))

    def prepare_chunks(self, datas: list[bytes]) -> list[Chunk]:
        """prepare_chunk for several chunks."""
        return [self.prepare_chunk(d) for d in datas]

    # -- line level, per chunk -----------------------------------------------------------

    def add_chunk(self, prep: Chunk, first_line: int, ctx: FileContext) -> None:
        """Signatures and blocks on the selected lines of the chunk's hit blocks."""
        data = prep.data
        for bi, before in prep.hits:
            a, b = prep.spans[bi]
            nl = count_newlines(data, a, b)
            n_own = nl + (1 if b == len(data) and not data.endswith(b"\n") else 0)
            lines = _Lines(data, a, b)
            sel = self.line_set.lines_with(data, a, b)
            n = min(n_own or 1, len(lines))
            strong, weak = set(sel.get("strong", ())), set(sel.get("weak", ()))
            selected = strong | weak
            hinted = [i for i in sel.get("hinted", ()) if i < n and i not in selected]
            consumed = self._scan_block(lines, sorted(i for i in selected if i < n), first_line + before, ctx)
            self._scan_progress(lines, hinted, selected, consumed, (data, a, b, nl, n), first_line + before, ctx)

    def add_tail(self, data: bytes, first_line: int, ctx: FileContext, chunk: Chunk | None = None) -> None:
        """Weak signatures over a file's end: `data` is the file's last chunk (`chunk`, whose block
        spans and newline counts are reused, when it is that chunk) or its last bytes; `first_line`
        numbers its first line. See _walk_tail."""
        if self.weak_set.empty or not data:
            return
        if chunk is not None and chunk.data is data:
            spans, (k0, before) = chunk.spans, chunk.tail_at
            tail_newlines = chunk.newlines - before
        else:
            spans = _block_spans(data)
            start = max(0, len(data) - TAIL_CHARS)
            k0 = next((k for k, (_, b) in enumerate(spans) if b > start), len(spans))
            if k0 == len(spans):
                return
            before = count_newlines(data, 0, spans[k0][0])
            tail_newlines = count_newlines(data, spans[k0][0])
        if k0 >= len(spans):
            return
        self._walk_tail(ctx, data, spans[k0:], first_line + before, tail_newlines)

    def add_call(self, fn: Callable[[], object]) -> None:
        """Run a call after the work added so far (a file's bookkeeping)."""
        fn()

    def flush(self) -> None:
        """Nothing waits: each add_* does its work at once (kept for callers that flush)."""

    def _walk_tail(self, ctx: FileContext, data: bytes, spans: list[tuple[int, int]], first_line: int,
                   newlines: int) -> None:
        """Weak signatures (progress, side work) on the tail's weak lines: each rank's last news.

        Walks back from the end line by line, keeping the last TAIL_PER_WRITER
        hits of each writer (rank), and stops once TAIL_QUIET hits in a row brought no new writer: a
        per-rank file stops after a few lines, a console shared by hundreds of ranks goes back
        until it has seen them all. In a file a launcher wrote for one worker every writer is that
        rank (its prints, torch's `[rankN]:` lines, NCCL's): TAIL_QUIET_ONE hits are enough there.
        `spans` are the tail's blocks, `newlines` the newlines in them. One backward search over the
        tail (prefilter.LiteralSet.lines_backward: windows doubling from the end) finds the weak lines
        and counts newlines only as far back as the walk goes: a file whose weak lines are sparse (a
        progress line every 50 steps among NCCL's `COLL` lines) is searched once, not once to find
        the blocks holding a weak literal and again for their lines.
        """
        kept: dict[object, int] = {}
        quiet = 0
        quiet_max = TAIL_QUIET_ONE if ctx.one_process else TAIL_QUIET
        for i, text in self.weak_set.lines_backward(data, spans[0][0], spans[-1][1], newlines=newlines):
            if quiet > quiet_max:
                return
            if kept.get(_TAIL_PLAIN, 0) >= TAIL_PER_WRITER and plain(text):
                quiet += 1  # a line without envelope: that writer, known already (as below)
                kept[_TAIL_PLAIN] += 1
                continue
            clean = strip_ansi(text[:MAX_LINE])
            for env in peel_all(clean):
                who = env.rank if env.rank is not None else (env.local_rank, env.key)
                n = kept.get(who, 0)
                quiet = 0 if n == 0 else quiet + 1
                kept[who] = n + 1
                if n >= TAIL_PER_WRITER:
                    continue
                for sig, fields in self.sigset.match_all(env.body, weak_only=True):
                    self._emit(ctx, sig.source, sig.event, fields, env, first_line + i, clean)

    # -- line level --------------------------------------------------------------------
    def _scan_block(self, lines: _Lines, idx: list[int], line0: int, ctx: FileContext) -> list[tuple[int, int]]:
        """Signatures and blocks from the selected lines `idx` of a hit block's lines (which run on
        into the next block, for continuation lines). Returns the (first, last) lines of the
        ChildFailedError blocks found, whose lines are theirs only."""
        consumed_until = -1
        consumed: list[tuple[int, int]] = []  # (line, last line of the block it started)
        cache: dict[int, Envelope] = {}

        def env_at(i: int) -> Envelope | None:
            if not lines.has(i):
                return None
            e = cache.get(i)
            if e is None:
                raw = lines[i][:MAX_LINE]
                e = peel(strip_ansi(raw.replace("\r", "")) if ("\x1b" in raw or "[" in raw) else raw)
                cache[i] = e
            return e

        for i in idx:
            if i <= consumed_until:
                continue
            raw = lines[i][:MAX_LINE]
            clean = strip_ansi(raw)
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
                        self._emit_block(ctx, blk, env, line0 + at, strip_ansi(lines[at]))
                        matched = True
                    continue
                if blocks.CHILD_FAILED in body:
                    view = _writer_view(same_writer, i)
                    blks, used = blocks.parse_child_failed(view, 0)
                    for blk in blks:
                        at = view.raw(blk.line_offset)
                        self._emit_block(ctx, blk, env, line0 + at, strip_ansi(lines[at]))
                    consumed_until = view.raw(max(0, used - 1))
                    consumed.append((i, consumed_until))
                    matched = True
                    continue
                if body.endswith(blocks.FAULT_STACK):
                    blk, _ = blocks.parse_fault_stack(_writer_view(same_writer, i), 0)
                    if blk is not None:
                        self._emit_block(ctx, blk, env, line0 + i, clean)
                        matched = True
                    continue
                found = self.sigset.match_all(body)
                if not found and lines.has(i + 1) and not _FRAME.match(body):
                    found, joined = self._rejoin(lines, i, body)
                    if found:
                        body = joined
                if not found and i > 0 and len(envs) == 1 and not (env.key or env.ts is not None or env.sev):
                    back = self._rejoin_back(lines, i, body)
                    if back is not None:
                        at, start_env, start_text, back_found = back
                        for sig, fields in back_found:
                            self._emit(ctx, sig.source, sig.event, fields, start_env, line0 + at, start_text)
                        continue
                if found and max(len(body), len(lines[i])) >= WRAP_MIN and lines.has(i + 1):
                    found = self._rewrapped(lines, i, env.body, found)
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
        return consumed

    def _scan_progress(self, lines: _Lines, hinted: list[int], selected: set[int], consumed: list[tuple[int, int]],
                       block: tuple[bytes, int, int, int, int], line0: int, ctx: FileContext) -> None:
        """Progress lines of a block, last first, until each writer has KEEP_PROGRESS rows: only a
        rank's last ones are kept (_emit), and a log may print one every step.

        A progress line is one holding a progress literal (`step`, `epoch` …) and no other literal
        (not in `selected`, which _scan_block read) nor inside a ChildFailedError block (`consumed`).
        Those that may carry an envelope (`hinted`: an envelope character, envelope.plain) are all
        peeled, to learn their writer; the plain ones, one writer, are found from the block's end
        (`block`: data, start, end, newlines, own lines) only until that writer has its rows.
        """
        data, a, b, nl, n = block

        def plain_lines():
            taken = set(hinted)
            for j, _ in self.progress_set.lines_backward(data, a, b, newlines=nl):
                if j < n and j not in selected and j not in taken:
                    yield j

        kept: dict[object, int] = {}
        todo = [i for i in hinted if not _inside(consumed, i)]
        from_end = plain_lines()
        p = next(from_end, None)
        while todo or p is not None:
            if p is not None and (not todo or p > todo[-1]):
                i, p = p, next(from_end, None)
                if _inside(consumed, i):
                    continue
                if plain(lines[i]) and kept.get(_PLAIN_WRITER, 0) >= KEEP_PROGRESS:
                    p, from_end = None, iter(())  # the rest are plain lines of that writer: nothing to learn
                    continue
            else:
                i = todo.pop()
            clean = strip_ansi(lines[i][:MAX_LINE])
            for env in peel_all(clean):
                who = (env.key, env.rank, env.local_rank)
                if kept.get(who, 0) >= KEEP_PROGRESS:
                    continue
                for sig, fields in self.sigset.match_all(env.body):
                    self._emit(ctx, sig.source, sig.event, fields, env, line0 + i, clean)
                    if sig.event == "step_progress":
                        kept[who] = kept.get(who, 0) + 1

    def _rewrapped(self, lines: _Lines, i: int, body: str, found: Sequence) -> Sequence:
        """A long line that matched, hard-wrapped in a paste (§1.8): when the continuation lines make
        the same signature match with more fields (the second rank of a fingerprint mismatch cut
        off at the terminal's width), those fields; and a signature whose words the wrap cut (an NCCL
        WARN whose `with error 12` went to the next line) matches the joined text."""
        joined = body
        width = len(lines[i])
        lead = _lead(lines[i], body)
        n = 0
        for k in range(1, MAX_WRAP_LINES + 1):
            if len(joined) > MAX_MATCH_JOIN or (k > FEW_WRAP_LINES and len(lines[i + k - 1]) < width):
                break  # past the first few, only a line filled to the terminal's width runs on
            nxt = _continuation(lines, i + k, lead)
            if nxt is None:
                break
            joined += nxt
            n = k
        if joined is body:
            return found
        more = dict(self.sigset.match_all(joined))
        out = []
        for sig, fields in found:
            wider = more.pop(sig, None)
            if wider is not None and len(wider) > len(fields) and all(_same_or_cut(v, wider.get(k))
                                                                      for k, v in fields.items()):
                fields = wider
            out.append((sig, fields))
        # a signature only the joined text matches (its words cut by the wrap), unless a continuation line
        # matches it alone: that line is scanned on its own
        pieces = [strip_ansi(lines[i + k]) for k in range(1, n + 1)] if more else []
        for sig, fields in more.items():
            if sig.match(body) is None and not any(sig.match(p) is not None for p in pieces):
                out.append((sig, fields))
        return out

    def _rejoin(self, lines: _Lines, i: int, body: str) -> tuple[list, str]:
        """A hard-wrapped line: join the following unenveloped lines and try again (§1.8).

        A continuation starts mid-text: an indented line (a traceback's frame or code) is no
        continuation. A signature that the continuation matches by itself is left to that line, so
        one event is not emitted twice at two line numbers."""
        joined = body
        alone: list[str] = []
        lead = _lead(lines[i], body)
        for k in range(1, 3):
            nxt = _continuation(lines, i + k, lead)
            if nxt is None:
                break
            joined += nxt
            alone.append(nxt)
            found = [(sig, f) for sig, f in self.sigset.match_all(joined)
                     if not any(sig.match(a) is not None for a in alone)]
            if found:
                return found, joined
        return [], body

    def _rejoin_back(self, lines: _Lines, i: int, body: str) -> tuple[int, Envelope, str, list] | None:
        """A hard-wrapped line whose literal the wrap moved into its continuation (§1.8: `… operation timeo` /
        `ut: WorkNCCL(…`): only the continuation was selected, and it matches nothing alone. The line before
        it (or the two before), each filled to the terminal's width, joined with it; the signatures that the
        joined text matches and no piece alone are the wrapped line's: (its index, its envelope, its text,
        those matches). None when line i is no continuation or nothing matches so."""
        if not body.strip() or blocks.indented(body) or _FRAME.match(body):
            return None
        pieces = [body]
        for start in (i - 1, i - 2):
            if start < 0 or len(lines[start]) < WRAP_MIN:
                return None  # a wrap's pieces before the last fill the terminal's width
            text = strip_ansi(lines[start][:MAX_LINE])
            env = peel(text)
            head = env.body
            if not head.strip() or _FRAME.match(head):
                return None
            joined = head + "".join(pieces)
            found = [(sig, f) for sig, f in self.sigset.match_all(joined)
                     if sig.match(head) is None and not any(sig.match(p) is not None for p in pieces)]
            if found:
                return start, env, text, found
            if env.key or env.ts is not None or env.sev or blocks.indented(head):
                return None  # a writer's line starts here: nothing before it is the same line
            pieces.insert(0, head)
        return None

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


# json.dumps(extra, default=str), without making an encoder per call (a row each: half its cost)
_EXTRA_JSON = json.JSONEncoder(default=str).encode
try:  # ... and for a dict of scalars, the C encoder JSONEncoder.encode makes on each call, made once
    # (no circular-reference check: scalars hold nothing); ~2.7 µs a row where encode takes ~4.5
    from json.encoder import c_make_encoder as _c_make_encoder
    from json.encoder import encode_basestring_ascii as _ascii

    _SCALARS_JSON = _c_make_encoder(None, str, _ascii, None, ": ", ", ", False, False, True)
except (ImportError, TypeError):  # pragma: no cover - an interpreter without the _json module
    _SCALARS_JSON = None
# ... and remembered for the few `extra` dicts of scalars that recur on every rank's rows ({"attempt": 0},
# {"cuda_dev": 3, "attempt": 0}): keyed by names, types and values (True is 1 to a dict, not to JSON)
_EXTRA_MEMO: dict[tuple, str] = {}
_EXTRA_MEMO_MAX = 4096
_MEMO_TYPES = (int, str, bool, float, type(None))


def forget() -> None:
    """Drop the `extra` texts remembered (events.forget_line_memos)."""
    _EXTRA_MEMO.clear()


def _extra_json(extra: dict) -> str:
    values = tuple(extra.values())
    types = tuple(map(type, values))
    if not all(t in _MEMO_TYPES for t in types):
        return _EXTRA_JSON(extra)  # lists (ranks), nested values: as they are
    key = (tuple(extra), types, values)
    out = _EXTRA_MEMO.get(key)
    if out is None:
        if len(_EXTRA_MEMO) >= _EXTRA_MEMO_MAX:
            _EXTRA_MEMO.clear()
        out = _EXTRA_MEMO[key] = "".join(_SCALARS_JSON(extra, 0)) if _SCALARS_JSON is not None else _EXTRA_JSON(extra)
    return out


def emit_row(ctx: FileContext, source: str, kind: str, fields: dict, env: Envelope, line_no: int,
         text: str) -> None:
    """Add one event row to the file's rows: typed fields into their columns (the rest into `extra`),
    rank/host/pid/time from the envelope, else from the path; each (line, kind, rank) once."""
    row: dict = {"file": ctx.name, "line": line_no, "source": source, "kind": kind,
                 "text": text[:TEXT_LIMIT]}
    extra = {}
    for k, v in fields.items():
        if k in _FIELD_COLUMNS:
            row[k] = v
        else:
            extra[k] = v
    if env.task is not None:
        extra["srun_task"] = env.task
    if env.world is not None:
        extra["world_size"] = env.world
    if env.uptime is not None:
        extra["uptime"] = env.uptime
    if env.kernel:
        extra["kernel"] = True
    if env.nccl_dev is not None:
        extra["cuda_dev"] = env.nccl_dev
    if env.agent:
        extra["agent"] = True
    if ctx.attempt is not None:
        extra["attempt"] = ctx.attempt
    if extra:
        row["extra"] = _extra_json(extra)
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


# a traceback's frame line (FORMATS.md §15), or a C++ exception's backtrace frame (`frame #<n>: <symbol> +
# 0x<offset> (0x<address> in <library>)`, §1.3): whole by itself, never the start of a hard-wrapped line
_FRAME = re.compile(r'\s*File "[^"]*", line \d+, in |frame #\d+: ')

# the writer of a line without any envelope: _scan_progress's key for it, and _walk_tail's
_PLAIN_WRITER = ("", None, None)
_TAIL_PLAIN = (None, "")


# the characters of a line's envelope that a following line must start with to be, at a glance, the same
# writer's next line: enough to hold a stamp's date or a host:pid, never more than the envelope
LEAD_MIN, LEAD_MAX = 6, 12


def _lead(line: str, body: str) -> str | None:
    """The first characters of the envelope in front of `body` (the line's own stamp, rank or NCCL
    header), when it is long enough to tell a writer's lines by; else None."""
    n = len(line) - len(body)
    return line[: min(n, LEAD_MAX)] if n >= LEAD_MIN and line.endswith(body) else None


def _continuation(lines: _Lines, j: int, lead: str | None = None) -> str | None:
    """Line j as the continuation of a hard-wrapped line (§1.8): it starts mid-text (no envelope, not
    indented, not blank); else None. A line that starts with `lead`, the start of the wrapped line's own
    envelope, is that writer's next line: no continuation, and not worth peeling to say so."""
    if not lines.has(j):
        return None
    if lead is not None and lines[j].startswith(lead):
        return None
    nxt = strip_ansi(lines[j])
    if not nxt.strip() or blocks.indented(nxt):  # blank or indented: no peeling needed to say so
        return None
    if _FRAME.match(nxt):  # a C++ backtrace's frame (§1.3) is a line of its own, where a message's lines end
        return None
    e = peel(nxt)
    if e.key or e.ts is not None or e.sev is not None:
        return None
    return nxt


def _same_or_cut(alone: object, joined: object) -> bool:
    """Whether a field the line gave alone is the one its hard-wrapped whole gives (§1.8): the same value, or
    a text the wrap cut (`Ch 00000001 c` of `Ch 00000001 caused by previous Xid 149`)."""
    return joined == alone or (isinstance(alone, str) and isinstance(joined, str) and joined.startswith(alone))



def _inside(consumed: list[tuple[int, int]], p: int) -> bool:
    """Whether line p was inside a multi-line block started before it: (start, last line) pairs in
    the order they were found."""
    return any(start < p <= last for start, last in consumed)


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
