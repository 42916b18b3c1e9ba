#!/usr/bin/env python3
"""Cost of finding the runs under a scan root (`find_runs`: walk + run-identity samples), and of a scan.

    .venv/bin/python bench/discover_bench.py bench/data/run1024_4G_xid [--scan]

Prints the median wall and CPU seconds of 3 `find_runs` calls and, with --scan, of one scan from scratch
(jobs 1, no reports) and one unchanged re-scan, with the bytes the identity samples read. CPU seconds
(self + children) are the figure to compare on a loaded machine. Run it with PYTHONPATH pointing at another
checkout to compare code versions on the same data.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

if not os.environ.get("PYTHONPATH"):  # PYTHONPATH picks another checkout's code to compare with
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def sampled_bytes(root: Path) -> int:
    """Upper bound of what the identity samples read: head + tail per file (dumps and JSON whole)."""
    try:
        from ncclforensics.scan.identity import HEAD_BYTES, TAIL_BYTES
    except ImportError:  # a checkout without run identity
        return 0
    total = 0
    for p in root.rglob("*"):
        if p.is_file():
            total += min(p.stat().st_size, HEAD_BYTES + TAIL_BYTES)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--scan", action="store_true", help="also time a scan and an unchanged re-scan")
    a = ap.parse_args()
    import ncclforensics
    from ncclforensics.scan import find_runs, scan

    print(f"code {Path(ncclforensics.__file__).parent}, root {a.root}, load {os.getloadavg()[0]:.1f}")
    rows = []
    for _ in range(3):
        t, c = time.perf_counter(), cpu()
        specs = find_runs(a.root)
        rows.append((time.perf_counter() - t, cpu() - c))
    rows.sort()
    size = sum(p.stat().st_size for p in a.root.rglob("*") if p.is_file())
    print(f"find_runs: {len(specs)} run(s), {size / 1e6:,.0f} MB; median wall {rows[1][0]:.2f} s, "
          f"CPU {rows[1][1]:.2f} s; identity samples read <= {sampled_bytes(a.root) / 1e6:,.1f} MB")
    if a.scan:
        out = Path(tempfile.mkdtemp(prefix="discover-bench-"))
        try:
            t, c = time.perf_counter(), cpu()
            res = scan(a.root, out, jobs=1, progress=False, reports=False)
            print(f"scan: wall {time.perf_counter() - t:.2f} s, CPU {cpu() - c:.2f} s; {res.statuses}")
            t, c = time.perf_counter(), cpu()
            scan(a.root, out, jobs=1, progress=False, reports=False)
            print(f"re-scan (unchanged): wall {time.perf_counter() - t:.2f} s, CPU {cpu() - c:.2f} s")
        finally:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
