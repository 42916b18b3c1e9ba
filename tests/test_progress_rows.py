"""Progress lines are many (one per step and rank); only each rank's last KEEP_PROGRESS rows are kept,
and the block scan matches progress lines last-first until it has them. The kept rows must be the
last ones of every rank, wherever the file's blocks and tail fall."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from ncclforensics.events import build_events
from ncclforensics.parse.lines import KEEP_PROGRESS

WATCHDOG = ("[rank{r}]:[E1122 07:44:17.000000000 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=17, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=600000) ran for 600001 milliseconds before timing out.")


@pytest.mark.parametrize("steps", [40, 3000])  # one block; many blocks and a separate tail
def test_each_rank_keeps_its_last_progress_rows(tmp_path: Path, steps: int):
    lines, last = [], {0: [], 1: [], 2: []}
    for s in range(steps):
        for r in (0, 1, 2):
            lines.append(f"[default{r}]:[rank{r}]: step {s} loss {1 + (s * 7 + r) % 97 / 100:.2f}")
            last[r].append(len(lines))
        if s == steps // 2:
            lines.append(WATCHDOG.format(r=1))  # a strong line mid-file: its block is scanned whole
    lines.append(WATCHDOG.format(r=0))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "console.log").write_text("\n".join(lines) + "\n")
    ev = build_events(tmp_path / "run").events
    prog = ev.filter(pl.col("kind") == "step_progress")
    for r in (0, 1, 2):
        got = sorted(prog.filter(pl.col("rank") == r)["line"].to_list())
        assert got == last[r][-KEEP_PROGRESS:], (r, got)
    assert prog.height == 3 * KEEP_PROGRESS
