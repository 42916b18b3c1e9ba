"""Hostile folders: empty, binary, sparse, huge file counts, links, permissions, odd file names."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ncclforensics.ingest import discover

from .builders import (
    CliRun,
    cpu_seconds,
    elf_like,
    ingest,
    json_rows_of,
    listing,
    put,
    random_bytes,
    reasons,
    rows_of,
    run_cli,
    watchdog,
)


def test_empty_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    res = ingest(run)
    assert res.files == 0 and res.events.is_empty() and res.skipped == []
    out = run_cli(run, 3)
    assert "no log files" in out.stderr


def test_folder_of_empty_files(tmp_path):
    run = tmp_path / "run"
    for name in ("a.log", "b.txt", "rank0.log"):
        put(run, name, b"")
    res = ingest(run)
    assert res.files == 0
    assert reasons(res) == {n: "empty file" for n in ("a.log", "b.txt", "rank0.log")}
    assert "empty file" in run_cli(run, 3).stderr


BINARIES = {
    "random_512.log": random_bytes(512, 1),
    "random_5k.dat": random_bytes(5_000, 2),
    "random_100k.log": random_bytes(100_000, 3),
    "random_1m": random_bytes(1 << 20, 4),
    "core.1234": elf_like(),
    "a.out": elf_like(70_000),
    "screenshot": b"\x89PNG\r\n\x1a\n" + random_bytes(4_000, 5),
    "model.bin": random_bytes(3_000, 6),  # refused by its suffix before any byte is read
}


def test_folder_of_binaries(tmp_path):
    run = tmp_path / "run"
    for name, data in BINARIES.items():
        put(run, name, data)
    res = ingest(run)
    assert res.files == 0 and res.events.is_empty()
    why = reasons(res)
    assert set(why) == set(BINARIES)
    assert why.pop("model.bin").startswith("not a log")
    assert all(r.startswith("binary file") for r in why.values()), why
    out = run_cli(run, 3)
    assert "binary" in out.stderr and "; +5 more)" in out.stderr


def test_binaries_next_to_a_good_log(tmp_path, good_bytes, good_expected):
    run = tmp_path / "run"
    for name, data in BINARIES.items():
        put(run, name, data)
    put(run, "good.log", good_bytes)
    res = ingest(run)
    assert res.files == 1
    assert set(reasons(res)) == set(BINARIES)
    assert rows_of(res, "good.log") == good_expected
    out = run_cli(run, 0)
    assert json_rows_of(out.events, "good.log") == good_expected
    assert {e["file"] for e in out.events} == {"good.log"}


def test_sparse_2gb_file_is_skipped_fast(tmp_path, good_bytes, good_expected):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "huge.log", "wb") as fh:
        fh.truncate(2 << 30)  # 2 GiB of holes: no disk used
    put(run, "good.log", good_bytes)
    t0 = cpu_seconds()
    res = ingest(run)
    assert cpu_seconds() - t0 < 30
    assert "binary" in reasons(res)["huge.log"]
    assert rows_of(res, "good.log") == good_expected
    out = run_cli(run, 0)
    assert json_rows_of(out.events, "good.log") == good_expected
    assert out.cpu_seconds < 30


def test_log_with_a_2gb_zero_filled_tail(tmp_path, good_bytes, good_expected):
    """A node that crashed hard leaves its log with a hole of zeros at the end: the text before
    the hole is the evidence and must be read, the hole passed over quickly."""
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "good.log", "wb") as fh:
        fh.write(good_bytes)
        fh.truncate(len(good_bytes) + (2 << 30))
    res = ingest(run)
    assert rows_of(res, "good.log") == good_expected
    out = run_cli(run, 0)
    assert json_rows_of(out.events, "good.log") == good_expected
    assert out.cpu_seconds < 30


def test_twenty_thousand_tiny_files(tmp_path):
    run = _many_files(tmp_path)
    cli = CliRun(run)  # runs on the other core while the library reads the same folder
    res = ingest(run)
    assert res.files == 20_000
    assert res.skipped == []
    assert sorted(res.events["seq"].to_list()) == list(range(0, 20_000, 1_000))
    out = cli.finish(0)
    assert "Read 20,000 files" in out.stderr
    assert sorted(e["seq"] for e in out.events) == list(range(0, 20_000, 1_000))


def _many_files(tmp_path: Path) -> Path:
    """20 folders x 1,000 one-line files; every 1,000th holds a watchdog timeout."""
    run = tmp_path / "run"
    for d in range(20):
        sub = run / f"node{d:02d}"
        sub.mkdir(parents=True)
        for i in range(1_000):
            n = d * 1_000 + i
            (sub / f"w{i:04d}.log").write_text(watchdog(n) + "\n" if n % 1_000 == 0 else "ok\n")
    return run


def test_symlink_loops_and_links_out_of_the_root(tmp_path, good_bytes, good_expected):
    outside = tmp_path / "outside"
    put(outside, "secret.log", watchdog(4242) + "\n")
    run = tmp_path / "run"
    put(run, "good.log", good_bytes)
    os.symlink("loop_b", run / "loop_a")
    os.symlink("loop_a", run / "loop_b")
    os.symlink("self", run / "self")
    os.symlink(".", run / "here")  # a folder loop
    os.symlink("..", run / "up")  # a folder out of the root
    os.symlink(outside / "secret.log", run / "secret.log")
    os.symlink(outside, run / "outside_dir")
    os.symlink(tmp_path / "nowhere.log", run / "dangling.log")
    before = listing(tmp_path)
    res = ingest(run)
    why = reasons(res)
    for name in ("loop_a", "loop_b", "self", "here", "up", "secret.log", "outside_dir", "dangling.log"):
        assert name in why, f"{name} not listed as skipped: {why}"
        assert "symlink" in why[name] and "not followed" in why[name], why[name]
    assert rows_of(res, "good.log") == good_expected
    assert 4242 not in res.events["seq"].to_list()
    assert res.files == 1
    out = run_cli(run, 0)
    assert json_rows_of(out.events, "good.log") == good_expected
    assert all(e["seq"] != 4242 for e in out.events)
    assert listing(tmp_path) == before


def test_fifo_is_not_opened(tmp_path, good_bytes, good_expected):
    """A named pipe in the folder would block a reader forever."""
    run = tmp_path / "run"
    put(run, "good.log", good_bytes)
    os.mkfifo(run / "pipe.log")
    res = ingest(run)
    assert reasons(res) == {"pipe.log": "not a regular file"}
    assert rows_of(res, "good.log") == good_expected
    assert json_rows_of(run_cli(run, 0).events, "good.log") == good_expected


def test_unreadable_file_chmod_000(tmp_path, good_bytes, good_expected):
    run = tmp_path / "run"
    put(run, "good.log", good_bytes)
    locked = put(run, "locked.log", watchdog(777) + "\n")
    locked.chmod(0)
    try:
        res = ingest(run)
        out = run_cli(run, 0)
        enforced = not os.access(locked, os.R_OK)
    finally:
        locked.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert rows_of(res, "good.log") == good_expected
    assert json_rows_of(out.events, "good.log") == good_expected
    if not enforced:
        pytest.skip("running as root (or with CAP_DAC_OVERRIDE): chmod 000 does not stop reads here, so "
                    "the 'unreadable' entry cannot appear; test_unreadable_file_simulated covers that path")
    assert "unreadable" in reasons(res)["locked.log"]
    assert all(e["seq"] != 777 for e in out.events)


def test_unreadable_file_simulated(tmp_path, monkeypatch, good_bytes, good_expected, cli_inproc):
    """Permission denied on open, whoever runs the tests (root reads chmod 000 files)."""
    run = tmp_path / "run"
    put(run, "good.log", good_bytes)
    put(run, "locked.log", watchdog(777) + "\n")
    real_open = open

    def guarded_open(file, *args, **kwargs):
        if os.fspath(file).endswith("locked.log"):
            raise PermissionError(13, "Permission denied", os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(discover, "open", guarded_open, raising=False)
    res = ingest(run)
    assert reasons(res) == {"locked.log": "unreadable (Permission denied)"}
    assert rows_of(res, "good.log") == good_expected
    out = cli_inproc(run, 0)
    assert json_rows_of(out.events, "good.log") == good_expected
    (run / "good.log").unlink()
    out = cli_inproc(run, 3)
    assert "locked.log: unreadable (Permission denied)" in out.stderr


def test_undecodable_and_control_character_file_names(tmp_path):
    """Names are bytes on Linux: not UTF-8, or holding a newline or an ESC sequence. They must
    come out as one line of valid text (escaped), never crash the JSON writer or the terminal."""
    run = tmp_path / "run"
    put(run, b"rank3-\xff\xfe.log", watchdog(3) + "\n")
    put(run, "evil\nname\x1b[31m.dat", bytes(4096))
    res = ingest(run)
    assert rows_of(res, "rank3-\\xff\\xfe.log") == {(1, "watchdog_timeout")}
    assert reasons(res) == {"evil\\nname\\x1b[31m.dat": "binary file (NUL bytes)"}
    out = run_cli(run, 0)
    assert [(e["file"], e["rank"]) for e in out.events] == [("rank3-\\xff\\xfe.log", 1)]
    (run / os.fsdecode(b"rank3-\xff\xfe.log")).unlink()
    out = run_cli(run, 3)
    assert "evil\\nname\\x1b[31m.dat: binary file" in out.stderr
    assert "\x1b" not in out.stderr
