"""The messages the reader hands the scanner, one per event of the walk, in file order."""

from __future__ import annotations

from dataclasses import dataclass

from ncclforensics.ingest.discover import Source
from ncclforensics.parse.lines import Chunk, FileContext


@dataclass(frozen=True, slots=True)
class Skip:
    """A source not read, and why (Skipped in the run's facts). `doc`: a document beside logs, which a
    root's walk names after everything else (ingest.reader.Reader._walk)."""

    name: str
    reason: str
    doc: bool = False


@dataclass(frozen=True, slots=True)
class RootStart:
    """The walk of the run's `index`-th path begins."""

    index: int


@dataclass(frozen=True, slots=True)
class UnitStart:
    """What follows is the `index`-th unit of a shared reading (ingest.shares.Claims), of the run's
    `root`-th path: its books, until the next UnitStart."""

    index: int
    root: int


@dataclass(frozen=True, slots=True)
class Note:
    """A note for the run (how something was read)."""

    text: str


@dataclass(frozen=True, slots=True)
class ChunkRead:
    """A chunk of a file after the block prefilter; its lines start at `first_line`."""

    ctx: FileContext
    prep: Chunk
    first_line: int

    @property
    def held_bytes(self) -> int:
        return len(self.prep.data)


@dataclass(frozen=True, slots=True)
class TailRead:
    """The end of a file (`data`, its first line's number), where weak signatures always run; `last`
    is the file's last prepared chunk, whose prefilter result the tail reuses."""

    ctx: FileContext
    data: bytes
    first_line: int
    last: Chunk


@dataclass(frozen=True, slots=True)
class SourceEnd:
    """A source read to its end, or to the error that stopped it (`error`); `part`: (k, n) when this
    was the k-th of n slices of a file (ingest.shares), whose rows number lines from 1."""

    src: Source
    ctx: FileContext
    nbytes: int
    error: BaseException | None
    part: tuple[int, int] | None = None


Item = Skip | RootStart | UnitStart | Note | ChunkRead | TailRead | SourceEnd
