"""GPU hardware: a GPU, its memory or its links failed (Xid, ECC, NVLink, GPU lost, PCIe AER)."""

from __future__ import annotations

import datetime as dt

import polars as pl

from ncclforensics.model import RootCause
from ncclforensics.rules.context import Context, extra
from ncclforensics.rules.detectors.common import (
    Hit,
    aftermath,
    attribute,
    by_host_pid,
    detector,
    earliest_ts,
    stuck_collective,
)

# A kernel log spans the node's uptime: a GPU fault this long before the run's first line of its own
# (and before twice its longest collective timeout) belongs to an earlier job.
STALE_KERNEL_S = 3600
_STRENGTH_CONF = {3: 1.0, 2: 0.8, 1: 0.5}


def current_kernel_rows(ctx: Context, rows: list[dict]) -> tuple[list[dict], list[str]]:
    """`rows` (kernel events) without those from well before the run, once the run had trained;
    and the notes saying which were left out."""
    if not rows or not ctx.training_started:
        return rows, []
    start = ctx.events.filter(pl.col("source") != "kernel")["ts"].min()  # the run's first line of its own
    if start is None:
        return rows, []
    longest = ctx.events.filter(pl.col("kind") == "watchdog_timeout")["timeout_ms"].max()  # a column: no dicts
    margin = dt.timedelta(seconds=max(STALE_KERNEL_S, 2 * (longest or 0) / 1000))
    keep = [r for r in rows if r["source"] != "kernel" or r["ts"] is None or r["ts"] >= start - margin]
    notes = [f"{r['file']}:{r['line']}: a GPU fault at {r['ts']:%Y-%m-%d %H:%M} is "
             f"{(start - r['ts']).total_seconds() / 3600:.0f} h older than the run's first line; "
             "left out as an earlier job's"
             for r in [r for r in rows if r not in keep][:3]]
    return keep, notes


def _short(detail: str | None, limit: int = 70) -> str:
    text = (detail or "").strip().rstrip(".")
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _bus(pci: str) -> str | None:
    """'0000:4e:00' / '00000000:4E:00.0' / '4e000' -> '4e' (the bus, compared lower-case, §10.2, §21.1)."""
    pci = pci.lower()
    if pci.count(":") >= 2:
        return pci.split(":")[1].lstrip("0") or "0"
    if pci and all(c in "0123456789abcdef" for c in pci) and len(pci) >= 4:
        return pci[:-3].lstrip("0")[-2:] or "0"
    return None


@detector
def gpu_fault(ctx: Context) -> list[Hit]:
    causes, notes = current_kernel_rows(ctx, ctx.causes(RootCause.GPU_HARDWARE))
    if not causes:
        return []
    top = max(r["strength"] for r in causes)
    rows = sorted(causes, key=lambda r: (-r["strength"], r["ts"] is None, r["ts"]))
    t_sym = ctx.first_symptom_ts
    hosts = sorted({r["host"] for r in rows if r["host"] and r["source"] == "kernel"})
    culprits = {r["rank"] for r in rows if r["rank"] is not None}
    # tie a PCI address to a rank through NCCL init lines (busId 4e000 = PCI 0000:4e:00)
    # a line without a host (nvidia-smi's output, a kernel log pasted alone) matches a bus that only
    # one rank of the run used
    bus_rank: dict[tuple, set[int]] = {}
    for r in ctx.rows("nccl_init"):
        b = _bus(str(extra(r).get("bus_id") or ""))
        if b and r["rank"] is not None:
            bus_rank.setdefault((r["host"], b), set()).add(r["rank"])
            bus_rank.setdefault((None, b), set()).add(r["rank"])
    for r in rows:
        b = _bus(str(extra(r).get("pci") or ""))
        if b and len(bus_rank.get((r["host"], b), ())) == 1:
            culprits |= bus_rank[(r["host"], b)]
    if not culprits:
        # the process the driver names (Xid `pid=`), where a launcher line tied that pid to a rank
        by_pid = by_host_pid(ctx)
        for r in rows:
            pid = extra(r).get("xid_pid")
            if isinstance(pid, str) and pid.isdigit():
                for key in ((r["host"], int(pid)), (None, int(pid))):
                    if len(by_pid.get(key, ())) == 1:
                        culprits |= by_pid[key]
                        break
    if not culprits:
        # the one rank whose own watchdog got stuck: its GPU stopped answering (FORMATS.md §4.1, §21.4)
        hung = {r["rank"] for r in ctx.rows("heartbeat_hang") if r["rank"] is not None}
        if len(hung) == 1:
            culprits = hung
    if not culprits and hosts:
        culprits = {rk for rk, h in ctx.rank_hosts.items() if h in hosts}
    if not culprits and not hosts:
        ranks, _conf, more = attribute(ctx, [])
        culprits, notes = set(ranks), notes + more
    if not hosts:  # a kernel log without a host name: the culprits' hosts, where known
        hosts = sorted({ctx.rank_hosts[rk] for rk in culprits if rk in ctx.rank_hosts})
    before = all(r["ts"] is None or t_sym is None or r["ts"] <= t_sym for r in rows)
    first = rows[0]
    what = (f"Xid {first['code']}: {_short(first.get('detail'))}" if first["kind"] == "xid"
            else (first.get("detail") or "GPU fault")[:120])
    if first["kind"] == "xid" and extra(first).get("cause_xid") is not None:
        what += f", caused by Xid {extra(first)['cause_xid']}"
    where = (" on " + ", ".join(hosts)) if hosts else ""
    if not hosts and culprits:
        where = (" on rank " if len(culprits) == 1 else " on ranks ") + ", ".join(map(str, sorted(culprits)))
    return [Hit(culprits=sorted(culprits), evidence=ctx.evidence_rows(rows), hosts=hosts, notes=notes,
                fields={"what": what, "where": where, "hosts": ", ".join(hosts) or "an unnamed host",
                        "aftermath": aftermath(ctx, sorted(culprits))},
                ts=earliest_ts(rows), collective=stuck_collective(ctx),
                confidence=_STRENGTH_CONF[top] * (1.0 if before else 0.7),
                params={"culprit_ranks": sorted(culprits)})]
