"""Human outputs of a diagnosis: the terminal summary (80 columns) and Markdown for a ticket."""

from __future__ import annotations

import re
import textwrap

from ncclforensics.model import Diagnosis, Finding, RunFacts, rank_ranges

WIDTH = 80
# `[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]` -> `[pair.cc:553]`
_SRC_PATH = re.compile(r"(?<![\w.])/?(?:[\w.\-]+/)+([\w.\-]+\.(?:cc|cpp|c|h|hpp|cu|py):\d+)")
_ENVELOPE = re.compile(r"^(?:\[(?:default|rank)\d+\]: ?|\[[FEWIV]\d{3,4} [\d:.]+ [\w.]+:\d+\] )+")


def _evidence_line(text: str) -> str:
    """An evidence line made short for 80 columns: prefixes and source paths trimmed."""
    return _SRC_PATH.sub(r"\1", _ENVELOPE.sub("", text.strip()))


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


def terminal(diag: Diagnosis, *, width: int = WIDTH) -> str:
    v = diag.verdict
    w = textwrap.TextWrapper(width=width, subsequent_indent="  ")
    lines = [f"VERDICT  {v.root_cause.value}  (confidence {v.confidence:.2f}{', rule ' + v.rule if v.rule else ''})"]
    lines += w.wrap(v.title)
    lines.append(f"Culprit: {_ranks(v)}")
    lines.append(f"Stuck collective: {collective_words(v)}")
    lines.append("")
    lines += textwrap.wrap(v.message, width=width)
    if v.evidence:
        lines.append("")
        lines.append("Evidence:")
        for e in v.evidence[:5]:
            where = f"{e.file}:{e.line}"
            who = f" rank {e.rank}" if e.rank is not None else ""
            lines.append(textwrap.shorten(f"  {where}{who}", width=width, placeholder="…"))
            lines.append(textwrap.shorten("    " + _evidence_line(e.text), width=width, placeholder="…"))
    if v.fixes:
        lines.append("")
        lines.append(f"Top fix: {v.fixes[0].title}")
        for code_line in v.fixes[0].code.splitlines()[:8]:
            lines.append(("    " + code_line)[:width])
    if diag.missing:
        lines.append("")
        lines += textwrap.wrap("To be surer: " + diag.missing, width=width)
    others = [f for f in diag.findings if f is not v]
    if others:
        lines.append("")
        lines.append("Other findings:")
        for f in others[:5]:
            lines.append(textwrap.shorten(f"  [{f.role.value}] {f.root_cause.value} {f.rule}: {f.title}",
                                          width=width, placeholder="…"))
    facts = diag.facts
    lines.append("")
    lines.append(textwrap.shorten(
        f"Read {facts.files} files, {facts.lines:,} lines; ranks seen {len(facts.ranks_seen)}"
        f"{_of_world(facts)}; {len(facts.skipped)} skipped.",
        width=width, placeholder="…"))
    return "\n".join(lines) + "\n"


def _of_world(facts: RunFacts) -> str:
    if not facts.world_size:
        return ""
    bound = any("lower bound" in n for n in facts.notes)
    return f" of {'at least ' if bound else ''}{facts.world_size}"


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
