#!/usr/bin/env python3
"""Generate a large, realistic *failed* distributed PyTorch run, for benchmarks and scale tests.

The run looks like torch 2.7 + NCCL 2.26 with `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL`:
per rank the NCCL bootstrap/topology/init lines, one `NCCL INFO AllReduce: opCount …` line per
collective, a `step N loss X` progress line every few steps, and at the end one failure with the
ProcessGroupNCCL watchdog timeouts, dump-signal and teardown lines, and torchrun's agent lines and
ChildFailedError summary. Line shapes follow ../shared/FORMATS.md; hosts, pids, addresses and
numbers are invented. Noise (everything but the failure) is > 99 % of the bytes.

Failures (`--failure`):
  lagging_rank  one rank stops issuing collectives (stuck before the first gradient bucket of the
                last step); every other rank times out in the watchdog at SeqNum S.
  xid           an Xid 79 (GPU fell off the bus) in the dmesg file of one host; that rank's watchdog
                dies with a CUDA error, its host is torn down, all other hosts time out at S.
  oom           one rank raises torch.OutOfMemoryError in the forward pass; its host is torn down,
                all other hosts time out at S.

Layouts (`--layout`):
  logdir        <out>/<host>/torchrun.log (the agent's console) and the torchrun --log-dir tree
                <out>/<host>/none_<8 chars>/attempt_0/<local_rank>/{stdout,stderr}.log
  console       <out>/console.log: every host's torchrun console (--tee 3) interleaved, worker lines
                prefixed `[default<lr>]:`; C++/Python lines after init also carry `[rank<r>]:`.
A dmesg file (`dmesg-<host>.txt`) is added for the xid host. `<out>.truth.json` records the truth.

Generation builds one template per rank for a training step and fills in the changing numbers, so
a few GB take a few minutes at most. Same arguments + same --seed = byte-identical output.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
import shutil
import string
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

FAILURES = ("lagging_rank", "xid", "oom")
LAYOUTS = ("logdir", "console")
PY = "/opt/venv/lib/python3.11/site-packages"
TORCH_LIB = f"{PY}/torch/lib"
SCRIPT = "/srv/train/train.py"
NCHANNELS = 32
PRE_COLLECTIVES = 2  # seq 1: init barrier (ALLREDUCE of 1), seq 2: DDP parameter broadcast
BUCKET_NUMEL = 6553600  # 25 MiB fp32 DDP bucket
LAST_BUCKET_NUMEL = 2883584
BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
PG = "[PG ID 0 PG GUID 0(default_pg) Rank {r}] "
DUMP_ADVICE = (
    "This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, "
    "the order of collectives is not same for all ranks or the scheduled collective, for some reason, "
    "didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors "
    "or bugs in the communications library (e.g. NCCL), etc."
)


def parse_size(text: str) -> int:
    """'100M', '1G', '4GiB', '512k', '2000000' -> bytes (binary multiples)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 100M, 1G)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


# -- envelopes (FORMATS.md §1) ------------------------------------------------------------------
def c10(rank: int, sev: str, t: dt.datetime, line: int, src: str = "ProcessGroupNCCL.cpp") -> str:
    """`[rank<r>]:[<sev><MMDD> <hh:mm:ss>.<9 digits> <file>:<line>] ` (month not zero padded)."""
    ns = t.microsecond * 1000 + (rank * 7919) % 997
    return f"[rank{rank}]:[{sev}{t.month}{t.day:02d} {t:%H:%M:%S}.{ns:09d} {src}:{line}] "


def pylog(sev: str, t: dt.datetime, pid: int, path: str, line: int) -> str:
    """torch Python logging 2.5+: `W0309 22:41:07.318000 70311 torch/distributed/run.py:874] `."""
    return f"{sev}{t:%m%d %H:%M:%S}.{t.microsecond // 1000 * 1000:06d} {pid} {path}:{line}] "


def ctime(t: dt.datetime) -> str:
    """dmesg -T stamp: `[Sun Mar  9 22:31:05 2025] ` (day right-aligned)."""
    return f"[{t:%a %b} {t.day:2d} {t:%H:%M:%S %Y}] "


def sec(t: dt.datetime, s: float) -> dt.datetime:
    return t + dt.timedelta(seconds=s)


# -- the plan: every random choice, drawn once ---------------------------------------------------
@dataclass
class Host:
    idx: int
    name: str
    fqdn: str
    ip: str
    agent_pid: int
    rundir: str
    ranks: list[Rank] = field(default_factory=list)


@dataclass
class Rank:
    rank: int
    lr: int
    host: Host
    pid: int
    tid_init: int
    tid_ag: int
    dev: int
    bus: str
    comm: str
    stream: str
    bufs: tuple[str, ...]
    # failure timeline (filled by plan_failure)
    t_start: dt.datetime | None = None  # entered collective S
    t_timeout: dt.datetime | None = None
    elapsed_ms: int = 0
    t_exit: dt.datetime | None = None  # natural exit (abort, exception); None = hangs
    exit_code: int = 0
    dump_src: int | None = None  # None: this local rank; else the remote rank that fired first
    t_dump: dt.datetime | None = None


@dataclass
class Plan:
    args: argparse.Namespace
    world: int
    hosts: list[Host]
    ranks: list[Rank]
    commid: str
    t0: dt.datetime
    t_init: dt.datetime
    step_s: float
    culprit: int
    n_steps: int = 0
    pieces: dict = field(default_factory=dict)

    @property
    def seq_hang(self) -> int:  # S: the first collective of the step that never finished
        return PRE_COLLECTIVES + self.n_steps * self.args.collectives + 1

    @property
    def t_hang(self) -> dt.datetime:
        return sec(self.t_init, 40 + self.n_steps * self.step_s)


