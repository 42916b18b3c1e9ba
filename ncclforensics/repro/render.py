"""Render the reproducer of a finding's rule from validated fields only (DESIGN.md §6)."""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

import jinja2

from ncclforensics.diskcache import template_cache
from ncclforensics.errors import ForensicsError
from ncclforensics.model import OP_TYPES, Finding, RunFacts, rank_ranges
from ncclforensics.repro.catalog import TEMPLATE_DIR, Instead, Plan, plan_for

SIGNALS = {9: "SIGKILL", 7: "SIGBUS", 11: "SIGSEGV", 6: "SIGABRT", 15: "SIGTERM"}

# The collectives a template can issue on both gloo and nccl; any other OpType renders as ALLREDUCE.
ISSUABLE_OPS = ("ALLREDUCE", "BROADCAST", "ALLGATHER", "BARRIER", "REDUCE")
DEFAULT_OP = "ALLREDUCE"

MIN_WORLD_SIZE = 2
MAX_REAL_WORLD_SIZE = 4096  # --real-world-size still has to be launchable
MAX_RANK = 1_000_000
MAX_STEP = 1_000_000_000
MAX_TIMEOUT_S = 7 * 24 * 3600
REPRO_STEPS = range(1, 7)  # a diagnosed step in here is kept; later ones fail at DEFAULT_FAULT_STEP
DEFAULT_FAULT_STEP = 3
DEFAULT_TIMEOUT_S = 8  # the script's --timeout default: a hang shows in seconds (and every rank still meets in init)
SCRIPT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\.py")

# Every string that reaches a template is built from validated ints, enum members and our own rule
# files; this is the last check that nothing else slipped in (no quotes, no newlines, no backslashes).
_SAFE_TEXT = re.compile(r"[A-Za-z0-9_ ,.;:()#/+=<>\[\]'@*%&?!–…-]*")


class NoReproducer(ForensicsError):
    """The verdict has no reproducer (no rule, or a rule whose mechanism a script cannot recreate)."""

    exit_code = 2


@dataclass(frozen=True)
class Reproducer:
    script: str               # the rendered Python script
    command: str              # e.g. "torchrun --nproc-per-node 4 repro.py"
    world_size: int
    template: str             # the template used, e.g. "rank_divergence/rank_only_work.py.j2"
    rule: str                 # what the analyzer should report on the script's logs ...
    root_cause: str
    culprit_ranks: tuple[int, ...]
    op_type: str | None       # ... the collective the others hang in, for hangs
    fix: str                  # the report's top fix for this verdict
    demonstrates: str         # what --fixed applies: `fix`, or the mitigation named in its place


@dataclass(frozen=True)
class RankMap:
    """Culprit ranks of the diagnosed run and the reproducer ranks that play them."""
    culprits: tuple[int, ...]
    played_by: tuple[tuple[int, int], ...]  # (diagnosed rank, reproducer rank) where they differ
    dropped: tuple[int, ...]                # diagnosed culprits with no rank left to play them
    chosen: bool = False                    # the finding named none; the script picked who plays one
    every: bool = False                     # the finding named some ranks; the mechanism fails on all


@dataclass(frozen=True)
class ReproSpec:
    """Everything a template may see: validated ints, enum members and text from our own rule files."""
    plan: Plan
    variant: dict[str, object]
    variant_seen: dict[str, object]  # the finding's own value of each variant param, when a safe token
    world_size: int
    observed_world_size: int | None
    ranks: RankMap
    op_type: str
    observed_op_type: str | None
    seq: int | None
    fault_step: int
    observed_step: int | None
    signal: int | None
    fix: str
    instead: Instead | None


def render_reproducer(
    finding: Finding, facts: RunFacts, *, real_world_size: bool = False, max_world_size: int = 4,
    script_name: str = "repro.py",
) -> Reproducer:
    """The script that recreates the finding's mechanism; NoReproducer when its rule has none."""
    plan = plan_for(finding.rule)
    if plan is None:
        raise NoReproducer("no reproducer: the verdict names no mechanism (no rule fired) to recreate")
    if plan.script is None:  # the first sentence says why; the rule file has the rest
        raise NoReproducer(f"no reproducer for {plan.rule.id}: {plan.none.split('. ')[0].rstrip('.')}")
    if not SCRIPT_NAME.fullmatch(script_name):
        script_name = "repro.py"
    spec = build_spec(plan, finding, facts, real_world_size=real_world_size, max_world_size=max_world_size)
    command = f"torchrun --nproc-per-node {spec.world_size} {script_name}"
    context = template_context(spec, command=command, script_name=script_name)
    module = _environment().get_template(plan.script).make_module(context)
    script = str(module)
    ast.parse(script)  # a template bug must fail here, not in the user's terminal
    # a script whose healthy ranks hang sets `stuck_op`: the OpType they wait in, part of what it promises
    stuck_op = getattr(module, "stuck_op", None)
    return Reproducer(
        script=script, command=command, world_size=spec.world_size, template=plan.script, rule=plan.rule.id,
        root_cause=plan.rule.root_cause.value, culprit_ranks=expected_culprits(spec),
        op_type=stuck_op if stuck_op in OP_TYPES else None, fix=spec.fix,
        demonstrates=spec.instead.demo if spec.instead else spec.fix,
    )


