"""Multi-literal search over bytes: which blocks, and which lines of a block, hold one of a set of literals.

One Hyperscan database per literal set (DESIGN.md §8: ~1 GB/s a core for ~100 literals, and it
releases the GIL while it scans); where the `hyperscan` package cannot be loaded, Python's `re`
over the same literals gives the same answers, slower. Literals never contain a newline, so a match
lies inside one line and one block (blocks end just after a newline: lines._block_spans).
"""

from __future__ import annotations

import hashlib
import platform
import re
import threading
from bisect import bisect_right
from collections.abc import Iterator, Sequence

from ncclforensics.atomic import atomic_write
from ncclforensics.diskcache import cache_dir

try:  # pragma: no cover - which branch runs depends on the platform
    import hyperscan as _hs
except ImportError:  # pragma: no cover
    _hs = None

HYPERSCAN = _hs is not None

# Newline counts (line numbers of hits, a file's lines): NumPy's vectorised compare-and-count is ~4×
# as fast as bytes.count on large ranges (bench/README.md, "Issue 14, fourth round"). Below NUMPY_MIN
# bytes the gain is small (~2× at 256 KB), and a run of small files never imports NumPy (~75 ms, ~15 MB
# of memory a process). Counted NUMPY_STEP bytes at a time: the comparison's temporary array stays in
# the CPU cache.
NUMPY_MIN = 1 << 20
# Once NumPy is imported (a run of NUMPY_RUN_BYTES or more imports it before forking its readers,
# events._read_shared), ranges from NUMPY_SMALL bytes on are counted with it too: measured ~4.8× as
# fast as bytes.count at 512 KB, ~3.5× at 64 KB, ~1.7× at 16 KB, slower at 4 KB (a torchrun rank's
# stdout of a few hundred KB, thousands of them in a large job).
NUMPY_SMALL = 32 << 10
NUMPY_RUN_BYTES = 256 << 20
# lines_backward's windows double up to this: a walk over a whole tail (lines._walk_tail) that stops
# early in a dense stretch never searches, and calls back for, more than one such window past its stop
MAX_WINDOW = 64 << 10
NUMPY_STEP = 256 << 10
_np: object = None  # the numpy module once imported; False where it cannot be
_np_lock = threading.Lock()


def numpy_module() -> object | None:
    """NumPy, imported on first use (None where it is missing). events._read_shared calls it before
    forking, so that no child starts while another thread holds the import lock."""
    global _np
    if _np is None:
        with _np_lock:
            if _np is None:
                try:
                    import numpy
                except ImportError:  # pragma: no cover - numpy is a dependency
                    numpy = False
                _np = numpy
    return _np or None


def count_newlines(data: bytes, a: int = 0, b: int | None = None) -> int:
    """data.count(b"\n", a, b) for 0 <= a (b None = to the end): NumPy's count for a range of
    NUMPY_MIN bytes or more (imported then), or of NUMPY_SMALL or more once it is imported."""
    end = len(data) if b is None else min(b, len(data))
    if end - a < NUMPY_MIN and (end - a < NUMPY_SMALL or not _np):
        return data.count(b"\n", a, end)
    np = numpy_module()
    if np is None:  # pragma: no cover
        return data.count(b"\n", a, end)
    arr = np.frombuffer(data, np.uint8, end - a, a)
    n = 0
    for i in range(0, end - a, NUMPY_STEP):
        n += int(np.count_nonzero(arr[i : i + NUMPY_STEP] == 10))
    return n


