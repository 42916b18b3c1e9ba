"""Event table -> collectives table: the per process group x rank frontier and the stuck collective."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field

import polars as pl

from ncclforensics.model import extra_field, json_object

# Kinds whose rows say where a rank stood in a process group.
TIMEOUT_KINDS = ("watchdog_timeout",)
STATUS_KINDS = ("watchdog_status", "dump_signal")
DEFAULT_PG = "0"

FRONTIER_SCHEMA = {
    "pg": pl.Utf8, "rank": pl.Int32, "host": pl.Utf8,
    "last_enqueued": pl.Int64, "last_started": pl.Int64, "last_completed": pl.Int64,
    "timeout_seq": pl.Int64, "timeout_op": pl.Utf8, "timeout_numel_in": pl.Int64,
    "timeout_ms": pl.Int64, "timeout_ts": pl.Datetime("us", "UTC"),
    "fr_last_seq": pl.Int64, "fr_last_op": pl.Utf8, "fr_last_numel": pl.Int64, "fr_entries": pl.Int64,
    "exc_op": pl.Utf8, "fp_seq": pl.Int64, "fp_op": pl.Utf8, "fp_shape": pl.Utf8, "fp_dtypes": pl.Utf8,
    "dump_src": pl.Int64, "err_seq": pl.Int64, "err_op": pl.Utf8, "err_numel": pl.Int64,
}


@dataclass(frozen=True)
class Stuck:
    """The collective the healthy ranks hung in, and who stood where."""

    pg: str | None
    op: str | None
    seq: int | None
    numel: int | None
    source: str  # watchdog | flight_recorder | fingerprint | async_error | traceback | none
    in_it: tuple[int, ...] = ()  # ranks seen waiting in it
    elsewhere: dict[int, str] = field(default_factory=dict)  # rank -> where it was instead


def frontier(events: pl.DataFrame) -> pl.DataFrame:
    """One row per (pg, rank) that any collective-position evidence mentions. After a worker-group
    restart (torchrun attempt_<n> trees) SeqNums start again: the first attempt that failed in a
    collective is the one aligned (FORMATS.md §2.2: keep the first attempt's failure)."""
    # a fingerprint names its reporter in its text (`Rank A is running …`, §7.1): it needs no rank prefix
    ev = events.filter(pl.col("rank").is_not_null() | (pl.col("kind").cast(pl.Utf8) == "fingerprint_mismatch"))
    attempt = extra_field("attempt").cast(pl.Int64, strict=False)
    placed = ev.filter(pl.col("kind").cast(pl.Utf8).is_in([*STATUS_KINDS, *TIMEOUT_KINDS, "fr_entry"]))
    attempts = placed.select(attempt.drop_nulls().unique())
    if attempts.height > 1:
        ev = ev.filter(attempt.is_null() | (attempt == attempts.min().item()))
    rows: dict[tuple[str, int], dict] = {}

    def slot(pg: str | None, rank: int, host: str | None) -> dict:
        key = (pg or DEFAULT_PG, int(rank))
        r = rows.get(key)
        if r is None:
            r = dict.fromkeys(FRONTIER_SCHEMA)
            r["pg"], r["rank"], r["host"] = key[0], key[1], host
            rows[key] = r
        if host and not r["host"]:
            r["host"] = host
        return r

    kinds = ev["kind"].cast(pl.Utf8)
    # status lines give the PG of a SeqNum on a rank: timeout lines (`[Rank N]` only) borrow it
    status = ev.filter(kinds.is_in(STATUS_KINDS))
    pg_by_rank_seq: dict[tuple[int, int], str] = {}
    for r in status.iter_rows(named=True):
        x = json_object(r["extra"])
        if r["pg"] is not None:
            if r["seq"] is not None:
                pg_by_rank_seq[(r["rank"], r["seq"])] = r["pg"]
        s = slot(r["pg"], r["rank"], r["host"])
        enq, done, st = x.get("enqueued"), x.get("completed"), x.get("started")
        if enq is not None:
            s["last_enqueued"] = max(s["last_enqueued"] or -1, enq)
        if done is not None:
            s["last_completed"] = max(s["last_completed"] or -1, done)
        if st is not None:
            s["last_started"] = max(s["last_started"] or -1, st)
        if r["kind"] == "dump_signal" and x.get("src_rank") is not None:
            s["dump_src"] = x["src_rank"]
    for r in ev.filter(kinds.is_in(TIMEOUT_KINDS)).iter_rows(named=True):
        pg = r["pg"] or (pg_by_rank_seq.get((r["rank"], r["seq"])) if r["seq"] is not None else None)
        s = slot(pg, r["rank"], r["host"])
        if s["timeout_seq"] is None or (r["seq"] is not None and r["seq"] < s["timeout_seq"]):
            s["timeout_seq"], s["timeout_op"] = r["seq"], r["op"]
            s["timeout_numel_in"], s["timeout_ms"], s["timeout_ts"] = r["numel_in"], r["timeout_ms"], r["ts"]
    # Flight Recorder: the last entry per rank per PG (gloo marks every entry `scheduled`, §15.2)
    fr = ev.filter(kinds == "fr_entry")
    if not fr.is_empty():
        fr = fr.unique(subset=["rank", "pg", "seq", "op"], keep="first")
        for (pg, rank), grp in fr.group_by(["pg", "rank"]):
            grp = grp.sort("seq")
            states = [json_object(x).get("state") for x in grp["extra"].to_list()]
            last = grp.row(grp.height - 1, named=True)
            if any(st in ("started", "completed") for st in states):
                # NCCL dumps: the first entry not completed is where the rank is stuck
                for row, st in zip(grp.iter_rows(named=True), states, strict=False):
                    if st != "completed":
                        last = row
                        break
            s = slot(pg, rank, last["host"])
            s["fr_last_seq"], s["fr_last_op"], s["fr_last_numel"] = last["seq"], last["op"], last["numel_in"]
            s["fr_entries"] = grp.height
    for r in ev.filter(kinds == "fr_status").iter_rows(named=True):
        x = json_object(r["extra"])
        s = slot(r["pg"], r["rank"], r["host"])
        if x.get("enqueued") is not None and x["enqueued"] >= 0:
            s["last_enqueued"] = max(s["last_enqueued"] or -1, x["enqueued"])
    # a collective that raised an async error (NCCL error, no timeout): where that rank failed (§3.8)
    for r in ev.filter((kinds == "watchdog_exception") & pl.col("seq").is_not_null()).iter_rows(named=True):
        s = slot(r["pg"], r["rank"], r["host"])
        if s["err_seq"] is None or r["seq"] < s["err_seq"]:
            s["err_seq"], s["err_op"], s["err_numel"] = r["seq"], r["op"], r["numel_in"]
    # DETAIL fingerprints: each rank prints its own collective as "Rank A"
    for r in ev.filter(kinds == "fingerprint_mismatch").iter_rows(named=True):
        x = json_object(r["extra"])
        a = x.get("rank_a", r["rank"])
        if a is None:
            continue
        s = slot(DEFAULT_PG, a, r["host"] if a == r["rank"] else None)
        if x.get("seq_a") is not None:
            s["fp_seq"] = x["seq_a"] + 1  # SequenceNumber counts the collectives issued before (§7.1)
        s["fp_op"], s["fp_shape"], s["fp_dtypes"] = r["op"], x.get("shape_a"), x.get("dtypes_a")
        b = x.get("rank_b")
        if b is not None:
            sb = slot(DEFAULT_PG, b, None)
            if sb["fp_op"] is None:
                sb["fp_seq"] = x["seq_b"] + 1 if x.get("seq_b") is not None else None
                sb["fp_op"], sb["fp_shape"], sb["fp_dtypes"] = x.get("op_b"), x.get("shape_b"), x.get("dtypes_b")
    # gloo: the op a rank was in comes from its traceback frames (§6)
    for r in ev.filter((kinds == "exception") & pl.col("op").is_not_null()).iter_rows(named=True):
        s = slot(None, r["rank"], r["host"])
        s["exc_op"] = s["exc_op"] or r["op"]
    if not rows:
        return pl.DataFrame(schema=FRONTIER_SCHEMA)
    return pl.DataFrame(list(rows.values()), schema=FRONTIER_SCHEMA, strict=False).sort(["pg", "rank"])


def _shape_numel(shape: str | None) -> int | None:
    if shape is None:
        return None
    n = 1
    dims = [d for d in shape.replace(" ", "").split(",") if d]
    if not dims:
        return 0
    for d in dims:
        if not d.isdigit():
            return None
        n *= int(d)
    return n


PG_LEAD = dt.timedelta(seconds=1)


def _first_pg(sub: pl.DataFrame) -> str | None:
    """With timeouts in several process groups: the PG that timed out first, when it did so clearly
    (PG_LEAD) before every other. A hang in one PG stalls the ranks in it, and the ranks that wait
    for those in another PG time out later: SeqNums of different PGs cannot be compared."""
    firsts = (sub.filter(pl.col("timeout_ts").is_not_null()).group_by("pg")
              .agg(pl.col("timeout_ts").min().alias("t")).sort("t"))
    if firsts.height < 2:
        return None
    t = firsts["t"].to_list()
    return firsts["pg"][0] if t[1] - t[0] >= PG_LEAD else None


def stuck_collective(fr: pl.DataFrame) -> Stuck:
    """Where the healthy ranks hung: the majority position among ranks, by the best evidence."""
    if fr.is_empty():
        return Stuck(None, None, None, None, "none")
    for source, seq_c, op_c, numel_c in (
        ("watchdog", "timeout_seq", "timeout_op", "timeout_numel_in"),
        ("flight_recorder", "fr_last_seq", "fr_last_op", "fr_last_numel"),
        ("fingerprint", "fp_seq", "fp_op", "fp_shape"),
        ("async_error", "err_seq", "err_op", "err_numel"),
    ):
        sub = fr.filter(pl.col(op_c).is_not_null() | pl.col(seq_c).is_not_null())
        if sub.is_empty():
            continue
        pg = _first_pg(sub) if source == "watchdog" else None
        # else the PG with the most ranks reporting (the default PG for DDP jobs)
        pg = pg if pg is not None else Counter(sub["pg"].to_list()).most_common(1)[0][0]
        sub = sub.filter(pl.col("pg") == pg)
        pos = {}
        for r in sub.iter_rows(named=True):
            numel = _shape_numel(r[numel_c]) if numel_c == "fp_shape" else r[numel_c]
            pos[r["rank"]] = (r[seq_c], r[op_c], numel)
        counts = Counter(pos.values())
        (seq, op, numel), n = counts.most_common(1)[0]
        if len(counts) > 1 and n == counts.most_common(2)[1][1]:
            # a tie (e.g. two ranks): the bigger collective is the regular one — rank-only
            # extras (metrics, diagnostics, an early barrier) are small (see detectors.tie_break)
            ties = [p for p, c in counts.items() if c == n]
            # ... and among equal collectives the later SeqNum: the rank behind never issued it
            seq, op, numel = max(ties, key=lambda p: (p[2] if p[2] is not None else -1, p[1] != "BARRIER",
                                                      p[0] if p[0] is not None else -1))
        in_it = tuple(sorted(r for r, p in pos.items() if p == (seq, op, numel)))
        elsewhere = {r: f"{p[1] or '?'}#{p[0] if p[0] is not None else '?'}" for r, p in pos.items()
                     if p != (seq, op, numel)}
        return Stuck(pg, op, seq, numel, source, in_it, elsewhere)
    ops = fr.filter(pl.col("exc_op").is_not_null())
    if not ops.is_empty():
        counts = Counter(ops["exc_op"].to_list())
        op, n = counts.most_common(1)[0]
        if len(counts) > 1 and counts.most_common(2)[1][1] == n:
            op = next((o for o in counts if o != "BARRIER"), op)
        in_it = tuple(sorted(r for r, o in zip(ops["rank"], ops["exc_op"], strict=False) if o == op))
        elsewhere = {r: o for r, o in zip(ops["rank"], ops["exc_op"], strict=False) if o != op}
        return Stuck(None, op, None, None, "traceback", in_it, elsewhere)
    return Stuck(None, None, None, None, "none")
