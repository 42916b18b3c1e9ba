"""Network at init: the group could not form (store, rendezvous, sockets, NCCL bootstrap, ports, names)."""

from __future__ import annotations

from ncclforensics.model import Collective, RootCause, rank_ranges
from ncclforensics.rules.context import Context, attempt_of, extra, is_symptom_row
from ncclforensics.rules.detectors.common import Hit, detector, earliest_ts


def _init_causes(ctx: Context, *sources: str) -> list[dict]:
    """network_init causes from these sources (all but NCCL's when none are given); none once training
    ran (then they were retried away)."""
    rows = [r for r in ctx.causes(RootCause.NETWORK_INIT)
            if (r["source"] in sources if sources else r["source"] != "nccl")]
    if ctx.training_started and not any(r["kind"] == "store_timeout" for r in rows):
        return []
    return rows


@detector
def init_connectivity(ctx: Context) -> list[Hit]:
    """Rendezvous, TCPStore, socket, name-resolution or gloo connection failures before training."""
    rows = [r for r in _init_causes(ctx) if r["kind"] != "server_bind_failed"]
    if not rows:
        return []
    addr = next((f"{extra(r).get('addr')}:{extra(r).get('port')}" for r in rows
                 if r["kind"] == "socket_connect_failed" and extra(r).get("addr")), None)
    missing = {extra(r)["key_rank"] for r in rows if r["kind"] == "store_timeout"
               and isinstance(extra(r).get("key_rank"), int)}  # the 2.13 key's last component (§6.2)
    hosts = {r["host"] for r in rows if r["kind"] == "socket_connect_failed" and r["host"]}
    names = sorted({str(extra(r).get("target")) for r in rows if r["kind"] == "gai_error" and extra(r).get("target")})
    joined = next(((extra(r).get("joined"), extra(r).get("expected")) for r in rows
                   if extra(r).get("expected") is not None), None)
    culprits = sorted(missing) or sorted(rk for rk, h in ctx.rank_hosts.items() if h in hosts)
    parts = []
    if names:
        parts.append(f"the host name {', '.join(names)} could not be resolved")
    if addr:
        parts.append(f"{addr} was unreachable")
    # the store's own wait with some participants in (FORMATS.md §9.3 `<k>/<n> clients joined`) and no
    # client's failure: those that joined reached it, the others never came — a node that could not
    # connect, or one never started, or a world size larger than what was launched: a moderate finding
    partial = (joined is not None and isinstance(joined[0], int) and joined[0] > 0
               and all(r["kind"] in ("store_timeout", "exception", "exception_line") for r in rows))
    if joined and joined[0] is not None:
        parts.append(f"only {joined[0]} of {joined[1]} expected participants joined the store"
                     + (" (those reached it: the others could not connect, were never started, or the world "
                        "size asks for more processes than were launched)" if partial else ""))
    if hosts:
        parts.append(f"failing side: {', '.join(sorted(hosts))}")
    if missing:
        parts.append(f"ranks that never joined: {rank_ranges(sorted(missing))}")
    strongest = max(r["strength"] for r in rows)
    mode = "name_resolution" if names and not addr else ("missing_rank" if missing else "unreachable_store")
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(sorted(rows, key=lambda r: -r["strength"])),
                hosts=sorted(hosts),
                fields={"what": "; ".join(parts) or (rows[0].get("detail") or "store connection failed")},
                ts=earliest_ts(rows), collective=Collective(),
                confidence={3: 1.0, 2: 1.0, 1: 0.6}[strongest] * (0.6 if partial else 1.0),
                params={"mode": mode})]


@detector
def store_port(ctx: Context) -> list[Hit]:
    """The store server could not bind its port: in use (another job, a stale process) or not
    permitted (below 1024 without privileges) (FORMATS.md §9.1, §9.5)."""
    rows = _init_causes(ctx, "c10d")
    rows = [r for r in rows if r["kind"] == "server_bind_failed"]
    if not rows:
        return []
    text = " ".join(f"{r.get('detail') or ''} {r.get('text') or ''}" for r in rows)
    mode = "permission" if "Permission denied" in text else "in_use"
    port = next((extra(r).get("port") for r in rows if extra(r).get("port")), None)
    strongest = max(r["strength"] for r in rows)
    return [Hit(culprits=[], evidence=ctx.evidence_rows(sorted(rows, key=lambda r: -r["strength"])),
                hosts=sorted({r["host"] for r in rows if r["host"]}),
                fields={"port": port if port is not None else "?",
                        "why": "is below 1024 and needs privileges" if mode == "permission"
                        else "is already in use by another process"},
                ts=earliest_ts(rows), collective=Collective(), confidence=1.0 if strongest >= 3 else 0.6,
                params={"mode": mode, "port": port})]


