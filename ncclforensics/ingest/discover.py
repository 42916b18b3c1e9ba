"""Find the log sources under a path and open each as a binary stream (archives streamed)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ncclforensics.errors import NoInputError, UnsafeInputError
from ncclforensics.ingest import archive
from ncclforensics.model import Skipped

MAX_FILES = 200_000


@dataclass
class Source:
    name: str  # path relative to the run root (archive member path inside archives)
    stream: BinaryIO | None  # valid until the next Source is yielded
    size: int | None
    mtime: float | None
    skipped: str | None = None  # reason, when the source cannot be read

    def __post_init__(self) -> None:
        self.name = display_name(self.name)


def display_name(name: str) -> str:
    """A path as one line of valid text: undecodable bytes (surrogate escapes from the file
    system or a tar) and control characters become backslash escapes. Names reach stdout,
    CSV and terminals; a raw newline, ESC or lone surrogate must not."""
    if name.isprintable():
        return name
    out = []
    for c in name:
        if c.isprintable():
            out.append(c)
        elif "\udc80" <= c <= "\udcff":  # os.fsdecode's escape of one undecodable byte
            out.append(f"\\x{ord(c) - 0xDC00:02x}")
        else:
            out.append(c.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def run_name(path: Path) -> str:
    name = display_name(path.name or str(path))
    for suf in sorted(archive.ARCHIVE_SUFFIXES + archive.COMPRESSED_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suf):
            return name[: -len(suf)]
    return name


def iter_sources(path: str | os.PathLike) -> Iterator[Source]:
    """Every readable file under `path` (a folder, file, compressed file or archive).

    Raises NoInputError when the path does not exist. Problems with one source become a
    Source with `skipped` set; they never stop the walk.
    """
    root = Path(path)
    try:
        st = root.stat()
    except FileNotFoundError:
        raise NoInputError(f"no such file or folder: {path}") from None
    except OSError as exc:
        raise NoInputError(f"cannot read {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        yield from _walk(root)
    else:
        yield from _open_file(root, root.name, st, is_root=True)


def _walk(root: Path) -> Iterator[Source]:
    real_root = os.path.realpath(root)
    seen_dirs: set[tuple[int, int]] = set()
    count = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False, onerror=None):
        try:
            dst = os.stat(dirpath)
            key = (dst.st_dev, dst.st_ino)
        except OSError:
            continue
        if key in seen_dirs:
            dirnames[:] = []
            continue
        seen_dirs.add(key)
        dirnames.sort()
        # os.walk lists a symlink to a folder among the folders and, not following it, drops it
        # silently: say so, like a file symlink that is not followed.
        for dname in [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            dirnames.remove(dname)
            rel = (Path(dirpath) / dname).relative_to(root).as_posix()
            yield Source(rel, None, None, None, "symlink to a folder (not followed)")
        for fname in sorted(filenames):
            full = Path(dirpath) / fname
            rel = full.relative_to(root).as_posix()
            count += 1
            if count > MAX_FILES:
                yield Source(rel, None, None, None, f"more than {MAX_FILES} files; the rest were not read")
                return
            try:
                if full.is_symlink():
                    target = os.path.realpath(full)
                    if not (target == real_root or target.startswith(real_root + os.sep)):
                        yield Source(rel, None, None, None, "symlink pointing outside the given folder (not followed)")
                        continue
                st = full.stat()
            except OSError as exc:
                why = "symlink not followed" if os.path.islink(full) else "unreadable"
                yield Source(rel, None, None, None, f"{why} ({exc.strerror or exc})")
                continue
            if not stat.S_ISREG(st.st_mode):
                yield Source(rel, None, None, None, "not a regular file")
                continue
            yield from _open_file(full, rel, st)


def _open_file(full: Path, rel: str, st: os.stat_result, *, is_root: bool = False) -> Iterator[Source]:
    name = full.name
    try:
        fh = open(full, "rb")
    except OSError as exc:
        yield Source(rel, None, None, None, f"unreadable ({exc.strerror or exc})")
        return
    with fh:
        if archive.is_archive(name):
            yield from _archive_members(full, rel, fh, is_root)
            return
        kind = archive.compression_of(name)
        stream = archive.decompressing(fh, kind, st.st_size, rel)
        yield Source(archive.strip_compression(rel), stream, st.st_size if kind is None else None,
                     st.st_mtime)


def _archive_members(full: Path, rel: str, fh: BinaryIO, is_root: bool) -> Iterator[Source]:
    # A single archive given on the command line is the run: member paths stand alone. In a
    # folder, even at its top, members are named archive!member (two archives may both hold
    # rank0.log, and so may the folder itself).
    prefix = "" if is_root else rel + "!"
    try:
        if full.name.lower().endswith(".zip"):
            members = archive.iter_zip(str(full), rel)
        else:
            members = archive.iter_tar(fh, rel, os.fstat(fh.fileno()).st_size)
            if archive.tar_compression(full.name) is not None:
                members = archive.read_ahead(members)
        for m in members:
            if m.stream is None:
                yield Source(prefix + m.name, None, m.size, m.mtime, m.refused)
                continue
            kind = archive.compression_of(m.name)
            stream = archive.decompressing(m.stream, kind, m.size, m.name)
            yield Source(prefix + archive.strip_compression(m.name), stream,
                         m.size if kind is None else None, m.mtime)
    except UnsafeInputError as exc:
        yield Source(rel, None, None, None, str(exc))


def skipped_of(src: Source) -> Skipped:
    return Skipped(src.name, src.skipped or "unreadable")
