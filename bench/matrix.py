#!/usr/bin/env python3
"""The benchmark matrix: named shapes of generated runs (gen_run.py arguments), generated on demand.

    .venv/bin/python bench/matrix.py            # generate every missing shape under bench/data/matrix/
    .venv/bin/python bench/matrix.py --list     # names, arguments and paths
    .venv/bin/python bench/bench.py --matrix    # time them (bench.py reads MATRIX from here)
    .venv/bin/python bench/matrix.py --table bench/data/bench_results.json   # before/after table of a bench run

Each shape is one run folder `bench/data/matrix/<name>` (and `<name>.tar.gz` where `tar` is set) with
its `<name>.truth.json`. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "matrix"

# name -> (gen_run.py arguments, also a .tar.gz, in the 1 GB matrix the verdict criterion reads)
MATRIX: dict[str, tuple[list[str], bool, bool]] = {
    # log-dir trees (256 ranks, 544 files of ~2 MB)
    "logdir_r0_10": (["--layout", "logdir", "--progress", "rank0", "--log-every", "10"], False, True),
    "logdir_all_50": (["--layout", "logdir", "--progress", "all", "--log-every", "50"], False, True),
    "logdir_all_1": (["--layout", "logdir", "--progress", "all", "--log-every", "1"], True, True),
    "logdir_all_1_nocoll": (["--layout", "logdir", "--progress", "all", "--log-every", "1", "--coll", "off"],
                            False, True),
    # one interleaved console
    "console_r0_10": (["--layout", "console", "--progress", "rank0", "--log-every", "10"], False, True),
    "console_all_1": (["--layout", "console", "--progress", "all", "--log-every", "1", "--failure", "oom"],
                      False, True),
    "console_all_1_nocoll": (["--layout", "console", "--progress", "all", "--log-every", "1", "--coll", "off"],
                             False, True),
    # many small files: 2,048 ranks, 4,352 files of ~240 KB
    "small_2048": (["--layout", "logdir", "--ranks", "2048", "--progress", "all", "--log-every", "1",
                    "--failure", "xid"], False, True),
}
SIZE = "1G"
SEED = "7"
# outside the 1 GB criterion: scale and the old small-run figure
EXTRA: dict[str, tuple[list[str], bool, bool]] = {
    "xid_1024_4G": (["--layout", "logdir", "--ranks", "1024", "--size", "4G", "--failure", "xid", "--progress",
                     "all", "--log-every", "1", "--seed", "3"], False, False),
    "logdir_100M": (["--layout", "logdir", "--size", "100M"], False, False),
}


def gen_args(name: str) -> list[str]:
    args, tar, _ = {**MATRIX, **EXTRA}[name]
    out = ["--size", SIZE, "--seed", SEED, *args, "--out", str(DATA / name), "--force"]
    return out + (["--tar-gz"] if tar else [])


def paths(name: str) -> list[Path]:
    """The inputs a shape is timed on: the folder, and its .tar.gz when made."""
    _, tar, _ = {**MATRIX, **EXTRA}[name]
    return [DATA / name] + ([DATA / f"{name}.tar.gz"] if tar else [])


def table(doc: dict) -> str:
    """One row per input of a bench.py JSON: analyze (and `before`, with --before) against grep and rg,
    wall and CPU medians, peak RSS and the verdict's check against the truth file."""
    rows: dict[str, dict[str, dict]] = {}
    for r in doc["results"]:
        rows.setdefault(r["run"], {})[r["command"]] = r

    def med(r: dict | None, key: str) -> float | None:
        return statistics.median(r[key]) if r and r.get(key) else None

    def ratio(x: float | None, y: float | None) -> str:
        return f"{x / y:.1f}×" if x and y else "–"

    def cell(r: dict | None, grep: dict | None, rg: dict | None) -> list[str]:
        w, c = med(r, "runs"), med(r, "cpu_s")
        rss = max(r["rss_kb"]) / 1024 if r and r.get("rss_kb") else None
        truth = (r.get("output") or {}).get("truth", "–") if r else "–"
        return [f"{w:.2f}" if w else "–", ratio(w, med(grep, "runs")), ratio(w, med(rg, "runs")),
                f"{c:.2f}" if c else "–", ratio(c, med(grep, "cpu_s")), f"{rss:.0f}" if rss else "–", truth]

    head = ("| input | MB | version | wall s | × grep | × rg | CPU s | × grep CPU | peak RSS MB | verdict |\n"
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---|")
    out = [head]
    for run, cmds in rows.items():
        grep, rg = cmds.get("grep"), cmds.get("rg")
        name = Path(run).name
        mb = f"{next(iter(cmds.values()))['bytes'] / 1e6:.0f}"
        for label, key in (("before", "before"), ("after", "analyze")):
            if key in cmds:
                out.append("| " + " | ".join([name, mb, label, *cell(cmds[key], grep, rg)]) + " |")
                name = mb = ""
        for key in ("grep", "rg"):
            if key in cmds:
                w, c = med(cmds[key], "runs"), med(cmds[key], "cpu_s")
                rss = max(cmds[key]["rss_kb"]) / 1024 if cmds[key].get("rss_kb") else None
                out.append(f"| | | {key} | {w:.2f} | | | {c:.2f} | | {rss:.0f} | |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="shapes to make (default: all)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--force", action="store_true", help="regenerate shapes that exist")
    ap.add_argument("--table", metavar="JSON", help="print the before/after table of a bench.py --json file")
    args = ap.parse_args(argv)
    if args.table:
        sys.stdout.write(table(json.loads(Path(args.table).read_text())))
        return 0
    names = args.names or [*MATRIX, *EXTRA]
    for name in names:
        if name not in MATRIX and name not in EXTRA:
            raise SystemExit(f"unknown shape {name!r}: {', '.join([*MATRIX, *EXTRA])}")
        if args.list:
            print(name, " ".join(gen_args(name)))
            continue
        truth = DATA / f"{name}.truth.json"
        if truth.exists() and not args.force:
            continue
        DATA.mkdir(parents=True, exist_ok=True)
        print(f"generating {name}", file=sys.stderr)
        subprocess.run([sys.executable, str(HERE / "gen_run.py"), *gen_args(name)], check=True,
                       stdout=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
