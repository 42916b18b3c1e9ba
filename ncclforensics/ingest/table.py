"""The rows of every file -> the run's event table (DESIGN.md §2): years, host names, repeats, ranks, meanings."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable

import polars as pl

from ncclforensics.ingest.envelope import UNKNOWN_YEAR
from ncclforensics.ingest.ranks import fill_ranks
from ncclforensics.model import EVENT_SCHEMA
from ncclforensics.vocabulary import vocabulary

_NEAR_S = 150 * 86_400


def nearest_year(t: dt.datetime, ref: dt.datetime, *, not_after: bool = False) -> dt.datetime | None:
    """`t` (its year unknown) in the year around `ref` that puts it nearest `ref`; with `not_after`
    (ref is the files' last write), never later than `ref`: a line cannot be newer than its file."""
    try:  # most stamps are months away from a year's end: ref's own year, nearest by far
        cand = t.replace(year=ref.year)
        gap = (cand.replace(tzinfo=None) - ref).total_seconds()
        if abs(gap) < _NEAR_S and not (not_after and gap > 86_400):
            return cand  # another year's candidate is ≥ 365 - 150 days away
    except ValueError:
        pass
    best = None
    for year in (ref.year - 1, ref.year, ref.year + 1):
        try:
            cand = t.replace(year=year)
        except ValueError:  # 29 February in a non-leap year
            continue
        gap = (cand.replace(tzinfo=None) - ref).total_seconds()
        if not_after and gap > 86_400:  # a day of slack for time zones: stamps are local, mtimes UTC
            continue
        gap = abs(gap)
        if best is None or gap < best[0]:
            best = (gap, cand)
    return best[1] if best else None


def _years_near(ref: dt.datetime, *, not_after: bool) -> Callable[[dt.datetime], dt.datetime | None]:
    """nearest_year(·, ref, not_after=…) for many stamps: the year is worked out once a calendar day
    where the day's first and last microsecond get the same one (the year can change at most once a
    day, as the stamp moves past a midpoint between two candidates or past `ref` + 1 day, and never
    back); stamps of a day that straddles such a point are worked out one by one."""
    days: dict[tuple[int, int], int | None] = {}
    first, last = dt.time(0, 0), dt.time(23, 59, 59, 999_999)

    def fixed(t: dt.datetime) -> dt.datetime | None:
        day = (t.month, t.day)
        year = days.get(day, 0)
        if year == 0:
            a = nearest_year(dt.datetime.combine(t.date(), first), ref, not_after=not_after)
            b = nearest_year(dt.datetime.combine(t.date(), last), ref, not_after=not_after)
            year = days[day] = a.year if a is not None and b is not None and a.year == b.year else None
        if year is None:
            return nearest_year(t, ref, not_after=not_after)
        return t.replace(year=year)

    return fixed


def event_table(rows: list[dict], run: str, mtimes: list[float]) -> tuple[pl.DataFrame, str]:
    """The event table of `rows` (one run), and where year-less stamps took their year from. Empties
    `rows` (its dicts are freed once the table holds them)."""
    stamps = [r.get("ts") for r in rows]
    # year-less stamps (c10 header, torch logging, syslog) take the run's year (FORMATS.md §1.9): the
    # year that puts them nearest the run's dated stamps (or the files' modification time), so a run
    # across New Year keeps 31 December before 1 January
    full = sorted(t.replace(tzinfo=None) for t in stamps if t is not None and t.year != UNKNOWN_YEAR)
    year_source = "log timestamps"
    if full:
        ref = full[len(full) // 2]
    elif mtimes:
        ref = dt.datetime.fromtimestamp(max(mtimes), dt.UTC).replace(tzinfo=None)
        year_source = "file modification time"
    else:
        ref, year_source = None, "unknown"
    year_of = _years_near(ref, not_after=year_source == "file modification time") if ref is not None else None
    fixed = []
    for t in stamps:
        if t is not None and t.year == UNKNOWN_YEAR:
            t = year_of(t) if year_of is not None else None
        fixed.append(t)
    schema = dict(EVENT_SCHEMA)
    schema["ts"] = pl.Datetime("us")
    schema["node"] = pl.Utf8
    schema["source"] = pl.Utf8
    schema["kind"] = pl.Utf8
    del schema["run"]
    # from the row dicts at once (polars reads them in Rust: ~2.5x faster than a list per column)
    df = pl.DataFrame(rows, schema=schema, strict=False) if rows else pl.DataFrame(schema=schema)
    rows.clear()  # the row dicts, once polars holds them (the caller keeps none): their memory for what follows
    del stamps, full
    df = df.with_columns(pl.Series("ts", fixed, dtype=pl.Datetime("us"), strict=False),
                         pl.lit(run, dtype=EVENT_SCHEMA["run"]).alias("run"))
    df = df.with_columns(pl.col("ts").dt.replace_time_zone("UTC"))
    # one host, one name: NCCL prints the name cut at the first dot, torchrun the FQDN (§10.1)
    df = df.with_columns(
        pl.when(pl.col("host").str.contains(r"^\d{1,3}(?:\.\d{1,3}){3}$|:|^\."))  # an IP; a redacted `...-48`
        .then(pl.col("host"))
        .otherwise(pl.col("host").str.split(".").list.first())
        .alias("host"))
    # the same Flight Recorder dump is often kept twice (pickle and JSON): one row per entry
    fr = pl.col("kind").is_in(["fr_entry", "fr_status", "fr_pg"])
    # the timeout line is repeated inside `... terminated with exception:` and `what():` (§3.4):
    # one timeout per (rank, PG, SeqNum, op) and file
    wd = (pl.col("kind") == "watchdog_timeout") & pl.col("rank").is_not_null()
    df = pl.concat([df.filter(~fr & ~wd),
                    df.filter(fr).unique(subset=["kind", "rank", "pg", "seq", "op", "line"], keep="first",
                                         maintain_order=True),
                    df.filter(wd).unique(subset=["file", "rank", "pg", "seq", "op"], keep="first",
                                         maintain_order=True)])
    df = fill_ranks(df)
    df = df.sort(["ts", "rank", "file", "line"], nulls_last=True, maintain_order=True)
    df = vocabulary().annotate(vocabulary().drop_duplicates(_aer_source_drivers(df)))
    df = df.with_columns(pl.col("source").cast(EVENT_SCHEMA["source"]), pl.col("kind").cast(pl.Categorical()))
    return df.select(list(EVENT_SCHEMA)), year_source


def _aer_source_drivers(df: pl.DataFrame) -> pl.DataFrame:
    """A PCIe port's AER lines report an error of the device below it (FORMATS.md §21.3: the root port
    writes `error … received from <bdf>`, the device that logged it writes the next lines): each port
    line gets that device's driver as `source_driver` (mlx5_core: a NIC; nvidia: a GPU), where the
    device's own lines on the same host or in the same file name it."""
    is_aer = pl.col("kind") == "pcie_aer"
    if df.is_empty() or df.filter(is_aer).is_empty():
        return df
    aer = df.with_row_index("_i").filter(is_aer).select("_i", "file", "host", "extra").to_dicts()
    drivers: dict[tuple, str] = {}  # (place, bdf) -> the driver of the device at that address
    below: dict[tuple, str] = {}    # (place, port bdf) -> the bdf of the device whose error it reported
    for r in aer:
        x = json.loads(r["extra"] or "{}")
        r["x"], r["place"] = x, r["host"] or r["file"]
        if x.get("device") and x.get("driver") and x["driver"] != "pcieport":
            drivers[(r["place"], x["device"].lower())] = x["driver"]
        if x.get("device") and x.get("source_bdf"):
            below[(r["place"], x["device"].lower())] = x["source_bdf"].lower()
    fixed = {}
    for r in aer:
        x = r["x"]
        if x.get("driver") not in (None, "pcieport"):
            continue
        src = (x.get("source_bdf") or below.get((r["place"], str(x.get("device") or "").lower())) or "").lower()
        driver = drivers.get((r["place"], src))
        if driver:
            fixed[r["_i"]] = json.dumps({**x, "source_driver": driver}, separators=(",", ":"))
    if not fixed:
        return df
    idx = pl.DataFrame({"_i": list(fixed), "_x": list(fixed.values())}, schema={"_i": pl.UInt32, "_x": pl.Utf8})
    return (df.with_row_index("_i").join(idx, on="_i", how="left", maintain_order="left")
            .with_columns(pl.coalesce("_x", "extra").alias("extra")).drop("_i", "_x"))
