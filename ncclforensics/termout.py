"""The terminal summary of a diagnosis: rich Text lines laid out for the terminal's width.

Prose wraps at the width; a log line or a file name that does not fit is cut with a visible `…`;
fix code is never cut or re-wrapped (people copy it): a long code line is printed whole and the
terminal folds it, and code lines left out are counted.
"""

from __future__ import annotations

import re
import textwrap

from rich.text import Text

from ncclforensics.console import plural
from ncclforensics.model import Diagnosis, Finding, RootCause, RunFacts
from ncclforensics.words import collective_words, culprit_text, cut, cut_left

EVIDENCE_LINES = 5
FIX_CODE_LINES = 12
OTHER_FINDINGS = 5
SKIPPED_SHOWN = 8
ROLE_STYLE = {"root": "bold red", "cascade": "yellow", "context": "cyan"}
# `[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]` -> `[pair.cc:553]`
_SRC_PATH = re.compile(r"(?<![\w.])/?(?:[\w.\-]+/)+([\w.\-]+\.(?:cc|cpp|c|h|hpp|cu|py):\d+)")
_ENVELOPE = re.compile(r"^(?:\[(?:default|rank)\d+\]: ?|\[[FEWIV]\d{3,4} [\d:.]+ [\w.]+:\d+\] )+")


def evidence_line(text: str) -> str:
    """An evidence line made short for a terminal: prefixes and source paths trimmed."""
    return _SRC_PATH.sub(r"\1", _ENVELOPE.sub("", text.strip()))


def _wrap(text: str, width: int, style: str = "", *, hang: str = "") -> list[Text]:
    """`text` wrapped at `width`, lines after the first indented by `hang`."""
    lines = textwrap.wrap(text, width=width, subsequent_indent=hang) or [""]
    return [Text(ln, style=style) for ln in lines]


def _note(text: str, width: int, indent: str = "  ") -> list[Text]:
    """A dim note under a list: what it left out and where to see it."""
    lines = textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent + "  ")
    return [Text(ln, style="dim") for ln in lines]


def terminal(diag: Diagnosis, *, width: int = 80, context=None) -> list[Text]:
    """`context`: an incident.IncidentContext to print after the evidence (`analyze -C N`)."""
    v = diag.verdict
    head = Text("VERDICT  ", style="bold")
    unknown = v.root_cause is RootCause.UNKNOWN
    head.append(v.root_cause.value, style="bold yellow" if unknown else "bold red")
    how = f"(confidence {v.confidence:.2f}{', rule ' + v.rule if v.rule else ''})"
    lines = [head + Text("  " + how)] if len(head) + 2 + len(how) <= width else [head, Text("  " + how)]
    lines += _wrap(v.title, width, "bold", hang="  ")
    culprit = Text("Culprit: ") + Text(culprit_text(v), style="bold")
    lines += [culprit] if len(culprit) <= width else _wrap(culprit.plain, width, hang="  ")
    lines += [*_wrap(f"Stuck collective: {collective_words(v)}", width, hang="  "), Text("")]
    lines += _wrap(v.message, width)
    if v.evidence:
        lines += [Text(""), Text("Evidence:", style="bold")]
        lines += _evidence(v, width)
    if context is not None:
        from ncclforensics.contextout import text_lines

        lines += [Text(ln, style=style) for ln, style in text_lines(context, width=width)]
    if v.fixes:
        lines += [Text("")]
        lines += _fix(v, width)
    if diag.missing:
        lines += [Text(""), *_wrap("To be surer: " + diag.missing, width)]
    others = [f for f in diag.findings if f is not v]
    if others:
        lines += [Text(""), Text("Other findings:", style="bold")]
        for f in others[:OTHER_FINDINGS]:
            tag = f"[{f.role.value}]"
            line = Text("  ")
            line.append(tag, style=ROLE_STYLE.get(f.role.value, ""))
            line.append(" " + cut(f"{f.root_cause.value} {f.rule}: {f.title}", width - 3 - len(tag)))
            lines.append(line)
        if len(others) > OTHER_FINDINGS:
            lines += _note(f"… and {plural(len(others) - OTHER_FINDINGS, 'more finding')} "
                           "(--json, --md and the HTML report list them all)", width)
    lines += [Text(""), *_wrap(read_sentence(diag.facts), width)]
    lines += _skipped(diag.facts, width)
    return lines


def _evidence(v: Finding, width: int) -> list[Text]:
    out = []
    for e in v.evidence[:EVIDENCE_LINES]:
        who = f" (rank {e.rank})" if e.rank is not None else ""
        out.append(Text("  ") + Text(cut_left(f"{e.file}:{e.line}", width - 2 - len(who)), style="cyan")
                   + Text(who))
        out.append(Text("    " + cut(evidence_line(e.text), width - 4)))
    if len(v.evidence) > EVIDENCE_LINES:
        out += _note(f"… and {plural(len(v.evidence) - EVIDENCE_LINES, 'more line')} "
                     "(--json, --md and the HTML report list them all)", width)
    return out


def _fix(v: Finding, width: int) -> list[Text]:
    fx = v.fixes[0]
    title = _wrap(f"Top fix: {fx.title}", width, "bold green", hang="  ")
    code = fx.code.splitlines()
    out = [*title, *(Text("    " + ln) for ln in code[:FIX_CODE_LINES])]
    if len(code) > FIX_CODE_LINES:
        where = f"`ncclforensics rules explain {v.rule}` prints it whole" if v.rule else "--md shows it whole"
        out += _note(f"… and {plural(len(code) - FIX_CODE_LINES, 'more line')} of code: {where}", width,
                     indent="    ")
    if len(v.fixes) > 1:
        out += _note(f"({plural(len(v.fixes) - 1, 'more fix', 'more fixes')} in --md and the HTML report)", width)
    return out


def read_sentence(facts: RunFacts) -> str:
    """'Read 16 files (200 lines) and saw 4 of 4 ranks.'"""
    read = f"Read {plural(facts.files, 'file')} ({plural(facts.lines, 'line')})"
    n = len(facts.ranks_seen)
    if not n:
        return read + "; no line named a rank."
    if facts.world_size:
        bound = any("lower bound" in note for note in facts.notes)
        return read + f" and saw {n:,} of {'at least ' if bound else ''}{plural(facts.world_size, 'rank')}."
    return read + f" and saw {plural(n, 'rank')}."


def _skipped(facts: RunFacts, width: int) -> list[Text]:
    if not facts.skipped:
        return []
    out = [Text(f"Skipped {plural(len(facts.skipped), 'file')}:")]
    for s in facts.skipped[:SKIPPED_SHOWN]:
        # the reason whole and the path cut at its start, as long as the file's own name stays whole
        room = width - 4 - len(s.reason)
        keeps_name = room > len(s.file.rsplit("/", 1)[-1])
        line = f"{cut_left(s.file, room)}: {s.reason}" if keeps_name else cut(f"{s.file}: {s.reason}", width - 2)
        out.append(Text("  " + line))
    if len(facts.skipped) > SKIPPED_SHOWN:
        out += _note(f"… and {plural(len(facts.skipped) - SKIPPED_SHOWN, 'more file')} (--json lists every one)",
                     width)
    return out
