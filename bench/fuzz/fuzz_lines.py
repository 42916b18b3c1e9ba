"""Fuzz the line path: bytes -> sniff/decode -> LineScanner.scan_chunk/scan_tail on a FileContext.

Not part of CI. Run from the repository root:

    pip install atheris                      # into the project's environment (or a venv that sees it)
    python bench/fuzz/fuzz_lines.py -max_total_time=180 /tmp/fuzz_lines/corpus

libFuzzer stops at the first crash and saves the input as ./crash-<sha1> (replay it by passing
its path instead of the corpus folder). To count crashes over a whole run instead, set
FUZZ_KEEP_GOING=1: each failing input is then recorded and the run goes on; the tally by crash
site (exception type + innermost ncclforensics frame) is kept in $FUZZ_CRASH_DIR/summary.json
(default /tmp/fuzz_lines/crashes), with the first input of each site saved next to it.
(libFuzzer's own -fork/-ignore_crashes mode does not work with atheris here.)
Set FUZZ_IGNORE="text|other text" to step over known crashes whose message holds that text.

The seed corpus is written to the corpus folder on the first run: every signature's sample
lines, with envelopes, CRs, NULs and invalid UTF-8 mixed in. Any exception escaping the scan is
a crash, except `BinaryContent` from the sniff (the ingest layer turns that into a skipped
file). Content the sniff refuses is scanned anyway: the scanner must survive anything.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import time
import traceback
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

with atheris.instrument_imports(include=["ncclforensics"]):
    from ncclforensics.ingest import decode
    from ncclforensics.parse.lines import FileContext, LineScanner
    from ncclforensics.parse.signatures import load_signatures

SCANNER = LineScanner(load_signatures())
NAMES = ("node-a/rank3.log", "attempt_0/1/stderr.log", "dmesg-gpu-q17.log", "console.log")


# Known crashes to step over while hunting for others: FUZZ_IGNORE="invalid utf8|other text"
IGNORE = [s for s in os.environ.get("FUZZ_IGNORE", "").split("|") if s]
KEEP_GOING = os.environ.get("FUZZ_KEEP_GOING") == "1"
CRASH_DIR = Path(os.environ.get("FUZZ_CRASH_DIR", "/tmp/fuzz_lines/crashes"))
TALLY: dict[str, int] = {}
STATS = {"inputs": 0, "crashing_inputs": 0, "ignored": 0, "started": time.time()}
_last_write = 0.0


def one_input(data: bytes) -> None:
    STATS["inputs"] += 1
    try:
        _scan(data)
    except Exception as exc:
        if IGNORE and any(s in f"{type(exc).__name__}: {exc}" for s in IGNORE):
            STATS["ignored"] += 1
            return
        if not KEEP_GOING:
            raise
        _record(exc, data)
    if KEEP_GOING and time.time() - _last_write > 5:
        _write_summary()


def _record(exc: Exception, data: bytes) -> None:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "ncclforensics" in f.filename]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    site = f"{type(exc).__name__} at {where}: {str(exc)[:120]}"
    STATS["crashing_inputs"] += 1
    if site not in TALLY:
        CRASH_DIR.mkdir(parents=True, exist_ok=True)
        (CRASH_DIR / f"crash-{hashlib.sha1(site.encode()).hexdigest()[:12]}").write_bytes(data)
        TALLY[site] = 1
        _write_summary()
    else:
        TALLY[site] += 1


def _write_summary() -> None:
    global _last_write
    _last_write = time.time()
    CRASH_DIR.mkdir(parents=True, exist_ok=True)
    summary = dict(STATS, seconds=round(time.time() - STATS["started"]), sites=TALLY)
    (CRASH_DIR / "summary.json").write_text(json.dumps(summary, indent=1))


def _scan(data: bytes) -> None:
    name = NAMES[data[0] % len(NAMES)] if data else NAMES[0]
    ctx = FileContext(name=name)
    stream = io.BytesIO(data[1:])
    head = stream.read(decode.HEAD_SIZE)
    try:
        kind = decode.sniff(head)
    except decode.BinaryContent:
        kind = "text"
    if kind == "utf-16":
        chunks = decode.utf16_chunks(stream, head)
    elif decode.cr_only(head):
        chunks = decode.iter_chunks(decode.CrToLf(stream), head.replace(b"\r", b"\n"))
    else:
        chunks = decode.iter_chunks(stream, head)
    line = 1
    last = b""
    for chunk in chunks:
        line += SCANNER.scan_chunk(chunk, line, ctx)
        last = chunk
    if last:
        SCANNER.scan_tail(last, max(1, line - last.count(b"\n")), ctx)
    for row in ctx.rows + [p for ps in ctx.progress.values() for p in ps]:
        assert isinstance(row["line"], int) and row["line"] >= 1, row
        assert isinstance(row.get("text", ""), str)


def _seed(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.iterdir()):
        return
    lines = [s["line"] for sig in load_signatures().signatures for s in sig.samples]
    for i, line in enumerate(lines):
        raw = line.encode()
        variants = (raw + b"\n", b"[rank1]:" + raw + b"\r\n", b"\xe9\x00" + raw[:40] + b"\r" + raw[40:],
                    b"x" * 300 + raw[: len(raw) // 2] + b"\n" + raw[len(raw) // 2 :])
        for j, v in enumerate(variants):
            (folder / f"seed-{i:03d}-{j}").write_bytes(bytes([i % 251]) + v)


def main() -> None:
    dirs = [a for a in sys.argv[1:] if not a.startswith("-")]
    if dirs and not os.path.isfile(dirs[0]):
        _seed(Path(dirs[0]))
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
