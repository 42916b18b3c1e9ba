"""Analysis -> the timeline's view-model: key events, Flight Recorder steps, per rank or host, stacked."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from ncclforensics.model import json_object, rank_ranges
from ncclforensics.rules.context import is_symptom_row
from ncclforensics.times import PLOTLY, utc_text
from ncclforensics.vocabulary import vocabulary
from ncclforensics.words import cut


@dataclass(frozen=True)
class Category:
    label: str  # plain words: the legend, a lane when lanes are categories
    color: str  # its markers: causes warm, reactions cool, bookkeeping grey
    symbol: str  # plotly marker symbol


# The key events' categories, causes first, reactions last. A signature file names its kind's category
# (`timeline = "gpu"`, ncclforensics.vocabulary); a kind with none is named after its source
# (SOURCE_WORDS), never by its raw name; BOOKKEEPING kinds are not drawn unless cited as evidence.
CATEGORIES: dict[str, Category] = {
    "gpu": Category("GPU / CUDA error", "#b71c1c", "x"),
    "oom": Category("out of memory", "#ad1457", "x"),
    "dataloader": Category("DataLoader worker", "#6a1b9a", "x"),
    "crash": Category("crash / exception", "#d84315", "x"),
    "network": Category("NCCL / network error", "#e65100", "diamond"),
    "store": Category("store / rendezvous", "#4527a0", "diamond"),
    "launch": Category("launch / config", "#827717", "diamond"),
    "checkpoint": Category("checkpoint save", "#2e7d32", "square"),
    "application": Category("application", "#00838f", "square"),
    "step": Category("training step", "#90a4ae", "circle"),
    "mismatch": Category("collective mismatch", "#f9a825", "diamond"),
    "timeout": Category("timeout / hang", "#1565c0", "hourglass"),
    "peer_closed": Category("peer closed", "#0277bd", "circle-open"),
    "fr_dump": Category("Flight Recorder dump", "#5d4037", "square-open"),
    "teardown": Category("teardown", "#78909c", "circle-open"),
    "exit": Category("process exit", "#455a64", "circle"),
}
# Bookkeeping rows: plentiful and never a failure by themselves (Flight Recorder entries are drawn
# as their own steps, near the failure only).
BOOKKEEPING = "bookkeeping"
# The Flight Recorder's steps of one collective on one rank (FORMATS.md §15.2): created by the
# caller, started and completed as the watchdog saw them (NCCL; gloo records only the first).
FR_STEP_CATEGORIES = {
    "collective enqueued": Category("collective enqueued", "#9e9e9e", "triangle-right-open"),
    "collective started": Category("collective started", "#66bb6a", "triangle-right"),
    "collective completed": Category("collective completed", "#2e7d32", "line-ns-open"),
}
FR_STEPS = tuple(FR_STEP_CATEGORIES)
# label -> Category, in legend order
STYLES: dict[str, Category] = {c.label: c for c in (*CATEGORIES.values(), *FR_STEP_CATEGORIES.values())}
CATEGORY_ORDER = tuple(STYLES)
SOURCE_WORDS = {
    "nccl": "NCCL", "c10d": "c10d store", "gloo": "gloo", "torch_detail": "collective check", "torchrun": "torchrun",
    "dataloader": "DataLoader worker", "cuda": "GPU / CUDA error", "python": "crash / exception",
    "kernel": "kernel log", "slurm": "Slurm", "app": "application", "flight_recorder": "Flight Recorder",
}
TIMEOUT_KINDS = ("watchdog_timeout", "gloo_timeout")
LAUNCHER_SOURCES = ("torchrun", "slurm")
MAX_POINTS = 1500
MAX_RANK_LANES = 32  # more ranks than this: one lane per host
MAX_HOST_LANES = 48  # more hosts than this: one lane per category
FR_LAST = 3  # Flight Recorder entries per rank and process group, the last ones (where the hang is)
STACK_OFFSETS = (0.0, 0.27, -0.27, 0.135, -0.135, 0.4, -0.4)


@dataclass(frozen=True)
class TimelineEvent:
    ts: str  # ISO, UTC, microseconds: what plotly reads
    lane: str
    y: float  # lane position plus a small offset when markers share a time
    category: str
    rank: int | None
    host: str
    where: str
    text: str
    culprit: bool
    root: bool
    launcher: bool  # written about the rank by torchrun or Slurm, not by the rank itself
    label: str = ""  # a short text beside the marker: the SeqNum of a rank's last Flight Recorder entry


@dataclass(frozen=True)
class TimelineView:
    events: tuple[TimelineEvent, ...]
    lanes: tuple[str, ...]  # top to bottom
    culprit_lanes: tuple[str, ...]
    group_by: str  # "rank", "host" or "kind of event"
    categories: tuple[str, ...]  # present, in legend order
    total: int  # key events and Flight Recorder steps with a timestamp
    untimed: int  # key events without one (not drawn)
    first_timeout: TimelineEvent | None
    root: TimelineEvent | None
    last_seen: TimelineEvent | None  # the culprit's last timestamped event, when the root has no time
    root_note: str
    x_range: tuple[str, str] | None  # the first view: the incident window, or seconds around a short burst
    focused: bool  # x_range is the incident window within a longer span (double-click shows it all)


def _plotly(ts: datetime) -> str:
    return utc_text(ts, PLOTLY) or ""


def category_of(kind: str, source: str) -> str:
    spec = vocabulary().specs.get(kind)
    cat = CATEGORIES.get(spec.timeline) if spec is not None and spec.timeline else None
    return cat.label if cat is not None else SOURCE_WORDS.get(source, "other")


def _fr_steps(ev: pl.DataFrame, per_rank: int) -> list[dict]:
    """The last Flight Recorder entries of each rank and group as enqueue/start/complete points."""
    fr = ev.filter((pl.col("kind") == "fr_entry") & pl.col("ts").is_not_null())
    if fr.is_empty():
        return []
    fr = fr.sort("ts").group_by("rank", "pg", maintain_order=True).tail(per_rank)
    out = []
    for r in fr.iter_rows(named=True):
        x = json_object(r["extra"])
        op = f"{r['op'] or x.get('profiling_name') or '?'}" + (f" #{r['seq']}" if r["seq"] is not None else "")
        for step, t in zip(FR_STEPS, (r["ts"], x.get("started"), x.get("completed")), strict=True):
            if t is None:
                continue
            if isinstance(t, str):
                try:
                    t = datetime.fromisoformat(t)
                except ValueError:
                    continue
            out.append({**r, "ts": t.replace(tzinfo=None), "_cat": step, "_text": f"{step}: {op}",
                        "_root": False, "_label": ""})
    # the last entry of each rank and group says where it stopped: label it with its SeqNum
    last: dict[tuple, dict] = {}
    for r in out:
        k = (r["rank"], r["pg"])
        if r["seq"] is not None and (k not in last or (r["seq"], r["ts"]) >= (last[k]["seq"], last[k]["ts"])):
            last[k] = r
    for r in last.values():
        r["_label"] = f"#{r['seq']}"
    return out


def _key_rows(ev: pl.DataFrame, diag) -> tuple[list[dict], int, dict | None]:
    """Key events with a time (duplicates of one line in console and per-rank file folded), the count
    without one, and the root row (the verdict's own cause line on a culprit, never a peer's timeout)."""
    evidence = diag.verdict.evidence
    cited = pl.DataFrame({"file": [e.file for e in evidence], "line": [e.line for e in evidence]},
                         schema={"file": pl.Utf8, "line": pl.UInt32}).unique()
    is_cited = pl.struct("file", "line").is_in(cited.to_struct().implode())
    bookkeeping = vocabulary().kinds_in_timeline(BOOKKEEPING)
    key = ev.filter(~pl.col("kind").is_in(list(bookkeeping)) | is_cited)
    untimed = key.filter(pl.col("ts").is_null() & (pl.col("kind") != "fr_entry")).height
    root = _root_row(key.filter(is_cited), diag)
    key = key.filter(pl.col("ts").is_not_null() & (pl.col("kind") != "fr_entry"))
    root_at = (root["file"], root["line"]) if root is not None else None
    is_root = ((pl.col("file") == root_at[0]) & (pl.col("line") == root_at[1])) if root_at else pl.lit(False)
    key = key.with_columns(pl.col("ts").dt.truncate("1s").alias("_sec"), is_root.alias("_root"))
    key = key.sort(["_root", "ts"], descending=[True, False]).unique(
        subset=["kind", "rank", "host", "_sec"], keep="first", maintain_order=True).sort(["ts", "rank"])
    rows = [{**r, "ts": r["ts"].replace(tzinfo=None), "_cat": category_of(r["kind"], r["source"]),
             "_text": cut(r["detail"] or r["text"], 120, fold=False)} for r in key.iter_rows(named=True)]
    return rows, untimed, root


def _root_row(cited: pl.DataFrame, diag) -> dict | None:
    culprits = set(diag.verdict.culprit_ranks)
    hosts = set(diag.verdict.culprit_hosts)
    best = None
    for r in cited.iter_rows(named=True):
        mine = (r["rank"] in culprits) if r["rank"] is not None else (r["host"] in hosts)
        if (culprits or hosts) and not mine:
            continue
        if is_symptom_row(r):
            continue
        if best is None or (r["ts"] is not None and (best["ts"] is None or r["ts"] < best["ts"])):
            best = r
    return best


def _group_by(rows: list[dict]) -> str:
    ranks = {r["rank"] for r in rows if r["rank"] is not None}
    hosts = {r["host"] for r in rows if r["host"]}
    if len(ranks) <= MAX_RANK_LANES:
        return "rank"
    if len(hosts) <= MAX_HOST_LANES:
        return "host"
    return "kind of event"


def _lane_of(r: dict, group_by: str, rank_host: dict[int, str]) -> str:
    if group_by == "rank":
        if r["rank"] is not None:
            return f"rank {r['rank']}"
        return f"host {r['host']}" if r["host"] else "launcher / other"
    if group_by == "host":
        host = r["host"] or rank_host.get(r["rank"])
        return host or "no host named"
    return r["_cat"]


def timeline_view(analysis) -> TimelineView:
    ev: pl.DataFrame = analysis.context.events
    diag = analysis.diagnosis
    culprits = set(diag.verdict.culprit_ranks)
    culprit_hosts = set(diag.verdict.culprit_hosts)
    if ev.is_empty():
        return TimelineView((), (), (), "rank", (), 0, 0, None, None, None, "", None, False)
    key, untimed, root_row = _key_rows(ev, diag)
    n_ranks = ev["rank"].drop_nulls().n_unique()
    steps = _fr_steps(ev, FR_LAST if n_ranks <= 64 else 1)
    rows = key + steps
    if not rows:
        return TimelineView((), (), (), "rank", (), 0, untimed, None, None, None, _root_note(root_row, None), None,
                            False)
    rank_host = dict(analysis.context.rank_hosts)
    group_by = _group_by(rows)
    root_at = (root_row["file"], root_row["line"]) if root_row is not None and root_row["ts"] is not None else None
    for r in rows:
        r["_root"] = root_at is not None and r["_cat"] not in FR_STEPS and (r["file"], r["line"]) == root_at
        r["_lane"] = _lane_of(r, group_by, rank_host)
    total = len(rows)
    if group_by != "rank":
        rows = _fold(rows, culprits)
    rows = _sample(rows, culprits)
    lanes = _lane_order(rows, group_by, culprits)
    culprit_lanes = tuple(x for x in lanes if _is_culprit_lane(x, group_by, culprits, culprit_hosts, rank_host))
    events = _stack(rows, lanes, culprits, culprit_hosts, group_by=group_by)
    root = next((e for e in events if e.root), None)
    last_seen = None
    if root is None and (culprits or culprit_hosts):
        # a culprit rank's own line first; a line of the culprit's host (the kernel's) only without one
        mine = ([e for e in events if e.culprit and not e.launcher and e.rank in culprits]
                or [e for e in events if e.culprit and not e.launcher])
        last_seen = mine[-1] if mine else None
    first_to = next((e for e, r in zip(events, rows, strict=True) if r["kind"] in TIMEOUT_KINDS), None)
    cats = {e.category for e in events}
    return TimelineView(
        events=events, lanes=lanes, culprit_lanes=culprit_lanes, group_by=group_by,
        categories=tuple(c for c in CATEGORY_ORDER if c in cats) + tuple(sorted(cats - set(CATEGORY_ORDER))),
        total=total, untimed=untimed, first_timeout=first_to, root=root, last_seen=last_seen,
        root_note=_root_note(root_row, last_seen), **_focus(events, root or last_seen, first_to, rows),
    )


def _root_note(root_row: dict | None, last_seen: TimelineEvent | None) -> str:
    if root_row is None or root_row["ts"] is not None:
        return ""
    who = f" on rank {root_row['rank']}" if root_row["rank"] is not None else ""
    note = f"The root event ({root_row['file']}:{root_row['line']}{who}) carries no timestamp, so it is not drawn"
    if last_seen is not None:
        note += f"; the culprit's last timestamped event is marked instead ({last_seen.text})"
    return note + "."


def _is_culprit_lane(lane: str, group_by: str, culprits: set[int], hosts: set[str], rank_host: dict) -> bool:
    if group_by == "rank":
        return lane in {f"rank {r}" for r in culprits} or lane in {f"host {h}" for h in hosts}
    if group_by == "host":
        return lane in hosts or lane in {rank_host.get(r) for r in culprits}
    return False


def _lane_order(rows: list[dict], group_by: str, culprits: set[int]) -> tuple[str, ...]:
    present = {r["_lane"] for r in rows}
    if group_by == "kind of event":
        return tuple(c for c in CATEGORY_ORDER if c in present) + tuple(sorted(present - set(CATEGORY_ORDER)))
    if group_by == "rank":
        ranks = sorted({r["rank"] for r in rows if r["rank"] is not None})
        order = [f"rank {r}" for r in ranks]
        return tuple(order + sorted(present - set(order)))
    return tuple(sorted(present))


def _fold(rows: list[dict], culprits: set[int]) -> list[dict]:
    """A lane holds many ranks (one per host): the same kind of event on several of them within a
    moment is one marker that counts them (255 watchdog timeouts are 32 markers, not 255)."""
    rows = sorted(rows, key=lambda r: r["ts"])
    span = (rows[-1]["ts"] - rows[0]["ts"]).total_seconds() if rows else 0.0
    eps = max(span / 250, 1.0)
    out: list[dict] = []
    open_: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (r["_lane"], r["_cat"], r["rank"] in culprits)  # a culprit's own rows stay apart
        g = open_.get(key)
        if r["_root"] or g is None or g["_root"] or (r["ts"] - g["ts"]).total_seconds() > eps:
            g = {**r, "_ranks": [r["rank"]] if r["rank"] is not None else [], "_count": 1}
            out.append(g)
            open_[key] = g
            continue
        g["_count"] += 1
        if r["rank"] is not None:
            g["_ranks"].append(r["rank"])
    for g in out:
        if g["_count"] > 1:
            ranks = sorted(set(g["_ranks"]))
            who = f" on ranks {rank_ranges(ranks, count=False)}" if ranks else ""
            g["_text"] = f"{g['_count']} events{who}; the first: {g['_text']}"
            g["rank"] = ranks[0] if len(ranks) == 1 else None
            g["_label"] = ""
    return out


def _sample(rows: list[dict], culprits: set[int]) -> list[dict]:
    """At most MAX_POINTS: the root, the culprits' rows and the latest rows first (the failure is at the end)."""
    if len(rows) <= MAX_POINTS:
        return sorted(rows, key=lambda r: r["ts"])
    ranked = sorted(rows, key=lambda r: (not r["_root"], r["rank"] not in culprits, r["_cat"] in FR_STEPS,
                                         -r["ts"].timestamp()))
    return sorted(ranked[:MAX_POINTS], key=lambda r: r["ts"])


