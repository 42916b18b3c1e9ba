"""The read-ahead of compressed tar members (archive.read_ahead) hands over exactly what reading the
archive in the consumer's thread gives: the same members, bytes and errors, in the same places."""

from __future__ import annotations

import io
import tarfile
import threading
import time

import pytest

from ncclforensics.errors import UnsafeInputError
from ncclforensics.ingest import archive


def _tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _outcome(members, read_sizes=(None,)) -> list[tuple]:
    """(name, bytes read, error) per member; a read size of None reads the member whole."""
    out = []
    try:
        for m in members:
            if m.stream is None:
                out.append((m.name, None, m.refused))
                continue
            got, err = [], None
            try:
                for n in read_sizes:
                    got.append(m.stream.read(-1 if n is None else n))
                got.append(m.stream.read(1) if read_sizes == (None,) else b"")  # confirm the end
            except UnsafeInputError as exc:
                err = str(exc)
            out.append((m.name, b"".join(got), err))
    except UnsafeInputError as exc:
        out.append(("<archive>", None, str(exc)))
    return out


def _members(blob: bytes, ahead: bool, name: str = "run.tar.gz"):
    it = archive.iter_tar(io.BytesIO(blob), name, len(blob))
    return archive.read_ahead(it) if ahead else it


# Members bigger than a read-ahead piece, an empty one, and many lines (a log's shape).
MEMBERS = {
    "a/rank0.log": b"".join(b"line %d of rank 0 NCCL INFO comm\n" % i for i in range(40_000)),
    "a/empty.log": b"",
    "b/rank1.log": bytes(range(256)) * 100_000,  # 25.6 MB: two pieces
    "b/rank2.log": b"[rank2]: Watchdog caught collective operation timeout\n" * 3,
}


@pytest.mark.parametrize("read_sizes", [(None,), (1000,), (64 << 10, 16 << 20, 16 << 20, 1)])
def test_same_members_and_bytes_as_reading_in_place(read_sizes, monkeypatch):
    monkeypatch.setattr(archive, "PREFETCH_PIECE", 1 << 20)  # many pieces per member
    blob = _tar_gz(MEMBERS)
    plain = _outcome(_members(blob, False), read_sizes)
    ahead = _outcome(_members(blob, True), read_sizes)
    assert ahead == plain
    if read_sizes == (None,):
        assert [(n, d) for n, d, _ in ahead] == list(MEMBERS.items())


def test_truncated_archive_fails_in_the_same_place(monkeypatch):
    monkeypatch.setattr(archive, "PREFETCH_PIECE", 1 << 20)
    blob = _tar_gz(MEMBERS)
    for cut in (len(blob) // 3, len(blob) * 2 // 3, len(blob) - 100):
        plain = _outcome(_members(blob[:cut], False))
        ahead = _outcome(_members(blob[:cut], True))
        assert ahead == plain, cut
        if cut < len(blob) - 1024:  # inside member data (a cut in the end blocks loses nothing)
            assert any(err for _, _, err in ahead), cut  # the damage is reported


def test_a_consumer_that_stops_early_ends_the_thread(monkeypatch):
    monkeypatch.setattr(archive, "PREFETCH_BYTES", 1 << 20)  # the worker blocks on a full queue
    monkeypatch.setattr(archive, "PREFETCH_PIECE", 256 << 10)
    blob = _tar_gz(MEMBERS)
    before = threading.active_count()
    gen = _members(blob, True)
    first = next(gen)
    assert first.stream.read(10) == MEMBERS["a/rank0.log"][:10]
    t0 = time.monotonic()
    gen.close()
    assert time.monotonic() - t0 < 3
    assert threading.active_count() == before
