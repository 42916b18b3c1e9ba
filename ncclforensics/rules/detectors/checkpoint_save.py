"""Checkpoint save: writing a checkpoint failed (the lagging-saver case is `rank_divergence.laggard`)."""

from __future__ import annotations

from ncclforensics.model import RootCause
from ncclforensics.rules.context import Context, culprits_named
from ncclforensics.rules.detectors.common import Hit, aftermath, attribute, detector, rank_fields, stuck_collective


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
