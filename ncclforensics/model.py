"""The types every stage shares: the event schema, root causes, findings, the diagnosis."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

SOURCES = (
    "nccl", "c10d", "gloo", "torch_detail", "torchrun", "dataloader", "cuda",
    "python", "kernel", "slurm", "app", "flight_recorder",
    "launcher",  # launchers other than torchrun: mp.spawn, DeepSpeed, Lightning, mpirun (FORMATS.md §18)
)

# The columns of the one event table (DESIGN.md §2), known without polars: a process that only reads
# logs (events._read_shared's forked readers) never imports it. `group_rank` and `extra` are our
# additions: the rank inside the process group a c10d message names, and a JSON object of the typed
# fields a signature captures that have no column of their own. Their dtypes, EVENT_SCHEMA, and
# INT_COLUMNS are made on first use (the module's __getattr__).
EVENT_COLUMNS = (
    "run", "file", "line", "ts", "host", "rank", "local_rank", "group_rank", "pg", "pid", "source", "kind", "seq",
    "op", "numel_in", "numel_out", "timeout_ms", "elapsed_ms", "code", "detail", "extra", "text",
    # what the row is evidence of, from its signature file (ncclforensics.vocabulary, DESIGN.md §3):
    # derived when the table is built, never emitted by a parser
    "class", "role", "strength", "phase",
)
MEANING_COLUMNS = ("class", "role", "strength", "phase")


def _event_schema() -> dict[str, pl.DataType]:
    """Column -> dtype, in EVENT_COLUMNS' order."""
    import polars as pl

    types = {
        "line": pl.UInt32, "ts": pl.Datetime("us", "UTC"), "rank": pl.Int32, "local_rank": pl.Int32,
        "group_rank": pl.Int32, "pid": pl.Int64, "source": pl.Enum(list(SOURCES)), "kind": pl.Categorical(),
        "seq": pl.Int64, "numel_in": pl.Int64, "numel_out": pl.Int64, "timeout_ms": pl.Int64,
        "elapsed_ms": pl.Int64, "code": pl.Int64, "strength": pl.Int8,
    }
    return {name: types.get(name, pl.Utf8) for name in EVENT_COLUMNS}


def __getattr__(name: str) -> object:
    """EVENT_SCHEMA and INT_COLUMNS, made (importing polars) on first use."""
    if name == "EVENT_SCHEMA":
        value: object = _event_schema()
    elif name == "INT_COLUMNS":
        import polars as pl

        value = frozenset(c for c, t in _event_schema().items() if t in (pl.Int32, pl.Int64, pl.UInt32))
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


TEXT_LIMIT = 2000  # characters of a raw line kept in `text`


class RootCause(StrEnum):
    RANK_DIVERGENCE = "rank_divergence"
    CHECKPOINT_SAVE = "checkpoint_save"
    NETWORK_INIT = "network_init"
    DATALOADER_ABORT = "dataloader_abort"
    GPU_HARDWARE = "gpu_hardware"
    OOM = "oom"
    RANK_CRASH = "rank_crash"
    NETWORK_RUNTIME = "network_runtime"
    LAUNCH_CONFIG = "launch_config"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Cause:
    """What every output says of one root cause. Its evidence is declared in patterns/signatures
    (`class` of a meaning), its rules in patterns/rules/<class>/, its detectors in
    rules/detectors/<class>.py, its reproducer in repro/templates/<class>.py.j2."""

    prefix: str  # of its rule ids: two letters + three digits (DESIGN.md §1); "" for unknown (no rules)
    plain: str  # what it means, in the words a tired on-call engineer wants first (the report's verdict card)
    color: str  # its bars, chips and legend in a scan's index page


