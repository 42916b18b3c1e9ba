"""What `ncclforensics events` shows of the event table: filters, row order, one writer per format."""

from __future__ import annotations

import datetime as dt
import io
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ncclforensics import outpaths
from ncclforensics.console import ColorMode, plural, stdout_console, terminal_width
from ncclforensics.errors import UsageError
from ncclforensics.model import SOURCES
from ncclforensics.times import JSON_EVENT, utc_text

TABLE_ROWS = 50  # rows the table shows unless -n says otherwise
TABLE_COLUMNS = ("time", "where", "host", "rank", "pg", "kind", "seq", "op", "code", "detail")


def _values(items: list[str] | None) -> list[str]:
    """Repeated options and comma lists alike: ["0,1", "3"] -> ["0", "1", "3"]."""
    return [v.strip() for item in items or [] for v in item.split(",") if v.strip()]


def parse_ranks(items: list[str] | None) -> list[int]:
    """`--rank 0,3 --rank 5-7` -> [0, 3, 5, 6, 7]."""
    out: list[int] = []
    for v in _values(items):
        a, sep, b = v.partition("-")
        try:
            lo, hi = int(a), int(b) if sep else int(a)
        except ValueError:
            raise UsageError(f"--rank {v}: want a rank, a list (0,3) or a range (4-7)") from None
        if hi < lo or hi - lo > 1_000_000:
            raise UsageError(f"--rank {v}: not a range of ranks")
        out.extend(range(lo, hi + 1))
    return out


def _iso(text: str) -> dt.datetime | dt.time | None:
    for kind in (dt.datetime, dt.time):
        try:
            return kind.fromisoformat(text)
        except ValueError:
            continue
    return None


def parse_time(option: str, text: str | None, day: dt.date | None) -> dt.datetime | None:
    """An ISO date or time (UTC unless it names a zone); a time of day alone is taken on `day`,
    the day of the run's first timestamp."""
    if text is None:
        return None
    t = _iso(text)
    if t is None:
        raise UsageError(f"{option} {text}: want an ISO time such as 2026-11-22T07:44:17 or 07:44")
    if isinstance(t, dt.time):
        if day is None:
            raise UsageError(f"{option} {text}: a time of day alone needs a run with dated lines; give the date too")
        t = dt.datetime.combine(day, t)
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


@dataclass(frozen=True)
class EventFilter:
    ranks: tuple[int, ...] = ()
    kinds: tuple[str, ...] = ()
    pgs: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    grep: str | None = None

    @classmethod
    def parse(cls, df: pl.DataFrame, *, ranks: list[str] | None = None, kinds: list[str] | None = None,
              pgs: list[str] | None = None, sources: list[str] | None = None, since: str | None = None,
              until: str | None = None, grep: str | None = None, ignore_case: bool = False) -> EventFilter:
        bad = [s for s in _values(sources) if s not in SOURCES]
        if bad:
            raise UsageError(f"--source {bad[0]}: not a source; the sources are {', '.join(SOURCES)}")
        pattern = None
        if grep is not None:
            pattern = ("(?i)" if ignore_case else "") + grep
            try:
                pl.Series([""]).str.contains(pattern)
            except Exception as exc:  # polars' regex error type differs between versions
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise UsageError(f"--grep {grep!r}: not a valid regular expression ({first[:120]})") from None
        ts = df["ts"].drop_nulls() if "ts" in df.columns else pl.Series([], dtype=pl.Datetime)
        day = ts.min().date() if len(ts) else None
        return cls(
            ranks=tuple(parse_ranks(ranks)), kinds=tuple(_values(kinds)), pgs=tuple(_values(pgs)),
            sources=tuple(_values(sources)), since=parse_time("--since", since, day),
            until=parse_time("--until", until, day), grep=pattern,
        )

    @property
    def active(self) -> bool:
        return any((self.ranks, self.kinds, self.pgs, self.sources, self.since, self.until, self.grep))

    def apply(self, df: pl.DataFrame) -> pl.DataFrame:
        conds = []
        if self.ranks:
            conds.append(pl.col("rank").is_in(list(self.ranks)))
        if self.kinds:
            conds.append(pl.col("kind").cast(pl.Utf8).is_in(list(self.kinds)))
        if self.pgs:
            conds.append(pl.col("pg").is_in(list(self.pgs)))
        if self.sources:
            conds.append(pl.col("source").cast(pl.Utf8).is_in(list(self.sources)))
        if self.since is not None:
            conds.append(pl.col("ts") >= self.since)
        if self.until is not None:
            conds.append(pl.col("ts") <= self.until)
        if self.grep is not None:
            conds.append(pl.col("text").str.contains(self.grep))
        for c in conds:
            df = df.filter(c.fill_null(False))
        return df

    def missing_kinds(self, df: pl.DataFrame) -> list[str]:
        """Kinds asked for that the run has none of (a typo, most likely)."""
        present = set(df["kind"].cast(pl.Utf8).unique().to_list())
        return [k for k in self.kinds if k not in present]


