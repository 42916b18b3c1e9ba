"""Analysis -> the report's typed view-model, which its templates read (never a dataframe)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from markupsafe import Markup

from ncclforensics.incident import EvidenceContext, FrameGroup, IncidentContext, TailLine
from ncclforensics.model import CAUSES, Evidence, Finding, rank_ranges
from ncclforensics.report.chartdata import STATE_COLORS, STATE_TEXT, STATES, FrontierView, frontier_view
from ncclforensics.report.richtext import to_html, to_inline_html
from ncclforensics.report.timeline import TimelineView, timeline_view
from ncclforensics.rules.loader import DOC_SECTIONS, rule_by_id
from ncclforensics.times import READABLE, utc_text
from ncclforensics.words import collective_words, confidence_word, culprit_text, cut, human_bytes, names

DOC_HEADINGS = {
    "what_it_detects": "What the rule saw",
    "why_it_happens": "Why this happens",
    "known_false_positives": "When this could be wrong",
    "what_would_settle_it": "What would settle it",
}
ROLE_TEXT = {
    "root": "root cause",
    "cascade": "consequence of the root",
    "context": "context",
}
MAX_EVIDENCE = 12
MAX_FILES = 40


# -- view-model ------------------------------------------------------------------------
@dataclass(frozen=True)
class ContextLineView:
    no: int
    text: str
    hit: bool


@dataclass(frozen=True)
class EvidenceView:
    where: str  # file:line
    rank: str
    host: str
    time: str
    kind: str
    text: str
    context: tuple[ContextLineView, ...] = ()  # ±N lines of its file, the line itself marked
    context_note: str = ""  # why there are none


@dataclass(frozen=True)
class DocSection:
    heading: str
    html: Markup  # the rule doc's Markdown, rendered with every tag of its text escaped


@dataclass(frozen=True)
class FixView:
    title: str
    why: Markup
    code: str


@dataclass(frozen=True)
class TailLineView:
    rank: str
    where: str  # file:line
    time: str
    text: str
    event: bool
    skipped: int


@dataclass(frozen=True)
class FrameGroupView:
    who: str
    what: str
    where: str
    culprit: bool
    frames: tuple[str, ...]  # "train/make_sample.py:68 in sync_gradients", innermost last
    code: tuple[str, ...]  # the source line of each frame, when a traceback printed it


@dataclass(frozen=True)
class IncidentView:
    radius: int
    tail: tuple[TailLineView, ...]
    tail_order: str
    tail_ranks: str
    frames: tuple[FrameGroupView, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class FindingView:
    role: str
    role_text: str
    root_cause: str
    rule: str
    title: str
    message: str
    confidence: str
    culprits: str
    evidence: tuple[EvidenceView, ...]


@dataclass(frozen=True)
class VerdictView:
    root_cause: str
    plain: str
    title: str
    summary: str
    rule: str
    confidence: str  # "0.90"
    confidence_word: str
    culprits: str
    has_culprit: bool
    collective: str
    first_failure: str
    what_would_change: Markup  # a rule doc's Markdown or the analyzer's note, rendered
    what_would_change_label: str


@dataclass(frozen=True)
class ReproView:
    command: str
    script: str
    world_size: int | None


@dataclass(frozen=True)
class FileCount:
    file: str
    events: int


@dataclass(frozen=True)
class FactsView:
    path: str
    files: int
    lines: str
    size: str
    world_size: str
    ranks_seen: str
    hosts: str
    n_hosts: int
    versions: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    files_with_events: tuple[FileCount, ...]
    more_files: int
    skipped: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class StateKey:
    state: str
    label: str
    color: str


@dataclass(frozen=True)
class ReportView:
    title: str
    verdict: VerdictView
    doc: tuple[DocSection, ...]
    evidence: tuple[EvidenceView, ...]
    more_evidence: int
    fixes: tuple[FixView, ...]
    findings: tuple[FindingView, ...]
    facts: FactsView
    repro: ReproView | None
    frontier: FrontierView
    states: tuple[StateKey, ...]  # the legend: only the states some rank has
    no_seq_culprits: str  # culprit ranks the frontier has no SeqNum for ("rank 14"), else ""
    timeline: TimelineView
    incident: IncidentView


# -- builders ----------------------------------------------------------------------------
def _evidence(e: Evidence, ctx: EvidenceContext | None = None) -> EvidenceView:
    lines = tuple(ContextLineView(x.no, x.text, x.hit) for x in ctx.lines) if ctx is not None else ()
    return EvidenceView(
        where=f"{e.file}:{e.line}", rank="" if e.rank is None else str(e.rank), host=e.host or "",
        time=utc_text(e.ts, READABLE) or "", kind=e.kind or "", text=cut(e.text, 600, fold=False), context=lines,
        context_note=ctx.note if ctx is not None else "",
    )


def _verdict_evidence(v: Finding, incident: IncidentContext) -> tuple[EvidenceView, ...]:
    """The verdict's evidence lines, each once (console and per-rank copies of one line are two lines)."""
    by_spot = {(c.file, c.line): c for c in incident.evidence}
    seen: set[tuple[str, int]] = set()
    out = []
    for e in v.evidence:
        if (e.file, e.line) in seen:
            continue
        seen.add((e.file, e.line))
        out.append(_evidence(e, by_spot.get((e.file, e.line))))
    return tuple(out)