def _stack(rows: list[dict], lanes: tuple[str, ...], culprits: set[int], hosts: set[str], *,
           group_by: str) -> tuple[TimelineEvent, ...]:
    """Markers of one lane closer than ~1/250 of the time span are spread up and down their lane."""
    span = (rows[-1]["ts"] - rows[0]["ts"]).total_seconds() if rows else 0.0
    eps = max(span / 250, 1e-3)
    pos = {lane: len(lanes) - 1 - i for i, lane in enumerate(lanes)}  # the first lane on top
    last: dict[str, tuple[float, int]] = defaultdict(lambda: (float("-inf"), 0))
    out = []
    for r in rows:
        t = r["ts"].timestamp()
        prev_t, k = last[r["_lane"]]
        k = k + 1 if t - prev_t < eps else 0
        last[r["_lane"]] = (t if k == 0 else prev_t, k)
        mine = (r["rank"] in culprits) if r["rank"] is not None else (r["host"] in hosts)
        out.append(TimelineEvent(
            ts=_plotly(r["ts"]), lane=r["_lane"], y=pos[r["_lane"]] + STACK_OFFSETS[k % len(STACK_OFFSETS)],
            category=r["_cat"], rank=r["rank"], host=r["host"] or "", where=f"{r['file']}:{r['line']}",
            text=r["_text"], culprit=mine, root=r["_root"], launcher=str(r["source"]) in LAUNCHER_SOURCES,
            label=r.get("_label", "") if group_by == "rank" else "",
        ))
    return tuple(out)


