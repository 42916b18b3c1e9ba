"""How several processes share the reading of one run (events.build_events, jobs > 1).

The walk's entries (discover.entry_sizes) are cut into units: contiguous runs of entries of about
equal bytes, a few per process. A file bigger than a unit (one console of a whole job) is cut into
slices at the places where reading it whole cuts its chunks (decode.iter_chunks cuts by position),
so each slice's chunks, and the lines and rows they give, are those of a whole reading; the slices'
rows join with their line numbers shifted (events._Books).

Units are equal in bytes, not in work: a console's end holds every rank's teardown and tracebacks,
the lines that cost Python time. So no process is given its units in advance: every process walks
the whole run and reads the units it claims (Claims) as it reaches them, a unit going to the first
process that gets there; a file's slices are reached from its ends (its last, its first, then the
middle from the end). The units' books join in unit order, which is walk order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ncclforensics.errors import NoInputError
from ncclforensics.ingest import archive, decode
from ncclforensics.ingest.discover import Root, entry_sizes

# A run is shared between processes only when each gets at least this much to read: a process
# costs ~10-30 ms to fork and its rows a pickle back (bench/README.md, "Several processes").
SHARE_MIN_BYTES = 48 << 20
# Units a reading process has on average: more balance the processes' work better (the last unit
# claimed is what the others may wait for); each costs a set of books (events._Books) and, for a
# file cut into slices, a slice.
UNITS_PER_PROCESS = 6
# ... and at most this many files a unit: a run of thousands of small files (2,048 ranks) costs its
# Python work by the file, and 6 units a process left the last unit ~0.7 s of reading, which the other
# process waited for (bench/README.md, "tenth round"); a unit of whole files costs a set of books only
FILES_PER_UNIT = 128
# How far before a chunk's cut position its last newline is looked for; a file whose lines are
# longer is not cut there.
CUT_WINDOW = 1 << 20

Key = tuple[int, int]  # (root index, entry index)


@dataclass(frozen=True)
class Slice:
    """The k-th of n slices of a file: the bytes from `start` (a line start) on; the stream is read
    from `grid` (a chunk's cut position: the bytes before it are the first chunk's head) to `end`
    (the next slice's grid, whose bytes after the last newline are that slice's) or the end."""

    k: int
    n: int
    start: int
    grid: int
    end: int | None


@dataclass
class Share:
    """What one process reads: whole entries, and slices of big files."""

    index: int
    whole: set[Key] = field(default_factory=set)
    slices: dict[Key, list[Slice]] = field(default_factory=dict)
    largest: int = 0  # bytes of its largest entry or slice (events._read_shared)

    def owns(self, root: int, entry: int) -> bool:
        return (root, entry) in self.whole or (root, entry) in self.slices

    def slices_of(self, root: int, entry: int) -> list[Slice] | None:
        return self.slices.get((root, entry))

    def books_entry(self, root: int, entry: int) -> bool:
        """Whether this share names the entry when it is skipped as a whole (not read, not a log):
        the share of its last slice, when it is cut."""
        sls = self.slices.get((root, entry))
        return (root, entry) in self.whole or (sls is not None and any(sl.k == sl.n - 1 for sl in sls))


class Plan(list):
    """The units of a shared reading (Shares, in walk order), how many processes read them and the
    bytes of the run."""

    procs: int
    bytes: int


class Claims:
    """Which units of a plan this process reads (`me`: its number): claimed as the walk reaches them,
    in `table`, shared by every reading process (a multiprocessing Array of ints, -1 for a unit no
    process has claimed yet). Asked by ingest.reader.Reader as a Share is: `owns` (claiming the
    entry's unit), `slices_of` (a file's slices, its ends first, each claimed when it is reached),
    `books_entry`; `current` is the unit of what is read now."""

    def __init__(self, units: list[Share], table, me: int) -> None:
        self.units = units
        self.table = table
        self.me = me
        self.current: int | None = None
        self._known: dict[int, bool] = {}
        self._unit_of: dict[Key, int] = {key: u for u, sh in enumerate(units) for key in sh.whole}
        self._slices: dict[Key, list[tuple[int, Slice]]] = {}
        for u, sh in enumerate(units):
            for key, sls in sh.slices.items():
                self._slices.setdefault(key, []).extend((u, sl) for sl in sls)
        for sls in self._slices.values():
            sls.sort(key=lambda us: us[1].k)

    def claim(self, unit: int) -> bool:
        """Whether `unit` is this process's: claimed now, unless another process has it."""
        mine = self._known.get(unit)
        if mine is None:
            with self.table.get_lock():
                owner = self.table[unit]
                if owner < 0:
                    self.table[unit] = owner = self.me
            mine = self._known[unit] = owner == self.me
        if mine:
            self.current = unit
        return mine

    def owns(self, root: int, entry: int) -> bool:
        unit = self._unit_of.get((root, entry))
        if unit is not None:
            return self.claim(unit)
        sls = self._slices.get((root, entry))
        # a file cut into slices is opened by every process that may read one of them (slices_of claims them)
        return sls is not None and any(self._may_claim(u) for u, _ in sls)

    def _may_claim(self, unit: int) -> bool:
        """Whether `unit` is this process's or no process's yet (claiming nothing)."""
        mine = self._known.get(unit)
        if mine is not None:
            return mine
        owner = self.table[unit]
        return owner < 0 or owner == self.me

    def slices_of(self, root: int, entry: int):
        sls = self._slices.get((root, entry))
        if sls is None:
            return None
        # a file's rare lines are at its ends (every rank's start-up at its head, its teardown and
        # tracebacks at its end): those slices first, then the middle from the end, so the slice
        # claimed last is a cheap one
        order = [sls[-1], sls[0], *reversed(sls[1:-1])] if len(sls) > 1 else sls
        return (sl for u, sl in order if self.claim(u))

    def books_entry(self, root: int, entry: int) -> bool:
        if (root, entry) in self._unit_of:
            return True  # owns() claimed it
        sls = self._slices.get((root, entry))
        return sls is not None and self.claim(sls[-1][0])


