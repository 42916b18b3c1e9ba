"""The shared helpers: one for each thing written or read alike everywhere (times, sizes, cuts, culprits,
collectives, signals)."""

from __future__ import annotations

import datetime as dt
import signal
import sys

import pytest

from ncclforensics import times
from ncclforensics.model import Collective, Finding, RootCause, rank_ranges
from ncclforensics.signals import LINUX_SIGNALS, signal_name, signal_number, signal_of_exit
from ncclforensics.words import collective_words, culprit_text, cut, cut_left, human_bytes

T = dt.datetime(2026, 11, 22, 7, 44, 34, 246813, tzinfo=dt.UTC)
WHOLE = T.replace(microsecond=0)


def test_rank_ranges():
    assert rank_ranges([3, 0, 1, 2, 7, 9, 10]) == "0–3, 7, 9, 10 (7 ranks)"
    assert rank_ranges([5]) == "5"
    assert rank_ranges(list(range(0, 100, 2)), limit=3).endswith("… (50 ranks)")


def test_each_time_style():
    cases = {
        times.JSON_SECONDS: ("2026-11-22T07:44:34Z", "2026-11-22T07:44:34Z"),
        times.JSON_EVENT: ("2026-11-22T07:44:34.246813Z", "2026-11-22T07:44:34Z"),
        times.SUMMARY: ("2026-11-22T07:44:34.246813Z", "2026-11-22T07:44:34.000000Z"),
        times.PLOTLY: ("2026-11-22 07:44:34.246813", "2026-11-22 07:44:34.000000"),
        times.READABLE: ("2026-11-22 07:44:34.246 UTC", "2026-11-22 07:44:34 UTC"),
        times.GENERATED_MINUTE: ("2026-11-22 07:44 UTC", "2026-11-22 07:44 UTC"),
        times.GENERATED_SECOND: ("2026-11-22 07:44:34 UTC", "2026-11-22 07:44:34 UTC"),
        times.TABLE: ("2026-11-22 07:44:34", "2026-11-22 07:44:34"),
        times.CLOCK: ("07:44:34.246", "07:44:34.000"),
    }
    for style, (fraction, whole) in cases.items():
        assert (times.utc_text(T, style), times.utc_text(WHOLE, style)) == (fraction, whole), style


def test_times_are_utc_from_any_input():
    # a naive time is UTC already; an aware one is converted; an ISO string is read; anything else is no time
    assert times.utc_text(T.replace(tzinfo=None), times.JSON_EVENT) == "2026-11-22T07:44:34.246813Z"
    plus2 = T.astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert times.utc_text(plus2, times.JSON_SECONDS) == "2026-11-22T07:44:34Z"
    assert times.utc_text("2026-11-22T07:44:34Z", times.READABLE) == "2026-11-22 07:44:34 UTC"
    assert times.utc_text("yesterday", times.READABLE) is None
    assert times.utc_text(None, times.SUMMARY) is None


def test_one_byte_unit():
    assert [human_bytes(n) for n in (None, 0, 999, 1024, 1536, 5 << 20, 3 << 30, 2 << 40)] == [
        "", "0 B", "999 B", "1.0 KB", "1.5 KB", "5.0 MB", "3.0 GB", "2.0 TB"]


def test_cuts_are_marked():
    assert cut("a  b\nc", 10) == "a b c"
    assert cut("abcdef ghij", 8) == "abcdef…"
    assert cut("  keep  inner  ", 40, fold=False) == "keep  inner"
    assert cut(None, 5) == ""
    assert cut_left("node0/attempt_0/3/stderr.log:12", 16) == "…3/stderr.log:12"


def _finding(ranks=(), hosts=(), collective: Collective | None = None) -> Finding:
    return Finding(RootCause.RANK_CRASH, "RC001", "t", "m", 0.9, culprit_ranks=list(ranks),
                   culprit_hosts=list(hosts), collective=collective or Collective())


def test_culprit_and_collective_words():
    assert culprit_text(_finding([0], ["localhost"])) == "rank 0 on localhost"
    assert culprit_text(_finding([1, 2, 3])) == "ranks 1–3 (3 ranks)"
    assert culprit_text(_finding(hosts=["gpu-a", "gpu-b"])) == "host gpu-a, gpu-b"
    assert culprit_text(_finding()) == "no single rank"
    assert collective_words(_finding()) == "none identified"
    assert collective_words(_finding(collective=Collective("0", "ALLREDUCE", 9))) == "PG 0 ALLREDUCE, SeqNum 9"
    assert collective_words(_finding(collective=Collective(None, "BARRIER", None))) == "BARRIER, SeqNum unknown"


def test_signal_words():
    assert [signal_number(t) for t in ("SIGKILL", "Killed", "killed", "-9", "9", "Segmentation fault (core dumped)",
                                       "Floating-point exception", "Out Of Memory")] == [9, 9, 9, 9, 9, 11, 8, None]
    assert (signal_name(7), signal_name(None), signal_name(64)) == ("SIGBUS", "a signal", "signal 64")
    assert [signal_of_exit(c) for c in (-6, 134, 250, 1, None)] == [6, 6, 6, None, None]


@pytest.mark.skipif(sys.platform != "linux", reason="the stdlib's signal table is the platform's")
def test_signal_table_is_linuxs():
    for n, (name, text) in LINUX_SIGNALS.items():
        assert (signal.Signals(n).name, signal.strsignal(n)) == (name, text)
