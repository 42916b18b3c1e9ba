"""Read one file under patterns/ as a TOML table, refusing a key its format does not know.

Start-up reads ~280 TOML files (signatures, their meanings, rules, reproducer plans): parsing them
is most of what `analyze` costs on a small run (bench/README.md, "Start-up"). load_toml parses a
file once per version of it (its size and modification time) and keeps the table, as JSON text, in
one cache file under the user's cache folder, written when the process ends if anything was parsed.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from ncclforensics.diskcache import JsonFile
from ncclforensics.errors import PatternError


class _TomlCache(JsonFile):
    """Parsed TOML tables by absolute path: {path: [mtime_ns, size, JSON text]}, in one cache file (one per
    installed copy of the package). Each load_toml call gets tables of its own (json.loads of the text):
    callers may change what they get."""

    def __init__(self) -> None:
        where = hashlib.sha256(Path(__file__).resolve().parent.as_posix().encode()).hexdigest()[:12]
        super().__init__(f"toml-{where}.json")

    def get(self, path: Path) -> dict:
        entries = self.table()
        key = os.path.abspath(path)
        st = os.stat(key)
        hit = entries.get(key)
        if hit is not None and hit[0] == st.st_mtime_ns and hit[1] == st.st_size:
            return json.loads(hit[2])
        with open(key, "rb") as f:
            raw = f.read()
        data = tomllib.loads(raw.decode("utf-8"))
        try:
            text = json.dumps(data)
        except (TypeError, ValueError):  # a TOML date or time: not kept (JSON has none)
            return data
        if len(raw) == st.st_size:  # not changed while it was read
            entries[key] = [st.st_mtime_ns, st.st_size, text]
            self.changed()
        return json.loads(text)

    def kept(self, entries: dict) -> dict:
        """The tables of files that still exist."""
        return {k: v for k, v in entries.items() if os.path.exists(k)}


_CACHE = _TomlCache()


def load_toml(path: Path) -> dict:
    """The TOML table of `path` (raises tomllib.TOMLDecodeError, UnicodeDecodeError, OSError)."""
    return _CACHE.get(path)


def read_table(path: Path, where: str, error: type[PatternError], known: frozenset[str],
               sections: Mapping[str, frozenset[str]] | None = None) -> dict:
    """The TOML table of `path`, its keys checked against `known` and those of each section (a table
    or an array of tables) against `sections[name]`. `where` names the file in the error's one line."""
    try:
        data = load_toml(path)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{where}: {exc}") from None
    check_keys(data, known, where, error)
    for name, keys in (sections or {}).items():
        entries = data.get(name)
        for entry in entries if isinstance(entries, list) else [entries]:
            check_keys(entry, keys, where, error, name)
    return data


def check_keys(table: object, known: frozenset[str], where: str, error: type[PatternError], section: str = "") -> None:
    """Raise `error` naming every key of `table` outside `known`: a typo in a pattern file would
    otherwise pass silently (the key read as absent)."""
    if not isinstance(table, dict):
        return
    unknown = sorted(set(table) - known)
    if unknown:
        names = ", ".join(repr(f"{section}.{k}" if section else k) for k in unknown)
        raise error(f"{where}: unknown key {names} (known: {', '.join(sorted(known))})")
