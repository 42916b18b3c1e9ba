"""Read one file under patterns/ as a TOML table, refusing a key its format does not know."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

from ncclforensics.errors import PatternError


def read_table(path: Path, where: str, error: type[PatternError], known: frozenset[str],
               sections: Mapping[str, frozenset[str]] | None = None) -> dict:
    """The TOML table of `path`, its keys checked against `known` and those of each section (a table
    or an array of tables) against `sections[name]`. `where` names the file in the error's one line."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
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
