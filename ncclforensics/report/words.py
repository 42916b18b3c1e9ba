"""Plain-words formatting the report's view-models share: rank ranges, times, sizes, verdict phrases."""

from __future__ import annotations

from datetime import datetime

from ncclforensics import textout
from ncclforensics.model import Finding, rank_ranges


def names(items: list[str], limit: int = 8) -> str:
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f", … ({len(items)} in all)"


def short(text: str | None, width: int) -> str:
    text = (text or "").strip()
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def fmt_ts(ts: object) -> str:
    """A datetime or an ISO string -> '2026-11-22 07:44:34.246 UTC'."""
    if ts is None:
        return ""
    if isinstance(ts, datetime):
        frac = f".{ts.microsecond // 1000:03d}" if ts.microsecond else ""
        return ts.strftime("%Y-%m-%d %H:%M:%S") + frac + " UTC"
    s = str(ts).replace("T", " ")
    return s[:-1] + " UTC" if s.endswith("Z") else s


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def confidence_word(c: float) -> str:
    return "high" if c >= 0.85 else "medium" if c >= 0.65 else "low"


def culprit_text(f: Finding) -> str:
    """The culprit in words, rank lists folded into ranges (terminal, --md and the report say it alike)."""
    hosts = names(f.culprit_hosts)
    if f.culprit_ranks:
        word = "rank" if len(f.culprit_ranks) == 1 else "ranks"
        return f"{word} {rank_ranges(f.culprit_ranks)}" + (f" on {hosts}" if hosts else "")
    if f.culprit_hosts:
        return "host " + hosts
    return "no single rank"


def collective_text(f: Finding) -> str:
    """The stuck collective in the words of the terminal summary."""
    return textout.collective_words(f)