def _hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def make_plan(args: argparse.Namespace) -> Plan:
    rng = random.Random(args.seed)
    world, per = args.ranks, args.per_host
    n_hosts = (world + per - 1) // per
    prefix = rng.choice("abcdefghjkmnpqrstuvwxyz")
    site = rng.choice(("cluster.internal", "hpc.example.net", "dc2.lab.example"))
    subnet = rng.randint(16, 200)
    hosts = []
    for h in range(n_hosts):
        name = f"gpu-{prefix}{h + 1:03d}"
        rundir = "none_" + "".join(rng.choice(string.ascii_lowercase + string.digits + "_") for _ in range(8))
        hosts.append(Host(h, name, f"{name}.{site}", f"10.{subnet}.{h // 250}.{h % 250 + 2}",
                          rng.randint(20000, 90000), rundir))
    bus_ids = list(BUS_IDS) + [f"{0x10 + 0x0d * i:02x}" for i in range(8, per)]
    ranks = []
    pid = 0
    for r in range(world):
        host = hosts[r // per]
        lr = r % per
        pid = (host.agent_pid if lr == 0 else pid) + rng.randint(1, 3)
        base = rng.randint(0x7F00, 0x7FFF) << 32
        bufs = tuple(f"{base + (rng.randint(0, 0xFFFFF) << 12):x}" for _ in range(args.collectives))
        rk = Rank(r, lr, host, pid, pid + rng.randint(40, 400), pid + rng.randint(400, 900), lr,
                  bus_ids[lr], "55" + _hex(rng, 10), "55" + _hex(rng, 10), bufs)
        host.ranks.append(rk)
        ranks.append(rk)
    t0 = dt.datetime(2025, rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23), rng.randint(0, 59),
                     rng.randint(0, 59), rng.randint(0, 999) * 1000)
    culprit = args.culprit if args.culprit is not None else rng.randrange(world)
    if not 0 <= culprit < world:
        raise SystemExit(f"--culprit {culprit} is not a rank of a {world}-rank world")
    plan = Plan(args, world, hosts, ranks, _hex(rng, 16), t0, sec(t0, rng.uniform(8, 15)),
                rng.uniform(0.6, 1.4), culprit)
    plan.pieces["rng_state"] = rng.getstate()
    return plan


def plan_failure(plan: Plan) -> None:
    """Times and exit codes of every rank at the end (depends on n_steps, so drawn afterwards)."""
    rng = random.Random()
    rng.setstate(plan.pieces["rng_state"])
    a = plan.args
    t_hang = plan.t_hang
    culprit = plan.ranks[plan.culprit]
    for rk in plan.ranks:
        rk.t_start = sec(t_hang, rng.uniform(0.05, 0.3))
        rk.elapsed_ms = a.timeout_ms + rng.randint(5, 120)
        rk.t_timeout = sec(rk.t_start, rk.elapsed_ms / 1000)
        rk.t_exit, rk.exit_code, rk.dump_src, rk.t_dump = None, 0, None, None
    timing_out = [rk for rk in plan.ranks if times_out(plan, rk)]
    if timing_out:
        first = min(timing_out, key=lambda rk: (rk.t_timeout, rk.rank))
        for rk in timing_out:
            t_recv = sec(first.t_timeout, rng.uniform(0.05, 0.1))
            if rk is not first and t_recv < rk.t_timeout:
                rk.dump_src, rk.t_dump = first.rank, t_recv
            else:
                rk.t_dump = rk.t_timeout
            rk.t_exit, rk.exit_code = sec(rk.t_timeout, rng.uniform(2.0, 4.0)), -6
        if a.failure == "lagging_rank":
            culprit.dump_src, culprit.t_dump = first.rank, sec(first.t_timeout, rng.uniform(0.06, 0.12))
        plan.pieces["first"] = first.rank
    if a.failure == "xid":
        culprit.t_exit, culprit.exit_code = sec(t_hang, 1.4), -6
    elif a.failure == "oom":
        culprit.t_exit, culprit.exit_code = sec(t_hang, 0.9), 1
    plan.pieces["agent_rng"] = rng.getstate()


def times_out(plan: Plan, rk: Rank) -> bool:
    """Does this rank sit in collective S until its watchdog fires?"""
    if rk.rank == plan.culprit:
        return False
    if plan.args.failure in ("xid", "oom"):  # the culprit's host is torn down at once
        return rk.host is not plan.ranks[plan.culprit].host
    return True


# -- rendering: each piece is (time, order, stream, rank or host, text) -------------------------
def nccl_head(rk: Rank, tid: int | None = None) -> str:
    return f"{rk.host.name}:{rk.pid}:{rk.pid if tid is None else tid} [{rk.dev}] "


def coll_line(plan: Plan, rk: Rank, j: int, op: str = "AllReduce", opcount: str = "%x",
              count: int | None = None) -> str:
    cnt = count if count is not None else bucket_numel(plan, j)
    return (f"{nccl_head(rk, rk.tid_ag)}NCCL INFO {op}: opCount {opcount} sendbuff 0x{rk.bufs[j]} recvbuff "
            f"0x{rk.bufs[j]} count {cnt} datatype 7 op 0 root 0 comm 0x{rk.comm} [nranks={plan.world}] "
            f"stream 0x{rk.stream}\n")


def bucket_numel(plan: Plan, j: int) -> int:
    c = plan.args.collectives
    if j == c - 1:
        return 1  # the loss all-reduce closes the step
    return LAST_BUCKET_NUMEL if j == c - 2 else BUCKET_NUMEL


def step_template(plan: Plan, rk: Rank) -> str:
    """One training step of one rank: `%x` slots for the opCounts (seq - 1); empty without the
    COLL trace (`--coll off`)."""
    if plan.args.coll == "off":
        return ""
    return "".join(coll_line(plan, rk, j) for j in range(plan.args.collectives))