def _tail_line(t: TailLine) -> TailLineView:
    return TailLineView(rank="" if t.rank is None else str(t.rank), where=f"{t.file}:{t.no}", time=t.ts,
                        text=t.text, event=t.event, skipped=t.skipped)


def _frame_group(g: FrameGroup) -> FrameGroupView:
    return FrameGroupView(
        who=g.who, what=g.what, where=g.where, culprit=g.culprit,
        frames=tuple(f"{f.file}:{f.line} in {f.fn}" for f in g.frames), code=tuple(f.code for f in g.frames),
    )


def _incident(incident: IncidentContext) -> IncidentView:
    return IncidentView(
        radius=incident.radius, tail=tuple(_tail_line(t) for t in incident.tail), tail_order=incident.tail_order,
        tail_ranks=incident.tail_ranks, frames=tuple(_frame_group(g) for g in incident.frames),
        notes=incident.notes,
    )


def _doc(f: Finding, *, shown: str) -> tuple[DocSection, ...]:
    """The rule's doc sections; the one the verdict card already shows (`shown`) is not repeated."""
    rule = rule_by_id(f.rule) if f.rule else None
    doc = dict(rule.doc) if rule is not None else {}
    doc = {**f.doc, **doc}
    keys = [k for k in (*DOC_SECTIONS, "what_would_settle_it") if doc.get(k) and str(doc[k]).strip() != shown]
    return tuple(DocSection(DOC_HEADINGS.get(k, k), to_html(str(doc[k]).strip())) for k in keys)


def _finding(f: Finding) -> FindingView:
    return FindingView(
        role=f.role.value, role_text=ROLE_TEXT.get(f.role.value, f.role.value), root_cause=f.root_cause.value,
        rule=f.rule or "—", title=cut(f.title, 240, fold=False), message=cut(f.message, 1200, fold=False),
        confidence=f"{f.confidence:.2f}", culprits=culprit_text(f),
        evidence=tuple(_evidence(e) for e in f.evidence[:MAX_EVIDENCE]),
    )