# The torch call an init-time NCCL error surfaced in (innermost traceback frame first): NCCL
# creates a communicator lazily, on the first collective of a process group, unless
# init_process_group got a device_id (eager init).
_INIT_STEPS = (  # (function, the step it is part of, what it does there)
    ("_verify_param_shape_across_processes", "DistributedDataParallel construction",
     "DDP's first collective, which creates the NCCL communicator"),
    ("_verify_params_across_processes", "DistributedDataParallel construction",
     "DDP's first collective, which creates the NCCL communicator"),
    ("_sync_module_states", "DistributedDataParallel construction",
     "broadcasting rank 0's parameters, the first NCCL collective"),
    ("_sync_params_and_buffers", "DistributedDataParallel construction",
     "broadcasting rank 0's parameters, the first NCCL collective"),
    ("_sync_module_params_and_buffers", "FSDP construction", "the first NCCL collective"),
    ("eager_connect_single_device", "init_process_group", "eager NCCL communicator creation for device_id"),
    ("new_group", "new_group", "creating a sub-group's NCCL communicator"),
    ("init_process_group", "init_process_group", "NCCL communicator creation"),
)
# NCCL source files the first `<file>:<line> -> <code>` error-trace line names (FORMATS.md §10.1)
_NCCL_STAGES = (
    ("bootstrap", "bootstrap (ranks exchanging addresses over sockets)"),
    ("socket", "a socket connection between ranks"),
    ("net_ib", "InfiniBand/RoCE transport set-up"),
    ("net_socket", "socket transport set-up"),
    ("p2p", "peer-to-peer (NVLink/PCIe) transport set-up"),
    ("shm", "shared-memory transport set-up"),
    ("proxy", "the proxy thread"),
    ("init", "communicator initialisation"),
)
_INIT_SOURCES = ("init.cc", "bootstrap.cc", "socket.cc", "transport.cc", "net_ib", "net_socket", "p2p.cc",
                 "shm.cc", "group.cc")


def _init_step(ctx: Context) -> tuple[str, str, str | None] | None:
    """(the init step an NCCL error surfaced in, the same with the torch call, the user code line), or
    None when no traceback shows one."""
    for r in ctx.rows("exception", "error_file"):
        if is_symptom_row(r):
            continue
        frames = [f for f in extra(r).get("frames") or [] if isinstance(f, dict)]
        user = next((f for f in reversed(frames) if not str(f.get("file", "")).startswith(
            ("distributed", "c10d_logger", "utils", "__init__", "module", "rendezvous"))), None)
        where = f"{user.get('file')}:{user.get('line')} `{user.get('code')}`" if user and user.get("code") else None
        stack = set(extra(r).get("stack") or [])
        for f in [*reversed(frames), *({"fn": s.rsplit(":", 1)[-1]} for s in stack)]:
            for fn, step, does in _INIT_STEPS:
                if f.get("fn") == fn:
                    return step, f"{step} ({fn}: {does})", where
    return None


def _nccl_stage(ctx: Context, last_error: str | None) -> str | None:
    origin = next((extra(r).get("src") for r in ctx.rows("nccl_error_trace")), None)
    text = f"{origin or ''} {last_error or ''}".lower()
    for key, stage in _NCCL_STAGES:
        if key in text:
            return stage + (f" ({origin})" if origin else "")
    return None


def _init_shown(ctx: Context) -> bool:
    """The logs show the NCCL failure happened while the group formed: an init-phase NCCL event, an
    init step on the traceback, or NCCL's error trace through init/bootstrap/transport set-up."""
    if any(r["phase"] == "init" and r["source"] == "nccl" for r in ctx.causes()):
        return True
    if _init_step(ctx) is not None:
        return True
    return any(str(extra(r).get("src") or "").startswith(_INIT_SOURCES) for r in ctx.rows("nccl_error_trace"))


