"""Hostile archives and compressed files: path escapes, links, bombs, truncation. Nothing is ever
extracted, so "nothing written outside" is checked by listing the whole tmp tree before and after."""

from __future__ import annotations

import gzip
import io
import random
import tarfile
import zipfile
import zlib

import pytest

from ncclforensics.ingest import archive

from .builders import (
    CliRun,
    ZeroReader,
    cpu_seconds,
    gz,
    gzip_stream_of_zeros,
    ingest,
    json_rows_of,
    listing,
    put,
    reasons,
    rows_of,
    run_cli,
    tar_add,
    watchdog,
    zip_add_symlink,
)

ESCAPE = "path escapes the archive root"
ABSOLUTE = "absolute path in archive"
LINK = "link member (not followed)"


def _hostile_tar(path, good: bytes, abs_target: str, compression: str) -> dict[str, str]:
    """A tar whose members try every way out; returns member -> expected reason (start)."""
    with tarfile.open(path, f"w:{compression}" if compression else "w") as tf:
        tar_add(tf, "good.log", good)
        tar_add(tf, "../escape_dotdot.log", (watchdog(901) + "\n").encode())
        tar_add(tf, "sub/../../escape_nested.log", (watchdog(902) + "\n").encode())
        tar_add(tf, abs_target, (watchdog(903) + "\n").encode())
        tar_add(tf, "link.log", kind=tarfile.SYMTYPE, linkname="/etc/passwd")
        tar_add(tf, "link_up.log", kind=tarfile.SYMTYPE, linkname="../../outside.log")
        tar_add(tf, "hard.log", kind=tarfile.LNKTYPE, linkname="good.log")
        tar_add(tf, "hard_abs.log", kind=tarfile.LNKTYPE, linkname="/etc/shadow")
        tar_add(tf, "fifo.log", kind=tarfile.FIFOTYPE)
        tar_add(tf, "late.log", (watchdog(904) + "\n").encode())
    return {
        "../escape_dotdot.log": ESCAPE, "sub/../../escape_nested.log": ESCAPE, abs_target: ABSOLUTE,
        "link.log": LINK, "link_up.log": LINK, "hard.log": LINK, "hard_abs.log": LINK,
        "fifo.log": "special file member",
    }


@pytest.mark.parametrize("suffix", [".tar", ".tgz", ".tar.xz"])
def test_tar_members_that_escape_or_link(tmp_path, suffix, good_bytes, good_expected):
    run = tmp_path / "run"
    (run / "node1").mkdir(parents=True)
    abs_target = str(tmp_path / "abs_escape.log")
    comp = {".tar": "", ".tar.gz": "gz", ".tgz": "gz", ".tar.xz": "xz", ".tar.bz2": "bz2"}[suffix]
    arc = run / "node1" / f"logs{suffix}"
    want = _hostile_tar(arc, good_bytes, abs_target, comp)
    before = listing(tmp_path)
    # the archive inside a run folder (members named folder/archive!member) and the archive as the run
    for path, prefix in ((run, f"node1/logs{suffix}!"), (arc, "")):
        cli = CliRun(path)
        res = ingest(path)
        why = reasons(res)
        assert set(why) == {prefix + m for m in want}, why
        for member, reason in want.items():
            assert why[prefix + member].startswith(reason), (member, why[prefix + member])
        assert rows_of(res, prefix + "good.log") == good_expected
        assert rows_of(res, prefix + "late.log") == {(1, "watchdog_timeout")}
        assert not {901, 902, 903} & set(res.events["seq"].to_list())
        assert res.files == 2
        out = cli.finish(0)
        assert json_rows_of(out.events, prefix + "good.log") == good_expected
        assert json_rows_of(out.events, prefix + "late.log") == {(1, "watchdog_timeout")}
        assert not {901, 902, 903} & {e["seq"] for e in out.events}
    assert listing(tmp_path) == before