def plan(roots: list[Root], jobs: int, min_bytes: int = SHARE_MIN_BYTES, per_process: int = 1) -> Plan | None:
    """The units of a reading by up to `jobs` processes (`per_process` units each, more where a unit
    would hold more than FILES_PER_UNIT files, fewer where files are too few to make them), or None
    when one process should read it all (standard input, a small run, one job). Each process has
    `min_bytes` at least to read."""
    if jobs < 2 or any(r.path is None for r in roots):
        return None
    try:
        entries = [((ri, ei), size, full) for ri, r in enumerate(roots)
                   for ei, (size, full) in enumerate(entry_sizes(r.path))]  # type: ignore[arg-type]
    except (NoInputError, OSError):
        return None  # the single reader says what is wrong
    total = sum(size for _, size, _ in entries)
    procs = min(jobs, total // max(1, min_bytes))
    if procs < 2:
        return None
    n = procs * max(1, per_process, -(-len(entries) // (procs * FILES_PER_UNIT)))
    # units: whole entries, and the chunks of files that may be cut, each with its bytes
    units: list[tuple[Key, int | None, int]] = []
    for key, size, full in entries:
        grids = _grids(full, size) if size > total / n / 2 else []
        if not grids:
            units.append((key, None, size))
            continue
        edges = [0, *grids, size]
        units += [(key, i, edges[i + 1] - edges[i]) for i in range(len(edges) - 1)]
    shares = [Share(k) for k in range(n)]
    chunk_owner: dict[Key, list[int]] = {}
    done = 0
    for key, chunk, size in units:
        owner = min(n - 1, int((done + size / 2) * n / total))
        done += size
        shares[owner].largest = max(shares[owner].largest, size)
        if chunk is None:
            shares[owner].whole.add(key)
        else:
            chunk_owner.setdefault(key, []).append(owner)
    full_of = {key: full for key, _, full in entries}
    for key, owners in chunk_owner.items():
        for owner, sl in _slices(full_of[key], owners):
            shares[owner].slices.setdefault(key, []).append(sl)
    for sh in shares:
        for key, sls in list(sh.slices.items()):
            if len(sls) == 1 and sls[0].n == 1:  # not cut after all
                del sh.slices[key]
                sh.whole.add(key)
    used = Plan(sh for sh in shares if sh.whole or sh.slices)
    for k, sh in enumerate(used):
        sh.index = k
    used.procs = min(procs, len(used))
    used.bytes = total
    return used if len(used) > 1 else None


def _grids(full: Path | None, size: int) -> list[int]:
    """The positions where reading the file whole cuts its chunks (read_source: a head, then a
    chunk at a time), when the file may be cut there: a plain text file (not compressed, not an
    archive, not UTF-16 or CR-only, not JSON) of at least three chunks. Else []."""
    if full is None or size < decode.HEAD_SIZE + 3 * decode.CHUNK_SIZE:
        return []
    name = full.name.lower()
    if archive.is_archive(name) or archive.compression_of(name) is not None or name.endswith(".json"):
        return []
    try:
        with open(full, "rb") as f:
            head = f.read(decode.HEAD_SIZE)
        if decode.sniff(head) != "text" or decode.cr_only(head):
            return []
    except (OSError, decode.BinaryContent):
        return []
    return list(range(decode.HEAD_SIZE + decode.CHUNK_SIZE, size, decode.CHUNK_SIZE))


def _slices(full: Path, owners: list[int]) -> list[tuple[int, Slice]]:
    """Chunk owners (chunk i starts after the i-th cut) -> (owner, Slice) per run of one owner. A
    cut without a newline in the CUT_WINDOW before it stays inside a slice; the last slice holds two
    chunks at least (its tail check reads the end of the chunk before the last)."""
    runs: list[list[int]] = []  # [owner, first chunk]
    for i, owner in enumerate(owners):
        if not runs or runs[-1][0] != owner:
            runs.append([owner, i])
    if len(owners) - runs[-1][1] < 2 and len(runs) > 1:
        runs.pop()
    starts: list[tuple[int, int, int]] = []  # (owner, first chunk, start byte)
    try:
        with open(full, "rb") as f:
            for owner, first in runs:
                if first == 0:
                    starts.append((owner, 0, 0))
                    continue
                cut = _cut(f, decode.HEAD_SIZE + first * decode.CHUNK_SIZE)
                if cut is not None:
                    starts.append((owner, first, cut))
    except OSError:
        return [(owners[0], Slice(0, 1, 0, decode.HEAD_SIZE, None))]
    out = []
    for k, (owner, first, start) in enumerate(starts):
        end = decode.HEAD_SIZE + starts[k + 1][1] * decode.CHUNK_SIZE if k + 1 < len(starts) else None
        out.append((owner, Slice(k, len(starts), start, decode.HEAD_SIZE + first * decode.CHUNK_SIZE, end)))
    return out


def _cut(f, grid: int) -> int | None:
    """Where the chunk ending at `grid` ends: after the last newline before it."""
    lo = max(0, grid - CUT_WINDOW)
    f.seek(lo)
    window = f.read(grid - lo)
    nl = window.rfind(b"\n")
    return None if nl < 0 or len(window) < grid - lo else lo + nl + 1


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
