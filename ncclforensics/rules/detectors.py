"""Detectors: pure functions of the rule Context and params, each returning zero or more Hits."""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from ncclforensics.model import Collective, rank_ranges
from ncclforensics.rules.context import SIGNAL_NAMES, Context, extra, is_symptom_row


@dataclass
class Hit:
    culprits: list[int]
    evidence: list[dict]
    fields: dict = field(default_factory=dict)  # for the rule's message template
    ts: object | None = None
    collective: Collective | None = None
    confidence: float = 1.0  # multiplies the rule's confidence
    params: dict = field(default_factory=dict)  # reproducer / fix selection (validated later)
    hosts: list[str] = field(default_factory=list)


DETECTORS: dict[str, Callable[..., list[Hit]]] = {}


def detector(fn: Callable[..., list[Hit]]) -> Callable[..., list[Hit]]:
    DETECTORS[fn.__name__] = fn
    return fn


# -- helpers -------------------------------------------------------------------------------
def _stuck_collective(ctx: Context) -> Collective:
    s = ctx.stuck
    return Collective(pg=s.pg, op_type=s.op, seq=s.seq)


def _minority(pos: dict[int, tuple]) -> tuple[list[int], tuple | None, bool]:
    """Ranks whose position differs from the strict majority; (culprits, majority, strict)."""
    counts = Counter(pos.values())
    if len(counts) < 2:
        return [], None, True
    (top, n), (_, n2) = counts.most_common(2)
    if n == n2:
        return [], None, False
    return sorted(r for r, p in pos.items() if p != top), top, True


def _earliest_ts(rows: list[dict]):
    ts = [r["ts"] for r in rows if r.get("ts") is not None]
    return min(ts) if ts else None


def _last_step(ctx: Context, rank: int) -> int | None:
    rows = [r for r in ctx.rows("step_progress") if r["rank"] == rank]
    steps = [extra(r).get("step") for r in rows]
    steps = [s for s in steps if isinstance(s, int)]
    return max(steps) if steps else None


def _waiting_ranks(ctx: Context) -> set[int]:
    """Ranks that show they were waiting for peers (timeouts of their own)."""
    rows = ctx.rows("watchdog_timeout", "gloo_timeout", "watchdog_status", "monitored_barrier")
    out = {r["rank"] for r in rows if r["rank"] is not None}
    if ctx.stuck.in_it and ctx.stuck.source in ("watchdog", "flight_recorder"):
        out |= set(ctx.stuck.in_it)
    return out


# -- rank divergence -----------------------------------------------------------------------
@detector
def seq_skew(ctx: Context, min_ranks: int = 2) -> list[Hit]:
    """Watchdog timeouts of one PG at different SeqNums: the minority took another path."""
    hits = []
    fr = ctx.frontier.filter(pl.col("timeout_seq").is_not_null())
    for (pg,), grp in fr.group_by(["pg"]):
        if grp.height < min_ranks or grp["timeout_seq"].n_unique() < 2:
            continue
        pos = {r["rank"]: (r["timeout_seq"],) for r in grp.iter_rows(named=True)}
        culprits, top, strict = _minority(pos)
        rows = [r for r in ctx.rows("watchdog_timeout") if r["rank"] in pos]
        seqs = sorted({p[0] for p in pos.values()})
        op = Counter(grp["timeout_op"].to_list()).most_common(1)[0][0]
        hits.append(Hit(
            culprits=culprits, evidence=ctx.evidence_rows(sorted(rows, key=lambda r: r["rank"] in culprits,
                                                              reverse=True)),
            fields={"pg": pg, "seq_min": seqs[0], "seq_max": seqs[-1], "n_ranks": len(pos)},
            ts=_earliest_ts(rows), collective=Collective(pg=pg, op_type=op, seq=top[0] if top else None),
            confidence=1.0 if strict else 0.5, params={"mode": "extra_collective"}))
    return hits


@detector
def op_mismatch(ctx: Context) -> list[Hit]:
    """Same SeqNum, different OpType or NumelIn across ranks: one rank ran another collective."""
    hits = []
    fr = ctx.frontier.filter(pl.col("timeout_seq").is_not_null())
    for (pg, seq), grp in fr.group_by(["pg", "timeout_seq"]):
        pos = {r["rank"]: (r["timeout_op"], r["timeout_numel_in"]) for r in grp.iter_rows(named=True)}
        if len(set(pos.values())) < 2:
            continue
        culprits, top, strict = _minority(pos)
        rows = [r for r in ctx.rows("watchdog_timeout") if r["rank"] in pos and r["seq"] == seq]
        hits.append(Hit(
            culprits=culprits, evidence=ctx.evidence_rows(rows),
            fields={"pg": pg, "seq": seq, "ops": ", ".join(sorted({f"{o}({n})" for o, n in pos.values()}))},
            ts=_earliest_ts(rows), collective=Collective(pg=pg, op_type=top[0] if top else None, seq=seq),
            confidence=1.0 if strict else 0.5, params={"mode": "extra_collective"}))
    return hits


