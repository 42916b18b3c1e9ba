"""Output paths of the CLI: checked before any work (a mistake is a one-line usage error), then written.

A file option (`--html`, `events -o`, `repro -o`) takes a file name, or `-` for stdout; an output
folder (`analyze -o`) takes a folder. Missing parent folders are created.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ncclforensics.errors import UsageError

STDOUT = "-"


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_parents(path: Path, option: str) -> None:
    """The folders above `path` exist or can be made: no file in the way, and room to write."""
    anc = _nearest_existing(path.parent)
    if not anc.is_dir():
        raise UsageError(f"{option} {path}: {anc} is a file, not a folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: cannot write in {anc} (permission denied)")


def file_target(value: str | Path | None, option: str) -> Path | str | None:
    """The file an option names, STDOUT for `-`, or None when the option was not given."""
    if value is None:
        return None
    text = str(value)
    if text == STDOUT:
        return STDOUT
    path = Path(text)
    if path.is_dir() or text.endswith(("/", os.sep)):
        raise UsageError(f"{option} {text}: is a folder; name a file, e.g. {path / 'report.html'}"
                         if option == "--html" else f"{option} {text}: is a folder; name a file")
    _check_parents(path, option)
    return path


def folder_target(value: str | Path | None, option: str) -> Path | None:
    """The folder an option names (made when written), or None when the option was not given."""
    if value is None:
        return None
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: is a file; {option} takes a folder"
                         " (--html FILE writes the report alone)")
    _check_parents(path / "x", option)
    return path


def write_text(target: Path | str, text: str) -> None:
    if target == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_bytes(Path(target), text.encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def make_folder(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot make the folder {path}: {exc.strerror or exc}") from None
