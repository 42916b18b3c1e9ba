"""The summary table of a scan (one row per run), rebuilt from the runs' result.json files."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ncclforensics.atomic import replacing

_LIST_I = pl.List(pl.Int64)
_LIST_S = pl.List(pl.Utf8)
_TS = pl.Datetime("us", "UTC")

# Column -> dtype, in output order. Times are UTC; lists are ';'-joined in the CSV.
SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.Utf8,  # folder under runs/ (slug of the path + short hash)
    "path": pl.Utf8,  # path of the run relative to the scan root
    "kind": pl.Utf8,  # folder | archive | file
    "status": pl.Utf8,  # ok | error | timeout | crashed
    "error": pl.Utf8,  # why the analysis failed (null when ok)
    "root_cause": pl.Utf8,
    "confidence": pl.Float64,
    "rule": pl.Utf8,
    "title": pl.Utf8,
    "culprit_ranks": _LIST_I,
    "culprit_hosts": _LIST_S,
    "culprit_gpus": _LIST_S,  # "<host> lr<local rank>"
    "pg": pl.Utf8,
    "op": pl.Utf8,
    "seq": pl.Int64,
    "first_failure": _TS,
    "first_failure_rank": pl.Int64,
    "last_event": _TS,  # latest timestamp in the run's event table
    "world_size": pl.Int64,
    "ranks": pl.Int64,  # ranks seen in the logs
    "hosts": _LIST_S,
    "xids": _LIST_S,  # "<code>@<host>"
    "xid_codes": _LIST_I,
    "xid_hosts": _LIST_S,
    "xid_gpus": _LIST_S,  # "<host> <PCI bus id>"
    "bytes": pl.Int64,  # on disk
    "files": pl.Int64,  # on disk
    "bytes_read": pl.Int64,  # decompressed bytes the analyzer read
    "files_read": pl.Int64,
    "files_skipped": pl.Int64,
    "lines": pl.Int64,
    "report": pl.Boolean,  # runs/<id>/report.html written
    "report_error": pl.Utf8,
    "tool_version": pl.Utf8,
    "content_hash": pl.Utf8,
    "elapsed_s": pl.Float64,
    "analyzed_at": _TS,
}


def summary_frame(rows: list[dict]) -> pl.DataFrame:
    cols: dict[str, list] = {c: [] for c in SUMMARY_SCHEMA}
    for r in rows:
        for c, t in SUMMARY_SCHEMA.items():
            v = r.get(c)
            if v is None and isinstance(t, pl.List):
                v = []
            cols[c].append(v)
    series = []
    for c, t in SUMMARY_SCHEMA.items():
        if t == _TS:
            s = pl.Series(c, cols[c], dtype=pl.Utf8).str.to_datetime(
                "%Y-%m-%dT%H:%M:%S%.fZ", time_unit="us", strict=False).dt.replace_time_zone("UTC")
        else:
            s = pl.Series(c, cols[c], dtype=t, strict=False)
        series.append(s)
    return pl.DataFrame(series).sort("path")


def csv_frame(df: pl.DataFrame) -> pl.DataFrame:
    """Lists as ';'-joined text, times as ISO 8601 with Z: what a CSV can hold."""
    exprs = []
    for c, t in df.schema.items():
        if isinstance(t, pl.List):
            exprs.append(pl.col(c).list.eval(pl.element().cast(pl.Utf8)).list.join(";").alias(c))
        elif isinstance(t, pl.Datetime):
            exprs.append(pl.col(c).dt.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").alias(c))
    return df.with_columns(exprs) if exprs else df


def write_tables(df: pl.DataFrame, out_dir: Path) -> tuple[Path, Path]:
    pq, csv = out_dir / "summary.parquet", out_dir / "summary.csv"
    for path, write in ((pq, df.write_parquet), (csv, lambda p: csv_frame(df).write_csv(p))):
        with replacing(path) as tmp:
            write(tmp)
    return pq, csv