@detector
def position_vote(ctx: Context, source: str = "flight_recorder") -> list[Hit]:
    """Ranks whose last collective (Flight Recorder, DETAIL fingerprint or gloo traceback) differs
    from the majority's. With two ranks and no majority, the smaller collective is the odd one:
    rank-only extras (a metric, a diagnostic, an early barrier) are small (see align.stuck_collective)."""
    s = ctx.stuck
    if s.source != source or not s.elsewhere or not s.in_it:
        return []
    kinds = {"flight_recorder": ("fr_entry",), "fingerprint": ("fingerprint_mismatch",),
             "traceback": ("exception", "gloo_timeout")}[source]
    culprits = sorted(s.elsewhere)
    if source == "flight_recorder" and s.seq is not None:
        fr = {r["rank"]: r["fr_last_seq"] for r in ctx.frontier.iter_rows(named=True) if r["pg"] == s.pg}
        if all(fr.get(r) is not None and fr[r] < s.seq for r in culprits):
            return []  # merely behind, not elsewhere: a lagging rank (RD007, CK001 explain it)
    strict = len(s.in_it) > len(culprits)
    rows = [r for r in ctx.rows(*kinds) if r["rank"] in set(culprits) | set(s.in_it)]
    if source == "flight_recorder":
        # show each rank's last entry, the odd ones first
        last: dict[int, dict] = {}
        for r in rows:
            if r["pg"] == s.pg and (r["rank"] not in last or (r["seq"] or -1) > (last[r["rank"]]["seq"] or -1)):
                last[r["rank"]] = r
        rows = sorted(last.values(), key=lambda r: (r["rank"] not in culprits, r["rank"]))
    else:
        rows = sorted(rows, key=lambda r: (r["rank"] not in culprits, r["rank"]))
    where = "; ".join(f"rank {r} in {p}" for r, p in sorted(s.elsewhere.items()))
    return [Hit(
        culprits=culprits, evidence=ctx.evidence_rows(rows),
        fields={"where": where, "majority": f"{s.op or '?'}#{s.seq if s.seq is not None else '?'}",
                "n_in": len(s.in_it)},
        ts=_earliest_ts(rows), collective=_stuck_collective(ctx), confidence=1.0 if strict else 0.75,
        params={"mode": "early_exit" if any("BARRIER" in p for p in s.elsewhere.values()) else "extra_collective"})]


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
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows), ts=_earliest_ts(rows),
                fields=_rank_fields(culprits),
                collective=_stuck_collective(ctx),
                params={"mode": "missing_collective"})]


_NEWS_KINDS = ("ckpt_save", "side_work", "step_progress", "nonfinite_loss")


def _still_in(ctx: Context, rank: int, kind: str) -> bool:
    """Whether `kind` of work (ckpt_save, side_work) is the rank's last news: it never came back.

    Rows without a time from several files sort loosely, so the work counts when it is among the
    last three news rows; news of another kind stamped later than the work (a later step, an
    evaluation after the save) shows the rank came back from it.
    """
    own = [r for r in ctx.events.filter(pl.col("rank") == rank).to_dicts() if r["kind"] in _NEWS_KINDS]
    own.sort(key=lambda r: (r["ts"] is None, r["ts"], r["file"], r["line"]))
    marks = [i for i, r in enumerate(own) if r["kind"] == kind]
    if not marks or marks[-1] < len(own) - 3:
        return False
    last = own[marks[-1]]["ts"]
    return last is None or not any(r["kind"] != kind and r["ts"] is not None and r["ts"] > last
                                   for r in own[marks[-1] + 1:])


@detector
def laggard(ctx: Context, require: str | None = None, exclude: str | None = None) -> list[Hit]:
    """Ranks absent from the collective the others wait in, alive in their own logs and not crashed.

    `require`: an event kind the laggard's own log must show (ckpt_save, side_work).
    `exclude`: an event kind that, on the laggard, means another rule explains it.
    """
    waiting = _waiting_ranks(ctx)
    if not waiting:
        return []
    s = ctx.stuck
    seen = set(ctx.ranks_seen)
    crashed = set(ctx.self_failures)
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
    lag = {r: why for r, why in lag.items() if r not in crashed}
    if not lag or len(lag) >= max(len(waiting), 1) + (1 if len(waiting) == 1 else 0):
        return []  # a laggard is a minority of the ranks
    app = {k: [r for r in ctx.rows(k) if r["rank"] in lag] for k in _NEWS_KINDS if k != "step_progress"}
    if require is not None:
        lag = {rank: why for rank, why in lag.items() if _still_in(ctx, rank, require)}
        if not lag:
            return []
    if exclude is not None and all(_still_in(ctx, rank, exclude) for rank in lag):
        return []  # another rule names this work
    culprits = sorted(lag)
    rows = [r for k in ("ckpt_save", "side_work", "nonfinite_loss") for r in app[k] if r["rank"] in lag]
    rows.sort(key=lambda r: (r["ts"] is None, r["ts"]), reverse=True)
    waits = [r for r in ctx.rows("watchdog_timeout", "gloo_timeout", "watchdog_status", "fr_entry")
             if r["rank"] in waiting][-4:]
    step = max((s for s in (_last_step(ctx, r) for r in culprits) if s is not None), default=None)
    return [Hit(
        culprits=culprits, evidence=ctx.evidence_rows(rows[:4] + waits),
        fields={"why": "; ".join(f"rank {rank_ranges(rs, count=False)}: {w}" for w, rs in _by_reason(lag).items()),
                "n_waiting": len(s.in_it) or len(waiting), "ranks": rank_ranges(culprits, count=False),
                "who": _who(culprits), "who_lc": _who(culprits).lower(),
                "work": (rows[0]["detail"] or rows[0]["text"] or "")[:160] if rows else "its own work"},
        ts=_earliest_ts(rows) or ctx.first_symptom_ts, collective=_stuck_collective(ctx),
        confidence=1.0 if rows else 0.7,
        params={"mode": "missing_collective", "step": step, "culprit_ranks": culprits,
                "lagging": "busy" if rows else "absent",
                "waited_in": "barrier" if s.op == "BARRIER" else "collective"})]


