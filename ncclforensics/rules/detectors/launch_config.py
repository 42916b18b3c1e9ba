"""Launch configuration: two ranks on one GPU, /dev/shm too small or closed, wrong devices, no main guard."""

from __future__ import annotations

from ncclforensics.model import Collective, RootCause
from ncclforensics.rules.context import Context, culprits_named, extra
from ncclforensics.rules.detectors.common import Hit, detector, earliest_ts
from ncclforensics.vocabulary import vocabulary

# which launch problem each kind of launch_config evidence shows (the kinds' meanings are in patterns/)
_PROBLEM_KINDS = {
    "duplicate_gpu": ("nccl_duplicate_gpu",),
    "shm": ("nccl_shm_error",),
    "device": ("cuda_error", "cuda_error_hint", "wrong_device"),
    "main_guard": ("spawn_bootstrap", "exception"),
}


@detector
def launch_misconfig(ctx: Context, problem: str = "duplicate_gpu") -> list[Hit]:
    kinds = vocabulary().check(*_PROBLEM_KINDS[problem])
    rows = [r for r in ctx.causes(RootCause.LAUNCH_CONFIG) if r["kind"] in kinds]
    if not rows:
        return []
    rows.sort(key=lambda r: (-r["strength"], r["ts"] is None, r["ts"]))
    named = sorted({rk for r in rows for rk in culprits_named(r)})
    culprits = named or sorted({r["rank"] for r in rows if r["rank"] is not None})
    first = rows[0]
    errors = " ".join(str(extra(r).get("error") or "") for r in rows)
    mode = problem
    if problem == "shm":
        mode = "shm_permission" if "Permission denied" in errors else "shm"
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows), ts=earliest_ts(rows),
                fields={"what": (first.get("detail") or first["text"] or "")[:200],
                        "shm_problem": "not permitted" if mode == "shm_permission" else "too small"},
                hosts=sorted({r["host"] for r in rows if r["host"]}), collective=Collective(),
                confidence=1.0 if first["strength"] >= 2 else 0.6,
                params={"mode": mode})]