class LiteralSet:
    """Literals in named groups (`strong`, `weak` …), searched in byte strings.

    `blocks_with_any` answers per block (stopping at a block's first match); `lines_with` per line
    of one span, by group. Matching is on bytes: a literal (ASCII or UTF-8) matches the same
    lines as in the decoded text, since an ASCII byte is never part of a multi-byte sequence and
    the decoder's replacement of invalid bytes never makes or breaks an ASCII literal.
    """

    def __init__(self, groups: dict[str, Sequence[str | bytes]], *, use_hyperscan: bool | None = None,
                 patterns: dict[str, Sequence[str]] | None = None) -> None:
        """`groups`: literals by group name; `patterns`: regular expressions by group name (for
        lines_with only; `^` is a line start; a pattern must not match across a newline)."""
        patterns = {g: p for g, p in (patterns or {}).items() if p}
        self.names = [g for g, lits in groups.items() if lits and g not in patterns] + list(patterns)
        lits: list[bytes] = []
        ids: list[int] = []
        for gi, g in enumerate(self.names):
            if g in patterns:
                continue
            for lit in dict.fromkeys(x.encode() if isinstance(x, str) else x for x in groups[g]):
                if not lit or b"\n" in lit:
                    raise ValueError(f"literal {lit!r}: empty or holds a newline")
                lits.append(lit)
                ids.append(gi)
        self._group_of = ids
        self._texts = [lit.decode("utf-8", "surrogatepass") for lit in lits]  # literals_in's answers
        self.empty = not lits and not patterns
        use = HYPERSCAN if use_hyperscan is None else (use_hyperscan and HYPERSCAN)
        self._db = self._db_first = self._rx_db = None
        self._local = threading.local()
        rx_list = [(self.names.index(g), p) for g, ps in patterns.items() for p in ps]
        self._rx_group_of = [g for g, _ in rx_list]
        self._rx_py = [(g, re.compile(p.encode(), re.M)) for g, p in rx_list]
        if use and rx_list:
            self._rx_db = _database([p.encode() for _, p in rx_list], _hs.HS_FLAG_MULTILINE, literal=False)
        if not lits:
            self._any_rx = None
            self._group_rx = []
            return
        if use:
            self._db = _database(lits, 0, literal=True)
            self._db_first = _database(lits, _hs.HS_FLAG_SINGLEMATCH, literal=True)
        else:
            alt = b"|".join(re.escape(x) for x in sorted(lits, key=len, reverse=True))
            self._any_rx = re.compile(alt)
            self._group_rx = [re.compile(b"|".join(re.escape(x) for x, g in zip(lits, ids, strict=True) if g == gi))
                              if gi in ids else None for gi in range(len(self.names))]

    @property
    def texts(self) -> list[str]:
        """The literals, in the order of the groups given (duplicates once): literal_ids_in's indices."""
        return self._texts

    @property
    def engine(self) -> str:
        return "hyperscan" if (self._db or self._rx_db) is not None else "re"

    def _scratch(self, db: object) -> object:
        """Hyperscan scratch space, one per thread and database (a scratch serves one scan at a time)."""
        key = id(db)
        s = getattr(self._local, "s", None)
        if s is None:
            s = self._local.s = {}
        scr = s.get(key)
        if scr is None:
            scr = s[key] = _hs.Scratch(db)
        return scr

    def blocks_with_any(self, data: bytes, spans: Sequence[tuple[int, int]]) -> list[int]:
        """Indices of the spans of `data` that hold any literal."""
        if self.empty or not spans:
            return []
        if self._db is None:
            out = []
            search = self._any_rx.search
            for k, (a, b) in enumerate(spans):
                if search(data, a, b) is not None:
                    out.append(k)
            return out
        # One scan of the whole range, stopping at the first match; then again from the next block.
        # A callback per match would cost ~0.2 µs each: a frequent literal would dominate.
        db = self._db_first
        scratch = self._scratch(db)
        view = memoryview(data)
        ends = [b for _, b in spans]
        hits: list[int] = []
        found: list[int] = []

        def first(_id: int, _from: int, to: int, _flags: int, _ctx: object) -> bool:
            found.append(to)
            return True

        k = 0
        base = spans[0][0]
        stop = spans[-1][1]
        while k < len(spans):
            found.clear()
            try:
                db.scan(view[base:stop], match_event_handler=first, scratch=scratch)
            except _hs.ScanTerminated:
                pass
            if not found:
                break
            # the match ends inside the block whose end is the first one past it
            k = bisect_right(ends, base + found[0] - 1, k)
            hits.append(k)
            k += 1
            if k < len(spans):
                base = spans[k][0]
        return hits

    def literals_in(self, text: str) -> set[str]:
        """Which literals (of any group) occur in one short text, a line's body: one scan (~1.5 µs for a
        few hundred literals) where a loop of `in` tests costs ~10 µs; without Hyperscan, that loop."""
        texts = self._texts
        return {texts[i] for i in self.literal_ids_in(text)}

    def literal_ids_in(self, text: str) -> frozenset[int]:
        """literals_in as the literals' indices into `texts`."""
        if self._db is None:
            return frozenset(i for i, lit in enumerate(self._texts) if lit in text)
        ids: set[int] = set()
        self._db.scan(text.encode("utf-8", "surrogatepass"), match_event_handler=lambda i, *_: ids.add(i),
                      scratch=self._scratch(self._db))
        return frozenset(ids)

    def lines_with(self, data: bytes, a: int, b: int) -> dict[str, list[int]]:
        """Per group, the sorted indices (0 = the line starting at `a`) of the lines of data[a:b]
        that hold one of the group's literals (or match one of its patterns)."""
        out: dict[str, list[int]] = {g: [] for g in self.names}
        if self.empty or a >= b:
            return out
        for g, ends in zip(self.names, self._ends(data, a, b), strict=True):
            if ends:
                ends.sort()
                out[g] = _line_indices(data, a, ends)
        return out

    def _ends(self, data: bytes, a: int, b: int) -> list[list[int]]:
        """Per group, the end offsets (into `data`, unsorted) of the matches in data[a:b]."""
        per: list[list[int]] = [[] for _ in self.names]
        if self._db is None:
            for gi, rx in enumerate(self._group_rx):
                if rx is not None:
                    per[gi] += [m.end() for m in rx.finditer(data, a, b)]
        else:
            group_of = self._group_of

            def each(i: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
                per[group_of[i]].append(a + to)

            self._db.scan(memoryview(data)[a:b], match_event_handler=each, scratch=self._scratch(self._db))
        if self._rx_db is not None:
            rx_group_of = self._rx_group_of

            def each_rx(i: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
                per[rx_group_of[i]].append(a + to)

            self._rx_db.scan(memoryview(data)[a:b], match_event_handler=each_rx, scratch=self._scratch(self._rx_db))
        else:
            for gi, rx in self._rx_py:
                # a pattern's matches never span lines: non-overlapping ones still find every line
                per[gi] += [m.end() for m in rx.finditer(data, a, b) if m.end() > m.start()]
        return per

    def lines_backward(self, data: bytes, a: int, b: int, newlines: int | None = None,
                       window: int = 4096) -> Iterator[tuple[int, str]]:
        """The lines of data[a:b] holding a literal of any group, last first, as (index from the
        line starting at `a`, decoded text): found a window at a time from the end (windows
        doubling), so a caller that stops early never pays for the start: newlines are counted
        and lines decoded only as far back as the walk goes. `newlines`: the newlines in
        data[a:b], when known."""
        if self.empty or a >= b:
            return
        if newlines is None:
            newlines = count_newlines(data, a, b)
        end = b
        pos, after = b, 0  # newlines in data[pos:b]
        while end > a:
            start = max(a, end - window)
            if start > a:
                start = max(a, data.rfind(b"\n", a, start) + 1)  # a line start (or the range's)
            ends = sorted({e for group in self._ends(data, start, end) for e in group}, reverse=True)
            line_start = end + 1  # of the line yielded last: a later match in it is that line's
            for e in ends:
                if e > line_start:
                    continue
                # a literal holds no newline: its line starts after the last newline before its end
                line_start = data.rfind(b"\n", start, e - 1) + 1 or start
                line_end = data.find(b"\n", e - 1, end)
                if line_end < 0:
                    line_end = end
                # (a short range, as most are between two hits: bytes.count without the call)
                after += (data.count(b"\n", line_start, pos) if pos - line_start < NUMPY_SMALL
                          else count_newlines(data, line_start, pos))
                pos = line_start
                yield newlines - after, data[line_start:line_end].decode("utf-8", "replace")
            end = start
            window = min(2 * window, MAX_WINDOW)


def _database(expressions: list[bytes], flags: int, *, literal: bool) -> object:
    """A Hyperscan block-mode database of `expressions` (ids = their indices). Compiled databases are
    kept in the user's cache folder (serialized: loading one takes ~1 ms, compiling the prefilter's
    ~20 ms each: bench/README.md, "Start-up"); one that does not load (another CPU, another Hyperscan)
    is compiled again."""
    key = hashlib.sha256(repr((_hs.__version__, platform.machine(), flags, literal, expressions)).encode())
    path = cache_dir() / "hyperscan" / f"{key.hexdigest()[:24]}.db"
    try:
        return _hs.loadb(path.read_bytes(), _hs.HS_MODE_BLOCK)
    except (OSError, _hs.error):
        pass
    db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
    db.compile(expressions=expressions, ids=list(range(len(expressions))), elements=len(expressions), flags=flags,
               literal=literal)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, _hs.dumpb(db))
    except (OSError, _hs.error):
        pass  # a read-only home: compile again next time
    return db


def _line_indices(data: bytes, a: int, ends: list[int]) -> list[int]:
    """Sorted unique line indices (counted from the line starting at `a`) of match end offsets."""
    out: list[int] = []
    line = 0
    at = a
    count = data.count
    for e in ends:
        pos = e - 1  # the match's last byte
        if pos >= at:
            # most ranges are short (a block holds a few dozen hits): bytes.count without the call
            line += count(b"\n", at, pos) if pos - at < NUMPY_SMALL else count_newlines(data, at, pos)
            at = pos
        if not out or out[-1] != line:
            out.append(line)
    return out