def _who(ranks: list[int]) -> str:
    """'Rank 3' / 'Ranks 0–3, 7' for messages."""
    if not ranks:
        return "No single rank"
    return ("Rank " if len(ranks) == 1 else "Ranks ") + rank_ranges(ranks, count=False)


def _rank_fields(ranks: list[int]) -> dict[str, str]:
    return {"ranks": rank_ranges(ranks, count=False) or "unknown", "who": _who(ranks), "who_lc": _who(ranks).lower()}


def _by_reason(lag: dict[int, str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for rank, why in sorted(lag.items()):
        out.setdefault(why, []).append(rank)
    return out


# -- crashes, data loading, memory ------------------------------------------------------------
def _attribute(ctx: Context, rows: list[dict]) -> tuple[list[int], float]:
    """Ranks of `rows`; rows without a rank go to the one rank that died on its own, if unique."""
    ranks = sorted({r["rank"] for r in rows if r["rank"] is not None})
    if ranks:
        return ranks, 1.0
    own = sorted(ctx.self_failures)
    if len(own) == 1:
        ctx.notes.append(f"a line without a rank prefix was attributed to rank {own[0]}, "
                         "the only rank that exited on its own")
        return own, 0.85
    return [], 0.6


_LOADER_FETCH = ("dataloader.py:_try_get_data", "dataloader.py:_get_data", "dataloader.py:_next_data")


def _died_in_loader_fetch(row: dict) -> bool:
    """An exception raised while the main process fetched a batch from a worker (EOFError,
    ConnectionResetError from multiprocessing): the worker died mid-transfer, often SIGKILLed."""
    x = extra(row)
    stack = x.get("stack") or []
    exc = str(x.get("exc_type") or "")
    return any(s in stack for s in _LOADER_FETCH) and exc.rsplit(".", 1)[-1] not in (
        "KeyboardInterrupt", "SystemExit") and "DataLoader worker" not in (row.get("detail") or "")


@detector
def dataloader_death(ctx: Context) -> list[Hit]:
    # SIGTERM/SIGINT reach the workers when torchrun or the scheduler stops the rank (§8.1
    # teardown): the loader did not fail, its process group was told to stop.
    rows = [r for r in ctx.rows("worker_killed", "worker_fault", "loader_error") if r["code"] not in (15, 2)]
    fetch = [r for r in ctx.rows("exception") if _died_in_loader_fetch(r)]
    if not rows and not fetch:
        return []
    culprits, conf = _attribute(ctx, rows or fetch)
    if not rows:
        # no "killed by signal" line: the worker vanished while handing over a batch — what a
        # SIGKILL (the OOM killer) looks like from the main process
        return [Hit(culprits=culprits, evidence=ctx.evidence_rows(fetch + _peer_symptoms(ctx, culprits)),
                    fields={"signal": "died while sending a batch", **_rank_fields(culprits)},
                    ts=_earliest_ts(fetch), collective=_stuck_collective(ctx), confidence=conf * 0.85,
                    params={"mode": "sigkill", "culprit_ranks": culprits})]
    sig = next((r["code"] for r in rows if r["code"] is not None), None)
    x = extra(rows[0])
    if sig is None and x.get("exit_code") is not None:
        mode = "exit"
    else:
        # SIGKILL: the OOM killer; SIGBUS: /dev/shm; a segfault or abort: native code in the worker
        mode = {9: "sigkill", 7: "bus_error"}.get(sig, "exit" if sig is None or sig in _NATIVE_CRASH else "sigkill")
    signame = SIGNAL_NAMES.get(sig, f"signal {sig}" if sig else "an exit")
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows + _peer_symptoms(ctx, culprits)),
                fields={"signal": signame, "ranks": rank_ranges(culprits, count=False) or "unknown",
                        "who": _who(culprits), "who_lc": _who(culprits).lower()},
                ts=_earliest_ts(rows), collective=_stuck_collective(ctx), confidence=conf,
                params={"signal": sig, "mode": mode, "culprit_ranks": culprits,
                        "native": "yes" if sig in _NATIVE_CRASH else "no"})]


_NATIVE_CRASH = frozenset({11, 6, 4, 8})  # SIGSEGV, SIGABRT, SIGILL, SIGFPE


def _peer_symptoms(ctx: Context, culprits: list[int], limit: int = 3) -> list[dict]:
    rows = [r for r in ctx.rows("peer_closed", "gloo_timeout", "watchdog_timeout") if r["rank"] not in culprits]
    return rows[:limit]


# CUDA error strings that name the hardware (FORMATS.md §14.1); illegal access, launch failures and
# device asserts are code bugs until an Xid says otherwise.
_HW_CUDA = re.compile(r"ECC error|NVLink error|fallen off the bus|GPU is lost|uncorrectable", re.I)