CAUSES: dict[RootCause, Cause] = {
    RootCause.RANK_DIVERGENCE: Cause("RD", "The ranks took different code paths", "#4e79a7"),
    RootCause.CHECKPOINT_SAVE: Cause("CK", "A checkpoint save held up the other ranks", "#f28e2b"),
    RootCause.NETWORK_INIT: Cause("NI", "The ranks could not connect at start-up", "#59a14f"),
    RootCause.DATALOADER_ABORT: Cause("DL", "A DataLoader worker died", "#b07aa1"),
    RootCause.GPU_HARDWARE: Cause("HW", "A GPU or its link failed", "#e15759"),
    RootCause.OOM: Cause("OM", "A process ran out of memory", "#ff9da7"),
    RootCause.RANK_CRASH: Cause("RC", "A training process crashed", "#9c755f"),
    RootCause.NETWORK_RUNTIME: Cause("NR", "The network failed during training", "#76b7b2"),
    RootCause.LAUNCH_CONFIG: Cause("LC", "The launch or environment is misconfigured", "#edc948"),
    RootCause.UNKNOWN: Cause("", "Not enough evidence for a root cause", "#bab0ac"),
}


class Role(StrEnum):
    ROOT = "root"
    CASCADE = "cascade"
    CONTEXT = "context"


# OpType names as WorkNCCL prints them (FORMATS.md §3.3).
OP_TYPES = frozenset({
    "BROADCAST", "ALLREDUCE", "ALLREDUCE_COALESCED", "REDUCE", "ALLGATHER", "_ALLGATHER_BASE",
    "ALLGATHER_COALESCED", "GATHER", "SCATTER", "REDUCE_SCATTER", "ALLTOALL_BASE", "ALLTOALL",
    "SEND", "RECV", "RECVANYSOURCE", "BARRIER", "_REDUCE_SCATTER_BASE", "COALESCED",
    "_ALLREDUCE_SPARSE", "REDUCE_SCATTER_TENSOR_COALESCED", "ALLGATHER_INTO_TENSOR_COALESCED",
    "UNKNOWN",
})
# the point-to-point ones: pipeline stages wait in different ones by design
P2P_OP_TYPES = frozenset({"SEND", "RECV", "RECVANYSOURCE"})

# Flight Recorder / profiler names -> OpType (FORMATS.md §3.3, §15.2).
PROFILING_OPS = {
    "all_reduce": "ALLREDUCE", "allreduce": "ALLREDUCE", "all_reduce_coalesced": "ALLREDUCE_COALESCED",
    "allreduce_coalesced": "ALLREDUCE_COALESCED", "broadcast": "BROADCAST", "reduce": "REDUCE",
    "all_gather": "ALLGATHER", "allgather": "ALLGATHER", "_all_gather_base": "_ALLGATHER_BASE",
    "_allgather_base": "_ALLGATHER_BASE", "all_gather_into_tensor_coalesced": "ALLGATHER_INTO_TENSOR_COALESCED",
    "allgather_coalesced": "ALLGATHER_COALESCED", "gather": "GATHER", "scatter": "SCATTER",
    "reduce_scatter": "REDUCE_SCATTER", "_reduce_scatter_base": "_REDUCE_SCATTER_BASE",
    "reduce_scatter_tensor_coalesced": "REDUCE_SCATTER_TENSOR_COALESCED", "all_to_all": "ALLTOALL",
    "alltoall": "ALLTOALL", "alltoall_base": "ALLTOALL_BASE", "all_to_all_single": "ALLTOALL_BASE",
    "barrier": "BARRIER", "send": "SEND", "recv": "RECV", "recv_any_source": "RECVANYSOURCE",
    "coalesced": "COALESCED",
}

# Python call names in a traceback frame -> the collective it issues (gloo prints no OpType).
CALL_OPS = {
    "all_reduce": "ALLREDUCE", "barrier": "BARRIER", "broadcast": "BROADCAST", "all_gather": "ALLGATHER",
    "all_gather_into_tensor": "_ALLGATHER_BASE", "reduce_scatter_tensor": "_REDUCE_SCATTER_BASE",
    "reduce_scatter": "REDUCE_SCATTER", "gather": "GATHER", "scatter": "SCATTER", "reduce": "REDUCE",
    "all_to_all": "ALLTOALL", "all_to_all_single": "ALLTOALL_BASE", "all_gather_object": "ALLGATHER",
    "broadcast_object_list": "BROADCAST", "gather_object": "GATHER", "monitored_barrier": "BARRIER",
    "_engine_run_backward": "ALLREDUCE", "run_backward": "ALLREDUCE",  # DDP gradient all-reduce
    "send": "SEND", "recv": "RECV",
}