def fill(tmpl: str, ops: tuple[int, ...]) -> str:
    """A step template with its opCounts filled in (nothing without the COLL trace)."""
    return tmpl % ops if tmpl else ""


def progress_line(rank: int, step: int) -> str:
    loss = 1.7 + 9.0 / (step + 8) + 0.01 * ((step * 7919 + rank * 104729) % 97) / 97
    return f"step {step} loss {loss:.4f}\n"


def header_pieces(plan: Plan, rk: Rank) -> list[tuple]:
    """NCCL bootstrap/topology/init, the first two collectives, a c10 warning (FORMATS.md §10.2)."""
    n, h = plan.world, rk.host
    per = len(h.ranks)
    t = sec(plan.t_init, 0.002 * rk.lr + 0.0001 * rk.rank)
    m = nccl_head(rk) + "NCCL INFO "
    mi = nccl_head(rk, rk.tid_init) + "NCCL INFO "
    hcas = " ".join(f"[{i}]mlx5_{i}:1/IB" for i in range(max(per, 1)))
    out = [
        f"{m}Bootstrap: Using ib0:{h.ip}<0>",
        f"{m}cudaDriverVersion 12040",
    ]
    if rk.rank == 0:
        out.append(f"{m}NCCL version 2.26.2+cuda12.2")
    out += [
        f"{m}NCCL_SOCKET_IFNAME set by environment to ib0",
        f"{m}NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
        f"{m}NCCL_IB_HCA set by environment to " + ",".join(f"mlx5_{i}" for i in range(max(per, 1))),
        f"{m}NET/IB : Using {hcas} [RO]; OOB ib0:{h.ip}<0>",
        f"{m}Using network IB",
        f"{m}ncclCommInitRankConfig comm 0x{rk.comm} rank {rk.rank} nranks {n} cudaDev {rk.dev} nvmlDev {rk.dev} "
        f"busId {rk.bus}000 commId 0x{plan.commid} - Init START",
        f"{mi}Setting affinity for GPU {rk.dev} to {'ffffffff,00000000' if rk.lr < per // 2 else '00000000,ffffffff'}",
        f"{mi}comm 0x{rk.comm} rank {rk.rank} nRanks {n} nNodes {len(plan.hosts)} localRanks {per} "
        f"localRank {rk.lr} MNNVL 0",
    ]
    if rk.rank == 0:
        ring = " ".join(str(i) for i in range(n))
        if len(ring) > 128:
            ring = ring[:125].rsplit(" ", 1)[0] + " ..."
        out += [f"{mi}Channel {c:02d}/{NCHANNELS} : {ring}" for c in range(NCHANNELS)]
    up = rk.rank - 1 if rk.lr else (rk.rank - per if rk.rank >= per else -1)
    down = rk.rank + 1 if rk.lr < per - 1 and rk.rank + 1 < n else -1
    out.append(f"{mi}Trees " + " ".join(f"[{c}] {down}/-1/-1->{rk.rank}->{up}" for c in range(NCHANNELS)))
    out.append(f"{mi}P2P Chunksize set to 524288")
    nxt, prv = (rk.rank + 1) % n, (rk.rank - 1) % n
    nxt_rk, prv_rk = plan.ranks[nxt], plan.ranks[prv]
    for c in range(NCHANNELS):
        if prv_rk.host is not h:
            out.append(f"{mi}Channel {c:02d}/0 : {prv}[{prv_rk.dev}] -> {rk.rank}[{rk.dev}] [receive] "
                       f"via NET/IB/{rk.dev}/GDRDMA")
        if nxt_rk.host is h:
            out.append(f"{mi}Channel {c:02d}/0 : {rk.rank}[{rk.dev}] -> {nxt}[{nxt_rk.dev}] via P2P/CUMEM/read")
        else:
            out.append(f"{mi}Channel {c:02d}/0 : {rk.rank}[{rk.dev}] -> {nxt}[{nxt_rk.dev}] [send] "
                       f"via NET/IB/{rk.dev}/GDRDMA")
    out += [
        f"{mi}Connected all rings, use ring PXN 0 GDR 1",
        f"{mi}Connected all trees",
        f"{mi}threadThresholds 8/8/64 | {8 * n}/8/64 | 512 | 512",
        f"{mi}{NCHANNELS} coll channels, {NCHANNELS} collnet channels, 0 nvls channels, {NCHANNELS} p2p channels, "
        f"2 p2p channels per peer",
        f"{m}TUNER/Plugin: Could not find: libnccl-tuner.so libnccl-net.so. Using internal tuner plugin.",
        f"{m}PROFILER/Plugin: Could not find: libnccl-profiler.so.",
        f"{mi}CC Off, workFifoBytes 1048576",
        f"{mi}ncclCommInitRankConfig comm 0x{rk.comm} rank {rk.rank} nranks {n} cudaDev {rk.dev} nvmlDev {rk.dev} "
        f"busId {rk.bus}000 commId 0x{plan.commid} - Init COMPLETE",
    ]
    k = 1 + (rk.rank * 37) % 50 / 100
    out.append(f"{mi}Init timings - ncclCommInitRankConfig: rank {rk.rank} nranks {n} total {2.1 * k:.2f} "
               f"(kernels {0.21 * k:.2f}, alloc {0.02 * k:.2f}, bootstrap {1.38 * k:.2f}, allgathers {0.04 * k:.2f}, "
               f"topo {0.23 * k:.2f}, graphs {0.02 * k:.2f}, connections {0.17 * k:.2f}, rest {0.03 * k:.2f})")
    text = "\n".join(out) + "\n"
    if plan.args.coll == "on":
        text += coll_line(plan, rk, 0, opcount="0", count=1)
        text += coll_line(plan, rk, 1, op="Broadcast", opcount="1", count=131072000)
    warn = (c10(rk.rank, "W", sec(t, 2.5), 4715) + PG.format(r=rk.rank)
            + f" using GPU {rk.dev} to perform barrier as devices used by this process are currently unknown. "
            "This can potentially cause a hang if this rank to GPU mapping is incorrect. Specify device_ids in "
            "barrier() to force use of a particular device, or call init_process_group() with a device_id.\n")
    return [(t, 1, "o", rk, text), (sec(t, 2.5), 1, "e", rk, warn)]


