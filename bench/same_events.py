#!/usr/bin/env python3
"""Write the event table of many inputs, or compare two such sets: the check that a change to the
reader kept every row and column (bench/README.md, "Same events").

    same_events.py dump OUTDIR INPUT...     # one OUTDIR/<n>.parquet per input (+ index.json)
    same_events.py compare OLDDIR NEWDIR    # equal tables, or the first differences

An INPUT that is a folder of case folders (a corpus: folders holding label.json or logs) counts as
its cases. Run `dump` under the old and the new code (PYTHONPATH=<old checkout> for the old).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl


def expand(inputs: list[str]) -> list[Path]:
    out = []
    for s in inputs:
        p = Path(s)
        cases = sorted(c for c in p.iterdir() if c.is_dir() and (c / "label.json").exists()) if p.is_dir() else []
        out += cases or [p]
    return out


def dump(outdir: Path, inputs: list[str]) -> int:
    from ncclforensics.events import build_events

    outdir.mkdir(parents=True, exist_ok=True)
    index = {}
    for i, path in enumerate(expand(inputs)):
        res = build_events(path)
        name = f"{i:04d}.parquet"
        res.events.write_parquet(outdir / name)
        index[name] = {"input": str(path), "files": res.files, "lines": res.lines, "bytes": res.bytes,
                       "skipped": [[s.file, s.reason] for s in res.skipped], "notes": res.notes,
                       "year_source": res.year_source}
        print(f"{name} {path} {res.events.height} rows", file=sys.stderr)
    (outdir / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return 0


def compare(old: Path, new: Path) -> int:
    a = json.loads((old / "index.json").read_text())
    b = json.loads((new / "index.json").read_text())
    bad = 0
    for name, meta in a.items():
        if name not in b or b[name]["input"] != meta["input"]:
            print(f"{name}: {meta['input']} missing from {new}")
            bad += 1
            continue
        x, y = pl.read_parquet(old / name), pl.read_parquet(new / name)
        same_meta = {k: v for k, v in meta.items()} == b[name]
        if x.columns == y.columns and x.dtypes == y.dtypes and x.equals(y) and same_meta:
            continue
        bad += 1
        print(f"{name} {meta['input']}: {x.height} rows -> {y.height}")
        if not same_meta:
            diff = {k: (v, b[name].get(k)) for k, v in meta.items() if b[name].get(k) != v}
            print("  counts/skips/notes differ:", diff)
        if x.columns != y.columns:
            print("  columns differ:", x.columns, y.columns)
            continue
        xs = x.with_columns(pl.all().cast(pl.Utf8))
        ys = y.with_columns(pl.all().cast(pl.Utf8))
        only_a = xs.join(ys, on=xs.columns, how="anti", nulls_equal=True)
        only_b = ys.join(xs, on=xs.columns, how="anti", nulls_equal=True)
        for tag, d in (("-", only_a), ("+", only_b)):
            for r in d.head(5).iter_rows(named=True):
                print(f"  {tag} {r['file']}:{r['line']} {r['kind']} rank={r['rank']} {str(r['text'])[:100]}")
    print(f"{len(a) - bad}/{len(a)} tables equal")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "dump":
        return dump(Path(argv[1]), argv[2:])
    if len(argv) == 3 and argv[0] == "compare":
        return compare(Path(argv[1]), Path(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
