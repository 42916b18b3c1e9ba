"""align.py on hand-built event tables: the frontier per process group x rank and the stuck collective."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import polars as pl

from ncclforensics.align import DEFAULT_PG, PG_LEAD, frontier, stuck_collective
from ncclforensics.model import EVENT_SCHEMA

T0 = datetime(2026, 11, 22, 7, 44, 0, tzinfo=UTC)


def table(*rows: dict) -> pl.DataFrame:
    """An event table from the columns each row names (the others null); `extra` given as a dict."""
    full = [{c: (json.dumps(r[c]) if c == "extra" and isinstance(r.get(c), dict) else r.get(c))
             for c in EVENT_SCHEMA} for r in rows]
    return pl.DataFrame(full, schema=EVENT_SCHEMA, strict=False)


def timeout(rank: int, seq: int, *, op: str = "ALLREDUCE", numel: int = 1024, pg: str | None = None,
            at: float = 0.0, **more) -> dict:
    return {"kind": "watchdog_timeout", "source": "nccl", "rank": rank, "seq": seq, "op": op, "numel_in": numel,
            "timeout_ms": 600_000, "pg": pg, "ts": T0 + timedelta(seconds=at), "file": f"rank{rank}.log",
            "line": 1, **more}


def fr_entry(rank: int, seq: int, state: str, *, op: str = "ALLREDUCE", pg: str = "0", numel: int = 8) -> dict:
    return {"kind": "fr_entry", "source": "flight_recorder", "rank": rank, "seq": seq, "op": op, "pg": pg,
            "numel_in": numel, "extra": {"state": state}, "file": f"fr_trace_{rank}", "line": seq}


def row(fr: pl.DataFrame, pg: str, rank: int) -> dict:
    return fr.filter((pl.col("pg") == pg) & (pl.col("rank") == rank)).row(0, named=True)


def test_nothing_to_align():
    fr = frontier(table())
    assert fr.is_empty()
    s = stuck_collective(fr)
    assert (s.pg, s.op, s.seq, s.source, s.in_it, s.elsewhere) == (None, None, None, "none", (), {})


def test_the_majority_of_timeouts_is_the_stuck_collective():
    fr = frontier(table(timeout(0, 812), timeout(1, 812), timeout(2, 811), timeout(3, 812)))
    assert fr["pg"].to_list() == [DEFAULT_PG] * 4 and fr["timeout_seq"].to_list() == [812, 812, 811, 812]
    s = stuck_collective(fr)
    assert (s.pg, s.op, s.seq, s.numel, s.source) == (DEFAULT_PG, "ALLREDUCE", 812, 1024, "watchdog")
    assert s.in_it == (0, 1, 3) and s.elsewhere == {2: "ALLREDUCE#811"}


def test_a_rank_keeps_its_earliest_timeout():
    fr = frontier(table(timeout(0, 9, at=5), timeout(0, 7, at=1), timeout(0, 8, at=3)))
    assert row(fr, DEFAULT_PG, 0)["timeout_seq"] == 7


def test_status_lines_give_positions_and_lend_their_pg_to_timeouts():
    status = {"kind": "watchdog_status", "source": "nccl", "rank": 1, "pg": "3", "seq": 41,
              "extra": {"enqueued": 44, "started": 41, "completed": 40}, "file": "rank1.log", "line": 2}
    fr = frontier(table(status, timeout(1, 41)))
    r = row(fr, "3", 1)  # the timeout names no PG: the status line of its SeqNum does
    assert (r["last_enqueued"], r["last_started"], r["last_completed"], r["timeout_seq"]) == (44, 41, 40, 41)
    assert fr.height == 1


def test_dump_signal_names_who_asked_for_the_dump():
    sig = {"kind": "dump_signal", "source": "nccl", "rank": 2, "pg": "0", "extra": {"enqueued": 8, "src_rank": 0},
           "file": "rank2.log", "line": 9}
    r = row(frontier(table(sig)), "0", 2)
    assert (r["last_enqueued"], r["dump_src"]) == (8, 0)


def test_flight_recorder_stops_at_the_first_entry_not_completed():
    rows = [fr_entry(0, 5, "completed"), fr_entry(0, 6, "started"), fr_entry(0, 7, "scheduled"),
            fr_entry(1, 5, "completed"), fr_entry(1, 6, "completed")]
    fr = frontier(table(*rows))
    assert (row(fr, "0", 0)["fr_last_seq"], row(fr, "0", 0)["fr_entries"]) == (6, 3)
    assert row(fr, "0", 1)["fr_last_seq"] == 6  # every entry completed: the last one
    s = stuck_collective(fr)
    assert (s.source, s.seq, s.in_it) == ("flight_recorder", 6, (0, 1))


def test_gloo_entries_are_all_scheduled_the_last_one_counts():
    fr = frontier(table(fr_entry(0, 3, "scheduled"), fr_entry(0, 4, "scheduled")))
    assert row(fr, "0", 0)["fr_last_seq"] == 4


def test_a_detail_fingerprint_places_both_ranks_one_collective_later():
    fp = {"kind": "fingerprint_mismatch", "source": "torch_detail", "rank": None, "op": "ALLREDUCE",
          "extra": {"rank_a": 1, "seq_a": 6, "shape_a": "4, 4", "rank_b": 0, "seq_b": 5, "op_b": "BROADCAST",
                    "shape_b": "4"}, "file": "console.log", "line": 3}
    fr = frontier(table(fp))
    a, b = row(fr, DEFAULT_PG, 1), row(fr, DEFAULT_PG, 0)
    # SequenceNumber counts the collectives issued before (FORMATS.md §7.1)
    assert (a["fp_seq"], a["fp_op"], a["fp_shape"]) == (7, "ALLREDUCE", "4, 4")
    assert (b["fp_seq"], b["fp_op"], b["fp_shape"]) == (6, "BROADCAST", "4")
    s = stuck_collective(fr)  # one rank each: the bigger collective (16 elements against 4) is the regular one
    assert (s.source, s.op, s.seq, s.numel, s.in_it, s.elsewhere) == ("fingerprint", "ALLREDUCE", 7, 16, (1,),
                                                                      {0: "BROADCAST#6"})


def test_a_tie_goes_to_the_bigger_collective():
    fr = frontier(table(timeout(0, 10, numel=1), timeout(1, 10, numel=4096)))
    s = stuck_collective(fr)
    assert (s.seq, s.numel, s.in_it, s.elsewhere) == (10, 4096, (1,), {0: "ALLREDUCE#10"})


def test_the_pg_that_timed_out_clearly_first_is_stuck():
    late = (PG_LEAD + timedelta(seconds=1)).total_seconds()
    fr = frontier(table(timeout(0, 50, pg="7", at=0), timeout(1, 900, pg="0", at=late),
                        timeout(2, 900, pg="0", at=late)))
    assert stuck_collective(fr).pg == "7"
    close = frontier(table(timeout(0, 50, pg="7", at=0), timeout(1, 900, pg="0", at=0.1),
                           timeout(2, 900, pg="0", at=0.1)))
    assert stuck_collective(close).pg == "0"  # no clear lead: the PG most ranks report


def test_after_a_restart_the_first_failed_attempt_is_aligned():
    rows = [timeout(0, 12, extra={"attempt": 0}), timeout(1, 12, extra={"attempt": 0}),
            timeout(0, 3, extra={"attempt": 1}), timeout(1, 3, extra={"attempt": 1})]
    assert stuck_collective(frontier(table(*rows))).seq == 12


def test_async_errors_when_nothing_timed_out():
    err = {"kind": "watchdog_exception", "source": "nccl", "rank": 2, "pg": "0", "seq": 31, "op": "ALLGATHER",
           "numel_in": 2, "file": "rank2.log", "line": 4}
    s = stuck_collective(frontier(table(err)))
    assert (s.source, s.op, s.seq) == ("async_error", "ALLGATHER", 31)


def test_gloo_tracebacks_give_the_op_alone():
    exc = [{"kind": "exception", "source": "python", "rank": r, "op": op, "file": f"rank{r}.log", "line": 1}
           for r, op in ((0, "BARRIER"), (1, "ALLREDUCE"), (2, "ALLREDUCE"))]
    s = stuck_collective(frontier(table(*exc)))
    assert (s.source, s.op, s.seq, s.in_it, s.elsewhere) == ("traceback", "ALLREDUCE", None, (1, 2), {0: "BARRIER"})


def test_rows_without_a_rank_are_not_placed():
    fr = frontier(table(timeout(0, 5), {**timeout(0, 5), "rank": None}))
    assert fr["rank"].to_list() == [0]
