"""Hostile Flight Recorder dumps: pickles that would run code, nest without end, or carry text
that is not valid Unicode. A dump is never unpickled with globals, so nothing runs."""

from __future__ import annotations

import json
import os
import pickle
import struct

from .builders import CliRun, ingest, put, reasons, rows_of, run_cli, watchdog


class _OpenForWrite:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


class _System:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def _dump_with(payload: object, protocol: int) -> bytes:
    """A plausible Flight Recorder dump whose entries hold the payload."""
    return pickle.dumps({"version": "2.4", "pg_config": {}, "pg_status": {},
                         "entries": [{"profiling_name": "nccl:all_reduce", "payload": payload}]},
                        protocol=protocol)


def test_pickle_that_would_create_a_file(tmp_path, good_bytes, good_expected):
    """Dumps whose __reduce__ opens a file for writing or runs a shell command, in every binary
    pickle protocol: each is listed as refused, and the file never appears."""
    run = tmp_path / "run"
    targets = []
    for i, (kind, protocol) in enumerate((k, p) for k in ("open", "system") for p in (2, 3, 4, 5)):
        target = tmp_path / f"pwned_{kind}_{protocol}"
        payload = _OpenForWrite(str(target)) if kind == "open" else _System(str(target))
        put(run / "fr_trace", f"nccl_trace_rank_{i}", _dump_with(payload, protocol))
        targets.append(target)
    put(run, "good.log", good_bytes)
    cli = CliRun(run)
    res = ingest(run)
    why = reasons(res)
    assert set(why) == {f"fr_trace/nccl_trace_rank_{i}" for i in range(8)}
    for i in range(8):
        glob = "io.open" if i < 4 else "posix.system"
        assert why[f"fr_trace/nccl_trace_rank_{i}"] == (
            f"pickle refused without running it: refused pickle global {glob}")
    assert rows_of(res, "good.log") == good_expected
    out = cli.finish(0)
    assert {e["file"] for e in out.events} == {"good.log"}
    assert not any(t.exists() for t in targets), "a pickle ran"
    # the dumps alone: nothing to analyse, and the one-line error says why
    (run / "good.log").unlink()
    out = run_cli(run, 3)
    assert "refused" in out.stderr
    assert not any(t.exists() for t in targets), "a pickle ran"


def test_protocol_0_pickle_is_read_as_text_not_run(tmp_path):
    """Protocol 0/1 pickles have no binary magic: they are read as (odd) text, never loaded."""
    target = tmp_path / "pwned_p0"
    run = tmp_path / "run"
    put(run, "nccl_trace_rank_1.pkl", pickle.dumps(_System(str(target)), protocol=0)
        + (watchdog(61) + "\n").encode())
    res = ingest(run)
    assert 61 in res.events["seq"].to_list()
    assert 61 in {e["seq"] for e in run_cli(run, 0).events}
    assert not target.exists()


def _deep_list_pickle(depth: int) -> bytes:
    """A dump whose input_sizes is a list nested `depth` deep (built from opcodes: pickle.dumps
    itself would hit the recursion limit)."""
    marker = "PLACEHOLDER"
    base = pickle.dumps({"version": "2.4", "pg_status": {}, "entries": [
        {"profiling_name": "nccl:all_reduce", "input_sizes": marker, "collective_seq_id": 1}]}, protocol=2)
    op = b"X" + struct.pack("<I", len(marker)) + marker.encode()
    assert op in base
    return base.replace(op, b"]" * depth + b"a" * (depth - 1))


