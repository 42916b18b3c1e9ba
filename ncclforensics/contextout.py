"""The incident context (ncclforensics.incident) as text: terminal lines (`analyze -C N`), Markdown blocks (--md)."""

from __future__ import annotations

from ncclforensics.incident import IncidentContext

TERMINAL_FRAMES = 2  # innermost user frames per stack in the terminal (the report and --md show up to 4)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def text_lines(ctx: IncidentContext, *, width: int = 80) -> list[tuple[str, str]]:
    """(line, style) pairs, grep -C style: `23:` marks the evidence line, `22-` its neighbours; every
    line cut to `width`. Styles are rich's: "" plain, "bold" headings and evidence lines, "dim" notes."""
    out: list[tuple[str, str]] = []
    shown = [e for e in ctx.evidence if e.lines or e.note]
    if shown and ctx.radius > 0:
        out += [("", ""), (f"Context ({ctx.radius} line{'s' if ctx.radius != 1 else ''} around each evidence line):",
                           "bold")]
        for e in shown:
            who = f" (rank {e.rank})" if e.rank is not None else ""
            out.append((_cut(f"  {e.file}:{e.line}{who}", width), "cyan"))
            if e.note:
                out.append((_cut(f"    ({e.note})", width), "dim"))
            for x in e.lines:
                out.append((_cut(f"    {x.no}{':' if x.hit else '-'} {x.text}", width), "bold" if x.hit else ""))
    if ctx.tail:
        out += [("", ""), (_cut(f"Last lines of {ctx.tail_ranks} before the failure, {ctx.tail_order}:", width),
                           "bold")]
        col = max(len(f"{_name(t.file)}:{t.no}") for t in ctx.tail)
        for t in ctx.tail:
            if t.skipped:
                out.append((f"    ⋮ {t.skipped} lines of rank {t.rank}'s traceback", "dim"))
            rank = f"r{t.rank}" if t.rank is not None else "-"
            out.append((_cut(f"  {rank:>4} {f'{_name(t.file)}:{t.no}':<{col}}  {t.text}", width),
                        "bold" if t.event else ""))
    if ctx.frames:
        out += [("", ""), ("Where in your code (innermost user frames):", "bold")]
        for g in ctx.frames:
            out.append((_cut(f"  {g.who}: {g.what}", width), "red" if g.culprit else ""))
            for f in g.frames[-TERMINAL_FRAMES:]:
                out.append((_cut(f"    {f.file}:{f.line} in {f.fn}" + (f": {f.code}" if f.code else ""), width), ""))
    for n in ctx.notes:
        out.append((_cut(f"  note: {n}", width), "dim"))
    return out


def fence(lines: list[str], lang: str = "text") -> list[str]:
    """A fenced code block whose fence is longer than any run of backticks inside it."""
    longest = max((len(r) for ln in lines for r in _runs(ln)), default=0)
    f = "`" * max(3, longest + 1)
    return [f + lang, *lines, f]


def _runs(line: str) -> list[str]:
    runs, cur = [], ""
    for ch in line:
        if ch == "`":
            cur += ch
        elif cur:
            runs.append(cur)
            cur = ""
    return runs + ([cur] if cur else [])


def markdown_lines(ctx: IncidentContext, esc) -> list[str]:
    """The context for --md: a fenced block per evidence line, the merged last lines, the user frames.
    `esc` escapes text outside code for Markdown (mdout.esc)."""
    out: list[str] = []
    if ctx.tail:
        out += [f"**Last lines of {esc(ctx.tail_ranks)} before the failure** ({esc(ctx.tail_order)})", ""]
        body = []
        for t in ctx.tail:
            if t.skipped:
                body.append(f"     ⋮ {t.skipped} lines of rank {t.rank}'s traceback")
            rank = f"r{t.rank}" if t.rank is not None else "-"
            body.append(f"{rank:>4} {_name(t.file)}:{t.no}  {t.text}")
        out += [*fence(body), ""]
    if ctx.frames:
        out += ["**Where in your code** (innermost user frames, innermost last)", ""]
        for g in ctx.frames:
            out.append(f"- {esc(g.who)}: {esc(g.what)} ({code(g.where)})")
            for f in g.frames:
                src = f": {code(f.code)}" if f.code else ""
                out.append(f"  - {code(f'{f.file}:{f.line}')} in {code(f.fn)}{src}")
        out.append("")
    for n in ctx.notes:
        out.append(f"_Note:_ {esc(n)}")
    if ctx.notes:
        out.append("")
    return out


def evidence_block(e) -> list[str]:
    """One evidence line's context for --md: `> 23  text` marks the line itself."""
    if not e.lines:
        return []
    return fence([f"{'>' if x.hit else ' '} {x.no:>5}  {x.text}" for x in e.lines])


def code(text: str) -> str:
    """An inline code span that survives backticks inside `text`."""
    text = text.replace("\n", " ")
    ticks = "`" * (max((len(r) for r in _runs(text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or ticks != "`" else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"
