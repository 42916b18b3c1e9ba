"""Stream compressed files and archive members safely: no extraction, no links, capped sizes.

Above ~400 lines because each container (gzip, bz2, xz, zstd, tar, zip) needs its own streaming
reader, and all of them must pass the same caps and refusals (CappedReader, safe_member_name): kept in
one module, one set of safety checks covers every format."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import posixpath
import tarfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from ncclforensics.bounded import BytesQueue
from ncclforensics.errors import UnsafeInputError

# A decompressed stream may grow to RATIO_CAP x its compressed size once it is past
# RATIO_FLOOR bytes, and never past ABS_CAP: logs compress 10-100x, bombs 1000x and more.
RATIO_CAP = 1000
RATIO_FLOOR = 256 << 20
ABS_CAP = 64 << 30
MAX_MEMBERS = 200_000
# Decompressed bytes asked of the inner reader per call. isal holds back up to this much
# output when its input ends early, so it bounds what a truncated .gz loses; 8 KiB costs
# about a quarter of isal's speed and nothing next to the line scan.
READ_STEP = 8 << 10
# Far from the end of the compressed input (known for files on disk) nothing is held back: a read
# asks for as much output as the caller wants, up to as many bytes as there is compressed input
# left before END_MARGIN (output never takes less input than that, bar crafted streams of empty
# blocks), in one call that decodes into one buffer (~130k calls per GB at 8 KiB; two copies
# through a BufferedReader). END_MARGIN covers the decompressor's input read-ahead (isal: 512 KiB).
BIG_STEP = 1 << 20
END_MARGIN = 4 << 20

COMPRESSED_SUFFIXES = (".gz", ".bz2", ".zst", ".xz")
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".tar.zst", ".zip")


def is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def compression_of(name: str) -> str | None:
    low = name.lower()
    for suf in COMPRESSED_SUFFIXES:
        if low.endswith(suf):
            return suf[1:]
    return None


def strip_compression(name: str) -> str:
    comp = compression_of(name)
    return name[: -len(comp) - 1] if comp else name


class CappedReader(io.RawIOBase):
    """Wraps a decompressing stream; raises UnsafeInputError past the size/ratio caps."""

    def __init__(self, inner: BinaryIO, compressed_size: int | None, label: str,
                 room: Callable[[], int] | None = None) -> None:
        self._inner = inner
        self._room = room
        self._limit = ABS_CAP
        if compressed_size:
            self._limit = min(ABS_CAP, max(RATIO_FLOOR, compressed_size * RATIO_CAP))
        self._read = 0
        self._label = label
        self._error: str | None = None
        self._ended = False
        self._read1 = getattr(inner, "read1", inner.read)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._step(len(b))
        n = len(data)
        b[:n] = data
        return n

    def read(self, n: int | None = -1) -> bytes:
        """Up to `n` bytes (all when n < 0), fewer only at the end or before damage. The bytes of a
        single decompression step are handed over as they are (no copy)."""
        want = ABS_CAP + 1 if n is None or n < 0 else n
        parts = []
        got = 0
        while got < want:
            data = self._step(min(want - got, 16 * BIG_STEP))
            if not data:
                break
            parts.append(data)
            got += len(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _step(self, want: int) -> bytes:
        """One step of decompression: b"" at the end. Past damage or a cap, it hands over what was
        decoded before it, reports the end of data once, then raises on the next read, which the
        consumer makes to confirm the end (ingest.formats.read_source)."""
        if self._error is not None:
            if self._read and not self._ended:
                self._ended = True
                return b""
            raise UnsafeInputError(self._error)
        data = b""
        try:
            room = self._room() if self._room is not None else 0
            if room >= READ_STEP:
                data = self._inner.read(min(want, room))
            else:
                # read1: one small step, so data decoded before a truncation is not dropped
                # along with the exception (read(n) loops and loses it)
                data = self._read1(min(want, READ_STEP))
        except UnsafeInputError as exc:  # an enclosing capped stream (a tar's) gave up
            self._error = str(exc)
        except (EOFError, OSError, zipfile.BadZipFile, lzma.LZMAError) as exc:
            self._error = f"truncated or corrupt compressed data ({exc})"
        except Exception as exc:  # zstandard raises its own ZstdError; tarfile its ReadError
            self._error = f"corrupt compressed data ({type(exc).__name__}: {exc})"
        if self._read + len(data) > self._limit:
            self._error = (f"decompressed size passed {self._limit >> 20} MiB "
                           f"(compression-bomb cap, ratio {RATIO_CAP}:1)")
            data = data[: self._limit - self._read]
        if not data and self._error is not None:
            return self._step(want)
        self._read += len(data)
        return data


def _zstd_reader(raw: BinaryIO) -> BinaryIO:
    try:
        import zstandard
    except ImportError:  # optional: only needed for .zst inputs
        raise UnsafeInputError("a .zst file needs the 'zstandard' package") from None
    return zstandard.ZstdDecompressor().stream_reader(raw)


def _gzip_reader(raw: BinaryIO) -> BinaryIO:
    try:  # isal decompresses gzip several times faster than zlib
        from isal import igzip

        return igzip.IGzipFile(fileobj=raw, mode="rb")
    except ImportError:
        return gzip.GzipFile(fileobj=raw, mode="rb")


def room_to_end(raw: BinaryIO, size: int | None) -> Callable[[], int] | None:
    """For a file on disk of known size: how far its read position is from END_MARGIN before
    its end (<= 0 within the margin)."""
    if not size or size <= END_MARGIN:
        return None
    try:
        if not raw.seekable():
            return None
        raw.tell()
    except (AttributeError, OSError, ValueError):
        return None
    limit = size - END_MARGIN
    return lambda: limit - raw.tell()


def decompressing(raw: BinaryIO, kind: str | None, size: int | None, label: str,
                  room: Callable[[], int] | None = None) -> BinaryIO:
    """A reader over `raw`, decompressed per `kind` (gz, bz2, zst, xz or None) and capped.
    read(n) returns n bytes but at the end (no BufferedReader: it would copy them once more)."""
    if kind is None:
        return raw
    opener = {"gz": _gzip_reader, "bz2": lambda r: bz2.BZ2File(r, "rb"),
              "xz": lambda r: lzma.LZMAFile(r, "rb"), "zst": _zstd_reader}[kind]
    return CappedReader(opener(raw), size, label, room or room_to_end(raw, size))


def safe_member_name(name: str) -> str:
    """The member path, or UnsafeInputError for absolute paths and `..` components."""
    norm = name.replace("\\", "/")
    if norm.startswith("/") or (len(norm) > 1 and norm[1] == ":"):
        raise UnsafeInputError(f"absolute path in archive: {name!r}")
    parts = [p for p in norm.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeInputError(f"path escapes the archive root: {name!r}")
    return posixpath.join(*parts) if parts else ""


@dataclass
class Member:
    name: str  # path inside the archive (safe, relative)
    size: int | None
    mtime: float | None
    stream: BinaryIO | None  # None when refused; then `refused` says why
    refused: str | None = None


def tar_compression(name: str) -> str | None:
    """gz, bz2, xz or zst for a compressed tar's name, else None."""
    low = name.lower()
    for suffixes, kind in (((".tar.gz", ".tgz"), "gz"), ((".tar.bz2", ".tbz2"), "bz2"),
                           ((".tar.xz",), "xz"), ((".tar.zst",), "zst")):
        if low.endswith(suffixes):
            return kind
    return None