@detector
def memory_exhausted(ctx: Context) -> list[Hit]:
    hits = []
    rows = ctx.rows("cuda_oom", "cpu_oom")
    # NCCL's own allocations failing (`NCCL WARN Cuda failure 'out of memory'`, or that text after
    # `Last error:` of the NCCL error it raised): CUDA memory too (FORMATS.md §10.3)
    rows += [r for r in ctx.rows("nccl_warn", "nccl_error") if r["rank"] is not None
             and _NCCL_OOM.search(f"{r.get('detail') or ''} {extra(r).get('last_error') or ''}")]
    if rows:
        culprits, conf = _attribute(ctx, rows)
        kind = "host" if all(r["kind"] == "cpu_oom" for r in rows) else "cuda"
        hits.append(Hit(culprits=culprits, evidence=ctx.evidence_rows(rows + _peer_symptoms(ctx, culprits)),
                        fields={"what": "CUDA memory" if kind == "cuda" else "host memory (CPU allocator)",
                                "ranks": rank_ranges(culprits, count=False) or "unknown"},
                        ts=_earliest_ts(rows), collective=_stuck_collective(ctx), confidence=conf,
                        params={"mode": kind, "culprit_ranks": culprits}))
    # a DataLoader worker the OOM killer took is DL001's (its pid is in the "DataLoader worker (pid N)
    # is killed" line, its name pt_data_worker); Slurm's "Detected N oom_kill event" counts the same
    # kills, so it is theirs too when every kill we can see, or the only death, is a worker's
    loader_pids = {extra(r).get("worker_pid") for r in ctx.rows("worker_killed")} - {None}
    loader_sigkill = any(r["code"] == 9 for r in ctx.rows("worker_killed"))

    def worker_kill(r: dict) -> bool:
        x = extra(r)
        return str(x.get("comm", "")).startswith("pt_data_worker") or x.get("victim_pid") in loader_pids

    kernel = ctx.rows("oom_killer")
    killed = [r for r in kernel if not worker_kill(r)]
    if killed or not ((kernel and all(map(worker_kill, kernel))) or (not kernel and loader_sigkill)):
        killed += ctx.rows("slurm_oom")
    if killed:
        # the killed pid on that host (pids repeat across hosts); a kernel log without a host name
        # matches a pid only if no two hosts share it
        by_host: dict[tuple, set[int]] = {}
        for row in ctx.all_rows:
            if row["pid"] is not None and row["rank"] is not None:
                by_host.setdefault((row["host"], row["pid"]), set()).add(row["rank"])
                by_host.setdefault((None, row["pid"]), set()).add(row["rank"])
        culprits = sorted({next(iter(by_host[key])) for r in killed
                           if (key := (r["host"], extra(r).get("victim_pid"))) in by_host
                           and len(by_host[key]) == 1})
        hosts = sorted({r["host"] for r in killed if r["host"]})
        if not culprits:
            culprits = sorted(rk for rk, h in ctx.rank_hosts.items() if h in hosts and rk in ctx.exit_codes
                              and ctx.exit_codes[rk] in (-9, 137))
        hits.append(Hit(culprits=culprits, evidence=ctx.evidence_rows(killed), hosts=hosts,
                        fields={"what": "host memory (the kernel OOM killer)",
                                "ranks": rank_ranges(culprits, count=False) or "unknown"},
                        ts=_earliest_ts(killed), collective=_stuck_collective(ctx),
                        params={"mode": "host", "signal": 9, "culprit_ranks": culprits}))
    return hits


_NCCL_OOM = re.compile(r"Cuda failure '?out of memory|Failed to CUDA calloc|cudaMalloc.*out of memory", re.I)


# An NCCL error raised before any step is communicator set-up failing between ranks (NI002,
# LC001, LC002 name it), not one rank's own crash, even when only one rank's traceback survived.
_NCCL_RAISED = re.compile(r"NCCL (?:error|timeout) in: ")


@detector
def rank_exception(ctx: Context) -> list[Hit]:
    """A rank raised an exception of its own (not a reaction to a peer) before the others failed."""
    # a CUDA error of the rank's own kernels (illegal address, device-side assert) is its exception;
    # the hardware ones (ECC, fallen off the bus) are HW001's
    own = {rk: r for rk, r in ctx.self_failures.items()
           if (r["kind"] in ("exception", "error_file")
               or (r["kind"] == "cuda_error" and not _HW_CUDA.search(r.get("detail") or "")))
           and not (_NCCL_RAISED.search(r.get("detail") or "") and not ctx.training_started)}
    conf = 1.0
    if not own:
        own, conf = _unprefixed_exception(ctx), 0.85
    if not own:
        return []
    first = sorted(own.values(), key=lambda r: (r["ts"] is None, r["ts"]))
    t0 = first[0]["ts"]
    culprits = sorted(rk for rk, r in own.items() if t0 is None or r["ts"] is None or r["ts"] <= t0)
    if ctx.world_size and len(culprits) >= ctx.world_size > 1 and not _waiting_ranks(ctx):
        return []  # every rank raised: a launch or code problem, see all_ranks_crashed
    exc = (first[0].get("detail") or first[0]["text"] or "")[:200]
    cuda = first[0]["kind"] == "cuda_error" or bool(_CUDA_RAISED.search(exc))
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(first + _peer_symptoms(ctx, culprits)),
                fields={"exc": exc, **_rank_fields(culprits)}, ts=t0, confidence=conf,
                collective=_stuck_collective(ctx),
                params={"mode": "exception", "culprit_ranks": culprits, "error": "cuda" if cuda else "python"})]


def _unprefixed_exception(ctx: Context) -> dict[int, dict]:
    """A worker's own exception printed without a rank prefix (torch < 2.4 consoles, pastes), when
    torchrun reports exactly one worker that exited with code 1 (an uncaught Python exception) and
    no rank-bearing failure of its own: {that rank: the exception row, timed by torchrun's report}."""
    exited = [rk for rk, code in ctx.exit_codes.items() if code == 1]
    if len(exited) != 1:
        return {}
    rank = exited[0]
    rows = [r for r in ctx.rows("exception") if r["rank"] is None and r["source"] == "python"
            and not is_symptom_row(r) and not _NCCL_RAISED.search(r.get("detail") or "")]
    if not rows:
        return {}
    report = next((r for r in ctx.rows("child_failed", "worker_failed") if r["rank"] == rank), None)
    row = dict(rows[0], rank=rank)
    if row["ts"] is None and report is not None:
        row["ts"] = report["ts"]
    ctx.notes.append(f"an exception without a rank prefix was attributed to rank {rank}, the one worker "
                     "torchrun reports exiting with code 1")
    return {rank: row}


