"""Rank crash: one rank died of its own exception, CUDA error or signal while the others waited."""

from __future__ import annotations

import polars as pl

from ncclforensics.model import RootCause, rank_ranges
from ncclforensics.rules.context import Context, extra, is_cause_row
from ncclforensics.rules.detectors.common import (
    Hit,
    aftermath,
    by_host_pid,
    detector,
    peer_symptoms,
    rank_fields,
    stuck_collective,
    waiting_ranks,
)
from ncclforensics.signals import SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGKILL, SIGSEGV, signal_name, signal_of_exit
from ncclforensics.vocabulary import vocabulary

# signals a process dies of by itself (FORMATS.md §18.1); SIGTERM/SIGINT come from a launcher's teardown
_OWN_SIGNALS = frozenset({SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGKILL, SIGSEGV})


def _is_exit_report(r: dict) -> bool:
    return r["kind"] in vocabulary().kinds_from_launcher()


def _is_signal_row(r: dict) -> bool:
    """A line saying the process died of a signal (faulthandler, the kernel, a C++ terminate)."""
    return r["kind"] in ("fatal_signal", "segfault", "cpp_terminate")


@detector
def rank_exception(ctx: Context) -> list[Hit]:
    """A rank raised an exception (or hit a CUDA error of its own kernels) before the others failed."""
    own = {rk: r for rk, r in ctx.self_failures.items()
           if r["class"] == RootCause.RANK_CRASH.value and not _is_exit_report(r) and not _is_signal_row(r)
           and r["kind"] != "ddp_error"}
    conf, notes = 1.0, []
    if not own:
        own, notes = _unprefixed_exception(ctx)
        conf = 0.85
    if not own:
        return []
    first = sorted(own.values(), key=lambda r: (r["ts"] is None, r["ts"]))
    t0 = first[0]["ts"]
    culprits = sorted(rk for rk, r in own.items() if t0 is None or r["ts"] is None or r["ts"] <= t0)
    if ctx.world_size and len(culprits) >= ctx.world_size > 1 and not waiting_ranks(ctx):
        return []  # every rank raised: a launch or code problem, not one rank's crash
    exc = (first[0].get("detail") or first[0]["text"] or "")[:200]
    cuda = first[0]["kind"] == "cuda_error" or "CUDA error" in exc or "CUDA" in str(first[0]["source"])
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(first + peer_symptoms(ctx, culprits)),
                fields={"exc": exc, **rank_fields(culprits), "aftermath": aftermath(ctx, culprits)}, ts=t0,
                confidence=conf, collective=stuck_collective(ctx), notes=notes,
                params={"mode": "exception", "culprit_ranks": culprits, "error": "cuda" if cuda else "python"})]


def _unprefixed_exception(ctx: Context) -> tuple[dict[int, dict], list[str]]:
    """A worker's own exception printed without a rank prefix (torch < 2.4 consoles, pastes), when
    a launcher reports exactly one worker that exited with code 1 (an uncaught Python exception) and
    no rank-bearing failure of its own: {that rank: the exception row, timed by the report}."""
    exited = [rk for rk, code in ctx.exit_codes.items() if code == 1]
    if len(exited) != 1:
        return {}, []
    rank = exited[0]
    rows = [r for r in ctx.causes(RootCause.RANK_CRASH) if r["rank"] is None and r["kind"] == "exception"]
    if not rows:
        return {}, []
    report = next((r for r in ctx.rows("child_failed", "worker_failed") if r["rank"] == rank), None)
    row = dict(rows[0], rank=rank)
    if row["ts"] is None and report is not None:
        row["ts"] = report["ts"]
    return {rank: row}, [f"an exception without a rank prefix was attributed to rank {rank}, the one worker "
                         "the launcher reports exiting with code 1"]


