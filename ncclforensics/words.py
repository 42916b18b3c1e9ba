"""Plain words for people, the same in every output: cut text, sizes, culprits, the stuck collective."""

from __future__ import annotations

from ncclforensics.model import Finding, rank_ranges


def names(items: list[str], limit: int = 8) -> str:
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f", … ({len(items)} in all)"


def cut(text: str | None, width: int, *, fold: bool = True) -> str:
    """`text` in at most `width` characters, a cut marked with `…`. `fold`: on one line, runs of white
    space (newlines too) made one space; else only stripped at both ends."""
    text = " ".join((text or "").split()) if fold else (text or "").strip()
    return text if len(text) <= width else text[: max(1, width - 1)].rstrip() + "…"


def cut_left(text: str, width: int) -> str:
    """A path cut at its start (its end, the file and line, tells most)."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]


def human_bytes(n: int | None) -> str:
    """1536 -> '1.5 KB' (1 KB = 1024 bytes); '' for no size."""
    if n is None:
        return ""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


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


def collective_words(f: Finding) -> str:
    """The stuck collective: 'PG 0 ALLREDUCE, SeqNum 9'."""
    c = f.collective
    if not c.op_type and c.seq is None:
        return "none identified"
    pg = f"PG {c.pg} " if c.pg else ""
    seq = f"SeqNum {c.seq}" if c.seq is not None else "SeqNum unknown"
    return f"{pg}{c.op_type or 'unknown op'}, {seq}"
