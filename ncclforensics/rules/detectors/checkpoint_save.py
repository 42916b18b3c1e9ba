"""Checkpoint save: writing a checkpoint failed (the lagging-saver case is `rank_divergence.laggard`), or a rank
stopped inside the kernel while writing to storage."""

from __future__ import annotations

from ncclforensics.model import RootCause
from ncclforensics.rules.context import Context, culprits_named, extra
from ncclforensics.rules.detectors.common import (
    Hit,
    aftermath,
    attribute,
    by_host_pid,
    detector,
    earliest_ts,
    rank_fields,
    stuck_collective,
    waiting_ranks,
)
from ncclforensics.rules.detectors.rank_divergence import laggard

# a hung task's call trace follows its `INFO: task` line (kernel/sched/core.c sched_show_task: ~15-40 frames)
TRACE_LINES = 60


@detector
def checkpoint_exception(ctx: Context) -> list[Hit]:
    """An exception raised while saving a checkpoint (its stack is in a save function: file races,
    full disk, permissions) or a writer error (FORMATS.md §22), with or without a rank."""
    rows = ctx.causes(RootCause.CHECKPOINT_SAVE)
    if not rows:
        return []
    named = sorted({rk for r in rows for rk in culprits_named(r)})
    culprits, conf, notes = (named, 1.0, []) if named else attribute(ctx, rows)
    first = rows[0]
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows), ts=first["ts"], confidence=conf,
                notes=notes,
                fields={"exc": (first.get("detail") or first["text"] or "")[:200], **rank_fields(culprits),
                        "aftermath": aftermath(ctx, culprits)},
                collective=stuck_collective(ctx), params={"mode": "collective", "culprit_ranks": culprits})]


@detector
def storage_stall(ctx: Context) -> list[Hit]:
    """Ranks the kernel saw blocked in a file system's write path (a hung task whose call trace writes back,
    flushes or fsyncs: a save to a stalled NFS/FUSE/CIFS mount) while the others waited in a collective.

    The blocked pid is a rank where a line ties that pid to one (by_host_pid); else the ranks absent from the
    collective (rank_divergence.laggard) on the blocked task's host are."""
    stalled = _stalled_writers(ctx)
    waiting = waiting_ranks(ctx)
    if not stalled or not waiting:
        return []
    by_pid = by_host_pid(ctx)
    culprits: set[int] = set()
    for h, _ in stalled:
        pid = extra(h).get("victim_pid")
        for key in ((h["host"], pid), (None, pid)):
            if len(by_pid.get(key, ())) == 1:
                culprits |= by_pid[key]
                break
    culprits -= waiting
    confidence, notes = 1.0, []
    if not culprits:
        lag = laggard(ctx)
        hosts = {h["host"] for h, _ in stalled if h["host"]}
        culprits = {rk for hit in lag for rk in hit.culprits
                    if not hosts or ctx.rank_hosts.get(rk) in hosts or rk not in ctx.rank_hosts}
        if not culprits:
            return []
        confidence = 0.85
        notes = ["no line ties the blocked process's pid to a rank: the culprits are the ranks absent from the "
                 "collective" + (" on the blocked task's host" if hosts else "")]
    ranks = sorted(culprits)
    first = min((h for h, _ in stalled), key=lambda r: (r["ts"] is None, r["ts"], r["line"]))
    frames = [f for _, fs in stalled for f in fs]
    modules = sorted({str(extra(f).get("module")) for f in frames if extra(f).get("module")})
    x = extra(first)
    tasks = list(dict.fromkeys(f"{extra(h).get('comm', 'a process')}:{extra(h).get('victim_pid', '?')}"
                               for h, _ in stalled))
    writing = sorted(frames, key=lambda f: not extra(f).get("write"))  # the write path's frames first
    waits = [r for r in ctx.rows("watchdog_timeout", "gloo_timeout", "watchdog_status") if r["rank"] in waiting]
    return [Hit(culprits=ranks, evidence=ctx.evidence_rows([first, *writing[:2], *waits[:3]]),
                ts=earliest_ts([h for h, _ in stalled]), collective=stuck_collective(ctx), confidence=confidence,
                notes=notes,
                fields={**rank_fields(ranks), "n_waiting": len(waiting),
                        "ranks_waiting": "rank" if len(waiting) == 1 else "ranks",
                        "tasks": ("task " if len(tasks) == 1 else "tasks ") + ", ".join(tasks[:3])
                                 + (f" and {len(tasks) - 3} more" if len(tasks) > 3 else ""),
                        "was": "was" if len(ranks) == 1 else "were",
                        "seconds": x.get("seconds", "?"),
                        "fs": (", ".join(modules) + " ") if modules else "",
                        "frame": str(extra(next((f for f in frames if extra(f).get("write")), frames[0])).get("func")),
                        "aftermath": aftermath(ctx, ranks)},
                params={"mode": "missing_collective", "culprit_ranks": ranks, "lagging": "busy",
                        "waited_in": "barrier" if ctx.stuck.op == "BARRIER" else "collective"})]


def _stalled_writers(ctx: Context) -> list[tuple[dict, list[dict]]]:
    """Hung tasks (patterns/signatures/kernel/hung_task.toml) whose call trace, the file system frames after
    the task's line and before the next task's, runs through a write path (kernel/fs_wait_frame.toml)."""
    hung = sorted(ctx.rows("hung_task"), key=lambda r: (r["file"], r["line"]))
    frames = ctx.rows("fs_wait_frame")
    out = []
    for i, h in enumerate(hung):
        nxt = next((g["line"] for g in hung[i + 1:] if g["file"] == h["file"]), None)
        end = h["line"] + TRACE_LINES if nxt is None else min(nxt, h["line"] + TRACE_LINES)
        mine = [f for f in frames if f["file"] == h["file"] and h["line"] < f["line"] < end]
        if any(extra(f).get("write") for f in mine):
            out.append((h, mine))
    return out