def test_deeply_nested_dumps(tmp_path, good_bytes, good_expected):
    run = tmp_path / "run"
    put(run, "nccl_trace_rank_0", _deep_list_pickle(200_000))
    deep_json = ('{"version": "2.4", "pg_status": {}, "entries": [{"input_sizes": '
                 + "[" * 100_000 + "]" * 100_000 + "}]}")
    put(run, "nccl_trace_rank_1.json", deep_json)
    put(run, "error.json", '{"message": ' + "[" * 100_000 + "]" * 100_000 + "}")
    put(run, "good.log", good_bytes)
    cli = CliRun(run)
    res = ingest(run)
    why = reasons(res)
    # the pickle is refused; the JSON files, not loadable as documents, are read as plain text
    assert why == {"nccl_trace_rank_0": "Flight Recorder dump nested too deeply"}
    assert res.files == 3
    assert rows_of(res, "good.log") == good_expected
    out = cli.finish(0)
    assert {e["file"] for e in out.events} == {"good.log"}


def test_truncated_and_garbage_pickles(tmp_path, good_bytes, good_expected):
    run = tmp_path / "run"
    whole = _dump_with("x" * 1000, 4)
    put(run, "nccl_trace_rank_0", whole[: len(whole) // 2])
    put(run, "nccl_trace_rank_1", b"\x80\x04" + os.urandom(0) + b"\xff" * 500)
    put(run, "nccl_trace_rank_2", pickle.dumps([1, 2, 3], protocol=4))  # valid, not a dump
    put(run, "good.log", good_bytes)
    res = ingest(run)
    why = reasons(res)
    assert why["nccl_trace_rank_0"].startswith("unreadable pickle"), why
    assert why["nccl_trace_rank_1"].startswith("unreadable pickle"), why
    assert why["nccl_trace_rank_2"] == "not a Flight Recorder dump", why
    assert rows_of(res, "good.log") == good_expected
    out = run_cli(run, 0)
    assert {e["file"] for e in out.events} == {"good.log"}


def test_lone_surrogates_in_dumps_and_error_files(tmp_path):
    """A pickle or a JSON `\\ud800` escape yields a str that cannot be written as UTF-8: it must
    reach the JSON output as U+FFFD, not crash it."""
    run = tmp_path / "run"
    entry = {"profiling_name": "nccl:all_reduce\ud800", "collective_seq_id": 7, "state": "sched\udfff",
             "process_group": ["0\ud800", "default_pg"], "input_sizes": [[4]], "output_sizes": [[4]]}
    put(run / "fr", "nccl_trace_rank_0", pickle.dumps({"version": "2.4", "pg_status": {}, "entries": [entry]},
                                                        protocol=4))
    put(run / "fr", "nccl_trace_rank_1.json", json.dumps({"version": "2.4", "pg_status": {}, "entries": [entry]}))
    put(run / "node0" / "attempt_0" / "0", "error.json",
        json.dumps({"message": {"message": "RuntimeError: boom \ud800 <b>", "extraInfo": {"timestamp": "1"}}}))
    res = ingest(run)
    assert res.skipped == []
    texts = res.events["text"].to_list() + res.events["detail"].drop_nulls().to_list()
    assert any("\ufffd" in t for t in texts)
    for t in texts:
        t.encode("utf-8")
    out = run_cli(run, 0)
    assert len(out.events) == len(res.events)
    details = [e["detail"] or "" for e in out.events]
    assert any(d.startswith("RuntimeError: boom \ufffd") and d.endswith("\ufffd <b>") for d in details), details


def test_pickle_global_names_with_terminal_escapes(tmp_path):
    """STACK_GLOBAL takes its module and name from the pickle's own strings: the refusal must not
    replay an ESC sequence or a newline on the user's terminal."""
    module, name = b"\x1b[2J\x1b]0;owned\x07\nos", b"system\n" + b"A" * 5000
    data = (b"\x80\x04\x8c" + bytes([len(module)]) + module + b"\x8d" + len(name).to_bytes(8, "little") + name
            + b"\x93.")
    run = tmp_path / "run"
    put(run, "nccl_trace_rank_0", data)
    res = ingest(run)
    reason = reasons(res)["nccl_trace_rank_0"]
    assert reason.startswith("pickle refused without running it: refused pickle global \\x1b[2J")
    assert reason.isprintable() and len(reason) < 300
    out = run_cli(run, 3)
    assert "\x1b" not in out.stderr and "\x07" not in out.stderr