def ordered(df: pl.DataFrame) -> pl.DataFrame:
    """Rows by time, then file and line; rows without a time after those with one."""
    return df.sort(["ts", "file", "line"], nulls_last=True, maintain_order=True)


def summary_line(res, shown: pl.DataFrame, flt: EventFilter) -> str:
    """One line for stderr: what was read and found (and, with filters, how many rows match)."""
    df = res.events
    read = f"Read {plural(res.files, 'file')} ({plural(res.lines, 'line')})"
    if res.skipped:
        read += f" and skipped {plural(len(res.skipped), 'file')}"
    ranks = df["rank"].drop_nulls().n_unique() if not df.is_empty() else 0
    hosts = df["host"].drop_nulls().n_unique() if not df.is_empty() else 0
    who = [f"from {plural(ranks, 'rank')}"] if ranks else []
    who += [f"on {plural(hosts, 'host')}"] if hosts else []
    found = f"found {plural(df.height, 'event')} {' '.join(who) or 'naming no rank or host'}"
    kinds = Counter(df["kind"].cast(pl.Utf8).to_list()).most_common(4) if not df.is_empty() else []
    if kinds:
        found += " (" + ", ".join(f"{k} {n:,}" for k, n in kinds) + (", …" if df["kind"].n_unique() > 4 else "") + ")"
    line = f"{read}; {found}"
    if flt.active:
        line += f"; {shown.height:,} match the filters"
        missing = flt.missing_kinds(df)
        if missing:
            line += f" (no event of kind {', '.join(missing)} here; `--kind` takes the names in the kind column)"
    return line + "."


def _time_format(ts: pl.Series) -> tuple[str, str]:
    """(strftime format, column header): times alone when every row is on one day."""
    days = ts.drop_nulls().dt.date().unique()
    if len(days) == 1:
        return "%H:%M:%S%.3f", f"UTC {days[0]}"
    return "%Y-%m-%d %H:%M:%S%.3f", "time (UTC)"


# Column caps for the table; `detail` takes what is left of the width, `where` gives way first.
CAPS = {"time": 23, "where": 48, "host": 20, "rank": 6, "pg": 12, "kind": 24, "seq": 10, "op": 16, "code": 6}
MIN_DETAIL = 24
MIN_WHERE = 24
DROP_ORDER = ("code", "pg", "op", "seq", "host")


def _cells(rows: pl.DataFrame) -> tuple[dict[str, list[str]], str]:
    from ncclforensics.termout import evidence_line

    fmt, time_header = _time_format(rows["ts"])
    view = rows.select(
        pl.col("ts").dt.strftime(fmt).alias("time"),
        pl.concat_str([pl.col("file"), pl.col("line").cast(pl.Utf8)], separator=":").alias("where"),
        "host", "rank", "pg", pl.col("kind").cast(pl.Utf8), "seq", "op", "code", "detail", "text",
    )
    cols = {c: ["" if v is None else str(v) for v in view[c].to_list()] for c in TABLE_COLUMNS if c != "detail"}
    cols["detail"] = [d if d else evidence_line(t or "") for d, t in zip(view["detail"].to_list(),
                                                                        view["text"].to_list(), strict=True)]
    return cols, time_header