def _verdict(diag) -> VerdictView:
    v: Finding = diag.verdict
    ff = diag.first_failure
    first = ""
    if ff is not None:
        who = f", rank {ff.rank}" if ff.rank is not None else ""
        who += f" on {ff.host}" if ff.host else ""
        first = f"{ff.file}:{ff.line}" + (f" at {utc_text(ff.ts, READABLE) or ff.ts}" if ff.ts else "") + who
    if diag.missing:
        change, label = diag.missing, "To be surer"
    else:
        change, label = v.doc.get("known_false_positives", ""), "When this could be wrong"
    return VerdictView(
        root_cause=v.root_cause.value, plain=CAUSES[v.root_cause].plain,
        title=cut(v.title, 240, fold=False), summary=cut(v.message, 1500, fold=False), rule=v.rule or "",
        confidence=f"{v.confidence:.2f}", confidence_word=confidence_word(v.confidence),
        culprits=culprit_text(v), has_culprit=bool(v.culprit_ranks or v.culprit_hosts),
        collective=collective_words(v), first_failure=first,
        what_would_change=to_inline_html(change), what_would_change_label=label,
    )


def _facts(analysis) -> FactsView:
    f = analysis.diagnosis.facts
    ev = analysis.ingest.events
    counts: list[FileCount] = []
    if not ev.is_empty():
        per = ev.group_by("file").len().sort(["len", "file"], descending=[True, False])
        counts = [FileCount(r["file"], r["len"]) for r in per.iter_rows(named=True)]
    seen = f"{len(f.ranks_seen)}" + (f" of {f.world_size}" if f.world_size else "")
    if f.ranks_seen:
        seen += f": {'rank' if len(f.ranks_seen) == 1 else 'ranks'} {rank_ranges(f.ranks_seen, count=False)}"
    return FactsView(
        path=f.path, files=f.files, lines=f"{f.lines:,}", size=human_bytes(f.bytes),
        world_size=str(f.world_size) if f.world_size else "unknown", ranks_seen=seen,
        hosts=names(f.hosts, 24) or "none named in the logs", n_hosts=len(f.hosts),
        versions=tuple(sorted(f.versions.items())), env=tuple(sorted(f.env.items())),
        files_with_events=tuple(counts[:MAX_FILES]), more_files=max(0, len(counts) - MAX_FILES),
        skipped=tuple((s.file, s.reason) for s in f.skipped), notes=tuple(f.notes),
    )


def _states(frontier: FrontierView) -> tuple[StateKey, ...]:
    present = {s.state for s in frontier.strip}
    return tuple(StateKey(s, STATE_TEXT[s], STATE_COLORS[s]) for s in STATES if s in present)


def _no_seq_culprits(frontier: FrontierView) -> str:
    if not frontier.pgs:
        return ""
    placed = {r.rank for pg in frontier.pgs for r in pg.ranks if r.culprit}
    missing = [c for c in frontier.culprits if c not in placed]
    if not missing:
        return ""
    return ("rank " if len(missing) == 1 else "ranks ") + rank_ranges(missing, count=False)


def build_view(analysis, repro=None, *, incident: IncidentContext) -> ReportView:
    diag = analysis.diagnosis
    v = diag.verdict
    all_evidence = _verdict_evidence(v, incident)
    evidence = all_evidence[:MAX_EVIDENCE]
    rv = None
    if repro is not None:
        rv = ReproView(command=repro.command, script=repro.script, world_size=getattr(repro, "world_size", None))
    title = f"{v.root_cause.value}: {cut(v.title, 100, fold=False)} — {diag.facts.path}"
    verdict = _verdict(diag)
    frontier = frontier_view(analysis)
    shown = (diag.missing or v.doc.get("known_false_positives", "")).strip()  # the verdict card's caveat
    return ReportView(
        title=title, verdict=verdict, doc=_doc(v, shown=shown), evidence=evidence,
        more_evidence=max(0, len(all_evidence) - MAX_EVIDENCE),
        fixes=tuple(FixView(x.title, to_inline_html(x.why), textwrap.dedent(x.code).strip("\n")) for x in v.fixes),
        findings=tuple(_finding(f) for f in diag.findings), facts=_facts(analysis), repro=rv,
        frontier=frontier, states=_states(frontier), no_seq_culprits=_no_seq_culprits(frontier),
        timeline=timeline_view(analysis), incident=_incident(incident),
    )
