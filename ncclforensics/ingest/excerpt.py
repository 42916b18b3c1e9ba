"""Read back given line ranges of a run's files (or archive members) after the event table is built."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ncclforensics.errors import ForensicsError
from ncclforensics.ingest import archive, decode
from ncclforensics.ingest.discover import Source, iter_sources, roots_of
from ncclforensics.ingest.envelope import strip_ansi
from ncclforensics.parse.prefilter import count_newlines

# Reading stops after this many bytes of one run (decompressed): a line deep in a 50 GB console is not
# worth a minute. The spots past it get a note instead of lines.
MAX_READ_BYTES = 1 << 30
MAX_LINE_CHARS = 500  # a context line is cut here (the event table keeps 2,000 of an evidence line)
MAX_LINES = 5_000  # lines kept per run, over all files
CHUNK = 1 << 20  # read in 1 MiB pieces: little memory, and the budget is checked often
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class Line:
    no: int
    text: str


@dataclass(frozen=True)
class Excerpt:
    """The lines read back from one file, in order; `note` says why some wanted lines are missing."""

    file: str
    lines: tuple[Line, ...]
    note: str = ""

    def between(self, first: int, last: int) -> tuple[Line, ...]:
        return tuple(x for x in self.lines if first <= x.no <= last)


def clean_line(raw: bytes | str) -> str:
    """One line as safe text: UTF-8 with replacement, ANSI codes and control characters removed, cut."""
    text = decode.decode_bytes(raw) if isinstance(raw, bytes) else raw
    text = strip_ansi(text.rstrip("\r\n"))
    text = _CTRL.sub("", text.replace("\t", "    "))
    return text if len(text) <= MAX_LINE_CHARS else text[: MAX_LINE_CHARS - 1] + "…"


def read_lines(paths: str | os.PathLike | Sequence[str | os.PathLike], wants: Mapping[str, Iterable[tuple[int, int]]],
               *, max_bytes: int = MAX_READ_BYTES) -> dict[str, Excerpt]:
    """For each file name (as in the event table's `file` column) the lines in its wanted ranges
    (1-based, inclusive), from the path (or the paths of one run, or "-") that was analyzed. Never
    raises for a file: a file that vanished, changed into binary or broke off gives an Excerpt with a
    note. Archives are streamed, as when the run was read."""
    ranges = {f: _merge(rs) for f, rs in wants.items()}
    ranges = {f: rs for f, rs in ranges.items() if rs}
    out: dict[str, Excerpt] = {}
    budget = [max_bytes, MAX_LINES]
    try:
        roots = roots_of(paths)
    except ForensicsError:  # the run itself vanished: every name gets the note below
        roots = []
    for root in roots:
        # names in the table carry their root's prefix when a run was given as several paths
        mine = {name[len(root.prefix):]: name for name in ranges if name.startswith(root.prefix)}
        if root.path is None:
            for name in mine.values():
                out.setdefault(name, Excerpt(name, (), "read from standard input, which cannot be read again"))
            continue
        for rel, src in _sources(root.path, set(mine)):
            name = mine[rel]
            if name in out:
                continue
            try:
                out[name] = _read(src, name, ranges[name], budget)
            except Exception as exc:  # never fatal: damage, a cap, a race with a writer
                out[name] = Excerpt(name, (), f"could not be read again ({type(exc).__name__}: {str(exc)[:120]})")
    for name in ranges:
        out.setdefault(name, Excerpt(name, (), "no longer there: moved or deleted since it was read"))
    return out


def _merge(rs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    spans = sorted((max(1, a), b) for a, b in rs if b >= max(1, a))
    out: list[tuple[int, int]] = []
    for a, b in spans:
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _sources(root: Path, names: set[str]):
    """(name, Source) for the wanted names: a plain file of a folder is opened directly; anything else
    (archive members, compressed files, odd names) by walking the run as ingest did."""
    left = set(names)
    if root.is_dir():
        for name in sorted(names):
            if "!" in name:
                continue
            path = root / name
            try:
                if path.is_symlink() or not path.is_file() or archive.is_archive(path.name):
                    continue
                if os.path.realpath(path) != os.path.join(os.path.realpath(root), *name.split("/")):
                    continue
                fh = open(path, "rb")
            except (OSError, ValueError):
                continue
            with fh:
                left.discard(name)
                yield name, Source(name, fh, os.fstat(fh.fileno()).st_size, None)
    if not left:
        return
    try:
        for src in iter_sources(root):
            if src.name in left and src.stream is not None:
                left.discard(src.name)
                yield src.name, src
                if not left:
                    return
    except Exception:  # the run itself vanished or an archive broke: the names left get notes
        return


def _read(src: Source, name: str, spans: list[tuple[int, int]], budget: list[int]) -> Excerpt:
    stream = src.stream
    head = stream.read(decode.HEAD_SIZE)
    kind = decode.sniff(head)
    if kind == "gzip" and archive.compression_of(name) is None:
        stream = archive.decompressing(decode.Chained(head, stream), "gz", None, name)
        head = stream.read(decode.HEAD_SIZE)
        kind = decode.sniff(head)
    if kind == "pickle" or (name.endswith(".json") and head.lstrip().startswith(b"{")):
        return Excerpt(name, (), "a Flight Recorder dump or JSON document: no log lines to show")
    if kind == "empty":
        return Excerpt(name, (), "now empty")
    if kind == "utf-16":
        chunks = decode.utf16_chunks(stream, head)
    elif decode.cr_only(head):
        chunks = decode.iter_chunks(decode.CrToLf(stream), head.replace(b"\r", b"\n"), CHUNK)
    else:
        chunks = decode.iter_chunks(stream, head, CHUNK)
    last_wanted = spans[-1][1]
    kept: list[Line] = []
    line_no = 1
    note = ""
    for data in chunks:
        budget[0] -= len(data)
        newlines = count_newlines(data)
        lo, hi = line_no, line_no + newlines - (1 if data.endswith(b"\n") else 0)
        hits = [(max(a, lo), min(b, hi)) for a, b in spans if a <= hi and b >= lo]
        if hits:
            lines = data.split(b"\n")
            for a, b in hits:
                take = min(b - a + 1, budget[1])
                kept += [Line(no, clean_line(lines[no - lo])) for no in range(a, a + take)]
                budget[1] -= take
                if take < b - a + 1:
                    note = "more lines than the context limit: the rest are not shown"
                    break
        line_no += newlines
        if hi >= last_wanted or note:
            break
        if budget[0] <= 0:
            note = f"not read past line {hi:,}: the run's context budget ({MAX_READ_BYTES >> 20} MiB) is spent"
            break
    if not kept and not note and line_no <= spans[0][0]:
        note = f"has only {line_no - 1:,} lines now: changed since it was read"
    return Excerpt(name, tuple(kept), note)
