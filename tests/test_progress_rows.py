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


@pytest.mark.parametrize("gap_blocks", [0, 3, 12])
def test_tail_rows_carry_their_own_line_numbers_when_weak_lines_are_sparse(tmp_path: Path, gap_blocks: int):
    """A worker's file of NCCL `COLL` lines with a progress line every few hundred KB (progress every 50
    steps): the tail walk goes back over blocks holding no weak literal, and every row it keeps must
    carry the line number the line has in the file (an earlier walk counted the skipped blocks'
    newlines into the next block's and numbered its lines past their place)."""
    coll = ("gpu-a:101:202 [0] NCCL INFO AllReduce: opCount {n:x} sendbuff 0x7f04e09f5000 recvbuff "
            "0x7f04e09f5000 count 6553600 datatype 7 op 0 root 0 comm 0x5582f53b7639 [nranks=8] stream 0x55e7")
    per_gap = gap_blocks * (64 << 10) // len(coll.format(n=0)) + 5
    lines, want = [], []
    for s in range(4):
        lines += [coll.format(n=len(lines) + k) for k in range(per_gap)]
        lines.append(f"step {s * 50} loss 1.{s}")
        want.append(len(lines))
    lines += [coll.format(n=len(lines) + k) for k in range(7)]
    path = tmp_path / "run" / "host-a/none_x1/attempt_0/0/stdout.log"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    ev = build_events(tmp_path / "run").events
    prog = ev.filter(pl.col("kind") == "step_progress").sort("line")
    assert prog.height >= 2
    text_at = {i + 1: line for i, line in enumerate(lines)}
    for line, text in zip(prog["line"].to_list(), prog["text"].to_list(), strict=True):
        assert text_at[line] == text, (line, text)
    assert prog["line"].to_list()[-KEEP_PROGRESS:] == want[-KEEP_PROGRESS:]