def table(df: pl.DataFrame, console: Console, *, limit: int | None) -> int:
    """Print up to `limit` rows (all for None) as a table fitted to the console's width; returns
    how many rows it left out. Columns empty in every shown row are left out; a cell that does not
    fit is cut with a visible `…` (a path at its start, the rest at its end)."""
    from ncclforensics.words import cut, cut_left

    rows = df if limit is None else df.head(limit)
    cols, time_header = _cells(rows)
    headers = {c: c for c in TABLE_COLUMNS} | {"time": time_header}
    keep = [c for c in TABLE_COLUMNS if c in ("where", "kind", "detail") or any(cols[c])]
    widths = {c: min(CAPS.get(c, 10**6), max([len(headers[c]), *(len(v) for v in cols[c])]))
              for c in keep if c != "detail"}

    def room() -> int:
        return console.width - 2 * (len(keep) - 1) - sum(widths.values())

    if room() < MIN_DETAIL:
        widths["where"] = max(MIN_WHERE, widths["where"] - (MIN_DETAIL - room()))
    for c in DROP_ORDER:  # still too narrow: the columns a reader misses least go
        if room() >= MIN_DETAIL:
            break
        if c in widths:
            keep.remove(c)
            del widths[c]
    widths["detail"] = max(8, min(room(), max([len(headers["detail"]), *(len(v) for v in cols["detail"])])))
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), header_style="bold",
              expand=False, collapse_padding=True)
    for c in keep:
        t.add_column(headers[c], width=widths[c], no_wrap=True, overflow="ellipsis",
                     justify="right" if c in ("rank", "seq", "code") else "left",
                     style="cyan" if c == "where" else None)
    for i in range(rows.height):
        t.add_row(*(Text(cut_left(cols[c][i], widths[c]) if c == "where" else cut(cols[c][i], widths[c]))
                    for c in keep))
    console.print(t, soft_wrap=False, crop=True)
    return df.height - rows.height


def hidden_note(hidden: int, total: int, width: int) -> str:
    import textwrap

    return textwrap.fill(f"… {plural(hidden, 'more event')} not shown (of {total:,}): `-n 0` shows every one; "
            "--rank, --kind, --pg, --source, --since/--until and --grep narrow them; -f csv writes every column.",
                         width=width)


# -- one writer per `events -f` format -------------------------------------------------------
def _write_table(df: pl.DataFrame, target, *, color: ColorMode, limit: int | None) -> None:
    if target == outpaths.STDOUT:
        console = stdout_console(color)
    else:  # a file: plain text, as wide as the table needs
        console = Console(file=io.StringIO(), width=max(terminal_width(), 200), color_system=None,
                          highlight=False, markup=False, emoji=False)
    hidden = table(df, console, limit=limit)
    if hidden:
        console.print(hidden_note(hidden, df.height, console.width), style="dim", soft_wrap=True)
    if target != outpaths.STDOUT:
        outpaths.write_text(target, console.file.getvalue())


def _write_csv(df: pl.DataFrame, target, **_) -> None:
    outpaths.write_text(target, df.with_columns(df["source"].cast(str), df["kind"].cast(str)).write_csv())


def _write_parquet(df: pl.DataFrame, target, **_) -> None:
    outpaths.make_folder(Path(target).parent)
    try:
        df.write_parquet(target)
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from None


def events_json(df: pl.DataFrame) -> str:
    """A JSON array, one object per row, keys = the schema's column names."""
    rows = df.with_columns(pl.col("source").cast(pl.Utf8), pl.col("kind").cast(pl.Utf8)).to_dicts()
    for r in rows:
        r["ts"] = utc_text(r["ts"], JSON_EVENT)
    return json.dumps(rows, ensure_ascii=False, indent=None) + "\n"


def _write_json(df: pl.DataFrame, target, **_) -> None:
    outpaths.write_text(target, events_json(df))


# `events -f NAME` -> its writer: (rows, target file or outpaths.STDOUT, color=, limit= table rows)
WRITERS: dict[str, Callable[..., None]] = {
    "table": _write_table, "csv": _write_csv, "parquet": _write_parquet, "json": _write_json,
}