@detector
def nccl_init_error(ctx: Context) -> list[Hit]:
    """An NCCL error while creating communicators, shown to be at start-up: name the step that failed."""
    if ctx.training_started:
        return []
    errors = [r for r in ctx.rows("nccl_error", "nccl_unhandled")
              if r["class"] in (None, RootCause.NETWORK_INIT.value, RootCause.NETWORK_RUNTIME.value)]
    if not errors or not _init_shown(ctx):
        return []
    warns = [r for r in ctx.causes(RootCause.NETWORK_INIT) if r["source"] == "nccl"]
    rows = errors + warns + ctx.rows("nccl_error_trace")
    first = next((r for r in errors if r["kind"] == "nccl_error"), errors[0])
    last_error = extra(first).get("last_error") or next((r.get("detail") for r in warns), None)
    step, step_detail, where = _init_step(ctx) or ("start-up", "start-up, creating the communicator", None)
    stage = _nccl_stage(ctx, last_error)
    # torchrun --max-restarts, or the user relaunching: every attempt printed the error again, in
    # the same console or in its own attempt_<n> folder (a --tee console repeats the per-rank files)
    per_file = {}
    for r in errors:
        per_file[(r["file"], r["rank"])] = per_file.get((r["file"], r["rank"]), 0) + (r["kind"] == "nccl_error")
    attempts = {a for r in errors if (a := attempt_of(r)) is not None}
    launches = max(max(per_file.values(), default=1), len(attempts))
    # the ranks that failed, when every other rank was stopped (SIGTERM) rather than failing too:
    # e.g. one host's network interface. A console filtered to one rank shows only that rank's
    # error while the others failed as well (their exit codes say so): no culprit then.
    failed = {r["rank"] for r in errors + warns if r["rank"] is not None}
    others = set(ctx.ranks_seen) - failed
    term = (-15, 15, 143, -2)
    codes = {r["rank"]: r["code"] for r in ctx.rows("child_failed", "worker_failed") if r["code"] is not None}
    stopped = bool(others) and all(codes.get(rk) in (None, *term) and (rk in ctx.symptom_ranks or rk in codes)
                                   for rk in others)
    culprits = sorted(failed) if failed and stopped else []
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows),
                hosts=sorted({ctx.rank_hosts[rk] for rk in culprits if rk in ctx.rank_hosts}),
                fields={"what": (first.get("detail") or "NCCL error")[:200], "step": step,
                        "step_detail": step_detail,
                        "where": f" (called from {where})" if where else "",
                        "stage": f" NCCL itself failed during {stage}." if stage else "",
                        "launches": f" The same error ended all {launches} launches." if launches > 1 else "",
                        "last_error": last_error or "no NCCL WARN line was logged (rerun with NCCL_DEBUG=INFO)"},
                ts=earliest_ts(rows), collective=Collective(), params={"mode": "unreachable_store"})]


@detector
def nccl_init_network(ctx: Context) -> list[Hit]:
    """NCCL's own network set-up failed at init: no usable interface, a bad address family, a peer it
    could not connect to, InfiniBand devices it could not open (FORMATS.md §10.3, §20.5)."""
    rows = [r for r in ctx.causes(RootCause.NETWORK_INIT) if r["source"] == "nccl"]
    if not rows or ctx.training_started:
        return []  # NCCL retried and connected: training ran after these warnings
    rows.sort(key=lambda r: (-r["strength"], r["ts"] is None, r["ts"]))
    hosts = sorted({r["host"] for r in rows if r["host"]})
    first = rows[0]
    return [Hit(culprits=[], evidence=ctx.evidence_rows(rows), hosts=hosts,
                fields={"what": (first.get("detail") or first.get("text") or "")[:300],
                        "on_hosts": f" on {', '.join(hosts)}" if hosts else ""},
                ts=earliest_ts(rows), collective=Collective(),
                confidence=1.0 if first["strength"] >= 3 else 0.8, params={"mode": "unreachable_store"})]
