"""A paste hard-wrapped at the terminal's width (FORMATS.md §1.8): a line that matched on its own but
lost fields to the wrap takes them back from its continuation lines; plain lines that follow a
complete line change nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ncclforensics.events import build_events

MISMATCH = ("RuntimeError: Detected mismatch between collectives on ranks. Rank 3 is running collective: "
            "CollectiveFingerPrint(SequenceNumber=812, OpType=ALLREDUCE, TensorShape=[1], TensorDtypes=Float, "
            "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda)), but Rank 6 is running "
            "collective: CollectiveFingerPrint(SequenceNumber=812, OpType=BROADCAST, TensorShape=[4], "
            "TensorDtypes=Long, TensorDeviceTypes=TensorOptions(dtype=long int, device=cuda)).")


def _wrapped(text: str, width: int) -> str:
    return "\n".join(text[i : i + width] for i in range(0, len(text), width))


def _mismatch_rows(tmp_path: Path, text: str) -> list[dict]:
    path = tmp_path / "paste.txt"
    path.write_text("Traceback (most recent call last):\n  File \"/srv/eval.py\", line 9, in <module>\n" + text + "\n")
    df = build_events(path).events
    return df.filter(df["kind"] == "fingerprint_mismatch").to_dicts()


# torch 2.x's whole form (FORMATS.md §7.1): each side's TensorOptions, then the aspects; ~800 characters
MISMATCH_FULL = (
    "[default3]:RuntimeError: Detected mismatch between collectives on ranks. Rank 3 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=105417, OpType=ALLREDUCE, TensorShape=[1], TensorDtypes=BFloat16, "
    "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda, layout=Strided (default), "
    "requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt))), but Rank 6 is "
    "running collective: CollectiveFingerPrint(SequenceNumber=105417, OpType=ALLREDUCE, TensorShape=[1], "
    "TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda, layout=Strided "
    "(default), requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt)))."
    "Collectives differ in the following aspects: \tTensor Tensor dtypes: BFloat16vs Float")


@pytest.mark.parametrize("text", [MISMATCH, MISMATCH_FULL], ids=["short", "full"])
@pytest.mark.parametrize("width", [80, 100, 120, 160, 200])
def test_a_wrapped_fingerprint_mismatch_keeps_both_ranks(tmp_path, width, text):
    """Both sides' fields, the dtypes and the aspects included, however many lines the wrap made."""
    whole = _mismatch_rows(tmp_path, text)
    assert whole, "the unwrapped line is a collective mismatch"
    assert {"dtypes_a", "dtypes_b"} <= set(json.loads(whole[0]["extra"]))
    cut = _mismatch_rows(tmp_path, _wrapped(text, width))
    assert cut
    fields = {k: v for k, v in whole[0].items() if k not in ("text", "line", "file")}
    got = {k: v for k, v in cut[0].items() if k not in ("text", "line", "file")}
    assert json.loads(got.pop("extra") or "{}") == json.loads(fields.pop("extra") or "{}")
    assert got == fields


def test_plain_lines_after_a_complete_line_change_nothing(tmp_path):
    text = MISMATCH + "\nrank six said something else\nand one more plain line"
    assert _mismatch_rows(tmp_path, text)[0]["extra"] == _mismatch_rows(tmp_path, MISMATCH)[0]["extra"]


def test_a_signature_whose_words_the_wrap_cut(tmp_path):
    # an NCCL WARN (FORMATS.md §10) wrapped at 96 columns: `with error 12` went to the next line
    line = ("node-q04:21887:22012 [6] transport/net_ib.cc:1150 NCCL WARN NET/IB : Got completion from peer "
            "10.31.4.18<51120> with error 12, opcode 0, len 0, vendor err 129")
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / "paste.txt").write_text(line + "\n")
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "paste.txt").write_text(_wrapped(line, 96) + "\n")
    kinds = {r["kind"] for r in build_events(whole).events.to_dicts()}
    got = {r["kind"] for r in build_events(cut).events.to_dicts()}
    assert kinds - {"nccl_warn"} and kinds <= got