_CUDA_RAISED = re.compile(r"CUDA error|illegal memory access|device-side assert|misaligned address|"
                          r"unspecified launch failure|an illegal instruction|CUBLAS_STATUS|CUDNN_STATUS", re.I)


_SIGNAL_KINDS = ("fatal_signal", "segfault", "cpp_terminate", "gloo_enforce")


@detector
def rank_signal(ctx: Context) -> list[Hit]:
    """A rank killed by a signal (SIGKILL, SIGSEGV, SIGABRT...) while the others waited for it."""
    # a rank whose own exception came first died of that exception (RC001), whatever signal ended it
    raised = {rk for rk, r in ctx.self_failures.items() if r["kind"] in ("exception", "error_file")}
    codes = {rk: c for rk, c in ctx.exit_codes.items()
             if ((c < 0 and c not in (-15, -2)) or c in (134, 137, 139)) and rk not in raised}
    # a `terminate called … DistBackendError` is the watchdog's own teardown after a timeout (§3.7)
    sig_rows = [r for r in ctx.rows(*_SIGNAL_KINDS) if not is_symptom_row(r) and r["rank"] not in raised]
    if not codes and not sig_rows:
        return []
    ranks = sorted(codes) or sorted({r["rank"] for r in sig_rows if r["rank"] is not None})
    rows = [r for r in ctx.rows("child_failed", "worker_failed") if r["rank"] in codes] + sig_rows
    every = bool(ctx.world_size) and len(ranks) >= (ctx.world_size or 0) and not _waiting_ranks(ctx)
    if every:
        culprits: list[int] = []
    else:
        culprits = ranks
    code = next(iter(codes.values()), None)
    sig = abs(code) if code is not None and code < 0 else (code - 128 if code and code > 128 else None)
    if sig is None:
        sig = next((r["code"] for r in sig_rows if r["code"] is not None), None)
    signame = SIGNAL_NAMES.get(sig, f"signal {sig}") if sig else "a signal"
    confidence = 0.9 if every else 1.0
    # SIGABRT known only from torchrun's exit code, with no line of the rank's own: the NCCL watchdog
    # ends a rank that timed out with SIGABRT too (§3.7), so this may be a symptom. Its log settles it.
    own = {r["rank"] for r in ctx.all_rows if r["rank"] in codes and r["kind"] not in _AGENT_KINDS}
    if sig == 6 and not own and not any(r["rank"] in codes for r in sig_rows) and codes:
        # (rank-less `Fatal Python error: Aborted` lines are other ranks' watchdog teardowns as often)
        ctx.notes.append(f"rank {rank_ranges(ranks, count=False)} is known to have died of SIGABRT only from "
                         "torchrun's exit code; the NCCL watchdog ends a rank that timed out the same way, "
                         "so this names no culprit. That rank's own log would tell which.")
        return []
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows + _peer_symptoms(ctx, culprits)),
                fields={"signal": signame, "ranks": rank_ranges(ranks, count=False) or "unknown",
                        "who": "every rank" if every else "rank " + rank_ranges(ranks, count=False)},
                ts=_earliest_ts(rows), collective=_stuck_collective(ctx), confidence=confidence,
                params={"mode": "signal", "signal": sig, "culprit_ranks": culprits})]


# Rows a torchrun agent writes about a worker (not the worker's own lines).
_AGENT_KINDS = frozenset({"child_failed", "worker_failed", "closing_signal"})


# -- hardware, network, launch --------------------------------------------------------------
@detector
def gpu_fault(ctx: Context, fatal_xids: list[int] | None = None) -> list[Hit]:
    fatal = set(fatal_xids or [])
    current = _current_kernel_rows(ctx, [r for r in ctx.rows("xid") if r["code"] in fatal] + ctx.rows("gpu_lost"))
    xids = [r for r in current if r["kind"] == "xid"]
    lost = [r for r in current if r["kind"] == "gpu_lost"]
    cuda = [r for r in ctx.rows("cuda_error", "watchdog_exception") if _HW_CUDA.search(r.get("detail") or "")]
    rows = xids + lost + cuda
    if not rows:
        return []
    t_sym = ctx.first_symptom_ts
    hosts = sorted({r["host"] for r in xids + lost if r["host"]})
    culprits = sorted({r["rank"] for r in cuda if r["rank"] is not None})
    # tie a PCI address to a rank through NCCL init lines (busId 4e000 = PCI 0000:4e:00)
    bus_rank = {}
    for r in ctx.rows("nccl_init"):
        x = extra(r)
        if x.get("bus_id") and r["rank"] is not None:
            bus_rank[(r["host"], str(x["bus_id"]).lower().lstrip("0")[:2])] = r["rank"]
    for r in xids + lost:
        pci = str(extra(r).get("pci") or "")
        bus = pci.split(":")[1].lower().lstrip("0") if pci.count(":") >= 2 else None
        if bus and (r["host"], bus[:2]) in bus_rank:
            culprits.append(bus_rank[(r["host"], bus[:2])])
    if not culprits and hosts:
        culprits = sorted(rk for rk, h in ctx.rank_hosts.items() if h in hosts)
    if not hosts:  # a kernel log without a host name: the culprits' hosts, where known
        hosts = sorted({ctx.rank_hosts[rk] for rk in culprits if rk in ctx.rank_hosts})
    before = all(r["ts"] is None or t_sym is None or r["ts"] <= t_sym for r in rows)
    code = next((r["code"] for r in xids), None)
    return [Hit(culprits=sorted(set(culprits)), evidence=ctx.evidence_rows(rows), hosts=hosts,
                fields={"what": f"Xid {code}" if code is not None else (rows[0].get("detail") or "GPU fault")[:120],
                        "hosts": ", ".join(hosts) or "unknown host"},
                ts=_earliest_ts(rows), collective=_stuck_collective(ctx), confidence=1.0 if before else 0.7,
                params={"culprit_ranks": sorted(set(culprits))})]


