"""Analysis -> the frontier chart's view-model: where each rank stood per process group, in which state."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import polars as pl

# Per-rank states of Diagnosis.ranks (analysis.rank_rows) plus ranks with no log line at all.
STATES = ("culprit", "crashed", "waiting", "seen", "no_log")
STATE_TEXT = {
    "culprit": "culprit",
    "crashed": "failed or exited",
    "waiting": "failed waiting for a peer",
    "seen": "no failure line",
    "no_log": "no log lines",
}
STATE_COLORS = {
    "culprit": "#c62828",
    "crashed": "#ef6c00",
    "waiting": "#1565c0",
    "seen": "#90a4ae",
    "no_log": "#e6e6e6",
}
# the words inside a strip cell (the legend above the chart has the long ones)
STATE_SHORT = {
    "culprit": "culprit", "crashed": "failed", "waiting": "waiting", "seen": "no failure", "no_log": "no log",
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
        stuck_pg=s.pg, stuck_seq=s.seq, stuck_op=s.op or "",
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