def build_spec(plan: Plan, finding: Finding, facts: RunFacts, *, real_world_size: bool,
               max_world_size: int) -> ReproSpec:
    params = finding.params if isinstance(finding.params, dict) else {}
    observed_ws = _int_in(params.get("world_size"), MIN_WORLD_SIZE, MAX_RANK) or _int_in(
        facts.world_size, 1, MAX_RANK
    )
    culprits = _culprit_list(params.get("culprit_ranks", finding.culprit_ranks), observed_ws)
    cap = _int_in(max_world_size, MIN_WORLD_SIZE, MAX_REAL_WORLD_SIZE) or 4
    world_size = _world_size(observed_ws, culprits, plan, real_world_size=real_world_size, max_world_size=cap)
    variant = plan.variant_values(params)
    fix = plan.top_fix(variant)
    observed_op = params.get("op_type") if params.get("op_type") in OP_TYPES else None
    observed_step = _int_in(params.get("step"), 0, MAX_STEP)
    signal = variant.get("signal") if isinstance(variant.get("signal"), int) else None
    shrunk = world_size < (observed_ws or 0) or any(r >= world_size for r in culprits)
    return ReproSpec(
        plan=plan,
        variant=variant,
        variant_seen={k: v for k, v in params.items() if k in plan.variants and _token(v)},
        world_size=world_size,
        observed_world_size=observed_ws,
        ranks=remap_culprits(plan, culprits, world_size, shrunk=shrunk),
        op_type=observed_op if observed_op in ISSUABLE_OPS else DEFAULT_OP,
        observed_op_type=observed_op,
        seq=_int_in(params.get("seq"), 0, 2**62),
        fault_step=observed_step if observed_step in REPRO_STEPS else DEFAULT_FAULT_STEP,
        observed_step=observed_step,
        signal=signal,
        fix=fix.title,
        instead=plan.instead_for(fix),
    )


