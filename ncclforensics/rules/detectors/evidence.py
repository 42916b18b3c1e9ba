"""The verdict when no mechanism rule fires: the best-supported class from the evidence itself.

`class_evidence` turns the cause rows of one class into a finding whose confidence follows their
strength (decisive, strong, weak); `symptom_shape` gives a class to logs that hold symptoms only,
from the class those symptoms suggest and the shape of who waited (DESIGN.md §3).
"""

from __future__ import annotations

from ncclforensics.console import plural
from ncclforensics.model import RootCause
from ncclforensics.rules.context import Context, culprits_named
from ncclforensics.rules.detectors.common import (
    Hit,
    aftermath,
    attribute,
    detector,
    earliest_ts,
    rank_fields,
    stuck_collective,
    waiting_ranks,
)

# confidence by the strongest cause's strength: measured on ../shared/corpus-real (score_corpus --report)
STRENGTH_CONFIDENCE = {3: 0.85, 2: 0.7, 1: 0.45}
SYMPTOM_CONFIDENCE = 0.35


@detector
def class_evidence(ctx: Context, cls: str) -> list[Hit]:
    """Every cause row of class `cls`: culprits are the ranks those rows carry or name."""
    root = RootCause(cls)
    rows = ctx.causes(root)
    if root is RootCause.NETWORK_INIT and ctx.training_started:
        # an init-phase failure cannot explain a run that trained after it (retried, or noise); one after
        # every step of its file is a relaunch's that could not start
        rows = [r for r in rows if not ctx.trained_after(r)]
    if not rows:
        return []
    top = max(r["strength"] for r in rows)
    if top == 1 and any(r["strength"] > 1 for r in ctx.causes()):
        return []  # weak evidence (an exit code) stands only where no class has stronger (DESIGN.md §3)
    rows.sort(key=lambda r: (-r["strength"], r["ts"] is None, r["ts"]))
    best = [r for r in rows if r["strength"] == top]
    named = sorted({rk for r in best for rk in culprits_named(r)})
    if named:
        culprits, factor, notes = named, 1.0, []
    else:
        culprits, factor, notes = attribute(ctx, best)
    first = best[0]
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows + ctx.first_symptoms(3)), ts=earliest_ts(best),
                collective=stuck_collective(ctx), confidence=STRENGTH_CONFIDENCE[top] * factor, notes=notes,
                fields={**rank_fields(culprits), "what": (first.get("detail") or first["text"] or "")[:240],
                        "aftermath": aftermath(ctx, culprits),
                        "strength": {3: "decisive", 2: "strong", 1: "weak"}[top]},
                params={"culprit_ranks": culprits, "strength": top})]


@detector
def symptom_shape(ctx: Context, cls: str) -> list[Hit]:
    """Logs with symptoms and no cause: the class the symptoms suggest (timeouts: ranks that took
    different paths; closed connections: a peer that died; store waits: start-up). When the world
    size is known and every rank but some reports the wait, the absent ranks are the culprits."""
    if ctx.causes():
        return []
    root = RootCause(cls)
    rows = ctx.symptoms(root)
    if not rows:
        return []
    votes = {c: len(ctx.symptoms(c)) for c in RootCause if c is not RootCause.UNKNOWN}
    if votes[root] < max(votes.values()):
        return []
    waiting = waiting_ranks(ctx)
    ws = ctx.world_size
    culprits: list[int] = []
    if waiting and ws and ctx.world_size_stated and len(waiting) < ws <= 65_536:
        absent = sorted(set(range(ws)) - set(ctx.ranks_seen))
        if 0 < len(absent) <= max(1, len(waiting) // 3):
            culprits = absent
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows), ts=earliest_ts(rows),
                collective=stuck_collective(ctx), confidence=SYMPTOM_CONFIDENCE * (1.3 if culprits else 1.0),
                fields={**rank_fields(culprits), "n": len(rows), "aftermath": aftermath(ctx, culprits),
                        "what": (rows[0].get("detail") or rows[0]["text"] or "")[:240]},
                params={"culprit_ranks": culprits})]


@detector
def whole_world_waited(ctx: Context) -> list[Hit]:
    """Every rank of the world waited in one collective (the same PG, SeqNum and op) before any sign of
    training, none was elsewhere, and no rank failed: each entered it, so none took another path; what they
    sent each other did not arrive, where their start-up messages (rendezvous, NCCL's bootstrap) had."""
    if ctx.causes() or ctx.training_started:
        return []
    ws, s = ctx.world_size, ctx.stuck
    if not (ws and ctx.world_size_stated and 1 < ws <= 65_536) or s.seq is None or s.op is None:
        return []
    if s.source not in ("watchdog", "flight_recorder") or s.elsewhere or set(s.in_it) != set(range(ws)):
        return []
    rows = [r for r in ctx.rows("watchdog_timeout", "watchdog_status") if r["seq"] == s.seq]
    hosts = sorted({h for h in ctx.rank_hosts.values() if h})
    return [Hit(culprits=[], evidence=ctx.evidence_rows(rows), ts=earliest_ts(rows), collective=stuck_collective(ctx),
                confidence=1.0, fields={"n": ws, "hosts": plural(len(hosts), "host") if hosts else "their hosts"},
                params={"culprit_ranks": []})]
