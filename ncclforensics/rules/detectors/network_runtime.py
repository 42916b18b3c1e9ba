"""Network at runtime: the fabric or the sockets between ranks failed while the job ran."""

from __future__ import annotations

from ncclforensics.model import RootCause
from ncclforensics.rules.context import Context, extra
from ncclforensics.rules.detectors.common import Hit, aftermath, detector, earliest_ts, stuck_collective

_STRENGTH_CONF = {3: 1.0, 2: 0.9, 1: 0.6}


@detector
def nccl_runtime_network(ctx: Context) -> list[Hit]:
    """Transport errors with no phase shown or shown mid-run: IB completion errors, a NIC's own async
    events, connections reset or closed (FORMATS.md §20.3-§20.5). A NIC's own event names its host and
    the ranks on it; a completion error is seen by both ends of a broken link, so names no culprit.
    (A dead peer explains resets and closures: the rule yields to crash classes.)"""
    rows = [r for r in ctx.causes(RootCause.NETWORK_RUNTIME)]
    if not rows:
        return []
    rows.sort(key=lambda r: (-r["strength"], r["ts"] is None, r["ts"]))
    local = [r for r in rows if r["kind"] == "nccl_ib_async"]
    hosts = sorted({r["host"] for r in (local or rows) if r["host"]})
    culprits = sorted({r["rank"] for r in local if r["rank"] is not None})
    peers = sorted({str(extra(r).get("peer")) for r in rows if extra(r).get("peer")})
    first = rows[0]
    what = (first.get("detail") or first.get("text") or "")[:300]
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(local + [r for r in rows if r not in local]),
                hosts=hosts,
                fields={"what": what, "hosts": ", ".join(hosts) or "an unnamed host",
                        "on_hosts": f" on {', '.join(hosts)}" if hosts else "",
                        "peers": f" Peers named: {', '.join(peers[:4])}." if peers else "",
                        "aftermath": aftermath(ctx, culprits)},
                ts=earliest_ts(rows), collective=stuck_collective(ctx),
                confidence=_STRENGTH_CONF[first["strength"]],
                params={"mode": "unreachable_store"})]
