"""Rank divergence: ranks that issued different collectives, or one rank that never reached them."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import polars as pl

from ncclforensics.model import P2P_OP_TYPES, Collective, rank_ranges
from ncclforensics.rules.context import Context, extra
from ncclforensics.rules.detectors.common import (
    Hit,
    detector,
    earliest_ts,
    last_step,
    minority,
    rank_fields,
    stuck_collective,
    waiting_ranks,
    who,
)


def _split_words(strict: bool, n_groups: int) -> str:
    """How to say which ranks are off: a strict minority, or a split no majority settles (MISSES §10)."""
    if strict:
        return "the ranks in the minority issued a different number of collectives"
    return (f"the ranks split into {n_groups} groups of equal size, so no majority says which group took "
            "the other code path")


@detector
def seq_skew(ctx: Context, min_ranks: int = 2) -> list[Hit]:
    """Watchdog timeouts of one PG at different SeqNums: the minority took another path."""
    hits = []
    fr = ctx.frontier.filter(pl.col("timeout_seq").is_not_null())
    for (pg,), grp in fr.group_by(["pg"]):
        if grp.height < min_ranks or grp["timeout_seq"].n_unique() < 2:
            continue
        pos = {r["rank"]: (r["timeout_seq"],) for r in grp.iter_rows(named=True)}
        culprits, top, strict = minority(pos)
        rows = [r for r in ctx.rows("watchdog_timeout") if r["rank"] in pos]
        seqs = sorted({p[0] for p in pos.values()})
        op = Counter(grp["timeout_op"].to_list()).most_common(1)[0][0]
        hits.append(Hit(
            culprits=culprits, evidence=ctx.evidence_rows(sorted(rows, key=lambda r: r["rank"] in culprits,
                                                              reverse=True)),
            fields={"pg": pg, "seq_min": seqs[0], "seq_max": seqs[-1], "n_ranks": len(pos),
                    "split": _split_words(strict, len(set(pos.values())))},
            ts=earliest_ts(rows), collective=Collective(pg=pg, op_type=op, seq=top[0] if top else None),
            confidence=1.0 if strict else 0.5, params={"mode": "extra_collective"}))
    return hits


@detector
def op_mismatch(ctx: Context) -> list[Hit]:
    """Same SeqNum (or none printed, torch <= 1.10: FORMATS.md §19.4), different OpType or NumelIn
    across ranks: one rank ran another collective."""
    hits = []
    fr = ctx.frontier.filter(pl.col("timeout_op").is_not_null())
    for (pg, seq), grp in fr.group_by(["pg", "timeout_seq"]):
        if seq is None and fr.filter(pl.col("timeout_seq").is_not_null() & (pl.col("pg") == pg)).height:
            continue  # ranks that printed a SeqNum are compared by it (seq_skew)
        pos = {r["rank"]: (r["timeout_op"], r["timeout_numel_in"]) for r in grp.iter_rows(named=True)}
        if len(set(pos.values())) < 2:
            continue
        culprits, top, strict = minority(pos)
        rows = [r for r in ctx.rows("watchdog_timeout") if r["rank"] in pos and r["seq"] == seq]
        ops = ", ".join(sorted({f"{o}({n})" if n is not None else o for o, n in pos.values()}))
        hits.append(Hit(
            culprits=culprits, evidence=ctx.evidence_rows(rows),
            fields={"pg": pg, "seq": seq if seq is not None else "?", "ops": ops,
                    "at": (f"SeqNum {seq}" if seq is not None else "the same point (this torch prints no SeqNum)")
                    + f" of process group {pg}"},
            ts=earliest_ts(rows), collective=Collective(pg=pg, op_type=top[0] if top else None, seq=seq),
            confidence=1.0 if strict else 0.5, params={"mode": "extra_collective"}))
    return hits or _unranked_op_mismatch(ctx)


def _unranked_op_mismatch(ctx: Context) -> list[Hit]:
    """Timeouts that name no rank and no SeqNum (torch <= 1.10's blocking wait raises `Caught collective
    operation timeout: WorkNCCL(OpType=…, TensorShape=…)` from `work.wait()` in the rank's own thread,
    once per rank: FORMATS.md §19.4) in different collectives: some ranks ran another call. Which ranks
    the lines came from is unknown, so no culprit is named; and without a process group in the line the
    collectives may belong to different groups, so the finding is moderate."""
    rows = ctx.rows("watchdog_timeout")
    if not rows or any(r["rank"] is not None or r["seq"] is not None or r["pg"] is not None for r in rows):
        return []
    # pipeline stages wait in SEND and RECV by design: those are no divergence
    ops = Counter(r["op"] for r in rows if r["op"] and r["op"].upper() not in P2P_OP_TYPES)
    if len(ops) < 2 or sum(ops.values()) < 3:
        return []
    (top, n), (_, n2) = ops.most_common(2)
    words = ", ".join(f"{o} ×{c}" for o, c in sorted(ops.items()))
    return [Hit(
        culprits=[], evidence=ctx.evidence_rows(sorted(rows, key=lambda r: r["op"] == top)),
        fields={"pg": "?", "seq": "?", "ops": words,
                "at": "the same point (the timeouts name no rank, SeqNum or process group)"},
        ts=earliest_ts(rows), collective=Collective(op_type=top if n > n2 else None),
        confidence=0.6, params={"mode": "extra_collective"})]


@detector
def position_vote(ctx: Context, source: str = "flight_recorder") -> list[Hit]:
    """Ranks whose last collective (Flight Recorder or gloo traceback) differs from the majority's.
    With two ranks and no majority, the smaller collective is the odd one: rank-only extras (a
    metric, a diagnostic, an early barrier) are small (see align.stuck_collective)."""
    s = ctx.stuck
    if s.source != source or not s.elsewhere or not s.in_it:
        return []
    kinds = {"flight_recorder": ("fr_entry",), "traceback": ("exception", "gloo_timeout")}[source]
    culprits = sorted(s.elsewhere)
    if source == "flight_recorder" and s.seq is not None:
        fr = {r["rank"]: r["fr_last_seq"] for r in ctx.frontier.iter_rows(named=True) if r["pg"] == s.pg}
        if all(fr.get(r) is not None and fr[r] < s.seq for r in culprits):
            return []  # merely behind, not elsewhere: a lagging rank (RD007, CK001 explain it)
    strict = len(s.in_it) > len(culprits)
    rows = [r for r in ctx.rows(*kinds) if r["rank"] in set(culprits) | set(s.in_it)]
    if source == "flight_recorder":
        last: dict[int, dict] = {}  # each rank's last entry, the odd ones first
        for r in rows:
            if r["pg"] == s.pg and (r["rank"] not in last or (r["seq"] or -1) > (last[r["rank"]]["seq"] or -1)):
                last[r["rank"]] = r
        rows = list(last.values())
    rows = sorted(rows, key=lambda r: (r["rank"] not in culprits, r["rank"]))
    where = "; ".join(f"rank {r} in {p}" for r, p in sorted(s.elsewhere.items()))
    return [Hit(
        culprits=culprits, evidence=ctx.evidence_rows(rows),
        fields={"where": where, "majority": f"{s.op or '?'}#{s.seq if s.seq is not None else '?'}",
                "n_in": len(s.in_it)},
        ts=earliest_ts(rows), collective=stuck_collective(ctx), confidence=1.0 if strict else 0.75,
        params={"mode": "early_exit" if any("BARRIER" in p for p in s.elsewhere.values()) else "extra_collective"})]


@detector
def fingerprint_mismatch(ctx: Context) -> list[Hit]:
    """A DETAIL fingerprint mismatch, even one-sided or cut (FORMATS.md §7.1): by itself it proves the
    ranks ran different collectives. The collective is the majority's, else the reporter's own; the
    culprits are the minority when three or more ranks' fingerprints vote, else nobody (one message
    between two ranks cannot say which of them is off)."""
    rows = ctx.rows("fingerprint_mismatch")
    if not rows:
        return []
    fr = ctx.frontier.filter(pl.col("fp_op").is_not_null())
    # the tensors' dtypes vote too (a Float loss beside the others' BFloat16 one: FORMATS.md §7.1's
    # `Tensor Tensor dtypes` aspect), but only where every rank's are known: a fingerprint cut before
    # them is no other dtype
    dtypes = fr["fp_dtypes"].null_count() == 0
    pos = {r["rank"]: (r["fp_seq"], r["fp_op"], r["fp_shape"]) + ((r["fp_dtypes"],) if dtypes else ())
           for r in fr.iter_rows(named=True)}
    culprits, top, strict = minority(pos) if len(pos) >= 3 else ([], None, False)
    confidence = 1.0
    if not strict and len(pos) == 2:
        # two sides, no vote: a rank-only extra is a scalar (a metric, a flag, a norm) beside the
        # regular collective's tensor; between two big tensors nothing says which side is off
        (ra, pa), (rb, pb) = sorted(pos.items())
        na, nb = _shape_numel(pa[2]), _shape_numel(pb[2])
        if (na is not None and nb is not None and min(na, nb) <= SCALAR_NUMEL
                and max(na, nb) >= 64 * max(1, min(na, nb))):
            small, big = (ra, pb) if na < nb else (rb, pa)
            culprits, top, strict, confidence = [small], big, True, 0.85
    first = rows[0]
    x = extra(first)
    seq = x["seq_a"] + 1 if isinstance(x.get("seq_a"), int) else None  # SequenceNumber counts those before
    op = first["op"]
    if strict and top is not None:
        seq, op = top[0], top[1]
    sides = []
    for r in rows[:1]:
        xr = extra(r)
        a = xr.get("rank_a", r["rank"])
        sides.append(f"rank {a} ran {_fp(xr.get('seq_a'), r['op'], xr.get('shape_a'))}")
        if xr.get("rank_b") is not None:
            sides.append(f"rank {xr['rank_b']} ran {_fp(xr.get('seq_b'), xr.get('op_b'), xr.get('shape_b'))}")
        else:
            sides.append("the other side of the message is not in the log")
    aspects = (x.get("aspects") or "").strip()
    differ = f" They differ in: {aspects}." if aspects else ""
    return [Hit(
        culprits=culprits if strict else [], evidence=ctx.evidence_rows(rows),
        fields={"sides": "; ".join(sides), "differ": differ, "n_reports": len(rows),
                "collective": f"{op or '?'}#{seq if seq is not None else '?'}"},
        ts=earliest_ts(rows), collective=Collective(pg=None, op_type=op, seq=seq), confidence=confidence,
        params={"mode": "extra_collective"})]


SCALAR_NUMEL = 16


def _shape_numel(shape: str | None) -> int | None:
    """'1' -> 1, '3, 4' -> 12, '' -> 0 (a tensor-less fingerprint), None when unknown."""
    if shape is None:
        return None
    dims = [d for d in shape.replace(" ", "").split(",") if d]
    n = 1
    for d in dims:
        if not d.isdigit():
            return None
        n *= int(d)
    return n if dims else 0


def _fp(seq_a, op, shape) -> str:
    at = f"#{seq_a + 1}" if isinstance(seq_a, int) else ""
    return f"{op or '?'}{at}" + (f" (shape [{shape}])" if shape else "")


@detector
def named_by_peers(ctx: Context) -> list[Hit]:
    """monitored_barrier on rank 0 and the desync report name the lagging ranks outright."""
    missing: Counter[int] = Counter()
    rows = []
    for r in ctx.rows("monitored_barrier", "desync_report"):
        x = extra(r)
        for key in ("missing_ranks", "lagging_ranks", "never_joined"):
            for rank in x.get(key) or []:
                missing[rank] += 1
                rows.append(r)
    if not missing:
        return []
    culprits = sorted(missing)
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows), ts=earliest_ts(rows),
                fields=rank_fields(culprits), collective=stuck_collective(ctx),
                params={"mode": "missing_collective"})]


# -- a rank that never reached the collective -----------------------------------------------
_NEWS_KINDS = ("ckpt_save", "ckpt_saved", "side_work", "step_progress", "nonfinite_loss")
_WORK_KINDS = ("ckpt_save", "side_work", "nonfinite_loss")
MAIN_RANK = 0  # frameworks print progress, evaluation and save lines from the main process (§22)
# a timeout fires `Timeout(ms)` after the collective was enqueued: a work line that long before the
# timeout is what the lagging rank started instead (MISSES G3)
TIMING_SLACK = dt.timedelta(seconds=90)


def _news(ctx: Context, rank: int, adopted: list[dict]) -> list[dict]:
    own = [r for r in ctx.rows(*_NEWS_KINDS) if r["rank"] == rank]
    own += [dict(r, _adopted=True) for r in adopted]
    own.sort(key=lambda r: (r["ts"] is None, r["ts"], r["file"], r["line"]))
    return own


def _still_in(news: list[dict], kind: str) -> bool:
    """Whether the rank never came back from its last `kind` of work (ckpt_save, side_work).

    For a save that is its last save *start*: the per-file lines that follow (`Model weights saved in`,
    `[Torch] Saved <file>.`) are progress within it; only a whole-save completion of its own ends it
    (`successfully saved`, `is ready now!`, `Checkpoint saved to`, `Model saved to`: FORMATS.md §22) —
    a completion line without a rank prefix may be another writer's (DeepSpeed: every rank prints
    them). News of another kind stamped later (a step, an evaluation) shows the rank came back. Rows
    without a time sort loosely: then the work counts when it is among the last three news rows.
    """
    marks = [i for i, r in enumerate(news) if r["kind"] == kind]
    if not marks:
        return False
    i = marks[-1]
    if kind == "ckpt_save" and any(r["kind"] == "ckpt_saved" and not r.get("_adopted") for r in news[i + 1:]):
        return False  # its own completion ended the save
    t = news[i]["ts"]
    if t is None:
        return i >= len(news) - 3
    return not any(r["kind"] not in (kind, "ckpt_saved") and r["ts"] is not None and r["ts"] > t
                   for r in news[i + 1:])


def _timed_to(ctx: Context, work: dict) -> bool:
    """The waiting ranks' collective was enqueued right after this work line: their timeout fired
    one timeout period after it."""
    if work["ts"] is None:
        return False
    for r in ctx.rows("watchdog_timeout"):
        if r["ts"] is not None and r["timeout_ms"]:
            start = r["ts"] - dt.timedelta(milliseconds=r["timeout_ms"])
            if abs(start - work["ts"]) <= TIMING_SLACK:
                return True
    return False


@detector
def laggard(ctx: Context, require: str | None = None, exclude: str | None = None) -> list[Hit]:
    """Ranks absent from the collective the others wait in, alive in their own logs and not crashed.

    `require`: an event kind the laggard's last news must be (ckpt_save, side_work).
    `exclude`: an event kind that, on every laggard, means another rule explains it.
    A rank that left no line at all is a laggard only when every rank seen waits and the world size
    bounds the ranks; a work line without a rank is the main process's (rank 0's) when rank 0 is such
    a rank, since frameworks print those from the main process (FORMATS.md §22).
    """
    waiting = waiting_ranks(ctx)
    if not waiting:
        return []
    s = ctx.stuck
    seen = set(ctx.ranks_seen)
    crashed = set(ctx.self_failures)
    notes: list[str] = []
    lag: dict[int, str] = {}
    for r in ctx.frontier.iter_rows(named=True):
        if (s.seq is not None and r["pg"] == (s.pg or r["pg"]) and r["last_enqueued"] is not None
                and r["last_enqueued"] < s.seq and r["timeout_seq"] is None):
            lag[r["rank"]] = f"its last enqueued SeqNum is {r['last_enqueued']} < {s.seq}"
        elif r["dump_src"] is not None and r["dump_src"] != r["rank"] and r["timeout_seq"] is None \
                and r["rank"] not in waiting:
            lag[r["rank"]] = "it only received the dump signal from another rank"
    for rank in seen - waiting - crashed:
        lag.setdefault(rank, "it shows no timeout while the others wait")
    adopted: dict[int, list[dict]] = {}
    rankless = [r for r in ctx.rows(*_WORK_KINDS) if r["rank"] is None]
    ws = ctx.world_size
    absent = set(range(ws)) - seen if ws and ws <= 65_536 else set()
    if absent and not (seen - waiting - crashed) and s.source in ("watchdog", "flight_recorder", "none"):
        if MAIN_RANK in absent and rankless:
            lag[MAIN_RANK] = "it is absent from the timeouts, and the main process's last line is its own work"
        elif len(absent) <= max(1, len(waiting) // 3):
            for rank in absent:
                lag.setdefault(rank, "every rank seen waits in the collective, and this one left no line")
    lag = {r: why for r, why in lag.items() if r not in crashed}
    if MAIN_RANK in lag and rankless:
        adopted[MAIN_RANK] = rankless
        notes.append(f"work lines without a rank prefix were taken as rank {MAIN_RANK}'s: frameworks print saves, "
                     f"evaluations and progress from the main process, and rank {MAIN_RANK} was not in the collective")
    if not lag or len(lag) >= max(len(waiting), 1) + (1 if len(waiting) == 1 else 0):
        return []  # a laggard is a minority of the ranks
    news = {rank: _news(ctx, rank, adopted.get(rank, [])) for rank in lag}
    if require is not None:
        lag = {rank: why for rank, why in lag.items() if _still_in(news[rank], require)}
        if not lag:
            return []
    if exclude is not None and all(_still_in(news[rank], exclude) for rank in lag):
        return []  # another rule names this work
    culprits = sorted(lag)
    work = [r for rank in culprits for r in news[rank] if r["kind"] in _WORK_KINDS]
    work.sort(key=lambda r: (r["ts"] is None, r["ts"]), reverse=True)
    waits = [r for r in ctx.rows("watchdog_timeout", "gloo_timeout", "watchdog_status", "fr_entry")
             if r["rank"] in waiting][-4:]
    step = max((st for st in (last_step(ctx, r) for r in culprits) if st is not None), default=None)
    timed = bool(work) and _timed_to(ctx, work[0])
    seen_lag = all(rank in seen for rank in culprits)
    confidence = (1.0 if work else 0.7) if seen_lag or adopted else 0.6
    if timed:
        confidence = min(1.0, confidence + 0.1)
    n_waiting = len(s.in_it) or len(waiting)
    w = who(culprits)
    return [Hit(
        culprits=culprits, evidence=ctx.evidence_rows(work[:4] + waits),
        fields={"why": "; ".join(f"rank {rank_ranges(rs, count=False)}: {y}" for y, rs in _by_reason(lag).items()),
                "n_waiting": n_waiting, "ranks_waiting": "rank" if n_waiting == 1 else "ranks",
                "ranks": rank_ranges(culprits, count=False), "who": w, "who_lc": w[:1].lower() + w[1:],
                "work": (work[0]["detail"] or work[0]["text"] or "")[:160] if work else "no line of its own",
                "timing": (" The others' timeout fired exactly one timeout period after that line: the "
                           "collective was issued right after it.") if timed else ""},
        ts=earliest_ts(work) or ctx.first_symptom_ts, collective=stuck_collective(ctx), confidence=confidence,
        notes=notes,
        params={"mode": "missing_collective", "step": step, "culprit_ranks": culprits,
                "lagging": "busy" if work else "absent",
                "waited_in": "barrier" if s.op == "BARRIER" else "collective"})]


def _by_reason(lag: dict[int, str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for rank, why in sorted(lag.items()):
        out.setdefault(why, []).append(rank)
    return out


# -- DDP reducer ---------------------------------------------------------------------------
@detector
def ddp_reducer(ctx: Context, divergent: bool = False) -> list[Hit]:
    """DDP's reducer found parameters without gradients, a variable marked ready twice, or a changed
    static graph (FORMATS.md §7.3). With `divergent`, fires only when the ranks disagree on which
    parameters went unused (the ranks ran different code); otherwise only when they do not."""
    rows = ctx.rows("ddp_error")
    if not rows:
        return []
    params: dict[int, set[str]] = {}
    for r in rows:
        x = extra(r)
        rank = r["group_rank"] if r["group_rank"] is not None else r["rank"]
        names = x.get("param_indices") or x.get("param_names")
        if rank is not None and names:
            params.setdefault(rank, set()).update(p.strip() for p in str(names).replace(",", " ").split() if p)
    reporting = sorted(params)
    # ranks that raised the reducer error without naming parameters, or never raised it
    raised = {r["rank"] for r in rows if r["rank"] is not None} | set(reporting)
    differ = len({frozenset(v) for v in params.values()}) > 1
    # every rank's reducer checks its own graph at the same iteration: ranks seen in the same logs
    # that did not raise ran every parameter, so the reporting ranks' graphs differed (§7.3)
    quiet = sorted(set(ctx.ranks_seen) - raised) if params else []
    is_divergent = differ or (bool(params) and bool(quiet))
    if is_divergent != divergent:
        return []
    detail = " ".join(str(r["detail"] or "") for r in rows).lower()
    mode = ("ready_twice" if "ready twice" in detail or "ready only once" in detail
            else "graph_changed" if "graph has changed" in detail else "unused")
    shown = []
    for rank in reporting[:4]:
        ps = sorted(params[rank], key=lambda p: (len(p), p))
        shown.append(f"rank {rank}: {', '.join(ps[:8])}{' …' if len(ps) > 8 else ''}")
    culprits = reporting if divergent or len(reporting) == 1 else []
    return [Hit(
        culprits=culprits, evidence=ctx.evidence_rows(rows), ts=earliest_ts(rows),
        fields={**rank_fields(culprits),
                "params": "; ".join(shown) or "the parameters are not listed (TORCH_DISTRIBUTED_DEBUG=INFO names them)",
                "what": {"unused": "parameters that received no gradient",
                         "ready_twice": "a parameter marked ready twice in one backward",
                         "graph_changed": "a static graph that changed between iterations"}[mode]},
        collective=stuck_collective(ctx),
        params={"mode": mode, "culprit_ranks": culprits, "divergent": "yes" if divergent else "no"})]


@detector
def horovod_missing(ctx: Context) -> list[Hit]:
    """Horovod's stall report (`Missing ranks:`, one line a rank: the tensors it has not submitted that
    others have). Ranks missing different tensors ran different code: the minority is off. Ranks that
    all miss the same tensors, while the others submitted them, are the ones that never got there."""
    rows = ctx.rows("horovod_missing")
    if not rows:
        return []
    missing: dict[int, str] = {}
    for r in sorted(rows, key=lambda r: r["line"]):  # the last report of each rank is its latest state
        x = extra(r)
        rank, first = x.get("missing_rank"), x.get("first_tensor")
        if isinstance(rank, int) and first and x.get("first_whole"):  # a name cut off by the paste says nothing
            missing[rank] = str(first)
    if not missing:
        return []
    groups = {t: sorted(r for r, f in missing.items() if f == t) for t in set(missing.values())}
    if len(groups) == 1:
        culprits, strict = sorted(missing), True  # only these ranks are missing what the rest submitted
    else:
        culprits, _, strict = minority({r: (t,) for r, t in missing.items()})
    shown = "; ".join(f"{'rank' if len(rs) == 1 else 'ranks'} {rank_ranges(rs, count=False)} missing {t}"
                      for t, rs in sorted(groups.items(), key=lambda g: g[1]))
    return [Hit(
        culprits=culprits, evidence=ctx.evidence_rows(ctx.rows("horovod_stall")[:1] + rows),
        ts=earliest_ts(rows),
        fields={**rank_fields(culprits), "groups": shown,
                "reading": (f"{who(culprits)} submitted what the majority did not: another code path"
                            if len(groups) > 1 and culprits else
                            f"{who(culprits)} alone never submitted what the other ranks did" if culprits else
                            "The ranks split into groups of equal size: no majority says which took the other path")},
        collective=None, confidence=1.0 if strict else 0.5)]