def _focus(events, anchor, first_to, rows) -> dict:
    """The first view: seconds around a burst shorter than 4 s, or the incident window (the root or the
    culprit's last sign, and the timeouts after it) when the events span much longer, e.g. a day of
    training before a hang; double-click shows everything."""
    none = {"x_range": None, "focused": False}
    if not events:
        return none
    t0, t1 = rows[0]["ts"], rows[-1]["ts"]
    span = t1 - t0
    if span < timedelta(seconds=4):
        mid = t0 + span / 2
        return {"x_range": (_plotly(mid - timedelta(seconds=3)), _plotly(mid + timedelta(seconds=3))), "focused": False}
    starts = [datetime.fromisoformat(e.ts) for e in (anchor, first_to) if e is not None]
    if first_to is not None:
        timeout_ms = max((r.get("timeout_ms") or 0) for r in rows if r["kind"] in TIMEOUT_KINDS)
        starts.append(datetime.fromisoformat(first_to.ts) - timedelta(milliseconds=timeout_ms))
    if not starts:
        return none
    start = max(t0, min(starts))
    if (t1 - start) * 3 > span:
        return none
    pad = max((t1 - start) * 0.05, timedelta(seconds=1))
    return {"x_range": (_plotly(start - pad), _plotly(t1 + pad)), "focused": True}