class ForwardOnly(io.RawIOBase):
    """A stream that seeks forward by reading (and refuses to go back): enough for tarfile's "r:"
    mode read member by member, in order."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        data = self._inner.read(n)
        self._pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._pos
        elif whence != io.SEEK_SET:
            raise io.UnsupportedOperation("seek from the end of a stream")
        if offset < self._pos:
            raise io.UnsupportedOperation("seek backwards in a stream")
        while self._pos < offset:
            if not self.read(min(offset - self._pos, BIG_STEP)):
                break  # the end: the caller's next read finds no data
        return self._pos


class _TarMember(io.RawIOBase):
    """A regular tar member's data read straight from the archive's (forward-only, capped) stream.
    Valid until tarfile moves on to the next header."""

    def __init__(self, stream: ForwardOnly, size: int, label: str) -> None:
        self._stream = stream
        self._left = size
        self._label = label

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        want = self._left if n is None or n < 0 else min(n, self._left)
        if want == 0:
            return b""
        data = self._stream.read(want)  # the capped stream raises UnsafeInputError on damage
        self._left -= len(data)
        if not data:
            self._stream.read(1)  # a truncated archive raises on this second read
            raise UnsafeInputError(f"truncated or corrupt tar archive (member {self._label} cut short)")
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def iter_tar(raw: BinaryIO, label: str, size: int | None = None) -> Iterator[Member]:
    """Members of a (possibly compressed) tar in stream mode: each stream is valid until the next.

    The tar stream itself is decompressed through the caps (`size` is the archive's size on disk),
    so a tar bomb stops at the ratio cap like any compressed file.
    """
    kind = tar_compression(label)
    room = room_to_end(raw, size)  # the archive on disk: members far from its end read in big steps
    mode = "r|*"  # tarfile's stream mode finds a compression the name does not state
    if kind is not None:
        raw = decompressing(raw, kind, size, label, room)
        # Our own decompressed stream: tarfile's random-access mode over a forward-only view reads
        # member data in large pieces; its stream mode hands it over in 10 KiB records (2x slower).
        raw, mode = ForwardOnly(raw), "r:"
    try:
        tf = tarfile.open(fileobj=raw, mode=mode)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UnsafeInputError(f"not a readable tar archive ({exc})") from None
    count = 0
    try:
        for info in tf:
            count += 1
            if count > MAX_MEMBERS:
                raise UnsafeInputError(f"more than {MAX_MEMBERS} members")
            if info.isdir():
                continue
            try:
                name = safe_member_name(info.name)
            except UnsafeInputError as exc:
                yield Member(info.name, info.size, info.mtime, None, str(exc))
                continue
            if info.issym() or info.islnk():
                yield Member(name, 0, info.mtime, None, "link member (not followed)")
                continue
            if not info.isfile():
                yield Member(name, 0, info.mtime, None, "special file member")
                continue
            if info.size > ABS_CAP:
                yield Member(name, info.size, info.mtime, None, f"member larger than {ABS_CAP >> 30} GiB")
                continue
            if isinstance(raw, ForwardOnly) and raw.tell() == info.offset_data and not info.issparse():
                # straight from our decompressed stream, which sits at the member's data: tarfile's
                # member reader would copy every byte twice more
                fobj = _TarMember(raw, info.size, name)
            else:
                # wrapped so that a short or corrupt member ends in UnsafeInputError, not tarfile.ReadError
                fobj = io.BufferedReader(CappedReader(tf.extractfile(info), None, name, room), buffer_size=1 << 20)
            yield Member(name, info.size, info.mtime, fobj)
    except (tarfile.TarError, EOFError, OSError, zipfile.BadZipFile) as exc:
        raise UnsafeInputError(f"truncated or corrupt tar archive ({exc})") from None


def iter_zip(path: str, label: str) -> Iterator[Member]:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UnsafeInputError(f"not a readable zip archive ({exc})") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise UnsafeInputError(f"more than {MAX_MEMBERS} members")
        for info in infos:
            if info.is_dir():
                continue
            try:
                name = safe_member_name(info.filename)
            except UnsafeInputError as exc:
                yield Member(info.filename, info.file_size, None, None, str(exc))
                continue
            if (info.external_attr >> 16) & 0o170000 == 0o120000:
                yield Member(name, 0, None, None, "link member (not followed)")
                continue
            try:
                raw = zf.open(info)
            except (zipfile.BadZipFile, NotImplementedError, RuntimeError, OSError) as exc:
                yield Member(name, info.file_size, None, None, f"unreadable zip member ({exc})")
                continue
            comp = info.compress_size or None
            stream = io.BufferedReader(CappedReader(raw, comp, name), buffer_size=1 << 20)
            mtime = None
            try:
                import datetime as _dt

                mtime = _dt.datetime(*info.date_time).timestamp()
            except (ValueError, OverflowError):
                pass
            yield Member(name, info.file_size, mtime, stream)


# -- read-ahead -------------------------------------------------------------------------------
# A compressed archive's members are read ahead by a thread: decompression and tar parsing (which
# hold the GIL) then overlap the scan's polars work (which does not). Pieces are handed over as
# read, so a member's bytes are not copied again.
PREFETCH_BYTES = 32 << 20  # member data read ahead, at most (one piece more when a piece is bigger)
PREFETCH_PIECE = 16 << 20


class _AheadStream(io.RawIOBase):
    """A member's data as the read-ahead thread delivers it: pieces, then its end or its error.
    read(n) returns n bytes but at the end, like the member's own stream; an error after some data
    is raised by the next read, as the capped streams do."""

    def __init__(self, ahead: BytesQueue) -> None:
        self._ahead = ahead
        self._buf = b""
        self._pos = 0
        self._pending: BaseException | None = None
        self.done = False  # the member's end (or error) was taken from the queue

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        """Whether buffered data is there (taking the next piece if needed); raises its error."""
        if self._pos < len(self._buf):
            return True
        if self._pending is not None:
            exc, self._pending = self._pending, None
            raise exc
        if self.done:
            return False
        kind, value = self._ahead.get()
        if kind == "piece":
            self._buf, self._pos = value, 0
            return True
        self.done = True
        if kind == "error":
            raise value
        return False

    def _take(self, n: int) -> bytes:
        if self._pos == 0 and n >= len(self._buf):
            out, self._buf = self._buf, b""  # the whole piece: no copy
            return out
        out = self._buf[self._pos : self._pos + n]
        self._pos += len(out)
        return out

    def read(self, n: int | None = -1) -> bytes:
        want = ABS_CAP + 1 if n is None or n < 0 else n
        if want == 0 or not self._fill():
            return b""
        first = self._take(want)
        if len(first) == want:
            return first
        parts, got = [first], len(first)
        try:
            while got < want and self._fill():
                part = self._take(want - got)
                parts.append(part)
                got += len(part)
        except Exception as exc:  # what came before it is handed over first
            self._pending = exc
        return b"".join(parts)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        """Skip what the consumer did not read of this member."""
        self._buf, self._pos, self._pending = b"", 0, None
        while not self.done:
            kind, _ = self._ahead.get()
            self.done = kind in ("end", "error")


def read_ahead(members: Iterator[Member]) -> Iterator[Member]:
    """The same members, read ahead by a thread (see PREFETCH_BYTES). Each member's stream is
    valid until the next member is asked for; errors arrive where they happened."""
    ahead = BytesQueue(PREFETCH_BYTES)

    def run() -> None:
        try:
            for m in members:
                if not ahead.put(("member", m)):
                    return
                if m.stream is None:
                    continue
                while True:
                    try:
                        piece = m.stream.read(PREFETCH_PIECE)
                    except Exception as exc:  # handed to the consumer, raised there
                        if not ahead.put(("error", exc)):
                            return
                        break
                    if not piece:
                        if not ahead.put(("end", None)):
                            return
                        break
                    if not ahead.put(("piece", piece), len(piece)):  # sized by its bytes
                        return
            ahead.put(("done", None))
        except BaseException as exc:  # the archive's own error, raised in the consumer
            ahead.put(("fatal", exc))

    worker = threading.Thread(target=run, name="ncclforensics-archive", daemon=True)
    worker.start()
    try:
        while True:
            kind, value = ahead.get()
            if kind == "done":
                return
            if kind == "fatal":
                raise value
            m = value
            if m.stream is None:
                yield m
                continue
            stream = _AheadStream(ahead)
            yield Member(m.name, m.size, m.mtime, stream, m.refused)
            stream.drain()
    finally:
        ahead.stop.set()
        worker.join(timeout=5)