# A kernel log spans the node's uptime: a GPU fault this long before the run's first line of its own
# (and before twice its longest collective timeout) belongs to an earlier job.
STALE_KERNEL_S = 3600


def _current_kernel_rows(ctx: Context, rows: list[dict]) -> list[dict]:
    """`rows` (kernel events) without those from well before the run, once the run had trained."""
    own = [r["ts"] for r in ctx.all_rows if r["ts"] is not None and r["source"] != "kernel"]
    if not rows or not own or not ctx.training_started:
        return rows
    timeouts = [r["timeout_ms"] for r in ctx.rows("watchdog_timeout") if r.get("timeout_ms")]
    margin = dt.timedelta(seconds=max(STALE_KERNEL_S, 2 * max(timeouts, default=0) / 1000))
    start = min(own)
    current = [r for r in rows if r["ts"] is None or r["ts"] >= start - margin]
    for r in [r for r in rows if r["ts"] is not None and r["ts"] < start - margin][:3]:
        ctx.notes.append(f"{r['file']}:{r['line']}: a GPU fault at {r['ts']:%Y-%m-%d %H:%M} is "
                         f"{(start - r['ts']).total_seconds() / 3600:.0f} h older than the run's first "
                         "line; left out as an earlier job's")
    return current


_NET_RUNTIME = re.compile(
    r"NET/IB|NET/OFI|Got completion from peer|async fatal event|Got async event|ibv_|"
    r"socketProgress|Call to recv from|Connection closed by remote peer|Socket recv failed|"
    r"\[Proxy Service \d+\] Failed", re.I)
_LINK_EVENT = re.compile(r"Got async event|async fatal event", re.I)
_NET_INIT = re.compile(
    r"Bootstrap|no socket interface|No usable listening interface|neither AF_INET|Connect to .* failed|"
    r"socketStartConnect|socketPollConnect|exceeded retries|exceeded timeouts|Message truncated|"
    r"NET/IB : No (?:IP interface|device) found|Unable to open device|ibv_modify_qp", re.I)


@detector
def nccl_network(ctx: Context, phase: str = "runtime") -> list[Hit]:
    warns = [r for r in ctx.rows("nccl_warn") if (_NET_RUNTIME if phase == "runtime" else _NET_INIT)
             .search(r.get("detail") or "")]
    errs = ctx.rows("nccl_error")
    if phase == "runtime":
        if not ctx.training_started:
            return []
        errs = [r for r in errs if "remote process exited" in (r.get("detail") or "")
                or _NET_RUNTIME.search(extra(r).get("last_error") or "")]
    else:
        if ctx.training_started:
            return []
        errs += ctx.rows("store_conn_lost")
    rows = warns + errs
    if not rows:
        return []
    hosts = sorted({r["host"] for r in rows if r["host"]})
    culprits: list[int] = []
    # an event of a NIC's own link (port error, async fatal event) is local: it names the host and
    # the ranks that use that NIC; completion errors are seen by both ends of a broken connection
    local = [r for r in warns if _LINK_EVENT.search(r.get("detail") or "")] if phase == "runtime" else []
    if local:
        hosts = sorted({r["host"] for r in local if r["host"]}) or hosts
        culprits = sorted({r["rank"] for r in local if r["rank"] is not None})
        rows = local + [r for r in rows if r not in local]
    first = rows[0]
    what = (first.get("detail") or "") + (f" — last NCCL warning: {extra(first)['last_error']}"
                                          if extra(first).get("last_error") else "")
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows), hosts=hosts,
                fields={"what": what[:300], "hosts": ", ".join(hosts) or "unknown"},
                ts=_earliest_ts(rows), collective=_stuck_collective(ctx), confidence=1.0 if warns else 0.7,
                params={"mode": "unreachable_store"})]


_KEY_RANK = re.compile(r"/(\d+)$")
_IPV6_ONLY = re.compile(r"errno: 97\b|Address family not supported by protocol")


