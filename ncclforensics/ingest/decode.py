"""Bytes -> text chunks on line boundaries: sniff binary, decode UTF-8/UTF-16, keep line numbers."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import BinaryIO

CHUNK_SIZE = 16 << 20
HEAD_SIZE = 64 << 10
UTF16_CAP = 512 << 20
PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")

_ALLOWED_CTRL = bytes([9, 10, 11, 12, 13, 27])
_CTRL = bytes(range(32)).translate(None, _ALLOWED_CTRL)
_NUL_RUN = re.compile(rb"\x00{64,}")
_HIGH = bytes(range(0xF8, 0x100))  # never valid in UTF-8, rare in latin-1 text


class BinaryContent(Exception):
    """The source is not text; the message says what it looks like."""


def sniff(head: bytes) -> str:
    """'text', 'utf-16', 'gzip', 'pickle' or 'empty'; BinaryContent for anything else."""
    if not head:
        return "empty"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(PICKLE_MAGIC):
        return "pickle"
    sample = head[:8192]
    nul = sample.count(0)
    if nul > len(sample) // 10:
        # A run of zeros is a hole (a log cut short by a crash, a preallocated file), not binary
        # content: judge the bytes around the holes. A file that is all holes stays binary.
        dense = _NUL_RUN.sub(b"", head)[:8192]
        if not dense or dense.count(0) > len(dense) // 10:
            raise BinaryContent("binary file (NUL bytes)")
        sample = dense
        nul = sample.count(0)
    ctrl = len(sample) - len(sample.translate(None, _CTRL))
    if ctrl - nul > len(sample) // 10:
        raise BinaryContent("binary file (control bytes)")
    high = len(sample) - len(sample.translate(None, _HIGH))
    if high > len(sample) // 20:  # bytes never valid in UTF-8 and rare in latin-1 text
        raise BinaryContent("binary file (not text)")
    # Random or compressed bytes pass the tests above (~10% control bytes, ~3% in F8-FF) but
    # are mostly invalid UTF-8 *and* hold control bytes; latin-1 or GBK text holds none.
    if ctrl > len(sample) // 100 and sample.decode("utf-8", "replace").count("\ufffd") > len(sample) // 10:
        raise BinaryContent("binary file (not text)")
    return "text"


def decode_bytes(data: bytes) -> str:
    if b"\x00" in data:
        data = data.translate(None, b"\x00")  # 30x faster than replace() on a run of zeros
    return data.decode("utf-8", "replace")


def iter_chunks(stream: BinaryIO, head: bytes, chunk_size: int | None = None, *,
                keep_tail: bool = True) -> Iterator[bytes]:
    """Byte chunks of `head` + the rest of `stream`, each ending on a line boundary (NULs removed).
    `keep_tail=False` drops what follows the last newline (a slice of a file: the next slice's).

    Chunks are cut by position: chunk i ends after the last newline before the i-th read's end
    (len(head) + i * chunk_size bytes into the stream), whatever came before; so a slice of a file
    read from one of those cuts (ingest.shares) gets the chunks a reading of the whole file gets.

    Text stays bytes on the bulk path: polars validates UTF-8 ~20x faster than bytes.decode, and only
    the few blocks with candidate lines are decoded in Python. A line longer than `chunk_size` is cut:
    the chunk then does not end with a newline and the next chunk continues that line.

    A file (or a slice of one) is read into a kept buffer behind the carried bytes, and each chunk
    copied out of it once: joining the carry to a fresh read and cutting the chunk off copied it
    twice more, into fresh memory each time (a page fault every 4 KiB: ~0.45 s of system time a GiB
    read alone, bench/README.md, "eighth round"). Other streams (decompressors, archive members) are
    read as before: their readinto may return less than asked before their end.
    """
    chunk_size = chunk_size or CHUNK_SIZE
    # only where readinto fills the buffer but at the end, as read(n) does: chunks are cut by position
    readinto = stream.readinto if isinstance(stream, io.BufferedReader) or getattr(
        stream, "fills_readinto", False) else None
    scratch: memoryview | None = None
    try:
        carry = head
        while True:
            view = None  # the kept buffer, when this read went into it (else `buf` is bytes)
            if len(carry) >= chunk_size:  # a full chunk in hand (the caller's first read)
                buf, end = carry, len(carry)
            else:
                try:
                    if readinto is not None:
                        if scratch is None or len(scratch) < len(carry) + chunk_size:
                            if scratch is not None:
                                _give_back(scratch)
                            scratch = _take_buffer(len(carry) + chunk_size + HEAD_SIZE)
                        scratch[: len(carry)] = carry
                        got = readinto(scratch[len(carry) : len(carry) + chunk_size]) or 0
                        view, buf, end = scratch, scratch.obj, len(carry) + got
                    else:
                        data = stream.read(chunk_size)
                        got = len(data)
                        buf = carry + data if carry else data
                        end = len(buf)
                except Exception:  # damage or a cap: what was decoded before it still counts
                    if carry:
                        yield clean(carry)
                    raise
                if not got:
                    if carry and keep_tail:
                        yield clean(carry)
                    return

            def piece(a: int, b: int) -> bytes:
                # out of the kept buffer: one copy; of bytes: the object itself when it is all of it
                return bytes(view[a:b]) if view is not None else buf[a:b]  # noqa: B023

            cut = buf.rfind(b"\n", 0, end)  # type: ignore[union-attr]
            if cut < 0:
                if end < chunk_size:
                    carry = piece(0, end)
                    continue
                yield clean(piece(0, end))
                carry = b""
                continue
            body, carry = piece(0, cut + 1), piece(cut + 1, end)
            yield clean(body)
    finally:
        if scratch is not None:
            _give_back(scratch)


# iter_chunks' buffers, kept for the next file: a fresh one is zeroed and faulted in page by page (16 MiB
# a slice of a file, bench/README.md, "eighth round"); one per generator alive at a time
_BUFFERS: list[memoryview] = []


def _take_buffer(n: int) -> memoryview:
    while _BUFFERS:
        buf = _BUFFERS.pop()
        if len(buf) >= n:
            return buf
    return memoryview(bytearray(n))


def _give_back(buf: memoryview) -> None:
    if len(_BUFFERS) < 2:
        _BUFFERS.append(buf)


def clean(data: bytes) -> bytes:
    """The bytes without NULs."""
    # translate, not replace: 30x faster on a run of zeros (2 GiB hole: ~1 s instead of ~30 s)
    return data.translate(None, b"\x00") if b"\x00" in data else data


def utf16_chunks(stream: BinaryIO, head: bytes) -> Iterator[bytes]:
    data = head + stream.read(UTF16_CAP)
    yield data.decode("utf-16", "replace").replace("\x00", "").encode("utf-8")


def cr_only(head: bytes) -> bool:
    """A file whose lines end with a lone CR (no LF in its head): treat CR as the line end."""
    return b"\n" not in head and b"\r" in head


class CrToLf:
    """Stream wrapper that turns every CR into LF (for CR-only files)."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner

    def read(self, n: int = -1) -> bytes:
        return self._inner.read(n).replace(b"\r", b"\n")


class Chained:
    """`head` bytes (already read to sniff the content), then the rest of a stream."""

    def __init__(self, head: bytes, rest) -> None:
        self._head = head
        self._rest = rest

    def read(self, n: int = -1) -> bytes:
        if self._head:
            if n < 0:
                out, self._head = self._head + self._rest.read(), b""
                return out
            out, self._head = self._head[:n], self._head[n:]
            return out
        return self._rest.read(n)

    def readinto(self, b) -> int:  # gzip and isal readers ask for it on streams of unknown size (stdin)
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def writable_row(row: dict) -> dict:
    """`row` with lone UTF-16 surrogates (a pickle or a JSON `\\ud800` can carry them) made U+FFFD:
    a str holding one cannot be written out as UTF-8."""
    for k, v in row.items():
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                row[k] = v.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return row
