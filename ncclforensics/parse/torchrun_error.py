"""torchelastic's error.json (FORMATS.md §8.3) -> rows: its error_file row, the events its message names."""

from __future__ import annotations

import datetime as dt
import json

from ncclforensics.ingest.decode import writable_row
from ncclforensics.ingest.envelope import peel
from ncclforensics.model import TEXT_LIMIT
from ncclforensics.parse import blocks
from ncclforensics.parse.lines import MAX_LINE, FileContext, emit_row
from ncclforensics.parse.signatures import load_signatures

MAX_MESSAGE_LINES = 50  # lines of the message read as log lines


def is_error_file(obj: object) -> bool:
    """Whether a JSON document is an error.json: an object with a `message`."""
    return isinstance(obj, dict) and "message" in obj


def error_file_rows(obj: dict, ctx: FileContext) -> None:
    """Add the error.json's rows to `ctx.rows`: one error_file row (its message, time and stack), then
    the events the message's lines yield, dated by the file where they carry no time of their own."""
    msg = obj["message"]
    if isinstance(msg, dict):
        extra_info = msg.get("extraInfo") or {}
        text = str(msg.get("message", ""))
    else:
        text = str(msg)
        extra_info = {"timestamp": obj.get("timestamp")}
    ts = None
    try:
        ts = dt.datetime.fromtimestamp(int(str(extra_info.get("timestamp"))), dt.UTC).replace(tzinfo=None)
    except (TypeError, ValueError, OverflowError, OSError):
        pass
    extra: dict = {"error_file": True}
    op = None
    stack = str(extra_info.get("py_callstack") or "")
    if stack:
        lines = stack.splitlines()
        blk, _ = blocks.parse_traceback(lambda k: lines[k] if k < len(lines) else None, 0)
        if blk is not None:
            for key in ("frames", "stack", "exc_type", "user_frames"):
                extra[key] = blk.extra.get(key)
            op = blk.fields.get("op")
    ctx.rows.append(writable_row({
        "file": ctx.name, "line": 1, "ts": ts, "rank": ctx.rank, "local_rank": ctx.local_rank,
        "host": ctx.host, "node": ctx.node, "source": "torchrun", "kind": "error_file", "op": op,
        "detail": text[:TEXT_LIMIT], "extra": json.dumps(extra, default=str), "text": text[:TEXT_LIMIT],
    }))
    # the message is a log line too: the line signatures say what it means (a gloo timeout, a CUDA
    # OOM …), and the error_file row, a carrier, yields to them (patterns/signatures/torchrun/error_file.toml)
    for body in text.splitlines()[:MAX_MESSAGE_LINES]:
        env = peel(body[:MAX_LINE])
        for sig, fields in load_signatures().match_all(env.body):
            before = len(ctx.rows)
            emit_row(ctx, sig.source, sig.event, fields, env, 1, body)
            for row in ctx.rows[before:]:
                if row.get("ts") is None:
                    row["ts"] = ts
                writable_row(row)
