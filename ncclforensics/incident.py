"""The lines an engineer reads next: each evidence line's neighbours, every rank's last lines, the user frames."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

import polars as pl

from ncclforensics.ingest.envelope import peel
from ncclforensics.ingest.excerpt import Excerpt, read_lines
from ncclforensics.model import json_object, rank_ranges
from ncclforensics.parse.blocks import TRACEBACK_START
from ncclforensics.rules.context import is_cause_row, is_symptom_row
from ncclforensics.times import CLOCK, utc_text

MAX_EVIDENCE = 12  # evidence lines given context (the report shows as many)
TAIL_LINES = 6  # per rank in the merged view
TAIL_RANKS = 8  # ranks in the merged view: the culprits first, then one of each other state, then the lowest
TAIL_READBACK = 400  # lines read back before a rank's anchor in a console many ranks share
MAX_FRAME_GROUPS = 4
# rows written about a rank by someone else (the launcher, the kernel) or no line of a file at all
_NOT_OWN_SOURCES = ("torchrun", "slurm", "kernel", "flight_recorder")


@dataclass(frozen=True)
class ContextLine:
    no: int
    text: str
    hit: bool  # the evidence line itself


@dataclass(frozen=True)
class EvidenceContext:
    file: str
    line: int
    rank: int | None
    lines: tuple[ContextLine, ...]
    note: str  # why there are no lines (a Flight Recorder entry, a file that vanished), else ""


@dataclass(frozen=True)
class TailLine:
    rank: int | None
    file: str
    no: int
    ts: str  # HH:MM:SS.mmm when the line carries a time, else ""
    text: str
    event: bool  # a line the analyzer matched (a failure or progress line)
    skipped: int = 0  # lines of this rank left out just before this one (a traceback's frames)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    fn: str
    code: str


@dataclass(frozen=True)
class FrameGroup:
    who: str  # "rank 0 (culprit)", "ranks 1–3"
    what: str  # "traceback: RuntimeError …", "last collective in the Flight Recorder: ALLREDUCE #8"
    where: str  # file:line of the source row
    frames: tuple[Frame, ...]  # innermost last
    culprit: bool


@dataclass(frozen=True)
class IncidentContext:
    radius: int
    evidence: tuple[EvidenceContext, ...]
    tail: tuple[TailLine, ...]
    tail_order: str  # how the merged view is ordered, in words
    tail_ranks: str  # which ranks it shows, in words
    frames: tuple[FrameGroup, ...]
    notes: tuple[str, ...]  # files that could not be read again

    def narrowed(self, radius: int) -> IncidentContext:
        """The same context with fewer lines around each evidence line (read once, shown several ways)."""
        if radius >= self.radius:
            return self
        ev = tuple(EvidenceContext(e.file, e.line, e.rank,
                                   tuple(x for x in e.lines if abs(x.no - e.line) <= radius), e.note)
                   for e in self.evidence)
        return dataclasses.replace(self, radius=radius, evidence=ev)


def build_context(analysis, *, radius: int, read: bool = True) -> IncidentContext:
    """Read back what the event table points at. Never raises for a file: notes say what is missing."""
    diag = analysis.diagnosis
    ev: pl.DataFrame = analysis.context.events
    root = getattr(analysis, "path", None) if read else None  # what was analyzed; None: nothing to read
    spots = _evidence_spots(diag.verdict.evidence)
    plan = _tail_plan(ev, diag) if root is not None else []
    wants: dict[str, list[tuple[int, int]]] = defaultdict(list)
    if radius > 0:
        for file, line, _rank, _text in spots:
            if line > 0:
                wants[file].append((line - radius, line + radius))
    for p in plan:
        wants[p.file].append((p.first, p.last))
    excerpts = read_lines(root, wants) if root is not None and wants else {}
    evidence = tuple(_evidence_context(s, excerpts.get(s[0]), radius) for s in spots)
    tail, order = _tail(plan, excerpts, ev)
    shown = sorted({t.rank for t in tail if t.rank is not None})
    notes = sorted({f"{name}: {x.note}" for name, x in excerpts.items() if x.note and not x.lines})
    return IncidentContext(
        radius=radius, evidence=evidence, tail=tail, tail_order=order,
        tail_ranks=("rank " if len(shown) == 1 else "ranks ") + rank_ranges(shown, count=False) if shown else "",
        frames=_frame_groups(ev, diag), notes=tuple(notes),
    )


# -- evidence lines ---------------------------------------------------------------------
def _evidence_spots(evidence) -> list[tuple[str, int, int | None, str]]:
    seen: set[tuple[str, int]] = set()
    out = []
    for e in evidence:
        if (e.file, e.line) in seen:
            continue
        seen.add((e.file, e.line))
        out.append((e.file, e.line, e.rank, e.text))
        if len(out) >= MAX_EVIDENCE:
            break
    return out


def _evidence_context(spot, excerpt: Excerpt | None, radius: int) -> EvidenceContext:
    file, line, rank, text = spot
    if radius <= 0 or excerpt is None:
        return EvidenceContext(file, line, rank, (), "")
    lines = excerpt.between(line - radius, line + radius)
    note = excerpt.note if not lines else ""
    hit = next((x for x in lines if x.no == line), None)
    if line <= 0:
        note = "a Flight Recorder entry, not a line of a log"
    elif hit is not None and not _same_line(hit.text, text):
        note = "the file changed since it was read: these lines may not be the ones the analyzer saw"
    return EvidenceContext(file, line, rank, tuple(ContextLine(x.no, x.text, x.no == line) for x in lines), note)


def _same_line(read_back: str, text: str) -> bool:
    a, b = read_back.strip(), (text or "").strip()
    n = min(len(a), len(b), 200)
    return n == 0 or a.rstrip("…")[:n] == b[:n] or a[:60] in b or b[:60] in a


# -- the merged view of every rank's last lines -------------------------------------------
@dataclass(frozen=True)
class _TailSpot:
    rank: int
    file: str
    first: int
    last: int
    anchor: int
    shared: bool  # the file holds lines of several ranks (a console)


def _tail_plan(ev: pl.DataFrame, diag) -> list[_TailSpot]:
    """Per rank: the file that shows its own lines best and the line its failure starts at."""
    own = ev.filter(pl.col("rank").is_not_null() & (pl.col("line") > 0)
                    & ~pl.col("source").cast(pl.Utf8).is_in(list(_NOT_OWN_SOURCES)))
    if own.is_empty():
        return []
    writers = own.group_by("file").agg(pl.col("rank").n_unique().alias("n"))
    shared = {f for f, n in writers.iter_rows() if n > 1}
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for r in own.sort("file", "line").iter_rows(named=True):
        by_rank[r["rank"]].append(r)
    plan = []
    for rank in _tail_ranks(diag, set(by_rank)):
        rows = by_rank[rank]
        files = {r["file"] for r in rows}
        # one console many ranks share keeps their true interleaving: it beats a per-rank file
        file = min(files, key=lambda f: (f not in shared, -sum(1 for r in rows if r["file"] == f), f))
        mine = [r for r in rows if r["file"] == file]
        fail = next((r for r in mine if is_cause_row(r) or is_symptom_row(r)), None)
        if fail is not None:
            anchor = fail["line"]
            after = 0
        else:  # no failure line of its own (a rank that hung or was busy elsewhere): its last lines
            anchor = mine[-1]["line"]
            after = TAIL_LINES
        back = TAIL_READBACK if file in shared else TAIL_LINES
        plan.append(_TailSpot(rank, file, max(1, anchor - back), anchor + after, anchor, file in shared))
    return plan


def _tail_ranks(diag, have: set[int]) -> list[int]:
    culprits = [r for r in diag.verdict.culprit_ranks if r in have]
    picked = list(dict.fromkeys(culprits))
    states: dict[str, int] = {}
    for row in diag.ranks:
        if row["rank"] in have and row["rank"] not in picked:
            states.setdefault(row.get("state") or "seen", row["rank"])
    picked += [r for r in states.values() if r not in picked]
    picked += [r for r in sorted(have) if r not in picked]
    return picked[:TAIL_RANKS]


def _writer_ranks(ev: pl.DataFrame, file: str) -> dict[str, int]:
    """Launcher prefix (`[default2]:`, `node3:2: `) -> the one rank whose rows carry it in `file`."""
    seen: dict[str, set[int]] = defaultdict(set)
    for text, rank in ev.filter((pl.col("file") == file) & pl.col("rank").is_not_null()).select("text", "rank").rows():
        env = peel(text or "")
        if env.outer:
            seen[env.outer].add(rank)
    return {k: next(iter(v)) for k, v in seen.items() if len(v) == 1}


def _tail(plan: list[_TailSpot], excerpts: dict[str, Excerpt], ev: pl.DataFrame) -> tuple[tuple[TailLine, ...], str]:
    if not plan:
        return (), ""
    event_lines = set(ev.filter(pl.col("line") > 0).select("file", "line").unique().rows())
    writers: dict[str, dict[str, int]] = {}
    lines: list[tuple[TailLine, object]] = []
    for p in plan:
        x = excerpts.get(p.file)
        if x is None:
            continue
        if p.shared and p.file not in writers:
            writers[p.file] = _writer_ranks(ev, p.file)
        mine: list[tuple[TailLine, object]] = []
        for ln in x.between(p.first, p.last):
            env = peel(ln.text)
            rank = env.rank if env.rank is not None else writers.get(p.file, {}).get(env.outer)
            if p.shared and rank != p.rank:
                continue
            ts = utc_text(env.ts, CLOCK) or ""
            mine.append((TailLine(p.rank, p.file, ln.no, ts, ln.text, (p.file, ln.no) in event_lines), env.ts))
        before = [m for m in mine if m[0].no <= p.anchor]
        after = [m for m in mine if m[0].no > p.anchor]
        lines += _skip_traceback(before)[-TAIL_LINES:] + after[:TAIL_LINES]
    if not lines:
        return (), ""
    files = {t.file for t, _ in lines}
    if len(files) == 1:
        ordered = sorted(lines, key=lambda m: m[0].no)
        ranks = {t.rank for t, _ in lines}
        order = "in the order of the file they share" if len(ranks) > 1 else "in file order"
    elif all(ts is not None for _, ts in lines):
        ordered = sorted(lines, key=lambda m: (m[1], m[0].rank, m[0].no))
        order = "by time"
    else:
        ordered = lines  # plan order: culprits first
        order = "grouped by rank (their lines carry no common clock)"
    seen: set[tuple[str, int]] = set()
    out = []
    for t, _ in ordered:
        if (t.file, t.no) not in seen:
            seen.add((t.file, t.no))
            out.append(t)
    return tuple(out), order


def _skip_traceback(before: list[tuple[TailLine, object]]) -> list[tuple[TailLine, object]]:
    """A rank that failed with a traceback: what it did before the traceback, its first line and the
    exception line (the frames are in the evidence context and under "user code")."""
    start = next((i for i in range(len(before) - 1, -1, -1)
                  if peel(before[i][0].text).body.startswith(TRACEBACK_START)), None)
    if start is None or start >= len(before) - 2:
        return before
    t, ts = before[-1]
    gap = before[-1][0].no - before[start][0].no - 1
    skipped = TailLine(t.rank, t.file, t.no, t.ts, t.text, t.event, skipped=gap)
    return before[:start + 1] + [(skipped, ts)]


# -- user frames ----------------------------------------------------------------------------
def _frames(raw) -> tuple[Frame, ...]:
    out = []
    for f in raw or []:
        if isinstance(f, dict) and f.get("file"):
            out.append(Frame(str(f["file"]), int(f.get("line") or 0), str(f.get("fn") or ""), str(f.get("code") or "")))
    return tuple(out)


def _frame_groups(ev: pl.DataFrame, diag) -> tuple[FrameGroup, ...]:
    """The culprits' innermost user frames (tracebacks, then their last Flight Recorder entry), then
    where the other ranks waited; identical stacks of several ranks are one group."""
    culprits = set(diag.verdict.culprit_ranks)
    stuck = diag.verdict.collective
    rows = ev.filter(pl.col("extra").str.contains('"user_frames": \\[\\{', literal=False)).sort("rank", "file", "line")
    found: list[tuple[int | None, str, str, tuple[Frame, ...], int]] = []  # rank, what, where, frames, priority
    code_at: dict[tuple[str, int], str] = {}
    last_fr: dict[int, dict] = {}
    exc_type: dict[str, str] = {}
    for r in rows.iter_rows(named=True):
        x = json_object(r["extra"])
        frames = _frames(x.get("user_frames"))
        if not frames:
            continue
        for f in frames:
            if f.code:
                code_at[(f.file, f.line)] = f.code
        if r["kind"] == "fr_entry":
            prev = last_fr.get(r["rank"])
            if r["rank"] is not None and (prev is None or (r["seq"] or 0) >= (prev["seq"] or 0)):
                last_fr[r["rank"]] = r
            continue
        what = "traceback: " + (r["detail"] or r["kind"])[:160]
        found.append((r["rank"], what, f"{r['file']}:{r['line']}", frames, 0 if r["rank"] in culprits else 2))
        exc_type[what] = str(x.get("exc_type") or "exception")
    for rank, r in last_fr.items():
        op = f"{r['op'] or '?'} #{r['seq']}" if r["seq"] is not None else (r["op"] or "?")
        if rank in culprits:
            what = f"its last collective in the Flight Recorder: {op}"
        elif stuck.seq is not None and r["seq"] == stuck.seq:
            what = f"where it waited (Flight Recorder): {op}"
        else:
            what = f"its last collective in the Flight Recorder: {op}"
        frames = _frames(json_object(r["extra"]).get("user_frames"))
        frames = tuple(Frame(f.file, f.line, f.fn, f.code or code_at.get((f.file, f.line), "")) for f in frames)
        found.append((rank, what, f"{r['file']} entry {r['line']}", frames, 1 if rank in culprits else 3))
    groups: dict[tuple, dict] = {}
    for rank, what, where, frames, prio in sorted(found, key=lambda f: f[4]):
        culprit = prio < 2
        # the other ranks: one group per stack, whatever each one's message said
        key = (culprit, what if culprit else "", tuple((f.file, f.line, f.fn) for f in frames))
        g = groups.setdefault(key, {"ranks": set(), "whats": [], "where": where, "frames": frames, "prio": prio})
        if rank is not None:
            g["ranks"].add(rank)
        if prio == g["prio"] and what not in g["whats"]:
            g["whats"].append(what)
    out = []
    for g in sorted(groups.values(), key=lambda g: (g["prio"], min(g["ranks"], default=-1))):
        rs = sorted(g["ranks"])
        who = (("rank " if len(rs) == 1 else "ranks ") + rank_ranges(rs, count=False)) if rs else "a process"
        what = g["whats"][0]
        if len(g["whats"]) > 1:  # the same stack, different messages (recv vs send): the exception type
            what = "traceback: " + exc_type.get(what, "exception") if what.startswith("traceback") else what
        if g["prio"] < 2:
            who += " (culprit)"
        out.append(FrameGroup(who=who, what=what, where=g["where"], frames=g["frames"], culprit=g["prio"] < 2))
    return tuple(out[:MAX_FRAME_GROUPS])
