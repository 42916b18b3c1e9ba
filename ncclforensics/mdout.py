"""The diagnosis as Markdown for a ticket comment (--md): verdict, evidence with context, fixes, skipped files."""

from __future__ import annotations

import re
import textwrap

from ncclforensics.contextout import code, evidence_block, fence, markdown_lines
from ncclforensics.incident import IncidentContext
from ncclforensics.model import Diagnosis, Finding
from ncclforensics.words import collective_words, culprit_text

MAX_EVIDENCE = 8
MAX_SKIPPED = 30
# Markdown's own characters: escaped with a backslash, never as HTML entities (a ticket shows `&lt;` as is)
_SPECIAL = re.compile(r"([\\`*_\[\]<>|#~])")


def esc(text: str) -> str:
    """Text outside code, shown literally by any CommonMark renderer (GitHub, GitLab)."""
    return _SPECIAL.sub(r"\\\1", (text or "").replace("\r", " ").replace("\n", " "))


def markdown(diag: Diagnosis, reproducer=None, *, context: IncidentContext | None = None) -> str:
    v = diag.verdict
    out = [f"### ncclforensics: {code(v.root_cause.value)} — {esc(v.title)}", ""]
    out.append(f"- **Culprit:** {esc(culprit_text(v))}")
    out.append(f"- **Stuck collective:** {esc(collective_words(v))}")
    out.append(f"- **Confidence:** {v.confidence:.2f}" + (f" (rule {code(v.rule)})" if v.rule else ""))
    if diag.first_failure:
        ff = diag.first_failure
        out.append(f"- **First failure:** {code(f'{ff.file}:{ff.line}')}" + (f" at {esc(str(ff.ts))}" if ff.ts else ""))
    out += ["", esc(v.message), ""]
    out += _evidence(v, context)
    if context is not None:
        out += markdown_lines(context, esc)
    if v.fixes:
        out += ["**What to change**", ""]
        for fx in v.fixes:
            # a fix's note is our own Markdown (patterns/rules): kept as written
            out.append(f"- **{esc(fx.title)}** — {fx.why.strip()}")
            if fx.code:
                body = textwrap.dedent(fx.code).strip("\n").splitlines()
                out += ["", *("  " + ln for ln in fence(body, "python")), ""]
        out.append("")
    if diag.missing:
        out += [f"_To be surer:_ {esc(diag.missing)}", ""]
    out += _skipped(diag)
    if reproducer is not None:
        out += [f"**Reproducer:** {code(reproducer.command)} (script attached as repro.py)", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _evidence(v: Finding, context: IncidentContext | None) -> list[str]:
    if not v.evidence:
        return []
    by_spot = {(e.file, e.line): e for e in context.evidence} if context is not None else {}
    out = ["**Evidence**", ""]
    seen: set[tuple[str, int]] = set()
    for e in v.evidence:
        if (e.file, e.line) in seen:
            continue
        seen.add((e.file, e.line))
        if len(seen) > MAX_EVIDENCE:
            break
        who = f" (rank {e.rank})" if e.rank is not None else ""
        ctx = by_spot.get((e.file, e.line))
        block = evidence_block(ctx) if ctx is not None else []
        if block:
            out += [f"{code(f'{e.file}:{e.line}')}{who}", "", *block, ""]
        else:
            out += [f"{code(f'{e.file}:{e.line}')}{who}", "", *fence([e.text.strip()[:500]]), ""]
            if ctx is not None and ctx.note:
                out += [f"_{esc(ctx.note)}_", ""]
    return out


def _skipped(diag: Diagnosis) -> list[str]:
    skipped = diag.facts.skipped
    if not skipped:
        return []
    out = [f"**Files skipped** ({len(skipped)})", ""]
    out += [f"- {code(s.file)}: {esc(s.reason)}" for s in skipped[:MAX_SKIPPED]]
    if len(skipped) > MAX_SKIPPED:
        out.append(f"- and {len(skipped) - MAX_SKIPPED} more")
    return [*out, ""]
