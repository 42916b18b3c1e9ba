#!/usr/bin/env python3
"""Throughput of `ncclforensics scan`: runs per second over many small runs and over a few big ones.

Builds (once; kept under --work, default bench/data/scan_bench/, git-ignored):
  small/  --small runs: copies of the dev corpus cases (../shared/corpus), every fifth as a .tar.gz
  large/  --large runs of --large-size each, made by bench/gen_run.py (NCCL_DEBUG=INFO-shaped noise
          around a lagging-rank, Xid or OOM failure; alternating --log-dir and console layouts)
then scans each set from scratch with every --jobs value, and once more unchanged (all cache hits),
and prints runs/s, MB/s and the machine's load average (other work on the machine skews figures).

    .venv/bin/python bench/scan_bench.py                       # 1000 small + 20 x 100 MB, jobs 1 and 2
    .venv/bin/python bench/scan_bench.py --small 200 --large 0 --no-reports
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from ncclforensics.scan import scan  # noqa: E402

CORPUS = REPO.parent / "shared" / "corpus"


def _size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def build_small(dest: Path, n: int) -> None:
    marker = dest / ".built"
    if marker.is_file() and marker.read_text() == str(n):
        return
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    cases = sorted(p.parent for p in CORPUS.glob("*/label.json"))
    if not cases:
        sys.exit(f"no corpus at {CORPUS}")
    skip = shutil.ignore_patterns("label.json")
    for i, case in zip(range(n), itertools.cycle(cases), strict=False):
        name = f"run{i:05d}_{case.name[:3]}"
        if i % 5 == 4:
            with tarfile.open(dest / f"{name}.tar.gz", "w:gz") as tf:
                for p in sorted(case.rglob("*")):
                    if p.is_file() and p.name != "label.json":
                        tf.add(p, arcname=f"{name}/{p.relative_to(case).as_posix()}")
        else:
            shutil.copytree(case, dest / name, ignore=skip)
    marker.write_text(str(n))


def build_large(dest: Path, n: int, size: str) -> None:
    marker = dest / ".built"
    if marker.is_file() and marker.read_text() == f"{n} {size}":
        return
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    failures = ("lagging_rank", "xid", "oom")
    for i in range(n):
        cmd = [sys.executable, str(HERE / "gen_run.py"), "--ranks", "64", "--per-host", "8", "--size", size,
               "--seed", str(100 + i), "--failure", failures[i % 3], "--layout", ("logdir", "console")[i % 2],
               "--out", str(dest / f"job{i:03d}")]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        (dest / f"job{i:03d}.truth.json").unlink(missing_ok=True)  # keep the root to runs only
    marker.write_text(f"{n} {size}")


def bytes_under(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))


def bench(label: str, root: Path, out_base: Path, jobs_list: list[int], reports: bool, timeout: float) -> list[dict]:
    total = bytes_under(root)
    rows = []
    for jobs in jobs_list:
        out = out_base / f"{label}-j{jobs}"
        shutil.rmtree(out, ignore_errors=True)
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        res = scan(root, out, jobs=jobs, progress=False, reports=reports, timeout=timeout)
        wall = time.monotonic() - t0
        t1 = time.monotonic()
        again = scan(root, out, jobs=jobs, progress=False, reports=reports, timeout=timeout)
        rescan = time.monotonic() - t1
        assert again.analyzed == 0, "an unchanged re-scan analyzed runs"
        rows.append({
            "set": label, "runs": res.runs, "jobs": jobs, "reports": reports, "seconds": round(wall, 2),
            "runs_per_s": round(res.runs / wall, 2), "MB_per_s": round(total / 1e6 / wall, 1),
            "errors": res.errors, "rescan_s": round(rescan, 2), "load_before": round(load, 1),
        })
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=1000, help="small runs (default 1000)")
    ap.add_argument("--large", type=int, default=20, help="large runs (default 20)")
    ap.add_argument("--large-size", default="100M", help="size of each large run (default 100M)")
    ap.add_argument("--jobs", default="1,2", help="comma-separated worker counts (default 1,2)")
    ap.add_argument("--no-reports", action="store_true", help="skip report.html per run")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--work", type=Path, default=HERE / "data" / "scan_bench")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args()
    jobs = [int(j) for j in a.jobs.split(",")]
    rows = []
    if a.small:
        t = time.monotonic()
        build_small(a.work / "small", a.small)
        print(f"small runs ready in {time.monotonic() - t:.1f} s", file=sys.stderr)
        rows += bench("small", a.work / "small", a.work / "out", jobs, not a.no_reports, a.timeout)
    if a.large:
        t = time.monotonic()
        build_large(a.work / "large", a.large, a.large_size)
        print(f"large runs ready in {time.monotonic() - t:.1f} s", file=sys.stderr)
        rows += bench("large", a.work / "large", a.work / "out", jobs, not a.no_reports, a.timeout)
    print(f"\n{'set':6} {'runs':>5} {'jobs':>4} {'reports':>7} {'seconds':>8} {'runs/s':>7} {'MB/s':>7} "
          f"{'rescan s':>8} {'load':>5}")
    for r in rows:
        print(f"{r['set']:6} {r['runs']:5d} {r['jobs']:4d} {r['reports']!s:>7} {r['seconds']:8.1f} "
              f"{r['runs_per_s']:7.2f} {r['MB_per_s']:7.1f} {r['rescan_s']:8.2f} {r['load_before']:5.1f}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
