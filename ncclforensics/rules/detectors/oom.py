"""Out of memory: CUDA memory (allocator, runtime, NCCL's own buffers) or host memory ran out."""

from __future__ import annotations

from ncclforensics.model import RootCause
from ncclforensics.rules.context import Context, extra
from ncclforensics.rules.detectors.common import (
    Hit,
    aftermath,
    attribute,
    by_host_pid,
    detector,
    earliest_ts,
    peer_symptoms,
    rank_fields,
    stuck_collective,
)
from ncclforensics.signals import SIGKILL

# the kernel's, the scheduler's and a launcher's kills: a process vanished, matched to a rank by pid (FORMATS.md
# §12.3, §13); Kubernetes' OOMKilled pod: its container's memory limit (patterns/signatures/launcher/
# pod_oom_killed.toml); Ray's memory monitor: a worker's pid on a node (patterns/signatures/launcher/ray_oom.toml)
_REPORTED_KILLS = ("slurm_oom", "srun_task_exit", "pod_oom_killed", "ray_oom")
_KILL_KINDS = ("oom_killer", *_REPORTED_KILLS)


@detector
def memory_exhausted(ctx: Context) -> list[Hit]:
    hits = []
    rows = [r for r in ctx.causes(RootCause.OOM) if r["kind"] not in _KILL_KINDS]
    if rows:
        culprits, conf, notes = attribute(ctx, rows)
        host = all(r["kind"] == "cpu_oom" for r in rows)
        hits.append(Hit(culprits=culprits, evidence=ctx.evidence_rows(rows + peer_symptoms(ctx, culprits)),
                        fields={"what": "host memory (CPU allocator)" if host else "CUDA memory",
                                **rank_fields(culprits), "aftermath": aftermath(ctx, culprits)},
                        ts=earliest_ts(rows), collective=stuck_collective(ctx), confidence=conf, notes=notes,
                        params={"mode": "host" if host else "cuda", "culprit_ranks": culprits}))
    killed = _host_kills(ctx)
    if killed:
        # the killed pid on that host (pids repeat across hosts); a kernel log without a host name
        # matches a pid only if no two hosts share it
        by_pid = by_host_pid(ctx)
        culprits = sorted({next(iter(by_pid[key])) for r in killed
                           if (key := (r["host"], extra(r).get("victim_pid"))) in by_pid and len(by_pid[key]) == 1}
                          | {r["rank"] for r in killed if r["rank"] is not None})  # srun's task = rank (§13)
        hosts = sorted({r["host"] for r in killed if r["host"]})
        if not culprits:
            # the ranks SIGKILLed on the kills' hosts; a report that names no host (slurmstepd's, for the
            # whole step: FORMATS.md §13) covers every rank of the job
            culprits = sorted(rk for rk, code in ctx.exit_codes.items() if code in (-9, 137)
                              and (not hosts or ctx.rank_hosts.get(rk) in hosts))
        hits.append(Hit(culprits=culprits, evidence=ctx.evidence_rows(killed), hosts=hosts,
                        fields={"what": _kill_what(killed), **rank_fields(culprits),
                                "aftermath": aftermath(ctx, culprits)},
                        ts=earliest_ts(killed), collective=stuck_collective(ctx),
                        params={"mode": "host", "signal": 9, "culprit_ranks": culprits}))
    return hits


def _kill_what(killed: list[dict]) -> str:
    kinds = {r["kind"] for r in killed}
    if "oom_killer" in kinds:
        return "host memory (the kernel OOM killer)"
    if "pod_oom_killed" in kinds:
        return "its container's memory limit (Kubernetes: OOMKilled)"
    if "ray_oom" in kinds:
        return "host memory (Ray's memory monitor)"
    return "host memory (Slurm's cgroup OOM handler)"


def _host_kills(ctx: Context) -> list[dict]:
    """The kernel's OOM kills of training processes, and the kills a scheduler or launcher reports (Slurm's
    cgroup OOM, Kubernetes' OOMKilled, Ray's memory monitor: _REPORTED_KILLS); a DataLoader
    worker the OOM killer took is the loader's death (DL001): its pid is in the `DataLoader worker
    (pid N) is killed` line, its comm pt_data_worker. Slurm's `Detected N oom_kill event` counts the
    same kills, so it is the loader's too when every kill seen, or the only death, is a worker's."""
    loader_pids = {extra(r).get("worker_pid") for r in ctx.rows("worker_killed")} - {None}
    loader_sigkill = any(r["code"] == SIGKILL for r in ctx.rows("worker_killed"))

    def worker_kill(r: dict) -> bool:
        x = extra(r)
        return str(x.get("comm", "")).startswith("pt_data_worker") or x.get("victim_pid") in loader_pids

    kernel = ctx.rows("oom_killer")
    killed = [r for r in kernel if not worker_kill(r)]
    reported = [r for r in ctx.causes(RootCause.OOM) if r["kind"] in _REPORTED_KILLS]
    if killed or not ((kernel and all(map(worker_kill, kernel))) or (not kernel and loader_sigkill)):
        killed += reported
    return killed
