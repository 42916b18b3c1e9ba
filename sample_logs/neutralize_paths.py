"""Rewrite machine-specific absolute paths in a captured run folder to neutral ones, in place.

Usage: python neutralize_paths.py RUN_DIR OLD=NEW [OLD=NEW ...]

Text files are rewritten as text. Flight Recorder pickles carry paths in their stack frames
and length-prefixed strings, so they are decoded and re-pickled; only run this on dumps you
produced yourself, never on files from elsewhere (unpickling executes code).
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path


def replace_all(text: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        text = text.replace(old, new)
    return text


def rewrite_value(value: object, pairs: list[tuple[str, str]]) -> object:
    if isinstance(value, str):
        return replace_all(value, pairs)
    if isinstance(value, dict):
        return {rewrite_value(k, pairs): rewrite_value(v, pairs) for k, v in value.items()}
    if isinstance(value, list):
        return [rewrite_value(v, pairs) for v in value]
    if isinstance(value, tuple):
        return tuple(rewrite_value(v, pairs) for v in value)
    return value


def rewrite_file(path: Path, pairs: list[tuple[str, str]]) -> None:
    data = path.read_bytes()
    if data.startswith(b"\x80"):  # a pickle protocol header: a Flight Recorder dump
        path.write_bytes(pickle.dumps(rewrite_value(pickle.loads(data), pairs), protocol=data[1]))
    else:
        path.write_text(replace_all(data.decode("utf-8"), pairs), encoding="utf-8")


def main() -> None:
    root = Path(sys.argv[1])
    pairs = [tuple(arg.split("=", 1)) for arg in sys.argv[2:]]
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rewrite_file(path, pairs)


if __name__ == "__main__":
    main()
