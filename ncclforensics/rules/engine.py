"""Evaluate the rules, order their findings causally (root, cascade, context), pick the verdict."""

from __future__ import annotations

import datetime as dt
import string
from collections import defaultdict
from dataclasses import dataclass, field

from ncclforensics.model import Collective, Evidence, Finding, Fix, Role, RootCause
from ncclforensics.rules.context import Context, attempt_of
from ncclforensics.rules.detectors import DETECTORS, Hit
from ncclforensics.rules.loader import Rule, load_rules
from ncclforensics.times import JSON_SECONDS, utc_text

CASCADE_SLACK = dt.timedelta(seconds=2)
# a finding explains another (makes it a cascade) only when it is at least this credible relative to it
CREDIBLE = 0.6


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def _format(template: str, fields: dict) -> str:
    """`template` with `fields`; `{x_lc}` is field x with a lower-case first letter (mid-sentence)."""
    derived = {f"{k}_lc": v[:1].lower() + v[1:] for k, v in fields.items() if isinstance(v, str)}
    try:
        return string.Formatter().vformat(template, (), _Blank({**derived, **fields}))
    except (ValueError, IndexError, KeyError):
        return template


def evidence_of(rows: list[dict]) -> list[Evidence]:
    return [Evidence(file=r["file"], line=int(r["line"] or 0), text=r["text"] or "", rank=r["rank"],
                     host=r["host"], ts=utc_text(r["ts"], JSON_SECONDS), kind=r["kind"], role=r.get("role"))
            for r in rows]


def _fixes(rule: Rule, hit: Hit) -> list[Fix]:
    out = []
    for f in rule.fixes:
        if all(hit.params.get(k) in (v if isinstance(v, list) else [v]) for k, v in f.when.items()):
            out.append(Fix(title=f.title, why=f.why, code=f.code))
    return out


def finding_of(rule: Rule, hit: Hit, ctx: Context) -> Finding:
    params = {k: v for k, v in hit.params.items() if v is not None}
    col = hit.collective or Collective()
    params.setdefault("culprit_ranks", hit.culprits)
    params.setdefault("world_size", ctx.world_size)
    if col.op_type:
        params.setdefault("op_type", col.op_type)
    if col.seq is not None:
        params.setdefault("seq", col.seq)
    if rule.reproducer_mode and "mode" not in hit.params:
        params["mode"] = rule.reproducer_mode
    hosts = hit.hosts or sorted({ctx.rank_hosts[r] for r in hit.culprits if r in ctx.rank_hosts})
    return Finding(
        root_cause=rule.root_cause, rule=rule.id, title=_format(rule.title, hit.fields),
        message=_format(rule.message, hit.fields), confidence=round(min(0.99, rule.confidence * hit.confidence), 2),
        culprit_ranks=list(hit.culprits), culprit_hosts=hosts, evidence=evidence_of(hit.evidence),
        collective=col, ts=hit.ts, fixes=_fixes(rule, hit), doc=dict(rule.doc),
        reproducer=rule.reproducer or rule.root_cause.value, params=params, yields_to=rule.yields_to,
        attempt=_attempt(hit.evidence),
    )


def _attempt(rows: list[dict]) -> int | None:
    """The earliest torchrun restart attempt the rows come from, None if none says."""
    attempts = [a for r in rows if (a := attempt_of(r)) is not None]
    return min(attempts) if attempts else None


def run_rule(rule: Rule, ctx: Context) -> tuple[list[Finding], list[str]]:
    """One rule's findings, and the notes its detectors had to tell."""
    findings: list[Finding] = []
    notes: list[str] = []
    for m in rule.matches:
        for hit in DETECTORS[m.detector](ctx, **m.params):
            notes.extend(hit.notes)
            if hit.confidence > 0:  # a hit without confidence only had something to say
                findings.append(finding_of(rule, hit, ctx))
    return findings, notes


@dataclass
class Evaluation:
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)


def evaluate(ctx: Context) -> Evaluation:
    """Every rule's findings, and the notes their detectors had to tell."""
    findings: list[Finding] = []
    fallback: set[str] = set()
    notes: list[str] = []
    for rule in load_rules():
        found, said = run_rule(rule, ctx)
        findings += found
        notes += said
        if rule.fallback:
            fallback.add(rule.id)
    # a class-level finding stands only where no mechanism rule of its class explains the run
    mechanism = {f.root_cause for f in findings if f.rule not in fallback}
    findings = [f for f in findings if f.rule not in fallback or f.root_cause not in mechanism]
    return Evaluation(_dedupe(findings), list(dict.fromkeys(notes)))


