"""Analysis -> what the two charts draw: the per-rank frontier and the key-event timeline, capped for scale."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

import polars as pl

from ncclforensics.report.words import short

# Per-rank states of Diagnosis.ranks (analysis.rank_rows) plus ranks with no log line at all.
STATES = ("culprit", "crashed", "waiting", "seen", "no_log")
STATE_TEXT = {
    "culprit": "culprit",
    "crashed": "failed or exited",
    "waiting": "failed waiting for a peer",
    "seen": "no failure line",
    "no_log": "no log lines",
}
MAX_STRIP_RANKS = 20_000
MAX_PGS = 4


@dataclass(frozen=True)
class RankPos:
    """Where one rank stood in one process group (a row of the frontier)."""

    rank: int
    host: str
    last_completed: int | None
    last_enqueued: int | None
    timeout_seq: int | None
    timeout_op: str
    current_seq: int | None  # Flight Recorder or DETAIL fingerprint position
    current_op: str
    culprit: bool


@dataclass(frozen=True)
class PgFrontier:
    pg: str
    ranks: tuple[RankPos, ...]


@dataclass(frozen=True)
class RankState:
    rank: int
    host: str
    state: str  # one of STATES
    where: str  # 'ALLREDUCE #6', 'BARRIER', ''


@dataclass(frozen=True)
class FrontierView:
    pgs: tuple[PgFrontier, ...]
    other_pgs: tuple[str, ...]
    strip: tuple[RankState, ...]
    culprits: tuple[int, ...]
    stuck_pg: str | None
    stuck_seq: int | None
    stuck_op: str
    stuck_source: str


@dataclass(frozen=True)
class TimelineEvent:
    ts: str  # ISO, UTC, microseconds: what plotly reads
    lane: str
    kind: str
    rank: int | None
    host: str
    where: str
    text: str
    culprit: bool
    root: bool


@dataclass(frozen=True)
class TimelineView:
    events: tuple[TimelineEvent, ...]
    lanes: tuple[str, ...]  # top to bottom
    total: int  # key events with a timestamp
    untimed: int  # key events without one (not drawn)
    first_timeout: TimelineEvent | None


def frontier_view(analysis) -> FrontierView:
    ctx = analysis.context
    diag = analysis.diagnosis
    culprits = set(diag.verdict.culprit_ranks)
    fr: pl.DataFrame = ctx.frontier
    seq_cols = ("last_completed", "last_enqueued", "timeout_seq", "fr_last_seq", "fp_seq")
    pgs: list[PgFrontier] = []
    other: list[str] = []
    if not fr.is_empty():
        with_seq = fr.filter(pl.any_horizontal(pl.col(c).is_not_null() for c in seq_cols))
        order = Counter(with_seq["pg"].to_list())
        names = sorted(order, key=lambda p: (p != ctx.stuck.pg, -order[p], p))
        for pg in names[:MAX_PGS]:
            rows = []
            for r in with_seq.filter(pl.col("pg") == pg).sort("rank").iter_rows(named=True):
                cur = r["fr_last_seq"] if r["fr_last_seq"] is not None else r["fp_seq"]
                rows.append(RankPos(
                    rank=r["rank"], host=r["host"] or ctx.rank_hosts.get(r["rank"]) or "",
                    last_completed=r["last_completed"], last_enqueued=r["last_enqueued"],
                    timeout_seq=r["timeout_seq"], timeout_op=r["timeout_op"] or "",
                    current_seq=cur, current_op=r["fr_last_op"] or r["fp_op"] or r["exc_op"] or "",
                    culprit=r["rank"] in culprits,
                ))
            pgs.append(PgFrontier(pg, tuple(rows)))
        other = names[MAX_PGS:]
    strip = _strip(analysis)
    s = ctx.stuck
    return FrontierView(
        pgs=tuple(pgs), other_pgs=tuple(other), strip=strip, culprits=tuple(sorted(culprits)),
        stuck_pg=s.pg, stuck_seq=s.seq, stuck_op=s.op or "", stuck_source=s.source,
    )


def _where(row: dict) -> str:
    op, seq = row.get("current_op"), row.get("current_seq")
    t = row.get("timed_out") or {}
    if op is None and t.get("op"):
        op, seq = t.get("op"), t.get("seq")
    if not op and seq is None:
        return ""
    return f"{op or '?'}" + (f" #{seq}" if seq is not None else "")


def _sizes(analysis) -> dict[int, str]:
    """rank -> the size of the collective it stood in, only when ranks disagree on it (DETAIL shape, FR numel)."""
    out: dict[int, str] = {}
    pg_of = {r["rank"]: r.get("pg") for r in analysis.diagnosis.ranks}
    for r in analysis.context.frontier.iter_rows(named=True):
        if pg_of.get(r["rank"]) not in (None, r["pg"]):
            continue
        if r["fp_shape"] is not None:
            out[r["rank"]] = f"[{r['fp_shape']}]"
        elif r["fr_last_numel"] is not None:
            out[r["rank"]] = f"[{r['fr_last_numel']}]"
    return out if len(set(out.values())) > 1 else {}


def _strip(analysis) -> tuple[RankState, ...]:
    diag = analysis.diagnosis
    ctx = analysis.context
    by_rank = {r["rank"]: r for r in diag.ranks}
    culprits = set(diag.verdict.culprit_ranks)
    sizes = _sizes(analysis)
    ws = diag.facts.world_size
    ranks = set(by_rank)
    if ws and ws <= MAX_STRIP_RANKS:
        ranks |= set(range(ws))
    ranks |= {r for r in culprits if r >= 0}
    out = []
    for rank in sorted(ranks)[:MAX_STRIP_RANKS]:
        row = by_rank.get(rank)
        if row is None:
            state = "culprit" if rank in culprits else "no_log"
            out.append(RankState(rank, ctx.rank_hosts.get(rank, ""), state, ""))
            continue
        state = row.get("state") or "seen"
        where = " ".join(x for x in (_where(row), sizes.get(rank, "")) if x)
        out.append(RankState(rank, row.get("host") or "", state if state in STATES else "seen", where))
    return tuple(out)


# Key events for the timeline: kind -> lane (plain words). Lanes are drawn top to bottom in this
# order, causes first, reactions last; kinds not listed get a lane named after the kind.
LANES: dict[str, str] = {}
for _lane, _kinds in (
    ("GPU / CUDA error", ("xid", "gpu_lost", "cuda_error", "health_check_failed")),
    ("out of memory", ("cuda_oom", "cpu_oom", "oom_killer")),
    ("DataLoader worker", ("worker_killed", "worker_fault", "loader_error")),
    ("crash / exception", ("segfault", "fatal_signal", "cpp_terminate", "gloo_enforce", "exception",
                           "error_file", "nccl_error_trace")),
    ("NCCL / network error", ("nccl_error", "remote_error", "nccl_warn", "nccl_unhandled", "comm_aborted")),
    ("store / rendezvous", ("socket_connect_failed", "store_timeout", "store_conn_lost", "rendezvous_error",
                            "server_bind_failed")),
    ("launch / config", ("wrong_device",)),
    ("checkpoint save", ("ckpt_save",)),
    ("application", ("nonfinite_loss", "side_work", "gil_hang")),
    ("training step", ("step_progress",)),
    ("collective mismatch", ("fingerprint_mismatch", "desync_report", "monitored_barrier")),
    ("timeout / hang", ("watchdog_timeout", "gloo_timeout", "watchdog_exception", "heartbeat_hang")),
    ("peer closed", ("peer_closed",)),
    ("Flight Recorder", ("dump_signal", "fr_dump", "fr_entry")),
    ("teardown", ("teardown", "closing_signal", "agent_signal")),
    ("process exit", ("child_failed", "worker_failed", "error_file_copy")),
):
    for _k in _kinds:
        LANES[_k] = _lane
LANE_ORDER = tuple(dict.fromkeys(LANES.values()))
# Bookkeeping rows: plentiful and never a failure by themselves.
NOISE_KINDS = frozenset({
    "fr_entry", "fr_pg", "fr_status", "nccl_init", "nccl_init_start", "nccl_version", "nccl_net", "pg_init",
    "env_setting", "watchdog_status", "rendezvous_ranks", "spawn_bootstrap",
})
TIMEOUT_KINDS = ("watchdog_timeout", "gloo_timeout")
MAX_PER_LANE = 250
MAX_POINTS = 1500


def _iso(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%d %H:%M:%S.%f")


def timeline_view(analysis) -> TimelineView:
    ev: pl.DataFrame = analysis.context.events
    diag = analysis.diagnosis
    culprits = set(diag.verdict.culprit_ranks)
    culprit_hosts = set(diag.verdict.culprit_hosts)
    if ev.is_empty():
        return TimelineView((), (), 0, 0, None)
    ff = diag.first_failure
    root_key = (ff.file, ff.line) if ff is not None else None
    # the verdict's own evidence is key whatever its kind (a Flight Recorder entry can be the root)
    cited = pl.DataFrame(
        {"file": [e.file for e in diag.verdict.evidence], "line": [e.line for e in diag.verdict.evidence]},
        schema={"file": pl.Utf8, "line": pl.UInt32},
    ).unique()
    is_cited = pl.struct("file", "line").is_in(cited.to_struct().implode())
    key = ev.filter(~pl.col("kind").is_in(list(NOISE_KINDS)) | is_cited)
    untimed = key.filter(pl.col("ts").is_null()).height
    key = key.filter(pl.col("ts").is_not_null())
    # one point per (kind, rank, host, second-long burst) is enough: retries and duplicated
    # console/--log-dir copies of a line say nothing new; the root row is never folded away
    is_root = (pl.col("file") == root_key[0]) & (pl.col("line") == root_key[1]) if root_key else pl.lit(False)
    key = key.with_columns(pl.col("ts").dt.truncate("1s").alias("_sec"), is_root.alias("_root"))
    key = key.sort(["_root", "ts"], descending=[True, False]).unique(
        subset=["kind", "rank", "host", "_sec"], keep="first", maintain_order=True).sort(["ts", "rank"])
    lanes: dict[str, list[dict]] = {}
    for r in key.iter_rows(named=True):
        lanes.setdefault(LANES.get(r["kind"], f"other: {r['kind']}"), []).append(r)
    budget = max(40, MAX_POINTS // max(1, len(lanes)))
    events: list[TimelineEvent] = []
    for lane, rows in lanes.items():
        for r in _sample(rows, min(MAX_PER_LANE, budget), culprits, root_key):
            is_root = root_key is not None and (r["file"], r["line"]) == root_key
            events.append(TimelineEvent(
                ts=_iso(r["ts"]), lane=lane, kind=r["kind"], rank=r["rank"], host=r["host"] or "",
                where=f"{r['file']}:{r['line']}", text=short(r["detail"] or r["text"], 120),
                culprit=(r["rank"] in culprits) if r["rank"] is not None else (r["host"] in culprit_hosts),
                root=is_root,
            ))
    events.sort(key=lambda e: (e.ts, e.rank if e.rank is not None else -1))
    present = set(lanes)
    order = [x for x in LANE_ORDER if x in present] + sorted(present - set(LANE_ORDER))
    first_to = next((e for e in events if e.kind in TIMEOUT_KINDS), None)
    return TimelineView(tuple(events), tuple(order), key.height, untimed, first_to)


def _sample(rows: list[dict], cap: int, culprits: set[int], root_key) -> list[dict]:
    """Keep culprit rows, the root row and the earliest rows, then spread the rest evenly in time."""
    if len(rows) <= cap:
        return rows
    must = [i for i, r in enumerate(rows)
            if r["rank"] in culprits or (root_key and (r["file"], r["line"]) == root_key)][: cap // 2]
    keep = set(must) | set(range(min(10, cap)))
    room = cap - len(keep)
    if room > 0:
        step = len(rows) / room
        keep |= {int(i * step) for i in range(room)}
    return [rows[i] for i in sorted(keep)]