def rank_ranges(ranks: list[int] | tuple[int, ...], *, limit: int = 12, count: bool = True) -> str:
    """[0,1,2,3,7,9,10] -> '0–3, 7, 9, 10 (7 ranks)'; past `limit` spans: '…, … (N ranks)'."""
    rs = sorted(set(ranks))
    if not rs:
        return ""
    spans: list[tuple[int, int]] = []
    for r in rs:
        if spans and r == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], r)
        else:
            spans.append((r, r))
    parts = [str(a) if a == b else (f"{a}, {b}" if b == a + 1 else f"{a}–{b}") for a, b in spans]
    text = ", ".join(parts[:limit])
    if len(parts) > limit:
        text += f", … ({len(rs)} ranks)"
    elif count and len(rs) > 1 and len(spans) < len(rs):
        text += f" ({len(rs)} ranks)"
    return text


def json_object(s: str | None) -> dict:
    """The `extra` column's JSON object, or {} (absent, malformed or not an object)."""
    if not s:
        return {}
    try:
        v = json.loads(s)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def extra_field(key: str) -> pl.Expr:
    """The `extra` column's top-level `key` as text (null where absent), an expression over the event
    table. Only the rows whose JSON holds `"key"` are parsed: most rows carry an `extra` of other
    names ({"attempt": 0} on every row of a --log-dir tree), and a parse a row is the cost."""
    import polars as pl

    x = pl.col("extra")
    return pl.when(x.str.contains(f'"{key}"', literal=True)).then(x).str.json_path_match(f"$.{key}")


def op_from_profiling_name(name: str | None) -> str | None:
    """`nccl:all_reduce`, `gloo:barrier`, `nccl:send 0->1` -> OpType, or None."""
    if not name:
        return None
    base = name.split(":", 1)[-1].split(" ", 1)[0].strip().lower()
    return PROFILING_OPS.get(base)


@dataclass(frozen=True)
class Skipped:
    file: str
    reason: str


@dataclass(frozen=True)
class Evidence:
    file: str
    line: int
    text: str
    rank: int | None = None
    host: str | None = None
    ts: str | None = None
    kind: str | None = None
    role: str | None = None  # what the line is evidence of (cause, symptom, …): its signature says


@dataclass(frozen=True)
class Fix:
    title: str
    why: str
    code: str


@dataclass(frozen=True)
class Collective:
    pg: str | None = None
    op_type: str | None = None
    seq: int | None = None


@dataclass
class Finding:
    root_cause: RootCause
    rule: str
    title: str
    message: str
    confidence: float
    culprit_ranks: list[int] = field(default_factory=list)
    culprit_hosts: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    collective: Collective = field(default_factory=Collective)
    ts: object | None = None  # datetime of the finding's key event, for causal order
    role: Role = Role.ROOT
    fixes: list[Fix] = field(default_factory=list)
    doc: dict[str, str] = field(default_factory=dict)
    reproducer: str | None = None
    params: dict[str, object] = field(default_factory=dict)  # validated values for the reproducer
    yields_to: tuple[str, ...] = ()
    # torchrun's restart attempt (attempt_<n> of a --log-dir, FORMATS.md §2.2) the evidence comes from,
    # the earliest where it spans several; None where the logs do not say
    attempt: int | None = None


@dataclass(frozen=True)
class RunFacts:
    path: str
    files: int
    lines: int
    bytes: int
    world_size: int | None
    ranks_seen: list[int]
    hosts: list[str]
    versions: dict[str, str]
    skipped: list[Skipped]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Diagnosis:
    facts: RunFacts
    verdict: Finding
    findings: list[Finding]
    ranks: list[dict]  # per rank x PG frontier rows, as in the --json contract
    first_failure: Evidence | None = None
    missing: str | None = None  # what log would settle an uncertain verdict
