"""Read Flight Recorder dumps (pickle or JSON) into event rows, never executing pickle code."""

from __future__ import annotations

import datetime as dt
import io
import json
import pickle
import re
from typing import Any

from ncclforensics.model import op_from_profiling_name
from ncclforensics.parse.blocks import user_frames

MAX_DUMP_BYTES = 256 << 20
FRAMES_OF_LAST = 8  # entries per dump whose stack frames are kept
_RANK_SUFFIX = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle)?$")


class UnsafePickle(Exception):
    """The pickle asked for a global (a class or function): refused, nothing was run."""


class _PlainUnpickler(pickle.Unpickler):
    """Builds only what needs no global: dicts, lists, tuples, str, bytes, numbers, bools, None.

    Every code path that could run code in a pickle (REDUCE, BUILD, INST, OBJ, NEWOBJ) first
    needs a callable from `find_class`, so refusing every global refuses all of them.
    """

    def find_class(self, module: str, name: str) -> Any:
        # the names are the pickle's own strings: any length, any characters (ESC, newlines)
        shown = f"{module[:80]}.{name[:80]}"
        if not shown.isprintable():
            shown = shown.encode("unicode_escape").decode("ascii")
        raise UnsafePickle(f"refused pickle global {shown}")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickle("refused pickle persistent id")


def load_pickle(data: bytes) -> Any:
    return _PlainUnpickler(io.BytesIO(data)).load()


def looks_like_dump(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("entries"), list) and (
        "pg_status" in obj or "pg_config" in obj or "version" in obj)


def parse_dump(data: bytes, *, is_pickle: bool) -> dict:
    """The dump as plain containers. Raises UnsafePickle, ValueError on a bad file."""
    if len(data) > MAX_DUMP_BYTES:
        raise ValueError(f"Flight Recorder dump larger than {MAX_DUMP_BYTES >> 20} MiB")
    if is_pickle:
        try:
            obj = load_pickle(data)
        except UnsafePickle:
            raise
        except Exception as exc:  # truncated or corrupt pickle: any unpickling error
            raise ValueError(f"unreadable pickle ({type(exc).__name__}: {exc})") from None
    else:
        try:
            obj = json.loads(data.decode("utf-8", "replace"))
        except RecursionError:
            raise ValueError("unreadable JSON (nested too deeply)") from None
        except ValueError as exc:
            raise ValueError(f"unreadable JSON ({exc})") from None
    if not looks_like_dump(obj):
        raise ValueError("not a Flight Recorder dump")
    return obj


def rank_from_name(name: str) -> int | None:
    """`<prefix><global_rank>` (FORMATS.md §2.2): the trailing number of the file name."""
    m = _RANK_SUFFIX.search(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _wall_ts(ns: Any) -> dt.datetime | None:
    """A `time_*_ns` field as a naive UTC datetime; 0, null and monotonic clocks (small numbers) give None."""
    t_ns = _int(ns)
    if not t_ns or t_ns <= 10**17:  # wall-clock ns since the epoch (UTC) only
        return None
    try:
        return dt.datetime.fromtimestamp(t_ns / 1e9, dt.UTC).replace(tzinfo=None)
    except (OverflowError, OSError, ValueError):
        return None


def _frames(raw: Any) -> list[dict]:
    """An entry's `frames` (innermost first: name, filename, line) -> the innermost user frames, innermost last."""
    if not isinstance(raw, list):
        return []
    stack = [{"file": str(f.get("filename") or "")[:500], "line": _int(f.get("line")) or 0,
              "fn": str(f.get("name") or "")[:200]} for f in raw[:200] if isinstance(f, dict)]
    return user_frames(list(reversed(stack)))


def _numel(sizes: Any) -> int | None:
    if not isinstance(sizes, list) or not sizes:
        return 0 if isinstance(sizes, list) else None
    total = 0
    for shape in sizes:
        if not isinstance(shape, list):
            return None
        n = 1
        for d in shape:
            n *= _int(d) or 0
        total += n
    return total


def dump_rows(obj: dict, *, file: str, rank: int | None) -> list[dict]:
    """One row per entry (kind fr_entry), one per PG status (fr_status) and config (fr_pg)."""
    rows: list[dict] = []
    pg_config = obj.get("pg_config") or {}
    if isinstance(pg_config, dict):
        for name, cfg in pg_config.items():
            if not isinstance(cfg, dict):
                continue
            ranks = cfg.get("ranks")
            members = [int(x) for x in re.findall(r"\d+", str(ranks))] if ranks is not None else []
            rows.append({
                "file": file, "line": 0, "rank": rank, "source": "flight_recorder", "kind": "fr_pg",
                "pg": str(cfg.get("name") or name or "0"),
                "extra": json.dumps({"desc": str(cfg.get("desc", "")), "members": members[:100_000]}),
                "text": f"pg_config {name!r}: ranks {str(ranks)[:200]}",
            })
    status = obj.get("pg_status") or {}
    if isinstance(status, dict):
        for pg_id, st in status.items():
            if not isinstance(st, dict):
                continue
            enq = _int(st.get("last_enqueued_collective"))
            fields = {"enqueued": enq, "started": _int(st.get("last_started_collective")),
                      "completed": _int(st.get("last_completed_collective"))}
            rows.append({
                "file": file, "line": 0, "rank": rank, "source": "flight_recorder", "kind": "fr_status",
                "pg": str(pg_id), "seq": enq, "extra": json.dumps(fields),
                "text": f"pg_status {pg_id}: {fields}",
            })
    entries = obj.get("entries") or []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            continue
        pg = e.get("process_group")
        pg_name = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(e.get("pg_id", ""))
        pg_desc = str(pg[1]) if isinstance(pg, (list, tuple)) and len(pg) > 1 else ""
        name = str(e.get("profiling_name") or "")
        is_p2p = bool(e.get("is_p2p"))
        seq = _int(e.get("p2p_seq_id") if is_p2p else e.get("collective_seq_id"))
        ts = _wall_ts(e.get("time_created_ns"))
        started = _wall_ts(e.get("time_discovered_started_ns"))
        completed = _wall_ts(e.get("time_discovered_completed_ns"))
        state = str(e.get("state") or "")
        extra = {
            "profiling_name": name, "state": state, "pg_desc": pg_desc, "is_p2p": is_p2p,
            "input_sizes": e.get("input_sizes") if isinstance(e.get("input_sizes"), list) else None,
            "output_sizes": e.get("output_sizes") if isinstance(e.get("output_sizes"), list) else None,
            "record_id": _int(e.get("record_id")), "duration_ms": e.get("duration_ms"),
            # when the watchdog saw it start and complete (NCCL; gloo records neither): the timeline draws them
            "started": started.isoformat() if started else None,
            "completed": completed.isoformat() if completed else None,
            # the entries near the end only: the hang is there, and a dump of 2,000 entries x 1,000 ranks
            # would otherwise carry the same call site a million times
            "user_frames": _frames(e.get("frames")) if i >= len(entries) - FRAMES_OF_LAST else [],
        }
        rows.append({
            "file": file, "line": i + 1, "ts": ts, "rank": rank, "source": "flight_recorder",
            "kind": "fr_entry", "pg": pg_name, "seq": seq, "op": op_from_profiling_name(name),
            "numel_in": _numel(e.get("input_sizes")), "numel_out": _numel(e.get("output_sizes")),
            "timeout_ms": _int(e.get("timeout_ms")), "detail": state,
            "extra": json.dumps(extra, default=str)[:4000],
            "text": f"#{seq} {name} in={str(e.get('input_sizes'))[:80]} state={state}",
        })
    return rows