@detector
def init_connectivity(ctx: Context) -> list[Hit]:
    """Rendezvous, TCPStore, socket or gloo connection failures before training started."""
    kinds = ("socket_connect_failed", "store_timeout", "rendezvous_error", "gloo_connect_failed",
             "server_bind_failed", "store_conn_lost")
    # an IPv6 attempt (errno 97, address family not supported) is followed by IPv4: harmless (§9.1)
    rows = [r for r in ctx.rows(*kinds) if not (r["kind"] == "server_bind_failed"
                                                 and "in use" in (r.get("detail") or ""))
            and not _IPV6_ONLY.search(f"{r.get('detail') or ''} {r.get('text') or ''}")]
    if not rows or (ctx.training_started and not ctx.rows("store_timeout")):
        return []
    addr = next((f"{extra(r).get('addr')}:{extra(r).get('port')}" for r in rows
                 if r["kind"] == "socket_connect_failed" and extra(r).get("addr")), None)
    missing: set[int] = set()
    hosts: set[str] = set()
    for r in rows:
        x = extra(r)
        if r["kind"] == "store_timeout" and x.get("keys"):
            m = _KEY_RANK.search(str(x["keys"]))
            if m:
                missing.add(int(m.group(1)))  # the 2.13 key's last component is the absent rank (§6.2)
        if r["kind"] == "socket_connect_failed" and r["host"]:
            hosts.add(r["host"])  # this node could not reach the store: its ranks never joined
    joined = next(((extra(r).get("joined"), extra(r).get("expected")) for r in rows
                   if extra(r).get("expected") is not None), None)
    culprits = sorted(missing)
    if not culprits and hosts:
        culprits = sorted(rk for rk, h in ctx.rank_hosts.items() if h in hosts)
    parts = []
    if addr:
        parts.append(f"{addr} was unreachable")
    if joined and joined[0] is not None:
        parts.append(f"only {joined[0]} of {joined[1]} expected participants joined the store")
    if hosts:
        parts.append(f"failing side: {', '.join(sorted(hosts))}")
    if missing:
        parts.append(f"ranks that never joined: {rank_ranges(sorted(missing))}")
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows), hosts=sorted(hosts),
                fields={"what": "; ".join(parts) or (rows[0].get("detail") or "store connection failed")},
                ts=_earliest_ts(rows), collective=Collective(),
                params={"mode": "missing_rank" if missing else "unreachable_store"})]


_LAUNCH = {
    "duplicate_gpu": re.compile(r"Duplicate GPU detected", re.I),
    "shm": re.compile(r"failed to extend .*(?:/dev/shm|bytes)|Error while creating shared memory segment|"
                      r"No space left on device.*shm|unable to allocate shared memory", re.I),
    "device": re.compile(r"invalid device ordinal|no CUDA-capable device|all CUDA-capable devices are busy|"
                         r"GPU device may be out of range|driver version is insufficient", re.I),
    "port": re.compile(r"Address already in use", re.I),
    "main_guard": re.compile(r"before the current process has finished its bootstrapping phase|"
                             r"freeze_support\(\)", re.I),
}


# Functions whose frame in a traceback names the problem even when the message itself spans
# several unprefixed lines no signature sees whole (Python's multiprocessing spawn check).
_LAUNCH_FRAMES = {"main_guard": frozenset({"_check_not_importing_main"})}


def _frame_fns(row: dict) -> set[str]:
    return {str(f.get("fn")) for f in extra(row).get("frames") or [] if isinstance(f, dict)}


@detector
def launch_misconfig(ctx: Context, problem: str = "duplicate_gpu") -> list[Hit]:
    rx = _LAUNCH[problem]
    checks = _LAUNCH_FRAMES.get(problem, frozenset())
    # NCCL's WARN text often survives only after `Last error:` (NCCL_DEBUG unset, FORMATS.md §5.1)
    rows = [r for r, hit in zip(ctx.all_rows, ctx.search_hits(rx), strict=True)
            if r["source"] != "flight_recorder" and (
                hit or (checks and r["kind"] == "exception" and _frame_fns(r) & checks))]
    if not rows:
        return []
    if problem == "port" and ctx.training_started:
        return []  # the store came up after all (another address family, a retry): the bind warning is noise
    culprits = sorted({r["rank"] for r in rows if r["rank"] is not None})
    first = rows[0]
    said = next((t for t in (first.get("detail"), extra(first).get("last_error")) if t and rx.search(t)), None)
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows), ts=_earliest_ts(rows),
                fields={"what": (said or first.get("detail") or first["text"] or "")[:200]},
                hosts=sorted({r["host"] for r in rows if r["host"]}), collective=Collective(),
                params={"mode": problem})]


# The torch call an init-time NCCL error surfaced in (innermost traceback frame first): NCCL
# creates a communicator lazily, on the first collective of a process group, unless
# init_process_group got a device_id (eager init).
_INIT_STEPS = (  # (function, the step it is part of, what it does there)
    ("_verify_param_shape_across_processes", "DistributedDataParallel construction",
     "DDP's first collective, which creates the NCCL communicator"),
    ("_verify_params_across_processes", "DistributedDataParallel construction",
     "DDP's first collective, which creates the NCCL communicator"),
    ("_sync_module_states", "DistributedDataParallel construction",
     "broadcasting rank 0's parameters, the first NCCL collective"),
    ("_sync_params_and_buffers", "DistributedDataParallel construction",
     "broadcasting rank 0's parameters, the first NCCL collective"),
    ("_sync_module_params_and_buffers", "FSDP construction", "the first NCCL collective"),
    ("eager_connect_single_device", "init_process_group", "eager NCCL communicator creation for device_id"),
    ("new_group", "new_group", "creating a sub-group's NCCL communicator"),
    ("init_process_group", "init_process_group", "NCCL communicator creation"),
)
# NCCL source files the first `<file>:<line> -> <code>` error-trace line names (FORMATS.md §10.1)
_NCCL_STAGES = (
    ("bootstrap", "bootstrap (ranks exchanging addresses over sockets)"),
    ("socket", "a socket connection between ranks"),
    ("net_ib", "InfiniBand/RoCE transport set-up"),
    ("net_socket", "socket transport set-up"),
    ("p2p", "peer-to-peer (NVLink/PCIe) transport set-up"),
    ("shm", "shared-memory transport set-up"),
    ("proxy", "the proxy thread"),
    ("init", "communicator initialisation"),
)


