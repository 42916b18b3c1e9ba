"""Small files read whole share one prefilter query (ingest.reader.Reader); the event table, skips and
notes must be exactly what reading them one by one gives, in the same order."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from ncclforensics import events
from ncclforensics.ingest import reader

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
WATCHDOG = ("[rank{r}]:[E1122 07:44:{s:02d}.000000000 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=17, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=600000) ran for 600001 milliseconds before timing out.\n")


def _folder(tmp: Path) -> Path:
    run = tmp / "run"
    run.mkdir()
    for r in range(12):
        noise = "".join(f"[rank{r}]: step {i} loss 2.{i:03d}\n" for i in range(300))
        text = noise + (WATCHDOG.format(r=r, s=r) if r % 3 else "")  # some files have no anchor at all
        (run / f"rank_{r}.log").write_text(text)
    (run / "latin1.log").write_bytes(b"caf\xe9 " + WATCHDOG.format(r=12, s=40).encode())  # invalid UTF-8
    (run / "empty.log").write_bytes(b"")
    lines = "".join(f"[rank13]: step {i} loss {i * 7919 % 10007} tokens {i * 104729 % 99991}\n" for i in range(20000))
    whole = gzip.compress((WATCHDOG.format(r=13, s=41) + lines).encode())
    (run / "cut.log.gz").write_bytes(whole[: len(whole) // 2])  # truncated: read in part
    (run / "no_newline.log").write_text(WATCHDOG.format(r=14, s=42).rstrip("\n"))
    return run


def _ingest(path: Path, monkeypatch, batch: int):
    monkeypatch.setattr(reader, "BATCH_BYTES", batch)
    return events.build_events(path)


@pytest.mark.parametrize("source", ["synthetic", "corpus"])
def test_batched_small_files_read_as_one_by_one(tmp_path, monkeypatch, source):
    if source == "corpus":
        if not CORPUS.is_dir():
            pytest.skip("../shared/corpus is not beside the checkout")
        run = tmp_path / "corpus"
        for case in sorted(CORPUS.iterdir())[:6]:
            if case.is_dir():
                shutil.copytree(case, run / case.name)
    else:
        run = _folder(tmp_path)
    one = _ingest(run, monkeypatch, 0)  # every file's query alone
    many = _ingest(run, monkeypatch, 64 << 20)  # all small files in one query
    assert one.events.height > 0
    assert many.events.equals(one.events)
    assert [(s.file, s.reason) for s in many.skipped] == [(s.file, s.reason) for s in one.skipped]
    assert many.notes == one.notes
    assert (many.files, many.bytes, many.lines) == (one.files, one.bytes, one.lines)
    if source == "synthetic":
        assert any("read only in part" in n for n in many.notes)  # the truncated .gz
        seen = set(many.events.filter(many.events["kind"] == "watchdog_timeout")["rank"].to_list())
        assert {1, 2, 4, 5, 7, 8, 10, 11, 12, 13, 14} <= seen


def test_a_folder_is_read_without_a_thread_of_its_own(tmp_path, monkeypatch):
    # the reader hands each item to the scanner in the scanning thread: a thread beside it only contended
    # for the GIL (ingest.reader; bench/README.md, issue 14's seventh round). Only a compressed archive's
    # read-ahead (ingest.archive) may start one.
    import threading

    started: list[str] = []
    start = threading.Thread.start

    def counted(self):
        started.append(self.name)
        return start(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    run = _folder(tmp_path)
    res = events.build_events(run)
    assert res.events.height and res.files >= 12
    assert started == []