def _dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per (class, culprits): the first (highest-priority) rule keeps it."""
    seen: set[tuple] = set()
    out = []
    for f in findings:
        key = (f.root_cause, tuple(f.culprit_ranks))
        if key in seen:
            continue
        seen.add(key)
        out.append(f)
    return out


def order(findings: list[Finding]) -> Finding | None:
    """Mark cascades; return the root (the earliest failure that explains the rest)."""
    by_class: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_class[f.root_cause.value].append(f)
    for f in findings:
        for cls in f.yields_to:
            for g in by_class.get(cls, []):
                if g is f or g.confidence < CREDIBLE * f.confidence:
                    continue  # a far weaker finding explains nothing
                if _weak_only(g) and not _weak_only(f):
                    continue  # an exit code ends every failed run: it cannot explain a finding of substance
                if f.attempt is not None and g.attempt is not None and g.attempt > f.attempt:
                    continue  # a restart's failure (the GPU still held, the port still bound) follows the first
                if f.root_cause.value in g.yields_to and _stays(f, g, findings):
                    continue  # each would explain the other: the stronger (else the earlier) stays
                if f.ts is None or g.ts is None or g.ts <= f.ts + CASCADE_SLACK:
                    f.role = Role.CASCADE
                    break
            if f.role is Role.CASCADE:
                break
    live = [f for f in findings if f.role is not Role.CASCADE]
    if not live:
        return None
    best = max(f.confidence for f in live)
    contenders = [f for f in live if f.confidence >= best - 0.2]
    root = max(contenders, key=lambda f: f.confidence)
    timed = sorted((f for f in contenders if f.ts is not None and (_weak_only(root) or not _weak_only(f))),
                   key=lambda f: f.ts)
    if timed and timed[0].confidence >= root.confidence - 0.2 and timed[0] is not root:
        if root.ts is None or timed[0].ts + CASCADE_SLACK < root.ts:
            root = timed[0]
    for f in live:
        f.role = Role.ROOT if f is root else Role.CONTEXT
    return root


def _weak_only(f: Finding) -> bool:
    """Whether a finding rests on weak evidence alone (an exit code, a launcher's report of one:
    DESIGN.md §3): every rank of a failed run exits non-zero, the waiting ones too, so such a finding
    may be the verdict where nothing else is, but it never makes another finding its consequence."""
    return f.params.get("strength") == 1


def _stays(f: Finding, g: Finding, findings: list[Finding]) -> bool:
    """Of two findings that would each explain the other, whether f is the one that stays: the more
    credible; at equal confidence the earlier (by time, else by rule order). Exactly one stays: two
    cascades of each other would leave the run without a root."""
    if f.confidence != g.confidence:
        return f.confidence > g.confidence
    if f.ts is not None and g.ts is not None and f.ts != g.ts:
        return f.ts < g.ts
    if (f.ts is None) != (g.ts is None):
        return f.ts is not None  # a finding placed in time is the better account of the order
    return findings.index(f) < findings.index(g)


def unknown_finding(ctx: Context) -> Finding:
    """The verdict when no rule explains the run: say what would settle it; never invent a culprit."""
    s = ctx.stuck
    ws = ctx.world_size
    if not ctx.causes() and not ctx.first_symptoms(1):
        why = ("No line here shows a failure (no error, timeout, crash or kernel fault): the logs may end "
               "before it, or hold only the launcher's output.")
        need = ("the end of every rank's log (torchrun --log-dir or --tee output) and each host's kernel log "
                "(dmesg -T)")
    else:
        why = "The failure lines here are consequences of another failure that left no trace in these logs."
        need = ("logs of the ranks missing here, dmesg/kern.log of each host (Xid, OOM killer), "
                "and a Flight Recorder dump (TORCH_NCCL_TRACE_BUFFER_SIZE)")
    return Finding(
        root_cause=RootCause.UNKNOWN, rule="", title="Not enough evidence for a root cause",
        message=why, confidence=0.0, collective=Collective(pg=s.pg, op_type=s.op, seq=s.seq),
        doc={"what_would_settle_it": need}, reproducer=None, params={"world_size": ws},
    )