def remap_culprits(plan: Plan, culprits: list[int], world_size: int, *, shrunk: bool) -> RankMap:
    """Fit the diagnosed culprits into the reproducer's world; rank 0 stays rank 0.

    A shrunk world keeps the culprits a strict minority, so "the odd ranks out" stay identifiable.
    """
    default = plan.options.get("default_culprits", "last")
    if plan.options.get("every_rank"):  # the mechanism fails on every rank, whoever the report named
        return RankMap(culprits=tuple(range(world_size)), played_by=(), dropped=(), chosen=not culprits,
                       every=bool(culprits) and len(culprits) < world_size)
    if not culprits:
        if default == "all":
            return RankMap(culprits=tuple(range(world_size)), played_by=(), dropped=(), chosen=True)
        if default == "none":
            return RankMap(culprits=(), played_by=(), dropped=())
    chosen = not culprits
    if chosen:
        culprits = [0] if default == "first" else [world_size - 1]
    least = plan.options.get("min_culprits", 1)
    limit = max(least, max(1, (world_size - 1) // 2) if shrunk else world_size - 1)
    kept, dropped = culprits[:limit], tuple(culprits[limit:])
    taken: set[int] = set()
    played_by: list[tuple[int, int]] = []
    for rank in kept:
        target = rank if rank < world_size and rank not in taken else _highest_free(taken, world_size)
        taken.add(target)
        if target != rank:
            played_by.append((rank, target))
    ranks = tuple(sorted(taken))
    while len(ranks) < least:  # e.g. a duplicate GPU is always shared by two ranks
        ranks = tuple(sorted((*ranks, min(r for r in range(world_size) if r not in ranks))))
    return RankMap(culprits=ranks, played_by=tuple(played_by), dropped=dropped, chosen=chosen and bool(ranks))


def expected_culprits(spec: ReproSpec) -> tuple[int, ...]:
    """The culprit ranks the analyzer names on the script's logs."""
    if spec.plan.expect_culprits == "none":
        return ()
    return spec.ranks.culprits


def template_context(spec: ReproSpec, *, command: str, script_name: str) -> dict[str, object]:
    culprits = spec.ranks.culprits
    plan = spec.plan
    context: dict[str, object] = {
        "rule": plan.rule.id,
        "root_cause": plan.rule.root_cause.value,
        "command": command,
        "script_name": script_name,
        "world_size": spec.world_size,
        "culprit_ranks": culprits,
        "culprit_text": _rank_list_text(culprits),
        "healthy_text": _rank_list_text(tuple(r for r in range(spec.world_size) if r not in culprits)),
        "others_text": _others_text(tuple(r for r in range(spec.world_size) if r not in culprits)),
        "s_others": "s" if spec.world_size - len(culprits) == 1 else "",  # "the other rank waits"
        "s_culprits": "s" if len(culprits) == 1 else "",                   # "rank 0 runs", "ranks 0, 1 run"
        "expected_culprits": _rank_list_text(expected_culprits(spec)),
        "op_type": spec.op_type,
        "observed_op_type": spec.observed_op_type,
        "observed_seq": spec.seq,
        "stuck_op": None,  # a hang template sets it (top-level `set`): the OpType the healthy ranks wait in
        "fault_step": spec.fault_step,
        "signal": spec.signal,
        "signal_name": SIGNALS.get(spec.signal or 0),
        "variant": dict(spec.variant),
        "options": {k: v for k, v in plan.options.items() if isinstance(v, bool | int | str)},
        "fix_title": spec.fix,
        "instead": {"demo": spec.instead.demo, "why": spec.instead.why} if spec.instead else None,
        "default_timeout": DEFAULT_TIMEOUT_S,
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
    if spec.ranks.chosen and spec.plan.expect_culprits != "none":
        verb = "plays" if len(spec.ranks.culprits) == 1 else "play"
        lines.append(f"The report named no culprit rank; {_rank_list_text(spec.ranks.culprits)} {verb} the part.")
    if spec.ranks.every:
        lines.append("The report named fewer ranks, but every rank runs this mechanism, so every rank fails.")
    lines += [f"Diagnosed rank {old} is played by rank {new}." for old, new in spec.ranks.played_by]
    if spec.ranks.dropped:
        lines.append(f"Left out to keep the culprits a minority: diagnosed {_rank_list_text(spec.ranks.dropped)}.")
    if spec.observed_step is not None and spec.observed_step != spec.fault_step:
        lines.append(f"The fault hit at step {spec.observed_step}; here it hits at step {spec.fault_step}.")
    for key in spec.plan.variants:
        seen = spec.variant_seen.get(key)
        if seen is not None and seen != spec.variant[key]:
            lines.append(f"The diagnosis says {key} = {seen}, which this script does not recreate; "
                         f"it plays {key} = {spec.variant[key]}.")
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
        bytecode_cache=template_cache(),
    )
    env.filters["py"] = repr
    env.filters["a"] = lambda word: f"{_article(str(word))} {word}"
    env.filters["wrap"] = _wrap
    env.filters["item"] = lambda text: textwrap.fill(" ".join(text.split()), width=100, initial_indent="  - ",
                                                      subsequent_indent="    ", break_on_hyphens=False)
    return env


def _wrap(text: str, width: int = 100) -> str:
    """Refill each blank-line-separated paragraph; lines indented by 4+ spaces (commands) stay as they are."""
    out = []
    for para in re.split(r"\n\s*\n", text.strip("\n")):
        lines = para.splitlines()
        if all(line.startswith(("    ", "  - ")) for line in lines):
            out.append("\n".join(lines))
        else:
            out.append(textwrap.fill(" ".join(line.strip() for line in lines), width=width,
                                     break_on_hyphens=False, break_long_words=False))
    return "\n\n".join(out)


def _article(word: str | None) -> str:
    """'an' before a vowel sound: an ALLREDUCE, an ALLGATHER; a BARRIER, a BROADCAST."""
    return "an" if (word or "x")[0].upper() in "AEIOU" else "a"


def _token(value: object) -> bool:
    """A short identifier or small int, fit to quote in a comment line."""
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) < 10**6
    return isinstance(value, str) and re.fullmatch(r"[a-z0-9_]{1,30}", value) is not None


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


def _world_size(observed: int | None, culprits: list[int], plan: Plan, *, real_world_size: bool,
                max_world_size: int) -> int:
    least = max(MIN_WORLD_SIZE, int(plan.options.get("min_world_size", MIN_WORLD_SIZE)))
    wanted = observed or max(least, (culprits[-1] + 2) if culprits else least)
    cap = MAX_REAL_WORLD_SIZE if real_world_size else max(max_world_size, least)
    return max(least, min(wanted, cap))


def _highest_free(taken: set[int], world_size: int) -> int:
    return max(r for r in range(1, world_size) if r not in taken)


def _rank_list_text(ranks: tuple[int, ...]) -> str:
    """(2,) -> "rank 2"; (0, 1) -> "ranks 0, 1"; (0, 1, 2, 3) -> "ranks 0–3"."""
    if not ranks:
        return "no rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks, limit=6, count=False)


def _others_text(ranks: tuple[int, ...]) -> str:
    """(1,) -> "the other rank (rank 1)"; (1, 2) -> "the other ranks (ranks 1, 2)"."""
    return f"the other rank{'s' if len(ranks) != 1 else ''} ({_rank_list_text(ranks)})"


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
