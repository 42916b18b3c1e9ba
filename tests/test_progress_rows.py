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


@pytest.mark.parametrize("layout", ["worker_file", "console"])
def test_the_tail_walk_stops_sooner_in_a_file_of_one_worker(tmp_path: Path, layout: str):
    """The tail is walked back until TAIL_QUIET hits in a row brought no new writer; in a file a
    launcher wrote for one worker (torchrun --log-dir) every writer is that rank, and TAIL_QUIET_ONE
    hits are enough. A console of several writers still goes back far enough to find a writer whose
    last line lies behind 20 lines of another's."""
    from ncclforensics.parse.lines import TAIL_QUIET, TAIL_QUIET_ONE

    assert TAIL_QUIET_ONE < 20 < TAIL_QUIET
    lines = [f"[default1]:[rank1]: step {s} loss 0.5" for s in range(30)]
    lines.append("[default0]:[rank0]: step 29 loss 0.7")  # the other writer's last news
    lines += [f"[default1]:[rank1]: step {s} loss 0.5" for s in range(30, 55)]
    name = "host-a/none_x1/attempt_0/0/stdout.log" if layout == "worker_file" else "console.log"
    path = tmp_path / "run" / name
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    ev = build_events(tmp_path / "run").events
    found = ev.filter(pl.col("line") == 31).height > 0
    # in one worker's file a line 25 hits back is not looked for; in a console it is found
    assert found is (layout == "console")
