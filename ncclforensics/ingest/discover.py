"""Find the log sources under a path and open each as a binary stream (archives streamed)."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ncclforensics.errors import NoInputError, UnsafeInputError, UsageError
from ncclforensics.ingest import archive
from ncclforensics.model import Skipped

MAX_FILES = 200_000
STDIN = "-"  # as a path given on the command line: standard input
STDIN_NAME = "stdin"  # the source name of what standard input held


@dataclass
class Source:
    name: str  # path relative to the run root (archive member path inside archives)
    stream: BinaryIO | None  # valid until the next Source is yielded
    size: int | None
    mtime: float | None
    skipped: str | None = None  # reason, when the source cannot be read
    entry: int = 0  # the walk's entry it belongs to (iter_sources: an archive's members share one)

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


@dataclass(frozen=True)
class Root:
    """One path of a run, and the prefix the names of its sources take in the run."""

    path: Path | None  # None: standard input
    prefix: str = ""

    @property
    def label(self) -> str:
        return STDIN if self.path is None else str(self.path)


def roots_of(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Root]:
    """The paths of one run as Roots; the string "-" is standard input.

    One path keeps its sources' names relative to itself. Several are one run whose names are
    relative to the paths' common folder (`node0/rank0.log`, `node1/rank0.log`, `dmesg.txt`), so
    they stay apart and a folder's name still tells its host; an archive's members are named
    `job.tar.gz!member`, as in a folder. Raises NoInputError for a path that does not exist and
    UsageError for a path given twice or inside another.
    """
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    if sum(1 for p in paths if isinstance(p, str) and p == STDIN) > 1:
        raise UsageError("standard input (-) is given more than once")
    files = [Path(p) for p in paths if not (isinstance(p, str) and p == STDIN)]
    for p in files:
        _stat(p)
    real = [Path(os.path.realpath(p)) for p in files]
    for i, a in enumerate(real):
        for j, b in enumerate(real[:i]):
            if a.is_relative_to(b) or b.is_relative_to(a):
                inner, outer = (files[i], files[j]) if a.is_relative_to(b) else (files[j], files[i])
                what = "the same as" if a == b else "inside"
                raise UsageError(f"{display_name(str(inner))} is {what} {display_name(str(outer))}: give it once")
    if len(paths) == 1:
        return [Root(files[0] if files else None)]
    parents = [Path(os.path.abspath(p)).parent for p in files]
    common = Path(os.path.commonpath(parents)) if parents else Path.cwd()
    roots = []
    for p in paths:
        if isinstance(p, str) and p == STDIN:
            roots.append(Root(None))
            continue
        path = Path(p)
        absolute = Path(os.path.abspath(path))
        if path.is_dir() or archive.is_archive(path.name):
            prefix = absolute.relative_to(common).as_posix() + ("/" if path.is_dir() else "!")
        else:
            rel = absolute.parent.relative_to(common).as_posix()
            prefix = "" if rel == "." else rel + "/"
        roots.append(Root(path, display_name(prefix)))
    return roots


Owned = Callable[[int], bool]


def iter_sources(path: str | os.PathLike | None, owned: Owned | None = None) -> Iterator[Source]:
    """Every readable file under `path` (a folder, file, compressed file or archive; None for
    standard input).

    Raises NoInputError when the path does not exist. Problems with one source become a
    Source with `skipped` set; they never stop the walk. `owned(i)`: whether to yield the i-th
    entry of a folder's walk (entry_sizes numbers them; an archive is one entry, all its
    members): the share of one process when several read a run (events.build_events).
    """
    if path is None:
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None or sys.stdin.closed:
            raise NoInputError("standard input (-) is closed")
        yield Source(STDIN_NAME, stream, None, None)
        return
    root = Path(path)
    st = _stat(root)
    if stat.S_ISDIR(st.st_mode):
        for index, _, opened in _walk(root, owned):
            for src in opened():
                src.entry = index
                yield src
    elif owned is None or owned(0):
        yield from _open_file(root, root.name, st, is_root=True)


def entry_sizes(path: str | os.PathLike) -> list[tuple[int, Path | None]]:
    """(bytes, the file) of each entry iter_sources(path, owned) numbers, in that order, without
    opening any file (a folder's walk; a file is one entry; an entry that is no regular file has
    0 bytes and no path). Raises NoInputError."""
    root = Path(path)
    st = _stat(root)
    if not stat.S_ISDIR(st.st_mode):
        return [(st.st_size, root)]
    return [entry for _, entry, _ in _walk(root, lambda _i: False)]


def _stat(path: Path) -> os.stat_result:
    try:
        return path.stat()
    except FileNotFoundError:
        raise NoInputError(f"no such file or folder: {display_name(str(path))}") from None
    except OSError as exc:
        raise NoInputError(f"cannot read {display_name(str(path))}: {exc.strerror or exc}") from None


Entry = tuple[int, tuple[int, Path | None], Callable[[], Iterator[Source]]]


def _walk(root: Path, owned: Owned | None = None) -> Iterator[Entry]:
    """The folder's entries in walk order: (index, (bytes, the file), the entry's sources when
    opened); an entry that `owned` refuses opens to nothing."""
    real_root = os.path.realpath(root)
    seen_dirs: set[tuple[int, int]] = set()
    count = 0
    index = -1

    def entry(size: int, full: Path | None, sources: Callable[[], Iterator[Source]]) -> Entry:
        nonlocal index
        index += 1
        if owned is not None and not owned(index):
            return index, (size, full), lambda: iter(())
        return index, (size, full), sources

    def one(src: Source) -> Callable[[], Iterator[Source]]:
        return lambda: iter((src,))

    # os.walk's order (top-down, names sorted), by os.scandir: a file's type and a folder's symlink-ness
    # come from its directory entry, its size from one stat (~4x faster than paths and two stats a file)
    stack: list[tuple[str, Path, str]] = [(os.fspath(root), root, "")]  # (folder, as a Path, its name + "/")
    while stack:
        dirpath, dpath, rel_dir = stack.pop()
        listed = list_folder(dirpath)
        if listed is None:
            continue  # os.walk's onerror=None: a folder that cannot be listed is left out
        dirs, files = listed
        # os.walk lists a symlink to a folder among the folders and, not following it, drops it
        # silently: say so, like a file symlink that is not followed.
        linked = [d for d in dirs if os.path.islink(d.path)]
        below = [(d.path, dpath / d.name, f"{rel_dir}{d.name}/") for d in reversed(dirs) if d not in linked]
        try:
            dst = os.stat(dirpath)
            key = (dst.st_dev, dst.st_ino)
        except OSError:
            stack.extend(below)
            continue
        if key in seen_dirs:
            continue
        seen_dirs.add(key)
        for d in linked:
            yield entry(0, None, one(Source(rel_dir + d.name, None, None, None, "symlink to a folder (not followed)")))
        for f in files:
            rel = rel_dir + f.name
            count += 1
            if count > MAX_FILES:
                yield entry(0, None, one(Source(rel, None, None, None,
                                                 f"more than {MAX_FILES} files; the rest were not read")))
                return
            try:
                if f.is_symlink():
                    target = os.path.realpath(f.path)
                    if not (target == real_root or target.startswith(real_root + os.sep)):
                        yield entry(0, None, one(Source(rel, None, None, None,
                                                         "symlink pointing outside the given folder (not followed)")))
                        continue
                st = f.stat()
            except OSError as exc:
                why = "symlink not followed" if os.path.islink(f.path) else "unreadable"
                yield entry(0, None, one(Source(rel, None, None, None, f"{why} ({exc.strerror or exc})")))
                continue
            if not stat.S_ISREG(st.st_mode):
                yield entry(0, None, one(Source(rel, None, None, None, "not a regular file")))
                continue
            full = dpath / f.name
            yield entry(st.st_size, full, lambda full=full, rel=rel, st=st: _open_file(full, rel, st))
        stack.extend(below)


def list_folder(path: str) -> tuple[list[os.DirEntry], list[os.DirEntry]] | None:
    """A folder's entries as os.walk splits them, each list sorted by name: folders (a symlink to one
    among them: is_dir follows it, as os.walk does) and the rest; None when it cannot be listed."""
    try:
        with os.scandir(path) as it:
            listed = list(it)
    except OSError:
        return None
    dirs: list[os.DirEntry] = []
    other: list[os.DirEntry] = []
    for e in listed:
        try:
            is_dir = e.is_dir()
        except OSError:
            is_dir = False
        (dirs if is_dir else other).append(e)
    dirs.sort(key=_entry_name)
    other.sort(key=_entry_name)
    return dirs, other


def _entry_name(e: os.DirEntry) -> str:
    return e.name


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
