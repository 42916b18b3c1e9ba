"""One call from a path to a Diagnosis: ingest, align, rules, the run facts around them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ncclforensics.console import plural
from ncclforensics.errors import NoInputError
from ncclforensics.events import IngestResult, build_events
from ncclforensics.ingest.discover import display_name
from ncclforensics.model import Diagnosis, Evidence, Finding, RootCause, RunFacts
from ncclforensics.rules import engine
from ncclforensics.rules.context import Context, extra
from ncclforensics.severalruns import several_runs_check


@dataclass
class Analysis:
    ingest: IngestResult
    context: Context
    diagnosis: Diagnosis
    several_runs: str | None = None  # the warning when the folder looks like several runs
    # what was analyzed (a path, several of one run, "-"), for reading context lines back (ncclforensics.incident)
    path: str | Path | list[str | Path] | None = None


def analyze_path(path: str | Path | list[str | Path], *, progress=None, check_runs: bool = True) -> Analysis:
    """Analyze a run: a folder, file or archive, or several paths of one run. With check_runs, a
    folder whose logs look like several runs gets a warning in run.notes (and `several_runs`)."""
    res = build_events(path, progress=progress, aside=several_runs_check(path) if check_runs else None)
    if res.files == 0 and res.events.is_empty():
        raise NoInputError(no_input_message(" ".join(map(str, path)) if isinstance(path, list) else str(path), res))
    analysis = analyze_events(res)
    note_several_runs(analysis)
    analysis.path = path
    return analysis


def note_several_runs(analysis: Analysis) -> str | None:
    """The check's warning when the folder's logs tell several runs apart (several_runs_check, done
    beside the reading), put first in the run's notes (the report's verdict card) and in
    `analysis.several_runs`. None for one run, a file, an archive, or no check."""
    aside = analysis.ingest.aside
    value = aside.result() if aside is not None else None
    warning = value if isinstance(value, str) and value else None
    if warning:
        analysis.ingest.notes.insert(0, warning)
        analysis.diagnosis.facts.notes.insert(0, warning)
    analysis.several_runs = warning
    return warning


def looks_like_logs(res: IngestResult) -> bool:
    """Whether any line looked like a log of a PyTorch run: an event of a PyTorch, NCCL, launcher,
    kernel or scheduler signature, or one that names its rank. The `app` signatures alone (words such
    as "validation", "checkpoint", "step 5") match ordinary text, so they do not count."""
    df = res.events
    return df.filter((pl.col("source").cast(pl.Utf8) != "app") | pl.col("rank").is_not_null()).height > 0


def no_input_message(label: str, res: IngestResult) -> str:
    """One line: why nothing under `label` could be analysed."""
    shown = "; ".join(f"{s.file}: {s.reason}" for s in res.skipped[:3])
    more = f"; +{len(res.skipped) - 3:,} more" if len(res.skipped) > 3 else ""
    skipped = f"skipped {plural(len(res.skipped), 'file')}"
    if res.files == 0 and res.skipped:
        text = (f"no readable log files in {label}: nothing looked like a PyTorch, NCCL or launcher log; "
                f"{skipped} ({shown}{more})")
    elif res.files == 0:
        text = f"no log files in {label}: it is empty"
    else:
        read = f"read {plural(res.files, 'file')}, {plural(res.lines, 'line')}"
        text = (f"no line in {label} looked like a PyTorch, NCCL or launcher log "
                f"({read}{'; ' + skipped if res.skipped else ''})")
    return display_name(text)

def analyze_events(res: IngestResult) -> Analysis:
    ctx = Context.build(res.events)
    evaluation = engine.evaluate(ctx)
    findings = evaluation.findings
    root = engine.order(findings)
    if root is None:
        root = engine.unknown_finding(ctx)
        findings = [root, *findings]
    findings.sort(key=lambda f: (f.role.value != "root", f.role.value == "cascade", -f.confidence))
    facts = run_facts(res, ctx, evaluation.notes)
    missing = root.doc.get("what_would_settle_it") if root.root_cause is RootCause.UNKNOWN else _missing_logs(ctx)
    diag = Diagnosis(facts=facts, verdict=root, findings=findings, ranks=rank_rows(ctx, root),
                     first_failure=_first_failure(root), missing=missing)
    return Analysis(ingest=res, context=ctx, diagnosis=diag)


def _first_failure(root: Finding) -> Evidence | None:
    """The root's own first line: a culprit's cause or work line, never a healthy rank's timeout (a
    symptom). With only symptoms in the evidence, there is no first failure to point at."""
    own = [e for e in root.evidence if e.role != "symptom"]
    culprit = [e for e in own if e.rank in root.culprit_ranks] if root.culprit_ranks else []
    for pool in (culprit, own):
        timed = [e for e in pool if e.ts is not None]
        if timed:
            return min(timed, key=lambda e: e.ts)
        if pool:
            return pool[0]
    return None


def _missing_logs(ctx: Context) -> str | None:
    ws = ctx.world_size
    if not ws or ws > 100_000:
        return None
    absent = sorted(set(range(ws)) - set(ctx.ranks_seen))
    if not absent:
        return None
    shown = ", ".join(map(str, absent[:20])) + (" …" if len(absent) > 20 else "")
    if len(absent) == 1:
        return f"no log lines from rank {shown}: its log would confirm or change this verdict"
    return f"no log lines from ranks {shown}: their logs would confirm or change this verdict"


def run_facts(res: IngestResult, ctx: Context, rule_notes: list[str]) -> RunFacts:
    versions: dict[str, str] = {}
    for r in ctx.rows("nccl_version", "nccl_error", "pg_init"):
        v = extra(r).get("version")
        if v:
            versions.setdefault("nccl", str(v))
    env: dict[str, str] = {}
    for r in ctx.rows("env_setting"):
        x = extra(r)
        if x.get("name"):
            env[str(x["name"])] = str(x.get("value", ""))[:200]
    notes = list(res.notes) + list(dict.fromkeys(rule_notes))
    if ctx.world_size and not ctx.world_size_stated:
        notes.append(f"no log states the world size: {ctx.world_size} is the highest rank seen + 1, "
                     "a lower bound")
    if res.year_source == "file modification time":
        notes.append("log timestamps carry no year: it was taken from the files' modification time")
    return RunFacts(
        path=str(res.run), files=res.files, lines=res.lines, bytes=res.bytes, world_size=ctx.world_size,
        ranks_seen=ctx.ranks_seen, hosts=ctx.hosts, versions=versions, skipped=list(res.skipped),
        env=env, notes=notes,
    )


def rank_rows(ctx: Context, root: Finding) -> list[dict]:
    """Per rank x PG state for --json and the report (DESIGN.md §4 `ranks`)."""
    culprits = set(root.culprit_ranks)
    # failed waiting for a peer: a timeout, the peer closing the connection, an abort (symptom rows)
    waiting = {r["rank"] for r in ctx.rows("watchdog_timeout", "gloo_timeout") if r["rank"] is not None}
    waiting |= ctx.symptom_ranks
    crashed = set(ctx.self_failures)
    fr = {(r["pg"], r["rank"]): r for r in ctx.frontier.iter_rows(named=True)}
    ranks = sorted(set(ctx.ranks_seen) | {k[1] for k in fr})
    pgs = Counter(k[0] for k in fr)
    main_pg = pgs.most_common(1)[0][0] if pgs else "0"
    out = []
    for rank in ranks:
        r = fr.get((main_pg, rank)) or next((v for (pg, rk), v in fr.items() if rk == rank), None) or {}
        if rank in culprits:
            state = "culprit"
        elif rank in crashed:
            state = "crashed"
        elif rank in waiting:
            state = "waiting"
        else:
            state = "seen"
        timed = None
        if r.get("timeout_seq") is not None or r.get("timeout_op"):
            timed = {"seq": r.get("timeout_seq"), "op": r.get("timeout_op")}
        last_seq = r.get("fr_last_seq")
        out.append({
            "rank": rank, "host": r.get("host") or ctx.rank_hosts.get(rank), "pg": r.get("pg", main_pg),
            "last_enqueued": r.get("last_enqueued") if r.get("last_enqueued") is not None else last_seq,
            "last_completed": r.get("last_completed"), "timed_out": timed,
            "current_op": r.get("fr_last_op") or r.get("fp_op") or r.get("exc_op"),
            "current_seq": last_seq if last_seq is not None else r.get("fp_seq"),
            "state": state,
        })
    return out

