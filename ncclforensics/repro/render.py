"""Render a standalone torch reproducer script for a finding, from validated fields only (DESIGN.md §6)."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jinja2

from ncclforensics.model import OP_TYPES, Finding, RootCause, RunFacts

TEMPLATE_DIR = Path(__file__).parent / "templates"

# Allowed `mode` values per template; the first is the default.
MODES: dict[RootCause, tuple[str, ...]] = {
    RootCause.RANK_DIVERGENCE: ("extra_collective", "missing_collective", "early_exit"),
    RootCause.CHECKPOINT_SAVE: ("barrier", "collective"),
    RootCause.NETWORK_INIT: ("unreachable_store", "missing_rank"),
    RootCause.DATALOADER_ABORT: ("sigkill", "bus_error", "exit"),
    RootCause.OOM: ("host", "cuda"),
    RootCause.RANK_CRASH: ("exception", "signal"),
    RootCause.LAUNCH_CONFIG: ("duplicate_gpu", "device", "shm"),
}

SIGNALS = {9: "SIGKILL", 7: "SIGBUS", 11: "SIGSEGV", 6: "SIGABRT", 15: "SIGTERM"}
DEFAULT_SIGNAL = 9

# The collectives a template can issue on both gloo and nccl; any other OpType renders as ALLREDUCE.
ISSUABLE_OPS = ("ALLREDUCE", "BROADCAST", "ALLGATHER", "BARRIER", "REDUCE")
DEFAULT_OP = "ALLREDUCE"

MIN_WORLD_SIZE = 2
MAX_REAL_WORLD_SIZE = 4096  # --real-world-size still has to be launchable
MAX_RANK = 1_000_000
MAX_STEP = 1_000_000_000
MAX_TIMEOUT_S = 7 * 24 * 3600
REPRO_STEPS = range(1, 11)  # a diagnosed step in here is kept; later ones fail at DEFAULT_FAULT_STEP
DEFAULT_FAULT_STEP = 3

# Templates whose fault is injected on one rank when the finding names none: who plays the culprit.
LAST_RANK_DEFAULT = frozenset({
    RootCause.DATALOADER_ABORT, RootCause.OOM, RootCause.RANK_CRASH, RootCause.GPU_HARDWARE,
    RootCause.NETWORK_RUNTIME, RootCause.LAUNCH_CONFIG,
})

# Every string that reaches a template is built from validated ints and enum members; this is the
# last check that nothing else slipped in (no quotes, no newlines, no backslashes).
_SAFE_TEXT = re.compile(r"[A-Za-z0-9_ ,.;:()#/+=<>\[\]'-]*")


@dataclass(frozen=True)
class Reproducer:
    script: str        # the rendered Python script
    command: str       # e.g. "torchrun --nproc-per-node 4 repro.py"
    world_size: int
    template: str      # the RootCause value used


@dataclass(frozen=True)
class RankMap:
    """Culprit ranks of the diagnosed run and the reproducer ranks that play them."""
    culprits: tuple[int, ...]
    played_by: tuple[tuple[int, int], ...]  # (diagnosed rank, reproducer rank) where they differ
    dropped: tuple[int, ...]                # diagnosed culprits with no rank left to play them
    chosen: bool = False                    # the finding named none; the template picked who plays one


@dataclass(frozen=True)
class ReproSpec:
    """Everything a template may see: validated ints, enum members and text built from them."""
    template: RootCause
    mode: str | None
    world_size: int
    observed_world_size: int | None
    ranks: RankMap
    op_type: str
    observed_op_type: str | None
    seq: int | None
    fault_step: int
    observed_step: int | None
    observed_timeout_s: int | None
    signal: int
    signal_name: str


def render_reproducer(
    finding: Finding, facts: RunFacts, *, real_world_size: bool = False, max_world_size: int = 4
) -> Reproducer:
    spec = build_spec(finding, facts, real_world_size=real_world_size, max_world_size=max_world_size)
    command = f"torchrun --nproc-per-node {spec.world_size} repro.py"
    context = template_context(spec, command)
    script = _environment().get_template(f"{spec.template.value}.py.j2").render(context)
    ast.parse(script)  # a template bug must fail here, not in the user's terminal
    return Reproducer(script=script, command=command, world_size=spec.world_size, template=spec.template.value)


def build_spec(finding: Finding, facts: RunFacts, *, real_world_size: bool, max_world_size: int) -> ReproSpec:
    template = choose_template(finding)
    params = finding.params if isinstance(finding.params, dict) else {}
    observed_ws = _int_in(params.get("world_size"), MIN_WORLD_SIZE, MAX_RANK) or _int_in(
        facts.world_size, 1, MAX_RANK
    )
    culprits = _culprit_list(params.get("culprit_ranks", finding.culprit_ranks), observed_ws)
    world_size = _world_size(observed_ws, culprits, real_world_size=real_world_size,
                             max_world_size=_int_in(max_world_size, MIN_WORLD_SIZE, MAX_REAL_WORLD_SIZE) or 4)
    mode = _mode(template, params.get("mode"))
    observed_op = params.get("op_type") if params.get("op_type") in OP_TYPES else None
    observed_step = _int_in(params.get("step"), 0, MAX_STEP)
    signal = _int_in(params.get("signal"), 1, 64)
    signal = signal if signal in SIGNALS else DEFAULT_SIGNAL
    return ReproSpec(
        template=template,
        mode=mode,
        world_size=world_size,
        observed_world_size=observed_ws,
        ranks=remap_culprits(template, mode, culprits, world_size,
                             shrunk=world_size < (observed_ws or 0) or any(r >= world_size for r in culprits)),
        op_type=observed_op if observed_op in ISSUABLE_OPS else DEFAULT_OP,
        observed_op_type=observed_op,
        seq=_int_in(params.get("seq"), 0, 2**62),
        fault_step=observed_step if observed_step in REPRO_STEPS else DEFAULT_FAULT_STEP,
        observed_step=observed_step,
        observed_timeout_s=_int_in(params.get("timeout_s"), 1, MAX_TIMEOUT_S),
        signal=signal,
        signal_name=SIGNALS[signal],
    )


def choose_template(finding: Finding) -> RootCause:
    for name in (finding.reproducer, finding.root_cause):
        try:
            return RootCause(name)
        except ValueError:
            continue
    return RootCause.UNKNOWN


def remap_culprits(
    template: RootCause, mode: str | None, culprits: list[int], world_size: int, *, shrunk: bool
) -> RankMap:
    """Fit the diagnosed culprits into the reproducer's world; rank 0 stays rank 0.

    A shrunk world keeps the culprits a strict minority, so "the odd ranks out" stay identifiable.
    """
    if not culprits and template is RootCause.NETWORK_INIT and mode == "unreachable_store":
        # No rank singled out: every rank points at the dead store (a wrong MASTER_PORT for the job).
        return RankMap(culprits=tuple(range(world_size)), played_by=(), dropped=())
    chosen = not culprits
    if chosen:
        culprits = _default_culprits(template, mode, world_size)
    limit = max(1, (world_size - 1) // 2) if shrunk else world_size - 1
    kept, dropped = culprits[:limit], tuple(culprits[limit:])
    taken: set[int] = set()
    played_by: list[tuple[int, int]] = []
    for rank in kept:
        target = rank if rank < world_size and rank not in taken else _highest_free(taken, world_size)
        taken.add(target)
        if target != rank:
            played_by.append((rank, target))
    ranks = tuple(sorted(taken))
    if template is RootCause.LAUNCH_CONFIG and mode == "duplicate_gpu" and len(ranks) == 1:
        partner = min(r for r in range(world_size) if r not in taken)
        ranks = tuple(sorted((*ranks, partner)))  # a duplicate GPU is always shared by two ranks
    return RankMap(culprits=ranks, played_by=tuple(played_by), dropped=dropped, chosen=chosen and bool(ranks))


def template_context(spec: ReproSpec, command: str) -> dict[str, object]:
    culprits = spec.ranks.culprits
    context: dict[str, object] = {
        "command": command,
        "world_size": spec.world_size,
        "culprit_ranks": culprits,
        "culprit_text": _rank_list_text(culprits),
        "healthy_text": _rank_list_text(tuple(r for r in range(spec.world_size) if r not in culprits)),
        "mode": spec.mode,
        "op_type": spec.op_type,
        "fault_step": spec.fault_step,
        "signal": spec.signal,
        "signal_name": spec.signal_name,
        "provenance": provenance_lines(spec),
    }
    for value in _strings(context):
        if not _SAFE_TEXT.fullmatch(value):
            raise ValueError(f"unsafe text for a reproducer template: {value[:80]!r}")
    return context


def provenance_lines(spec: ReproSpec) -> list[str]:
    """How the diagnosed run maps onto this reproducer, as short comment lines."""
    lines = []
    if spec.observed_world_size and spec.observed_world_size != spec.world_size:
        lines.append(f"The diagnosed run had {spec.observed_world_size} ranks; this one has {spec.world_size}.")
    if spec.ranks.chosen:
        lines.append(f"The report named no culprit rank; {_rank_list_text(spec.ranks.culprits)} plays the part.")
    lines += [f"Diagnosed rank {old} is played by rank {new}." for old, new in spec.ranks.played_by]
    if spec.ranks.dropped:
        lines.append(f"Left out to keep the culprits a minority: diagnosed {_rank_list_text(spec.ranks.dropped)}.")
    if spec.observed_step is not None and spec.observed_step != spec.fault_step:
        lines.append(f"The fault hit at step {spec.observed_step}; here it hits at step {spec.fault_step}.")
    if spec.observed_op_type or spec.seq is not None:
        op = spec.observed_op_type or "a collective"
        where = f" #{spec.seq}" if spec.seq is not None else ""
        lines.append(f"Healthy ranks hung in {op}{where} of the diagnosed run.")
    if spec.observed_timeout_s:
        lines.append(f"The diagnosed run's timeout was {spec.observed_timeout_s} s; --timeout here defaults to 30 s.")
    return lines


@functools.cache
def _environment() -> jinja2.Environment:
    # Not the report's environment: this one writes Python, so nothing is HTML-escaped, and every
    # value that lands in code goes through `py` (repr) — see STYLE.md habit 8.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["py"] = repr
    return env


def _int_in(value: object, low: int, high: int) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    return None


def _culprit_list(value: object, observed_ws: int | None) -> list[int]:
    if not isinstance(value, list | tuple):
        return []
    high = observed_ws - 1 if observed_ws else MAX_RANK
    ranks = {r for r in (_int_in(v, 0, high) for v in value) if r is not None}
    return sorted(ranks)


def _world_size(observed: int | None, culprits: list[int], *, real_world_size: bool, max_world_size: int) -> int:
    wanted = observed or max(MIN_WORLD_SIZE, (culprits[-1] + 2) if culprits else MIN_WORLD_SIZE)
    cap = MAX_REAL_WORLD_SIZE if real_world_size else max_world_size
    return max(MIN_WORLD_SIZE, min(wanted, cap))


def _mode(template: RootCause, value: object) -> str | None:
    allowed = MODES.get(template)
    if not allowed:
        return None
    return value if value in allowed else allowed[0]


def _default_culprits(template: RootCause, mode: str | None, world_size: int) -> list[int]:
    if template is RootCause.NETWORK_INIT:
        return [world_size - 1]
    if template is RootCause.LAUNCH_CONFIG and mode == "duplicate_gpu":
        return [0, 1]  # a shared GPU always involves two ranks
    if template in LAST_RANK_DEFAULT:
        return [world_size - 1]
    if template is RootCause.UNKNOWN:
        return []
    return [0]


def _highest_free(taken: set[int], world_size: int) -> int:
    return max(r for r in range(1, world_size) if r not in taken)


def _rank_list_text(ranks: tuple[int, ...]) -> str:
    """(2,) -> "rank 2"; (0, 1) -> "ranks 0, 1"."""
    if not ranks:
        return "no rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
