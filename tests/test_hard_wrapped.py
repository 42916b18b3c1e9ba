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


@pytest.mark.parametrize("width", [120, 160, 200])
def test_a_wrapped_fingerprint_mismatch_keeps_both_ranks(tmp_path, width):
    whole = _mismatch_rows(tmp_path, MISMATCH)
    assert whole, "the unwrapped line is a collective mismatch"
    cut = _mismatch_rows(tmp_path, _wrapped(MISMATCH, width))
    assert cut
    fields = {k: v for k, v in whole[0].items() if k not in ("text", "line", "file")}
    got = {k: v for k, v in cut[0].items() if k not in ("text", "line", "file")}
    assert json.loads(got.pop("extra") or "{}") == json.loads(fields.pop("extra") or "{}")
    assert got == fields


def test_plain_lines_after_a_complete_line_change_nothing(tmp_path):
    text = MISMATCH + "\nrank six said something else\nand one more plain line"
    assert _mismatch_rows(tmp_path, text)[0]["extra"] == _mismatch_rows(tmp_path, MISMATCH)[0]["extra"]