def work_nccl(plan: Plan) -> str:
    n = bucket_numel(plan, 0)
    return (f"WorkNCCL(SeqNum={plan.seq_hang}, OpType=ALLREDUCE, NumelIn={n}, NumelOut={n}, "
            f"Timeout(ms)={plan.args.timeout_ms})")


def frames(lib_base: int, first: str) -> str:
    rows = [
        ("c10::Error::Error(c10::SourceLocation, std::string) + 0x98", "libc10.so", 0x9a3c8),
        (first, "libtorch_cuda.so", 0x11a8b6e),
        ("c10d::ProcessGroupNCCL::watchdogHandler() + 0x88e", "libtorch_cuda.so", 0x11b3d4e),
        ("c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x14d", "libtorch_cuda.so", 0x11b4f1d),
        ("<unknown function> + 0xdbbf4", "/lib/x86_64-linux-gnu/libstdc++.so.6", 0xdbbf4),
        ("<unknown function> + 0x94ac3", "/lib/x86_64-linux-gnu/libc.so.6", 0x94ac3),
        ("<unknown function> + 0x126850", "/lib/x86_64-linux-gnu/libc.so.6", 0x126850),
    ]
    out = []
    for i, (sym, lib, off) in enumerate(rows):
        path = lib if lib.startswith("/") else f"{TORCH_LIB}/{lib}"
        out.append(f"frame #{i}: {sym} (0x{lib_base + off:x} in {path})")
    return "\n".join(out) + "\n\n"


def terminate_block(what: str, where: str, lib_base: int, first_frame: str) -> str:
    return ("terminate called after throwing an instance of 'c10::DistBackendError'\n"
            f"  what():  {what}\n"
            f"Exception raised from {where} (most recent call first):\n" + frames(lib_base, first_frame))


def timeout_pieces(plan: Plan, rk: Rank) -> list[tuple]:
    """A healthy rank stuck in S: watchdog timeout, status, dump signal, teardown (FORMATS.md §3-4)."""
    r, s, pg = rk.rank, plan.seq_hang, PG.format(r=rk.rank)
    enq, done = s + plan.args.collectives - 2, s - 1
    timeout = (f"[Rank {r}] Watchdog caught collective operation timeout: {work_nccl(plan)} ran for "
               f"{rk.elapsed_ms} milliseconds before timing out.")
    dump = (f"and we will try our best to dump the debug info. Last enqueued NCCL work: {enq}, last completed NCCL "
            f"work: {done}.{DUMP_ADVICE}")
    pieces = []
    if rk.dump_src is not None:
        pieces.append((rk.t_dump, 2, "e", rk, c10(r, "E", rk.t_dump, 1657) + pg
                       + f"Received a dump signal due to a collective timeout from  rank {rk.dump_src} {dump}\n"))
    msgs = [(632, timeout),
            (2271, f"{pg} failure detected by watchdog at work sequence id: {s} PG status: last enqueued work: "
                   f"{enq}, last completed work: {done}")]
    if rk.dump_src is None:
        msgs += [(2306, pg + "First PG on this rank to signal dumping."),
                 (1657, pg + f"Received a dump signal due to a collective timeout from this local rank {dump}")]
    msgs.append((1390, pg + "ProcessGroupNCCL preparing to dump debug info. Include stack trace: 1"))
    text = "".join(c10(r, "E", sec(rk.t_timeout, 0.00002 * i), ln) + m + "\n" for i, (ln, m) in enumerate(msgs))
    pieces.append((rk.t_timeout, 3, "e", rk, text))
    te = sec(rk.t_exit, -0.05)
    what = pg + "Process group watchdog thread terminated with exception: " + timeout
    msgs = [(2098, "Stack trace of the failed collective not found, potentially because FlightRecorder is disabled. "
                   "You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value."),
            (2134, f"[Rank {r}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
                   "CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data."),
            (2140, f"[Rank {r}] To avoid data inconsistency, we are taking the entire process down."),
            (1728, what)]
    text = "".join(c10(r, "E", sec(te, 0.00002 * i), ln) + m + "\n" for i, (ln, m) in enumerate(msgs))
    text += terminate_block(
        what, "checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:635",
        0x7F0000000000 + (rk.pid << 16) % 0xFFFF00000,
        "c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
        "std::ratio<1l, 1000l> > >) + 0x2b0")
    pieces.append((te, 4, "e", rk, text))
    return pieces

def hang_step_pieces(plan: Plan, rk: Rank) -> list[tuple]:
    """The gradient buckets of the last step, which this rank enqueued (S .. S+C-2)."""
    s = plan.seq_hang
    if plan.args.coll == "off":
        return []
    text = "".join(coll_line(plan, rk, j, opcount=f"{s - 1 + j:x}") for j in range(plan.args.collectives - 1))
    return [(sec(plan.t_hang, 0.01), 0, "o", rk, text)]