def _init_step(ctx: Context) -> tuple[str, str, str | None]:
    """(the init step the NCCL error surfaced in, the same with the torch call, the user code line)."""
    for r in ctx.rows("exception", "error_file"):
        if "NCCL" not in (r.get("detail") or "") or is_symptom_row(r):
            continue
        frames = [f for f in extra(r).get("frames") or [] if isinstance(f, dict)]
        user = next((f for f in reversed(frames) if not str(f.get("file", "")).startswith(
            ("distributed", "c10d_logger", "utils", "__init__", "module", "rendezvous"))), None)
        where = f"{user.get('file')}:{user.get('line')} `{user.get('code')}`" if user and user.get("code") else None
        for f in reversed(frames):
            for fn, step, does in _INIT_STEPS:
                if f.get("fn") == fn:
                    return step, f"{step} ({fn}: {does})", where
        if r.get("op"):
            return (f"the first {r['op']} collective", f"the first {r['op']} collective "
                    "(NCCL creates the communicator on a group's first collective)", where)
    return "communicator creation", "communicator creation", None


_ATTEMPT_DIR = re.compile(r"(?:^|/)attempt_(\d+)/")


def _nccl_stage(ctx: Context, last_error: str | None) -> str | None:
    origin = next((extra(r).get("src") for r in ctx.rows("nccl_error_trace")), None)
    text = f"{origin or ''} {last_error or ''}".lower()
    for key, stage in _NCCL_STAGES:
        if key in text:
            return stage + (f" ({origin})" if origin else "")
    return None


@detector
def nccl_init_error(ctx: Context) -> list[Hit]:
    """An NCCL error while creating communicators, before any step: name the step that failed."""
    if ctx.training_started:
        return []
    errors = ctx.rows("nccl_error")
    rows = errors + [r for r in ctx.rows("nccl_warn", "nccl_error_trace")]
    rows = [r for r in rows if not _LAUNCH["duplicate_gpu"].search(r.get("detail") or "")]
    if not errors:
        return []
    first = errors[0]
    last_error = extra(first).get("last_error") or next((r.get("detail") for r in ctx.rows("nccl_warn")), None)
    step, step_detail, where = _init_step(ctx)
    stage = _nccl_stage(ctx, last_error)
    # torchrun --max-restarts, or the user relaunching: every attempt printed the error again, in
    # the same console or in its own attempt_<n> folder (a --tee console repeats the per-rank files)
    per_file = Counter((r["file"], r["rank"]) for r in errors)
    attempts = {m.group(1) for r in errors if (m := _ATTEMPT_DIR.search(r["file"] or ""))}
    launches = max(max(per_file.values(), default=1), len(attempts))
    # the ranks that failed, when every other rank was stopped (SIGTERM) rather than failing too:
    # e.g. one host's network interface. A console filtered to one rank shows only that rank's
    # error while the others failed as well (their exit codes say so): no culprit then.
    failed = {r["rank"] for r in errors + ctx.rows("nccl_warn") if r["rank"] is not None}
    others = set(ctx.ranks_seen) - failed
    term = (-15, 15, 143, -2)
    codes = {r["rank"]: r["code"] for r in ctx.rows("child_failed", "worker_failed") if r["code"] is not None}
    stopped = bool(others) and all(codes.get(rk) in (None, *term) and (rk in ctx.symptom_ranks or rk in codes)
                                   for rk in others)
    culprits = sorted(failed) if failed and stopped else []
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows),
                hosts=sorted({ctx.rank_hosts[rk] for rk in culprits if rk in ctx.rank_hosts}),
                fields={"what": (first.get("detail") or "NCCL error")[:200], "step": step,
                        "step_detail": step_detail,
                        "where": f" (called from {where})" if where else "",
                        "stage": f" NCCL itself failed during {stage}." if stage else "",
                        "launches": f" The same error ended all {launches} launches." if launches > 1 else "",
                        "last_error": last_error or "no NCCL WARN line was logged (rerun with NCCL_DEBUG=INFO)"},
                ts=_earliest_ts(rows), collective=Collective(), params={"mode": "unreachable_store"})]


# The failing stack must be *saving* a checkpoint: resuming (load_checkpoint, torch.load) from a
# missing file is not a save problem.
_SAVING = re.compile(r"save|async_save|write_(?:checkpoint|state)", re.I)
_CKPT = re.compile(r"checkpoint|ckpt|torch\.save|state_dict|dcp\.", re.I)


@detector
def checkpoint_exception(ctx: Context) -> list[Hit]:
    """An exception raised while saving a checkpoint (file races, full disk, permissions)."""
    hits = []
    for rk, r in ctx.self_failures.items():
        if r["kind"] not in ("exception", "error_file"):
            continue
        frames = extra(r).get("frames") or []
        text = " ".join(f"{f.get('fn')} {f.get('code')}" for f in frames if isinstance(f, dict))
        if _SAVING.search(text) and _CKPT.search(text) and \
                re.search(r"Error|No space|Permission|exists", r.get("detail") or ""):
            hits.append(Hit(culprits=[rk], evidence=ctx.evidence_rows([r]), ts=r["ts"],
                            fields={"exc": (r.get("detail") or "")[:200], **_rank_fields([rk])},
                            collective=_stuck_collective(ctx), params={"mode": "collective"}))
    return hits


def symptom_only(ctx: Context) -> bool:
    rows = ctx.all_rows
    return bool(rows) and all(is_symptom_row(r) or r["kind"] in ("step_progress", "fr_entry", "fr_status", "fr_pg")
                              for r in rows)
