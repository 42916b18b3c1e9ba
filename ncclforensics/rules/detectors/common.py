"""What detectors share: their registry, the Hit they return, helpers several root causes use."""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from ncclforensics.model import Collective, rank_ranges
from ncclforensics.rules.context import Context, extra
from ncclforensics.signals import SIGINT, SIGTERM, signal_of_exit


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
    notes: list[str] = field(default_factory=list)  # run notes the detector has to tell


DETECTORS: dict[str, Callable[..., list[Hit]]] = {}


def detector(fn: Callable[..., list[Hit]]) -> Callable[..., list[Hit]]:
    DETECTORS[fn.__name__] = fn
    return fn


# -- collectives and positions -------------------------------------------------------------
def stuck_collective(ctx: Context) -> Collective:
    s = ctx.stuck
    return Collective(pg=s.pg, op_type=s.op, seq=s.seq)


def minority(pos: dict[int, tuple]) -> tuple[list[int], tuple | None, bool]:
    """Ranks whose position differs from the strict majority; (culprits, majority, strict)."""
    counts = Counter(pos.values())
    if len(counts) < 2:
        return [], None, True
    (top, n), (_, n2) = counts.most_common(2)
    if n == n2:
        return [], None, False
    return sorted(r for r, p in pos.items() if p != top), top, True


def earliest_ts(rows: list[dict]):
    ts = [r["ts"] for r in rows if r.get("ts") is not None]
    return min(ts) if ts else None


def last_step(ctx: Context, rank: int) -> int | None:
    steps = [extra(r).get("step") for r in ctx.rows("step_progress") if r["rank"] == rank]
    steps = [s for s in steps if isinstance(s, int)]
    return max(steps) if steps else None


def waiting_ranks(ctx: Context) -> set[int]:
    """Ranks that show they were waiting for peers (timeouts of their own)."""
    rows = ctx.rows("watchdog_timeout", "gloo_timeout", "watchdog_status", "monitored_barrier")
    out = {r["rank"] for r in rows if r["rank"] is not None}
    if ctx.stuck.in_it and ctx.stuck.source in ("watchdog", "flight_recorder"):
        out |= set(ctx.stuck.in_it)
    return out


# -- words ---------------------------------------------------------------------------------
def who(ranks: list[int]) -> str:
    """'Rank 3' / 'Ranks 0–3, 7' / 'A rank' for messages."""
    if not ranks:
        return "A rank"
    return ("Rank " if len(ranks) == 1 else "Ranks ") + rank_ranges(ranks, count=False)


def on_ranks(ranks: list[int]) -> str:
    """' on rank 3' / ' on ranks 0–3' / '' (no rank known: say nothing)."""
    if not ranks:
        return ""
    return (" on rank " if len(ranks) == 1 else " on ranks ") + rank_ranges(ranks, count=False)


def rank_fields(ranks: list[int]) -> dict[str, str]:
    w = who(ranks)
    return {"ranks": rank_ranges(ranks, count=False) or "unknown", "who": w, "who_lc": w[:1].lower() + w[1:],
            "on_ranks": on_ranks(ranks)}


def aftermath(ctx: Context, culprits: list[int]) -> str:
    """What the logs show the other ranks did next, in one sentence, or '' when they show nothing:
    a narrative claims only what the logs hold."""
    kinds, ranks = ctx.symptoms_apart_from(culprits)
    if not kinds:
        return ""
    subject = who(ranks) if ranks else "Other ranks"
    if kinds & {"watchdog_timeout", "gloo_timeout", "watchdog_status", "monitored_barrier", "desync_report"}:
        what = "timed out waiting in a collective"
    elif kinds & {"peer_closed", "store_conn_lost", "nccl_proxy_error", "remote_error"}:
        what = "saw their connections to it close"
    elif kinds & {"closing_signal", "launcher_teardown", "agent_signal"}:
        return " The launcher then stopped the other workers."
    else:
        what = "failed after it"
    return f" {subject} then {what}."


