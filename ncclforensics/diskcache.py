"""The user's cache folder: what ncclforensics can compute again but would rather not at every start.

Everything kept here is checked against what it was made from (file sizes and times, hashes of the
inputs) or is Jinja's own template bytecode, keyed by template source: deleting the folder is always safe.
"""

from __future__ import annotations

import atexit
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ncclforensics.atomic import atomic_write

if TYPE_CHECKING:
    import jinja2


def cache_dir() -> Path:
    """XDG_CACHE_HOME/ncclforensics, else ~/.cache/ncclforensics."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ncclforensics"


def template_cache() -> jinja2.BytecodeCache | None:
    """Compiled Jinja templates, kept between runs (compiling the reproducer's and the report's
    templates is a fifth of a small run's time: bench/README.md, "Start-up"); None where the folder
    cannot be made."""
    folder = cache_dir() / "jinja"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    import jinja2  # here: reading logs needs no templates

    return jinja2.FileSystemBytecodeCache(str(folder))


class JsonFile:
    """A table kept as JSON in one file of the cache folder: read on first use (a damaged or missing file
    reads as empty), written when the process ends if it changed (`changed`); a read-only home keeps
    nothing. `kept` says what of the table is written (by default all of it)."""

    def __init__(self, name: str) -> None:
        self.file = cache_dir() / name
        self.entries: dict | None = None
        self.dirty = False

    def table(self) -> dict:
        if self.entries is None:
            self.entries = self._read()
        return self.entries

    def changed(self) -> None:
        if not self.dirty:
            self.dirty = True
            atexit.register(self.write)

    def _read(self) -> dict:
        try:
            got = json.loads(self.file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return got if isinstance(got, dict) else {}

    def kept(self, entries: dict) -> dict:
        return entries

    def write(self) -> None:
        if not self.dirty or self.entries is None:
            return
        self.dirty = False
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.file, json.dumps(self.kept(self.entries)))
        except OSError:
            pass