def culprit_pieces(plan: Plan, rk: Rank) -> list[tuple]:
    a, r = plan.args, rk.rank
    s = plan.seq_hang
    pieces: list[tuple] = []
    if a.failure == "lagging_rank":
        t = rk.t_dump
        if t is not None:
            pg = PG.format(r=r)
            pieces.append((t, 2, "e", rk, c10(r, "E", t, 1657) + pg
                           + f"Received a dump signal due to a collective timeout from  rank {rk.dump_src} and we "
                           f"will try our best to dump the debug info. Last enqueued NCCL work: {s - 1}, last "
                           f"completed NCCL work: {s - 1}.{DUMP_ADVICE}\n"
                           + c10(r, "E", sec(t, 0.001), 1390) + pg
                           + "ProcessGroupNCCL preparing to dump debug info. Include stack trace: 1\n"))
    elif a.failure == "xid":
        pieces += hang_step_pieces(plan, rk)
        t = sec(plan.t_hang, 1.2)
        ts = f"[{t:%Y-%m-%d %H:%M:%S}] "
        head = nccl_head(rk, rk.tid_ag)
        pieces.append((t, 1, "o", rk, f"{ts}{head}misc/strongstream.cc:381 NCCL WARN Cuda failure 999 'unknown error'\n"
                       f"{head}NCCL INFO enqueue.cc:2153 -> 1\n{head}NCCL INFO enqueue.cc:2298 -> 1\n"))
        te = sec(rk.t_exit, -0.1)
        pg = PG.format(r=r)
        cuda = ("CUDA error: unknown error\nCUDA kernel errors might be asynchronously reported at some other API "
                "call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
                "CUDA_LAUNCH_BLOCKING=1.\n")
        what = pg + "Process group watchdog thread terminated with exception: " + cuda
        text = (c10(r, "E", te, 1728) + what + "\n"
                + terminate_block(what.rstrip("\n"),
                                  "c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:43",
                                  0x7F0000000000 + (rk.pid << 16) % 0xFFFF00000,
                                  "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, "
                                  "bool) + 0x3c3"))
        pieces.append((te, 4, "e", rk, text))
    elif a.failure == "oom":
        t = plan.t_hang
        p = f"[rank{r}]: "
        tb = [
            "Traceback (most recent call last):",
            f'  File "{SCRIPT}", line 311, in <module>',
            "    main()",
            f'  File "{PY}/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper',
            "    return f(*args, **kwargs)",
            "           ^^^^^^^^^^^^^^^^^^",
            f'  File "{SCRIPT}", line 274, in main',
            "    loss = model(**batch).loss",
            "           ^^^^^^^^^^^^^^^",
            f'  File "{PY}/torch/nn/modules/module.py", line 1751, in _wrapped_call_impl',
            "    return self._call_impl(*args, **kwargs)",
            "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
            f'  File "{PY}/torch/nn/modules/module.py", line 1762, in _call_impl',
            "    return forward_call(*args, **kwargs)",
            "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
            '  File "/srv/train/model.py", line 188, in forward',
            "    logits = self.lm_head(hidden).float()",
            "             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU {rk.dev} has a total "
            "capacity of 79.19 GiB of which 1.62 GiB is free. Including non-PyTorch memory, this process has 77.55 "
            "GiB memory in use. Of the allocated memory 71.84 GiB is allocated by PyTorch, and 4.12 GiB is reserved "
            "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
            "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        ]
        text = "".join(p + ln + "\n" for ln in tb)
        text += (c10(r, "W", sec(t, 0.4), 1496) + "Warning: WARNING: destroy_process_group() was not called before "
                 "program exit, which can leak resources. For more info, please see "
                 "https://pytorch.org/docs/stable/distributed.html#shutdown (function operator())\n")
        pieces.append((t, 4, "e", rk, text))
    return pieces


def agent_pieces(plan: Plan, host: Host, rng: random.Random) -> list[tuple]:
    """The torchrun agent at the end: SIGTERM the siblings, report, ChildFailedError (FORMATS.md §8)."""
    api = "torch/distributed/elastic/multiprocessing/api.py"
    natural = [rk for rk in host.ranks if rk.t_exit is not None]
    if not natural:  # nothing died here: the scheduler cancels the job later
        last = max(rk.t_exit or plan.t_hang for rk in plan.ranks)
        t = sec(last, 30)
        text = pylog("W", t, host.agent_pid, api, 900) + "Received SIGTERM death signal, shutting down workers\n"
        text += "".join(pylog("W", sec(t, 0.001 * (i + 1)), host.agent_pid, api, 900)
                        + f"Sending process {rk.pid} closing signal SIGTERM\n" for i, rk in enumerate(host.ranks))
        return [(t, 5, "a", host, text)]
    first = min(natural, key=lambda rk: (rk.t_exit, rk.lr))
    t_det = sec(first.t_exit, rng.uniform(0.05, 0.3))
    results = []
    for rk in host.ranks:
        if rk.t_exit is not None and rk.t_exit <= t_det:
            results.append((rk.t_exit, rk.lr, rk, rk.exit_code))
        elif rk is not first:
            results.append((sec(t_det, 0.5), rk.lr, rk, -15))
    results.sort(key=lambda x: (x[0].replace(microsecond=0), x[1] != first.lr, x[1]))
    lines = [pylog("W", sec(t_det, 0.001 * i), host.agent_pid, api, 900)
             + f"Sending process {rk.pid} closing signal SIGTERM"
             for i, rk in enumerate(r for r in host.ranks if r is not first)]
    t_rep = sec(t_det, 0.6)
    lines.append(pylog("E", t_rep, host.agent_pid, api, 874)
                 + f"failed (exitcode: {first.exit_code}) local_rank: {first.lr} (pid: {first.pid}) of binary: "
                 "/opt/venv/bin/python3")
    lines += [
        "Traceback (most recent call last):",
        '  File "/opt/venv/bin/torchrun", line 8, in <module>',
        "    sys.exit(main())",
        "             ^^^^^^",
        f'  File "{PY}/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper',
        "    return f(*args, **kwargs)",
        "           ^^^^^^^^^^^^^^^^^^",
        f'  File "{PY}/torch/distributed/run.py", line 892, in main',
        "    run(args)",
        f'  File "{PY}/torch/distributed/run.py", line 883, in run',
        "    elastic_launch(",
        f'  File "{PY}/torch/distributed/launcher/api.py", line 139, in __call__',
        "    return launch_agent(self._config, self._entrypoint, list(args))",
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        f'  File "{PY}/torch/distributed/launcher/api.py", line 270, in launch_agent',
        "    raise ChildFailedError(",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    ]
    signames = {-6: "SIGABRT", -9: "SIGKILL", -15: "SIGTERM", -11: "SIGSEGV"}

    def entry(idx: int, t: dt.datetime, rk: Rank, code: int) -> list[str]:
        if code < 0:
            tb = f"Signal {-code} ({signames.get(code, 'SIG' + str(-code))}) received by PID {rk.pid}"
        else:
            tb = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
        return [f"[{idx}]:", f"  time      : {t:%Y-%m-%d_%H:%M:%S}", f"  host      : {host.fqdn}",
                f"  rank      : {rk.rank} (local_rank: {rk.lr})", f"  exitcode  : {code} (pid: {rk.pid})",
                "  error_file: <N/A>", f"  traceback : {tb}"]

    root, others = results[0], results[1:]
    body = [f"{SCRIPT} FAILED", "<sep>", "Failures:"]
    if others:
        for i, (t, _lr, rk, code) in enumerate(others, 1):
            body += entry(i, t, rk, code)
    else:
        body.append("  <NO_OTHER_FAILURES>")
    body += ["<sep>", "Root Cause (first observed failure):"] + entry(0, root[0], root[2], root[3])
    width = min(max(len(x) for x in body), 60)
    body = [("-" * width if x == "<sep>" else x) for x in body]
    lines += ["=" * width, *body, "=" * width]
    return [(t_rep, 5, "a", host, "\n".join(lines) + "\n")]


def banner_piece(plan: Plan, host: Host) -> tuple:
    t = sec(plan.t0, 0.001 * host.idx)
    head = pylog("W", t, host.agent_pid, "torch/distributed/run.py", 766)
    stars = "*" * 41
    text = (f"{head}\n{head}{stars}\n{head}Setting OMP_NUM_THREADS environment variable for each process to be 1 in "
            "default, to avoid your system being overloaded, please further tune the variable for optimal performance "
            f"in your application as needed. \n{head}{stars}\n")
    return (t, 0, "a", host, text)


def dmesg_text(plan: Plan, rk: Rank) -> str:
    """dmesg -T of the culprit's host: boot noise, then the Xid 79 just after the hang began."""
    h = rk.host
    boot = sec(plan.t0, -86400 * 3 - 3217.25)
    noise = [
        "Linux version 5.15.0-119-generic (buildd@lcy02-amd64-028) (gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0, "
        "GNU ld (GNU Binutils for Ubuntu) 2.38) #129-Ubuntu SMP Fri Aug 2 19:25:20 UTC 2024 "
        "(Ubuntu 5.15.0-119.129-generic 5.15.160)",
        "Command line: BOOT_IMAGE=/vmlinuz-5.15.0-119-generic root=/dev/md0 ro iommu=pt pci=realloc=off",
        "x86/fpu: Supporting XSAVE feature 0x001: 'x87 floating point registers'",
        "BIOS-e820: [mem 0x0000000000000000-0x000000000009ffff] usable",
        "ACPI: Early table checksum verification disabled",
        "PCI: Using configuration type 1 for base access",
        "EXT4-fs (md0): mounted filesystem with ordered data mode. Opts: (null). Quota mode: none.",
        "nvidia: module license 'NVIDIA' taints kernel.",
        "nvidia-nvlink: Nvlink Core is being initialized, major device number 508",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024",
        "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  550.90.07  "
        "Fri May 31 09:34:34 UTC 2024",
        "mlx5_core 0000:0c:00.0: firmware version: 28.39.1002",
        "mlx5_core 0000:0c:00.0: 400.000 Gb/s available PCIe bandwidth (32.0 GT/s PCIe x16 link)",
        "IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready",
        "nvidia-fabricmanager: fabric manager started",
        'audit: type=1400 audit(1734000000.337:42): apparmor="STATUS" operation="profile_load" '
        'name="nvidia_modprobe" pid=1533 comm="apparmor_parser"',
    ]
    out = []
    for i, ln in enumerate(noise):
        out.append(ctime(sec(boot, 0.4 * i)) + ln)
    for i in range(40):  # periodic noise up to the failure
        t = sec(boot, 3600 * (i + 1) + 0.313 * i)
        out.append(ctime(t) + f"IPv4: martian source 10.{h.idx % 250}.0.{i % 250} from 10.{h.idx % 250}.0.1, "
                   "on dev ib0")
    tx = sec(plan.t_hang, 0.4)
    pci = f"0000:{rk.bus}:00"
    uuid = f"GPU-{_hex(random.Random(plan.args.seed + rk.rank), 8)}-5a1e-2b3c-9d4f-{rk.pid:012x}"
    out += [ctime(tx) + f"NVRM: GPU at PCI:{pci}: {uuid}",
            ctime(tx) + f"NVRM: GPU Board Serial Number: 165282301{rk.rank % 10000:04d}",
            ctime(tx) + f"NVRM: Xid (PCI:{pci}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            ctime(tx) + f"NVRM: GPU {pci}.0: GPU has fallen off the bus.",
            ctime(sec(tx, 0.2)) + "NVRM: A GPU crash dump has been created. If possible, please run",
            ctime(sec(tx, 0.2)) + "NVRM: nvidia-bug-report.sh as root to collect this data before",
            ctime(sec(tx, 0.2)) + "NVRM: the NVIDIA kernel module is unloaded."]
    return "\n".join(out) + "\n"


def all_pieces(plan: Plan) -> list[tuple]:
    plan_failure(plan)
    rng = random.Random()
    rng.setstate(plan.pieces["agent_rng"])
    pieces: list[tuple] = []
    for h in plan.hosts:
        pieces.append(banner_piece(plan, h))
    for rk in plan.ranks:
        pieces += header_pieces(plan, rk)
    for rk in plan.ranks:
        if times_out(plan, rk) or (plan.args.failure != "lagging_rank" and rk.rank != plan.culprit):
            pieces += hang_step_pieces(plan, rk)
        if times_out(plan, rk):
            pieces += timeout_pieces(plan, rk)
        if rk.rank == plan.culprit:
            pieces += culprit_pieces(plan, rk)
    for h in plan.hosts:
        pieces += agent_pieces(plan, h, rng)
    return pieces


# -- writing --------------------------------------------------------------------------------------
def prefixed(text: str, prefix: str) -> str:
    """Put a launcher prefix (`[default3]:`) before every line of `text`."""
    if not prefix or not text:
        return text
    if text.endswith("\n"):
        return prefix + text[:-1].replace("\n", "\n" + prefix) + "\n"
    return prefix + text.replace("\n", "\n" + prefix)


class Writer:
    def __init__(self, plan: Plan, out: Path) -> None:
        self.plan, self.out = plan, out
        self.bytes = 0
        self.files: list[Path] = []

    def open(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.files.append(path)
        return open(path, "w", encoding="utf-8", newline="", buffering=1 << 20)

    def put(self, fh, text: str) -> None:
        fh.write(text)
        self.bytes += len(text)  # ASCII only


def body_chunks(plan: Plan, rk: Rank, prefix: str):
    """The training steps of one rank, a few hundred steps per chunk."""
    a = plan.args
    tmpl = prefixed(step_template(plan, rk), prefix)
    c = a.collectives
    prog = a.progress == "all" or rk.rank == 0
    buf: list[str] = []
    for s in range(1, plan.n_steps + 1):
        base = PRE_COLLECTIVES + (s - 1) * c  # opCount = seq - 1
        buf.append(fill(tmpl, tuple(range(base, base + c))))
        if prog and s % a.log_every == 0:
            buf.append(prefix + progress_line(rk.rank, s))
        if len(buf) >= 512:
            yield "".join(buf)
            buf = []
    if buf:
        yield "".join(buf)


def write_logdir(plan: Plan, out: Path, pieces: list[tuple]) -> Writer:
    w = Writer(plan, out)
    by_rank: dict[int, list[tuple]] = {}
    for p in pieces:
        if p[2] == "a":
            continue
        by_rank.setdefault(p[3].rank, []).append(p)
    for h in plan.hosts:
        agent = sorted((p for p in pieces if p[2] == "a" and p[3] is h), key=lambda p: (p[0], p[1]))
        with w.open(out / h.name / "torchrun.log") as fh:
            for p in agent:
                w.put(fh, p[4])
        for rk in h.ranks:
            mine = sorted(by_rank.get(rk.rank, []), key=lambda p: (p[0], p[1]))
            d = out / h.name / h.rundir / "attempt_0" / str(rk.lr)
            with w.open(d / "stdout.log") as fo:
                for p in mine:
                    if p[2] == "o" and p[1] == 1 and p[0] < plan.t_hang:
                        w.put(fo, p[4])
                for chunk in body_chunks(plan, rk, ""):
                    w.put(fo, chunk)
                for p in mine:
                    if p[2] == "o" and not (p[1] == 1 and p[0] < plan.t_hang):
                        w.put(fo, p[4])
            with w.open(d / "stderr.log") as fe:
                for p in mine:
                    if p[2] == "e":
                        w.put(fe, p[4])
    if plan.args.failure == "xid":
        rk = plan.ranks[plan.culprit]
        with w.open(out / rk.host.name / f"dmesg-{rk.host.name}.txt") as fh:
            w.put(fh, dmesg_text(plan, rk))
    return w


def write_console(plan: Plan, out: Path, pieces: list[tuple]) -> Writer:
    w = Writer(plan, out)
    a = plan.args
    pre = {rk.rank: f"[default{rk.lr}]:" for rk in plan.ranks}

    def render(p: tuple) -> str:
        return p[4] if p[2] == "a" else prefixed(p[4], pre[p[3].rank])

    early = sorted((p for p in pieces if p[0] < plan.t_hang), key=lambda p: (p[0], p[1]))
    late = sorted((p for p in pieces if p[0] >= plan.t_hang), key=lambda p: (p[0], p[1]))
    with w.open(out / "console.log") as fh:
        for p in early:
            w.put(fh, render(p))
        tmpls = [prefixed(step_template(plan, rk), pre[rk.rank]) for rk in plan.ranks]
        c = a.collectives
        buf: list[str] = []
        size = 0
        for s in range(1, plan.n_steps + 1):
            base = PRE_COLLECTIVES + (s - 1) * c
            ops = tuple(range(base, base + c))
            for rk, tmpl in zip(plan.ranks, tmpls, strict=True):
                chunk = fill(tmpl, ops)
                buf.append(chunk)
                size += len(chunk)
                if s % a.log_every == 0 and (a.progress == "all" or rk.rank == 0):
                    buf.append(pre[rk.rank] + progress_line(rk.rank, s))
            if size >= 8 << 20:
                w.put(fh, "".join(buf))
                buf, size = [], 0
        w.put(fh, "".join(buf))
        for p in late:
            w.put(fh, render(p))
    if a.failure == "xid":
        rk = plan.ranks[plan.culprit]
        with w.open(out / f"dmesg-{rk.host.name}.txt") as fh:
            w.put(fh, dmesg_text(plan, rk))
    return w


def fixed_bytes(plan: Plan) -> int:
    """Bytes outside the training loop (with n_steps as set), all files."""
    a = plan.args
    fixed = 0
    for p in all_pieces(plan):
        text = p[4]
        if a.layout == "console" and p[2] != "a":
            text = prefixed(text, f"[default{p[3].lr}]:")
        fixed += len(text)
    if a.failure == "xid":
        fixed += len(dmesg_text(plan, plan.ranks[plan.culprit]))
    return fixed


def step_bytes(plan: Plan, mid: int) -> int:
    """Bytes of one training step, all ranks, with opCounts around `mid` (the hex width grows)."""
    a = plan.args
    per_step = 0.0
    for rk in plan.ranks:
        prefix = f"[default{rk.lr}]:" if a.layout == "console" else ""
        per_step += len(fill(prefixed(step_template(plan, rk), prefix), tuple(range(mid, mid + a.collectives))))
        if a.progress == "all" or rk.rank == 0:
            per_step += (len(prefix) + len(progress_line(rk.rank, mid))) / a.log_every
    return int(per_step)


def write_tar_gz(out: Path, mtime: float) -> Path:
    target = out.with_name(out.name + ".tar.gz")
    try:
        from isal import igzip

        gz = igzip.GzipFile(target, "wb", compresslevel=2, mtime=0)
    except ImportError:  # pragma: no cover - isal is a dependency of the package
        import gzip

        gz = gzip.GzipFile(target, "wb", compresslevel=6, mtime=0)

    def norm(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = mtime, 1000, 1000, "train", "train"
        return ti

    with gz, tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        for path in sorted(out.rglob("*")):
            tf.add(path, arcname=path.relative_to(out.parent).as_posix(), recursive=False, filter=norm)
    return target


def generate(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        if not args.force:
            raise SystemExit(f"{out} exists and is not empty (use --force to replace it)")
        shutil.rmtree(out)
    if args.per_host < 1 or args.ranks < 2 or args.collectives < 3 or args.log_every < 1:
        raise SystemExit("need --ranks >= 2, --per-host >= 1, --collectives >= 3, --log-every >= 1")
    started = time.perf_counter()
    plan = make_plan(args)
    fixed = fixed_bytes(plan)
    c = args.collectives
    n = max(args.min_steps, (args.size - fixed) // max(step_bytes(plan, 1 << 12), 1))
    for _ in range(2):  # refine: opCounts of a longer run print wider
        n = max(args.min_steps, (args.size - fixed) // max(step_bytes(plan, PRE_COLLECTIVES + n * c // 2), 1))
    plan.n_steps = n
    pieces = all_pieces(plan)
    out.mkdir(parents=True, exist_ok=True)
    writer = (write_logdir if args.layout == "logdir" else write_console)(plan, out, pieces)
    gen_s = time.perf_counter() - started
    first = plan.pieces.get("first")
    culprit = plan.ranks[plan.culprit]
    truth = {
        "failure": args.failure, "layout": args.layout, "seed": args.seed,
        "world_size": plan.world, "per_host": args.per_host, "hosts": len(plan.hosts),
        "culprit_rank": plan.culprit, "culprit_host": culprit.host.name,
        "culprit_local_rank": culprit.lr,
        "seq": plan.seq_hang, "op_type": "ALLREDUCE", "pg": "0",
        "healthy_timeout_ranks": sum(1 for rk in plan.ranks if times_out(plan, rk)),
        "first_timeout_rank": first,
        "hang_time": plan.t_hang.isoformat(), "timeout_ms": args.timeout_ms,
        "steps": plan.n_steps, "collectives_per_step": args.collectives, "coll": args.coll,
        "progress": args.progress, "log_every": args.log_every,
        "bytes": writer.bytes, "target_bytes": args.size, "files": len(writer.files),
        "generate_seconds": round(gen_s, 2),
    }
    if args.failure == "xid":
        truth["xid"] = {"code": 79, "pci": f"0000:{culprit.bus}:00", "nccl_bus_id": f"{culprit.bus}000"}
    if args.tar_gz:
        t = time.perf_counter()
        tgz = write_tar_gz(out, plan.t0.timestamp())
        truth["tar_gz"] = str(tgz)
        truth["tar_gz_bytes"] = tgz.stat().st_size
        truth["tar_gz_seconds"] = round(time.perf_counter() - t, 2)
    out.with_name(out.name + ".truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    return truth


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See bench/README.md.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=256, help="world size (default 256)")
    p.add_argument("--per-host", type=int, default=8, help="ranks per host (default 8)")
    p.add_argument("--size", type=parse_size, default=parse_size("100M"), help="target total bytes: 100M, 1G, 4G")
    p.add_argument("--layout", choices=LAYOUTS, default="logdir")
    p.add_argument("--failure", choices=FAILURES, default="lagging_rank")
    p.add_argument("--culprit", type=int, default=None, help="the failing rank (default: drawn from --seed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="run folder to create")
    p.add_argument("--tar-gz", action="store_true", help="also write <out>.tar.gz")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--progress", choices=("rank0", "all"), default="rank0",
                   help="which ranks print `step N loss X` (default rank0)")
    p.add_argument("--log-every", type=int, default=10, help="progress line every N steps (default 10)")
    p.add_argument("--collectives", type=int, default=24, help="collectives per step (default 24)")
    p.add_argument("--coll", choices=("on", "off"), default="on",
                   help="one NCCL INFO line per collective (NCCL_DEBUG_SUBSYS=COLL; default on)")
    p.add_argument("--timeout-ms", type=int, default=600000, help="ProcessGroupNCCL timeout (default 600000)")
    p.add_argument("--min-steps", type=int, default=5, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    truth = generate(args)
    print(json.dumps(truth, indent=2))
    mb = truth["bytes"] / 1e6
    print(f"wrote {mb:.1f} MB in {truth['files']} files in {truth['generate_seconds']:.1f} s "
          f"({mb / max(truth['generate_seconds'], 1e-9):.0f} MB/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