# -- attribution ---------------------------------------------------------------------------
def attribute(ctx: Context, rows: list[dict]) -> tuple[list[int], float, list[str]]:
    """Ranks of `rows`; rows without a rank go to the one rank that died on its own, if unique.
    Returns (culprits, confidence factor, notes). Confidence is about the class, which a missing
    rank does not make less certain: the factor stays 1."""
    ranks = sorted({r["rank"] for r in rows if r["rank"] is not None})
    if ranks:
        return ranks, 1.0, []
    files = {r["file"] for r in rows}
    if len(files) == 1:
        # a file whose every ranked line is one rank's (a pod's or a node's log with one worker: its own
        # launcher names it) holds that rank's unprefixed lines too, unless that rank shows it waited on
        # or lost a peer (a timeout, a closed connection): then the line may be the peer's
        mine = ctx.file_ranks.get(next(iter(files)), frozenset())
        if len(mine) == 1 and not mine & ctx.symptom_ranks:  # a rank that reacted to a peer is its victim
            (rank,) = mine
            return [rank], 1.0, [f"a line without a rank prefix was attributed to rank {rank}, the only "
                                 "rank its file shows"]
    own = sorted(ctx.self_failures)
    if len(own) == 1:
        return own, 1.0, [f"a line without a rank prefix was attributed to rank {own[0]}, "
                          "the only rank that failed on its own"]
    # the one rank the launcher saw exit by itself (not stopped by SIGTERM/SIGINT, no timeout of its own):
    # whatever ended it, the unprefixed failure is its (FORMATS.md §8.2, §18.1); also where several ranks
    # show a failure of their own, when only one of them ended of it (another's was a warning it outlived)
    exited = sorted(rk for rk, code in ctx.exit_codes.items() if code and signal_of_exit(code) not in (SIGTERM, SIGINT))
    if len(exited) == 1:
        return exited, 1.0, [f"a line without a rank prefix was attributed to rank {exited[0]}, the only "
                             "rank the launcher saw exit by itself"]
    return [], 1.0, []


def peer_symptoms(ctx: Context, culprits: list[int], limit: int = 3) -> list[dict]:
    rows = [r for r in ctx.rows("peer_closed", "gloo_timeout", "watchdog_timeout") if r["rank"] not in culprits]
    return rows[:limit]


def by_host_pid(ctx: Context) -> dict[tuple, set[int]]:
    """(host, pid) -> ranks seen with that pid on that host; (None, pid) across hosts. Besides rows
    with both, the DeepSpeed launcher's spawn lines give pid -> local rank, and its
    `global_rank_mapping` the node's global ranks (FORMATS.md §18.5), and a launcher's table of its workers
    (Ray Train's) each worker's host, pid and rank."""
    out: dict[tuple, set[int]] = {}
    ev = ctx.events.filter(pl.col("pid").is_not_null() & pl.col("rank").is_not_null())
    pairs = list(ev.select("host", "pid", "rank").iter_rows()) + _spawned_ranks(ctx) + _tabled_ranks(ctx)
    for host, pid, rank in pairs:
        out.setdefault((host, pid), set()).add(rank)
        out.setdefault((None, pid), set()).add(rank)
    return out


def _tabled_ranks(ctx: Context) -> list[tuple]:
    """(host, pid, rank) of each worker a launcher's table lists (patterns/signatures/launcher/worker_table.toml)."""
    out = []
    for r in ctx.rows("worker_table"):
        x = extra(r)
        pid, rank = x.get("worker_pid"), x.get("worker_rank")
        if isinstance(pid, int) and isinstance(rank, int):
            out.append((x.get("worker_host"), pid, rank))
    return out


def _spawned_ranks(ctx: Context) -> list[tuple]:
    """(host, pid, global rank) of each DeepSpeed child: its local rank's entry in its node's list."""
    mapping: dict[str, list[int]] = {}
    for r in ctx.rows("launcher_rank_map"):
        try:
            parsed = ast.literal_eval(str(extra(r).get("mapping") or ""))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(parsed, dict):
            mapping.update({str(h).split(".")[0]: v for h, v in parsed.items() if isinstance(v, list)})
    out = []
    for r in ctx.rows("launcher_spawn"):
        x = extra(r)
        host, pid, local = r["host"], x.get("child_pid"), x.get("spawn_local_rank")
        ranks = mapping.get(str(host).split(".")[0]) if host else (next(iter(mapping.values())) if len(mapping) == 1
                                                                 else None)
        if pid is not None and isinstance(local, int) and ranks and 0 <= local < len(ranks):
            out.append((host, pid, ranks[local]))
    return out