def _with_victim_rank(row: dict, by_pid: dict[tuple, set[int]]) -> dict:
    """A kernel crash line names a pid, not a rank (FORMATS.md §12.4): the rank of that pid on that
    host, or anywhere when the line has no host and only one rank had that pid."""
    pid = extra(row).get("victim_pid")
    if row["rank"] is not None or pid is None:
        return row
    ranks = by_pid.get((row["host"], pid), set())
    return dict(row, rank=next(iter(ranks))) if len(ranks) == 1 else row


@detector
def rank_signal(ctx: Context) -> list[Hit]:
    """A worker killed by a signal (SIGKILL, SIGSEGV, SIGABRT …) — from a launcher's exit report or a
    fatal-signal line — while the others waited for it."""
    raised = {rk for rk, r in ctx.self_failures.items() if not _is_exit_report(r) and not _is_signal_row(r)}
    codes = {rk: c for rk, c in ctx.exit_codes.items()
             if signal_of_exit(c) in _OWN_SIGNALS and rk not in raised}
    sig_rows = [r for r in ctx.rows("fatal_signal", "segfault", "cpp_terminate") if is_cause_row(r)]
    if any(r["rank"] is None and extra(r).get("victim_pid") is not None for r in sig_rows):
        by_pid = by_host_pid(ctx)
        sig_rows = [_with_victim_rank(r, by_pid) for r in sig_rows]
    sig_rows = [r for r in sig_rows if r["rank"] not in raised]
    # exit reports that name no rank (DeepSpeed, torch.distributed.launch: FORMATS.md §18.2, §18.5)
    rankless = [r for r in ctx.causes(RootCause.RANK_CRASH) if _is_exit_report(r) and r["rank"] is None
                and signal_of_exit(r["code"]) in _OWN_SIGNALS]
    if not codes and not sig_rows and not rankless:
        return []
    ranks = sorted(codes) or sorted({r["rank"] for r in sig_rows if r["rank"] is not None})
    rows = [r for r in ctx.rows("child_failed", "worker_failed", "srun_task_exit", "launcher_exit")
            if r["rank"] in codes] + sig_rows + rankless
    every = bool(ctx.world_size) and len(ranks) >= (ctx.world_size or 0) > 1 and not waiting_ranks(ctx)
    culprits: list[int] = [] if every else ranks
    code = next(iter(codes.values()), None)
    sig = signal_of_exit(code)
    if sig is None:
        sig = next((r["code"] for r in sig_rows if r["code"] is not None), None)
    if sig is None:
        sig = next((signal_of_exit(r["code"]) for r in rankless), None)
    # SIGABRT known only from a launcher's exit code, with no line of the rank's own: the NCCL watchdog
    # ends a rank that timed out with SIGABRT too (§3.7), so this may be a symptom. Its log settles it.
    own = set(ctx.events.filter(pl.col("rank").is_in(list(codes)) & ~pl.col("kind").is_in(
        [*vocabulary().kinds_from_launcher(), "closing_signal"]))["rank"].to_list())
    if sig == SIGABRT and codes and not own and not any(r["rank"] in codes for r in sig_rows):
        return [Hit(culprits=[], evidence=[], confidence=0.0, notes=[
            f"rank {rank_ranges(ranks, count=False)} is known to have died of SIGABRT only from the launcher's "
            "exit code; the NCCL watchdog ends a rank that timed out the same way, so this names no culprit. "
            "That rank's own log would tell which."])]
    fields = rank_fields(culprits)
    if every:
        fields.update(who="Every rank", who_lc="every rank")
    elif not culprits:
        fields.update(who="A worker", who_lc="a worker")
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows + peer_symptoms(ctx, culprits)),
                fields={**fields, "signal": signal_name(sig), "aftermath": aftermath(ctx, culprits)},
                ts=min((r["ts"] for r in rows if r["ts"] is not None), default=None),
                collective=stuck_collective(ctx), confidence=(0.9 if every else 1.0) * (1.0 if ranks else 0.6),
                params={"mode": "signal", "signal": sig, "culprit_ranks": culprits})]
