"""DataLoader abort: a worker process of some rank's DataLoader died."""

from __future__ import annotations

from ncclforensics.model import RootCause
from ncclforensics.rules.context import Context
from ncclforensics.rules.detectors.common import (
    Hit,
    aftermath,
    attribute,
    detector,
    earliest_ts,
    peer_symptoms,
    rank_fields,
    stuck_collective,
)
from ncclforensics.signals import SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGKILL, SIGSEGV, signal_name

_NATIVE_CRASH = frozenset({SIGSEGV, SIGABRT, SIGILL, SIGFPE})


@detector
def dataloader_death(ctx: Context) -> list[Hit]:
    """A worker killed by a signal (Killed = SIGKILL, usually the host OOM killer; Bus error = a small
    /dev/shm), a worker's own fault line, a loader error, or an exception in the loader's fetch path
    (the worker vanished mid-transfer) (FORMATS.md §11)."""
    rows = ctx.causes(RootCause.DATALOADER_ABORT)
    if not rows:
        return []
    culprits, conf, notes = attribute(ctx, rows)
    sig = next((r["code"] for r in rows if r["kind"] in ("worker_killed", "worker_fault") and r["code"]), None)
    killed = [r for r in rows if r["kind"] == "oom_killer"]
    fetch_only = all(r["kind"] == "exception" for r in rows)
    if fetch_only:
        signame, mode, conf = "died while sending a batch", "sigkill", conf * 0.85
    elif sig is None and killed:
        signame, mode = "killed by the kernel OOM killer", "sigkill"
    elif sig is None:
        signame, mode = "an exit or error", "exit"
    else:
        signame = signal_name(sig)
        mode = {SIGKILL: "sigkill", SIGBUS: "bus_error"}.get(sig, "exit" if sig in _NATIVE_CRASH else "sigkill")
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows + peer_symptoms(ctx, culprits)),
                fields={"signal": signame, **rank_fields(culprits), "aftermath": aftermath(ctx, culprits)},
                ts=earliest_ts(rows), collective=stuck_collective(ctx), confidence=conf, notes=notes,
                params={"signal": sig, "mode": mode, "culprit_ranks": culprits,
                        "native": "yes" if sig in _NATIVE_CRASH else "no"})]
