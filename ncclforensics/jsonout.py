"""The --json contract (DESIGN.md §4): the diagnosis as the one stable document other tools parse."""

from __future__ import annotations

from ncclforensics import __version__

SCHEMA_VERSION = 1


def _evidence(e) -> dict:
    return {"file": e.file, "line": e.line, "rank": e.rank, "host": e.host, "ts": e.ts, "text": e.text}


def diagnosis_dict(diag, reproducer=None) -> dict:
    """The --json document (DESIGN.md §4): stable keys, always present."""
    v = diag.verdict
    f = diag.facts
    ff = diag.first_failure
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "run": {
            "path": f.path, "files": f.files, "lines": f.lines, "world_size": f.world_size,
            "ranks_seen": f.ranks_seen, "hosts": f.hosts, "versions": f.versions,
            "skipped": [{"file": s.file, "reason": s.reason} for s in f.skipped],
            "notes": f.notes,
        },
        "verdict": {
            "class": v.root_cause.value, "confidence": v.confidence, "rule": v.rule or None,
            "title": v.title, "summary": v.message,
            "culprit_ranks": sorted(v.culprit_ranks), "culprit_hosts": v.culprit_hosts,
            "collective": {"pg": v.collective.pg, "op_type": v.collective.op_type, "seq": v.collective.seq},
            "first_failure": ({"ts": ff.ts, "rank": ff.rank, "file": ff.file, "line": ff.line} if ff else None),
            "missing": diag.missing,
        },
        "findings": [
            {"class": x.root_cause.value, "rule": x.rule or None, "role": x.role.value, "confidence": x.confidence,
             "title": x.title, "message": x.message, "culprit_ranks": sorted(x.culprit_ranks),
             "evidence": [_evidence(e) for e in x.evidence]}
            for x in diag.findings
        ],
        "ranks": diag.ranks,
        "fixes": [{"title": x.title, "why": x.why, "code": x.code} for x in v.fixes],
        "reproducer": ({"command": reproducer.command, "script": reproducer.script} if reproducer else None),
    }
