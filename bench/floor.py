#!/usr/bin/env python3
"""What reading a run costs below Python's line work: every file opened and read whole, the
scanner's block prefilter (Hyperscan, the same literals) and its newline counts, in N forked
processes (files dealt round-robin), and nothing else: no line decoded, peeled or matched, no row.

    .venv/bin/python bench/floor.py bench/data/matrix/small_2048 [PROCS] [RUNS]

Prints the median wall time of RUNS (default 3) readings. Beside bench.py's grep on the same folder
it tells how much of `analyze` the bytes themselves cost and how much the Python work on the lines
they select (bench/README.md, "tenth round").
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from ncclforensics.parse.lines import LineScanner, _block_spans
from ncclforensics.parse.prefilter import count_newlines, numpy_module
from ncclforensics.parse.signatures import load_signatures


def files_under(root: str) -> list[str]:
    out: list[str] = []
    for d, _, names in os.walk(root):
        out += [os.path.join(d, f) for f in names]
    return sorted(out)


def read_all(paths: list[str], scanner: LineScanner) -> tuple[int, int]:
    """Blocks with a prefilter hit and newlines of the files."""
    hits = newlines = 0
    for p in paths:
        with open(p, "rb") as fh:
            data = fh.read()
        spans = _block_spans(data)
        if spans:
            hits += len(scanner.block_set.blocks_with_any(data, spans))
        newlines += count_newlines(data)
    return hits, newlines


def once(files: list[str], procs: int, scanner: LineScanner) -> float:
    t = time.perf_counter()
    children = []
    for k in range(1, procs):
        pid = os.fork()
        if pid == 0:
            read_all(files[k::procs], scanner)
            os._exit(0)
        children.append(pid)
    read_all(files[0::procs], scanner)
    for pid in children:
        os.waitpid(pid, 0)
    return time.perf_counter() - t


def main() -> None:
    root = sys.argv[1]
    procs = int(sys.argv[2]) if len(sys.argv) > 2 else (os.cpu_count() or 1)
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    scanner = LineScanner(load_signatures())
    numpy_module()  # as a shared reading of a large run imports it before forking
    files = files_under(root)
    walls = [once(files, procs, scanner) for _ in range(runs)]
    print(f"{root}: {len(files)} files, {procs} processes, median {statistics.median(walls):.3f} s "
          f"({', '.join(f'{w:.3f}' for w in walls)})")


if __name__ == "__main__":
    main()