def test_a_child_failed_header_without_its_summary_takes_no_lines(tmp_path: Path):
    """torchrun's ChildFailedError summary follows its header between `=` borders (FORMATS.md §8.2). A
    header with no summary after it (a paste cut there, a collector's export in newest-first order)
    is one line: the lines after it are scanned as theirs, not swallowed into a block."""
    lines = [
        "2024-05-02 17:40:12.902\ttorch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "2024-05-02 17:40:12.880\t    raise ChildFailedError(",
        "2024-05-02 17:40:12.640\tERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) "
        "local_rank: 1 (pid: 4411) of binary: /usr/bin/python3",
        "2024-05-02 17:40:11.320\tgpu-w3:4411:4411 [1] misc/shmutils.cc:72 NCCL WARN Error: failed to extend "
        "/dev/shm/nccl-Qa81 to 9437188 bytes",
    ]
    run = tmp_path / "run"
    run.mkdir()
    (run / "export.txt").write_text("\n".join(lines) + "\n")
    kinds = set(build_events(run).events["kind"].cast(str).to_list())
    assert {"worker_failed", "nccl_shm_error"} <= kinds


# a C++ exception reaching stderr (FORMATS.md §1.3): the message, then `Exception raised from …` and the
# backtrace, one `frame #<n>: <symbol> + 0x<offset> (0x<address> in <library>)` line per frame
CXX_TAIL = (
    "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:635 "
    "(most recent call first):\n"
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f00ce35a3c8 in /opt/venv/lib/"
    "python3.11/site-packages/torch/lib/libc10.so)\n"
    "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
    "std::ratio<1l, 1000l> > >) + 0x2b0 (0x7f00cf468b6e in /opt/venv/lib/python3.11/site-packages/torch/lib/"
    "libtorch_cuda.so)\n"
    "frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x88e (0x7f00cf473d4e in /opt/venv/lib/python3.11/"
    "site-packages/torch/lib/libtorch_cuda.so)\n"
)
WHAT = ("  what():  [PG ID 0 PG GUID 0(default_pg) Rank 5] Process group watchdog thread terminated with exception: "
        "[Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2547, OpType=ALLREDUCE, "
        "NumelIn=6553600, NumelOut=6553600, Timeout(ms)=600000) ran for 600090 milliseconds before timing out.\n")


def _rows(tmp_path: Path, text: str) -> list[dict]:
    path = tmp_path / "stderr.log"
    path.write_text(text)
    return [{k: v for k, v in r.items() if k != "file"} for r in build_events(path).events.to_dicts()]


def test_cxx_backtrace_frames_neither_start_nor_continue_a_wrapped_line(tmp_path):
    """A backtrace's frame lines are lines of their own: the `what():` message ends where they start, and a
    frame is never joined to the frame after it. The rows are those of the message without its backtrace."""
    from ncclforensics.parse.lines import _FRAME, LineScanner, _continuation, _Lines
    from ncclforensics.parse.signatures import load_signatures

    text = "terminate called after throwing an instance of 'c10::DistBackendError'\n" + WHAT + CXX_TAIL
    data = text.encode()
    lines = _Lines(data, 0, len(data))
    frames = [i for i, ln in enumerate(lines) if ln.startswith("frame #")]
    assert len(frames) == 3 and all(_FRAME.match(lines[i]) for i in frames)
    assert all(_continuation(lines, i) is None for i in frames)
    body = lines[frames[0]]
    assert LineScanner(load_signatures())._rejoin(lines, frames[0], body) == ([], body)
    with_frames = _rows(tmp_path, text)
    without = _rows(tmp_path, text.split("frame #0")[0])
    assert {r["kind"] for r in with_frames} >= {"watchdog_timeout"}
    assert with_frames == without


def test_extra_json_of_scalars_is_json_dumps():
    """The `extra` column's text for a dict of scalars (the C encoder made once) is json.dumps(extra,
    default=str) to the character: non-ASCII, quotes, NaN and infinities, big ints, bools, None."""
    from ncclforensics.parse.lines import _extra_json

    cases = [{"attempt": 0}, {"cuda_dev": 3, "attempt": 0, "agent": True},
             {"what": 'näh "quoted"\n\ttab', "ratio": 1.5, "none": None, "big": 10**30, "neg": -0.0,
              "nan": float("nan"), "inf": float("inf"), "minf": float("-inf"), "no": False},
             {"ranks": [1, 2, 3], "nested": {"a": 1}}]
    for extra in cases:
        assert _extra_json(extra) == json.dumps(extra, default=str)
        assert _extra_json(dict(extra)) == json.dumps(extra, default=str)  # remembered: the same text


def test_a_wrapped_line_whose_literal_went_to_the_continuation(tmp_path):
    """`… Watchdog caught collective operation timeo` / `ut: WorkNCCL(SeqNum=…`: the literal is cut, only
    the continuation is selected and matches nothing alone; joined with the line before it, the timeout is
    the first line's, with its rank from the first line's envelope."""
    whole = ("[E ProcessGroupNCCL.cpp:828] [Rank 2] Watchdog caught collective operation timeout: "
             "WorkNCCL(SeqNum=18364, OpType=ALLGATHER, Timeout(ms)=4800000) ran for 4804648 milliseconds before "
             "timing out.")
    path = tmp_path / "console.log"
    path.write_text("INFO:accelerate.accelerator:Saving FSDP model\n" + _wrapped(whole, 80) + "\n")
    rows = build_events(path).events.filter(pl_kind("watchdog_timeout")).to_dicts()
    assert len(rows) == 1
    assert (rows[0]["line"], rows[0]["rank"], rows[0]["seq"], rows[0]["op"]) == (2, 2, 18364, "ALLGATHER")


def test_a_continuation_cut_just_before_a_space(tmp_path):
    """A wrap that cut a line just before a space leaves its continuation starting with one space: that is
    no indentation (two spaces or a tab are: a traceback's frame, a block's field)."""
    from ncclforensics.parse.blocks import indented as _indented

    assert not _indented(" AF_INET(2) nor AF_INET6(10)")
    assert _indented("  File \"/srv/train.py\", line 3, in <module>") and _indented("\tat x") and _indented("   ")
    line = ("[trainer0|0]:ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor "
            "AF_INET6(10)")
    whole = _rows(tmp_path, line + "\n")
    cut = _rows(tmp_path, line[:80] + "\n" + line[80:] + "\n")
    assert whole and line[80] == " "
    assert [(r["kind"], r["line"]) for r in cut] == [(r["kind"], r["line"]) for r in whole]


def test_a_plain_line_after_a_long_one_is_no_wrap_of_it(tmp_path):
    """A short line without envelope after a long complete line (a script's own print) is not joined to it
    backwards: it matches nothing with it, and the long line's rows are its own."""
    text = MISMATCH + "\nsaving to /tmp/out\n"
    rows = _rows(tmp_path, text)
    assert [r["line"] for r in rows if r["kind"] == "fingerprint_mismatch"] == [1]
    assert all(r["line"] == 1 for r in rows)


def pl_kind(kind: str):
    import polars as pl

    return pl.col("kind") == kind


def test_a_field_the_wrap_cut_is_taken_whole(tmp_path):
    """An Xid 45 line cut inside its detail (`… Ch 00000001 c` / `aused by previous Xid 149`): the joined
    line gives the whole detail and the Xid it was caused by; the cut detail is a prefix of it, not a
    conflicting value."""
    line = ("kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous "
            "Xid 149")
    whole = [r for r in _rows(tmp_path, line + "\n") if r["kind"] == "xid"]
    cut = [r for r in _rows(tmp_path, _wrapped(line, 80) + "\n") if r["kind"] == "xid"]
    assert len(whole) == len(cut) == 1
    assert json.loads(cut[0]["extra"])["cause_xid"] == 149
    assert json.loads(cut[0]["extra"]) == json.loads(whole[0]["extra"])


# a traceback as a terminal 80 or 120 columns wide shows it: frame paths, code and function names cut
SAVE_TRACEBACK = "\n".join([
    "Traceback (most recent call last):",
    '  File "/home/u/proj/src/train.py", line 339, in run_training',
    "    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)",
    '  File "/home/u/miniconda3/envs/e/lib/python3.10/site-packages/transformers/trainer.py", line 1914, in '
    "_inner_training_loop",
    "    self._maybe_log_save_evaluate(tr_loss, model, trial, epoch, ignore_keys_for_eval)",
    '  File "/home/u/miniconda3/envs/e/lib/python3.10/site-packages/transformers/trainer.py", line 2383, in '
    "_save_checkpoint",
    "    os.rename(staging_output_dir, output_dir)",
    "FileNotFoundError: [Errno 2] No such file or directory: '/home/u/tmp-checkpoint-100' -> '/home/u/checkpoint-100'",
    "",
])


@pytest.mark.parametrize("width", [80, 100, 120])
def test_a_hard_wrapped_traceback_keeps_its_frames(tmp_path, width):
    """Frame lines cut in the path or in the function name, and a code line cut before its end, are joined
    again (FORMATS.md §1.8): the exception and its stack are those of the unwrapped traceback."""
    def exception(text: str) -> dict:
        rows = [r for r in _rows(tmp_path, text) if r["kind"] == "exception"]
        assert len(rows) == 1
        extra = json.loads(rows[0]["extra"])
        return {"detail": rows[0]["detail"], "stack": extra["stack"], "frames": extra["frames"]}

    wrapped = "\n".join(_wrapped(line, width) for line in SAVE_TRACEBACK.split("\n"))
    assert wrapped != SAVE_TRACEBACK
    whole, cut = exception(SAVE_TRACEBACK), exception(wrapped)
    assert whole["stack"][-1] == "trainer.py:_save_checkpoint"
    assert cut["stack"] == whole["stack"]
    assert [(f["file"], f["line"], f["fn"]) for f in cut["frames"]] == [(f["file"], f["line"], f["fn"])
                                                                        for f in whole["frames"]]
    assert cut["detail"].startswith("FileNotFoundError: [Errno 2] No such file or directory")


def test_an_indented_line_after_a_long_code_line_is_no_wrap(tmp_path):
    """A long code line followed by the next frame (indented) or the exception line reads as before: only an
    unindented line that is no exception line is taken for the code line's rest."""
    long_code = "    " + "x = compute(" + ", ".join(f"argument_{k}" for k in range(12)) + ")"
    text = ("Traceback (most recent call last):\n  File \"/srv/a.py\", line 3, in <module>\n" + long_code + "\n"
            "  File \"/srv/b.py\", line 9, in compute\n    raise ValueError('bad')\nValueError: bad\n")
    rows = [r for r in _rows(tmp_path, text) if r["kind"] == "exception"]
    assert len(rows) == 1 and json.loads(rows[0]["extra"])["stack"] == ["a.py:<module>", "b.py:compute"]