def test_zip_slip(tmp_path, good_bytes, good_expected):
    run = tmp_path / "run"
    (run / "node1").mkdir(parents=True)
    arc = run / "node1" / "logs.zip"
    with zipfile.ZipFile(arc, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("good.log", good_bytes)
        zf.writestr("../../zipslip.log", watchdog(911) + "\n")
        zf.writestr("..\\..\\winslip.log", watchdog(912) + "\n")
        zf.writestr("/abs_zip.log", watchdog(913) + "\n")
        zf.writestr("C:/Windows/abs_drive.log", watchdog(914) + "\n")
        zip_add_symlink(zf, "link.log", "/etc/passwd")
        zf.writestr("late.log", watchdog(915) + "\n")
    before = listing(tmp_path)
    want = {"../../zipslip.log": ESCAPE, "..\\..\\winslip.log": ESCAPE, "/abs_zip.log": ABSOLUTE,
            "C:/Windows/abs_drive.log": ABSOLUTE, "link.log": LINK}
    for path, prefix in ((run, "node1/logs.zip!"), (arc, "")):
        cli = CliRun(path)
        res = ingest(path)
        why = reasons(res)
        assert set(why) == {prefix + m for m in want}, why
        for member, reason in want.items():
            assert why[prefix + member].startswith(reason), why[prefix + member]
        assert rows_of(res, prefix + "good.log") == good_expected
        assert rows_of(res, prefix + "late.log") == {(1, "watchdog_timeout")}
        assert not {911, 912, 913, 914} & set(res.events["seq"].to_list())
        out = cli.finish(0)
        assert json_rows_of(out.events, prefix + "good.log") == good_expected
        assert not {911, 912, 913, 914} & {e["seq"] for e in out.events}
    assert listing(tmp_path) == before


ZEROS_MB = 200


def test_bombs_of_zeros_are_stopped_at_the_head(tmp_path, good_bytes, good_expected):
    """200 MB of zeros as .gz, .zip and .tar.gz (default caps): the head is sniffed as binary,
    the rest is never decoded into lines."""
    run = tmp_path / "run"
    run.mkdir()
    gzip_stream_of_zeros(run / "zeros.log.gz", ZEROS_MB)
    with zipfile.ZipFile(run / "zeros.zip", "w", zipfile.ZIP_DEFLATED) as zf, zf.open("zeros.log", "w") as fh:
        for _ in range(ZEROS_MB):
            fh.write(bytes(1 << 20))
    with tarfile.open(run / "zeros.tar.gz", "w:gz", compresslevel=6) as tf:
        info = tarfile.TarInfo("zeros.log")
        info.size = ZEROS_MB << 20
        tf.addfile(info, ZeroReader(info.size))
        tar_add(tf, "after.log", (watchdog(921) + "\n").encode())
    put(run, "good.log", good_bytes)
    cli = CliRun(run)
    t0 = cpu_seconds()
    res = ingest(run)
    assert cpu_seconds() - t0 < 30
    why = reasons(res)
    assert set(why) == {"zeros.log", "zeros.zip!zeros.log", "zeros.tar.gz!zeros.log"}, why
    assert all(r.startswith("binary file") for r in why.values()), why
    assert rows_of(res, "good.log") == good_expected
    assert rows_of(res, "zeros.tar.gz!after.log") == {(1, "watchdog_timeout")}
    out = cli.finish(0)
    assert json_rows_of(out.events, "good.log") == good_expected
    assert out.cpu_seconds < 30


@pytest.fixture
def low_caps(monkeypatch):
    """Caps small enough that a 30 MB fake log trips them (the defaults need > 256 MiB)."""
    monkeypatch.setattr(archive, "RATIO_FLOOR", 1 << 20)
    monkeypatch.setattr(archive, "RATIO_CAP", 100)


def _fake_log(first_seq: int) -> bytes:
    """A real line, then 30 MB of one log line repeated: compresses ~1000:1."""
    filler = b"2026-11-22 07:44:19,330 INFO train: waiting for data loader\n"
    return (watchdog(first_seq) + "\n").encode() + filler * (30_000_000 // len(filler))


def test_compressible_fake_log_bombs_hit_the_ratio_cap(tmp_path, low_caps, cli_inproc, good_bytes,
                                                        good_expected):
    run = tmp_path / "run"
    run.mkdir()
    (run / "fake.log.gz").write_bytes(gzip.compress(_fake_log(931), 6))
    with zipfile.ZipFile(run / "fake.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("fake.log", _fake_log(932))
    with tarfile.open(run / "fake.tar.gz", "w:gz", compresslevel=6) as tf:
        tar_add(tf, "fake.log", _fake_log(933))
        tar_add(tf, "after.log", (watchdog(934) + "\n").encode())
    put(run, "good.log", good_bytes)
    res = ingest(run)
    why = reasons(res)
    cap = "compression-bomb cap, ratio 100:1"
    assert cap in why["fake.log"] and cap in why["fake.zip!fake.log"] and cap in why["fake.tar.gz"], why
    assert "fake.tar.gz!fake.log" in why  # cut short by the archive's cap
    # what came before the cap was read, and said to be partial
    seqs = set(res.events["seq"].to_list())
    assert {931, 932, 933} <= seqs and 934 not in seqs
    assert sum("read only in part" in n for n in res.notes) == 3, res.notes
    assert rows_of(res, "good.log") == good_expected
    out = cli_inproc(run, 0)
    assert json_rows_of(out.events, "good.log") == good_expected
    assert {931, 932, 933} <= {e["seq"] for e in out.events}


def test_absolute_cap(tmp_path, monkeypatch, cli_inproc):
    monkeypatch.setattr(archive, "ABS_CAP", 2 << 20)
    run = tmp_path / "run"
    run.mkdir()
    (run / "fake.log.gz").write_bytes(gzip.compress(_fake_log(941)[:5_000_000], 1))
    res = ingest(run)
    assert reasons(res)["fake.log"] == "decompressed size passed 2 MiB (compression-bomb cap, ratio 1000:1)"
    assert 941 in res.events["seq"].to_list()
    out = cli_inproc(run, 0)
    assert [e["seq"] for e in out.events] == [941]
    (run / "fake.log.gz").write_bytes(gzip.compress(b"x" * 5_000_000, 1))  # nothing before the cap but "x"
    res = ingest(run)
    assert "compression-bomb cap" in reasons(res)["fake.log"]


def _truncate(data: bytes, keep: float) -> bytes:
    return data[: int(len(data) * keep)]


def test_truncated_and_corrupt_compressed_files(tmp_path, good_bytes, good_expected):
    """A cut .gz/.tar.gz/.zip and a .gz with garbage in its middle: read up to the damage, say so."""
    run = tmp_path / "run"
    run.mkdir()
    body = (watchdog(951) + "\n").encode() + good_bytes * 60 + (watchdog(952) + "\n").encode()
    (run / "cut.log.gz").write_bytes(_truncate(gz(body), 0.5))
    damaged = bytearray(gz(body))
    mid = len(damaged) // 2
    damaged[mid:mid + 64] = bytes(64)
    (run / "damaged.log.gz").write_bytes(bytes(damaged))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tar_add(tf, "first.log", (watchdog(953) + "\n").encode())
        tar_add(tf, "second.log", body)
    (run / "cut.tar.gz").write_bytes(_truncate(buf.getvalue(), 0.6))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("first.log", watchdog(954) + "\n")
    (run / "cut.zip").write_bytes(_truncate(buf.getvalue(), 0.7))
    (run / "empty.log.gz").write_bytes(b"")
    (run / "notgzip.log.gz").write_bytes(b"plain text, not gzip\n")
    put(run, "good.log", good_bytes)
    cli = CliRun(run)
    res = ingest(run)
    why = reasons(res)
    assert why["cut.log"].startswith("truncated or corrupt compressed data"), why
    assert "compressed data" in why["damaged.log"], why
    assert why["cut.tar.gz"].startswith("truncated or corrupt"), why
    assert why["cut.zip"].startswith("not a readable zip archive"), why
    assert why["notgzip.log"].startswith("truncated or corrupt compressed data"), why
    seqs = res.events["seq"].to_list()
    assert 951 in seqs and 953 in seqs  # the part before the cut is read
    assert 952 not in seqs
    assert any(n.startswith("cut.log: read only in part") for n in res.notes), res.notes
    assert rows_of(res, "good.log") == good_expected
    out = cli.finish(0)
    assert {951, 953} <= {e["seq"] for e in out.events}
    assert json_rows_of(out.events, "good.log") == good_expected


def test_archive_that_is_only_garbage(tmp_path):
    run = tmp_path / "run"
    put(run, "a.tar.gz", b"\x1f\x8b\x08\x00garbage" * 100)
    put(run, "b.zip", b"PK\x03\x04" + bytes(100))
    put(run, "c.tar", b"not a tar at all\n" * 10)
    put(run, "d.tar.zst", b"\x28\xb5\x2f\xfd" + bytes(50))
    res = ingest(run)
    assert res.files == 0 and set(reasons(res)) == {"a.tar.gz", "b.zip", "c.tar", "d.tar.zst"}
    assert "no readable log files" in run_cli(run, 3).stderr


def test_big_truncated_gz_loses_only_the_last_small_step(tmp_path):
    """Far from the end of a file on disk, decompression runs in 1 MiB steps; near the end in 8 KiB
    steps, so a cut .gz or .tar.gz still yields nearly everything decoded before the cut."""
    rng = random.Random(5)
    parts: list[bytes] = []
    offsets: list[tuple[int, int]] = []  # (offset of the line's end, seq)
    pos = 0
    for seq in range(1000, 2600):
        line = (watchdog(seq) + "\n").encode()
        pos += len(line)
        offsets.append((pos, seq))
        filler = "".join(f"noise {rng.getrandbits(128):032x}\n" for _ in range(300)).encode()
        parts += [line, filler]
        pos += len(filler)
    body = b"".join(parts)
    comp = gzip.compress(body, 1)
    assert len(comp) > 2 * archive.END_MARGIN  # the big steps are taken
    cut = comp[: int(len(comp) * 0.8)]
    recoverable = len(zlib.decompressobj(31).decompress(cut))
    run = tmp_path / "run"
    put(run, "big.log.gz", cut)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tf:
        tar_add(tf, "member.log", body)
    tar_cut = buf.getvalue()[: int(len(buf.getvalue()) * 0.8)]
    tar_recoverable = len(zlib.decompressobj(31).decompress(tar_cut)) - 512  # the member's header
    put(run, "big.tar.gz", tar_cut)
    res = ingest(run)
    for name, avail in (("big.log", recoverable), ("big.tar.gz!member.log", tar_recoverable)):
        seqs = res.events.filter(res.events["file"] == name)["seq"].to_list()
        # everything up to a few 8 KiB steps before the cut, nothing after it
        want = max(seq for end, seq in offsets if end <= avail - 4 * archive.READ_STEP)
        assert seqs and max(seqs) >= want, (name, max(seqs or [0]), want)
        assert max(seqs) <= max(seq for end, seq in offsets if end <= avail)
