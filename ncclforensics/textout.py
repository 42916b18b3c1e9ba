"""Human outputs of a diagnosis: Markdown for a ticket, and the words it shares with the terminal
summary (termout.py)."""

from __future__ import annotations

from ncclforensics.model import Diagnosis, Finding, rank_ranges


def collective_words(f: Finding) -> str:
    c = f.collective
    if not c.op_type and c.seq is None:
        return "none identified"
    pg = f"PG {c.pg} " if c.pg else ""
    seq = f"SeqNum {c.seq}" if c.seq is not None else "SeqNum unknown"
    return f"{pg}{c.op_type or 'unknown op'}, {seq}"


def _ranks(f: Finding) -> str:
    if f.culprit_ranks:
        hosts = f" on {', '.join(f.culprit_hosts)}" if f.culprit_hosts else ""
        return rank_ranges(f.culprit_ranks) + hosts
    if f.culprit_hosts:
        return "host " + ", ".join(f.culprit_hosts)
    return "no single rank"


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def markdown(diag: Diagnosis, reproducer=None) -> str:
    v = diag.verdict
    out = [f"### ncclforensics: `{v.root_cause.value}` — {_md_escape(v.title)}", ""]
    out.append(f"- **Culprit:** {_md_escape(_ranks(v))}")
    out.append(f"- **Stuck collective:** {_md_escape(collective_words(v))}")
    out.append(f"- **Confidence:** {v.confidence:.2f}" + (f" (rule `{v.rule}`)" if v.rule else ""))
    if diag.first_failure:
        ff = diag.first_failure
        out.append(f"- **First failure:** `{ff.file}:{ff.line}`" + (f" at {ff.ts}" if ff.ts else ""))
    out += ["", _md_escape(v.message), ""]
    if v.evidence:
        out.append("**Evidence**")
        out.append("")
        out.append("```text")
        for e in v.evidence[:8]:
            out.append(f"{e.file}:{e.line}: {e.text.strip()[:300]}".replace("```", "'''"))
        out.append("```")
        out.append("")
    if v.fixes:
        out.append("**What to change**")
        out.append("")
        for fx in v.fixes:
            out.append(f"- **{_md_escape(fx.title)}** — {_md_escape(fx.why)}")
            if fx.code:
                code = fx.code.replace("```", "'''").splitlines()
                out += ["", "  ```python", *("  " + ln for ln in code), "  ```", ""]
    if diag.missing:
        out += [f"_To be surer:_ {_md_escape(diag.missing)}", ""]
    if reproducer is not None:
        out += [f"**Reproducer:** `{reproducer.command}` (script attached as repro.py)", ""]
    return "\n".join(out) + "\n"
