"""Write a file by renaming a finished copy over it: a reader, or a writer killed midway, never sees half."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_GLOB = ".*.tmp"  # what a killed writer may leave in a folder (the scan sweeps these)


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` to write; renamed over `path` when the block ends without an
    error, removed when it raises."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: str | bytes) -> None:
    """`data` (text as UTF-8, line ends as they are) in `path`, all of it or, on an error, none."""
    with replacing(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
