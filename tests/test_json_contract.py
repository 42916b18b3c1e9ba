"""The --json contract (DESIGN.md §4): every key, always present, of its type; schema_version says which.

A change here is a change of the contract other tools parse: bump SCHEMA_VERSION with it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ncclforensics import __version__
from ncclforensics.jsonout import SCHEMA_VERSION
from ncclforensics.model import RootCause

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_logs"
XID = "[Tue Mar  4 02:11:09 2025] NVRM: Xid (PCI:0000:41:00): 79, pid=7711, GPU has fallen off the bus.\n"
NONE = type(None)
ISO_SECOND = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
CLASSES = {c.value for c in RootCause}

# key -> type; (a, b) either; [t] a list of t; {key: t} an object with exactly these keys
EVIDENCE = {"file": str, "line": int, "rank": (int, NONE), "host": (str, NONE), "ts": (str, NONE), "text": str}
CONTRACT = {
    "schema_version": int,
    "tool_version": str,
    "run": {
        "path": str, "files": int, "lines": int, "world_size": (int, NONE), "ranks_seen": [int], "hosts": [str],
        "versions": {str: str}, "skipped": [{"file": str, "reason": str}], "notes": [str],
    },
    "verdict": {
        "class": str, "confidence": float, "rule": (str, NONE), "title": str, "summary": str,
        "culprit_ranks": [int], "culprit_hosts": [str],
        "collective": {"pg": (str, NONE), "op_type": (str, NONE), "seq": (int, NONE)},
        "first_failure": (NONE, {"ts": (str, NONE), "rank": (int, NONE), "file": str, "line": int}),
        "missing": (str, NONE),
    },
    "findings": [{
        "class": str, "rule": (str, NONE), "role": str, "confidence": float, "title": str, "message": str,
        "culprit_ranks": [int], "evidence": [EVIDENCE],
    }],
    "ranks": [{
        "rank": int, "host": (str, NONE), "pg": (str, NONE), "last_enqueued": (int, NONE),
        "last_completed": (int, NONE), "timed_out": (NONE, {"seq": (int, NONE), "op": (str, NONE)}),
        "current_op": (str, NONE), "current_seq": (int, NONE), "state": str,
    }],
    "fixes": [{"title": str, "why": str, "code": str}],
    "reproducer": (NONE, {"command": str, "script": str}),
}


def _check(value, spec, where: str) -> None:
    if isinstance(spec, tuple):
        errors = []
        for alt in spec:
            try:
                _check(value, alt, where)
                return
            except AssertionError as exc:
                errors.append(str(exc))
        raise AssertionError(f"{where}: none of the allowed types ({'; '.join(errors)})")
    if isinstance(spec, list):
        assert isinstance(value, list), f"{where}: want a list, got {value!r}"
        for i, v in enumerate(value):
            _check(v, spec[0], f"{where}[{i}]")
    elif isinstance(spec, dict) and set(spec) == {str}:  # a mapping of free keys
        assert isinstance(value, dict), f"{where}: want an object"
        for k, v in value.items():
            _check(k, str, f"{where} key")
            _check(v, spec[str], f"{where}.{k}")
    elif isinstance(spec, dict):
        assert isinstance(value, dict), f"{where}: want an object, got {value!r}"
        assert set(value) == set(spec), f"{where}: keys {sorted(value)} != {sorted(spec)}"
        for k, t in spec.items():
            _check(value[k], t, f"{where}.{k}")
    elif spec is float:
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}: want a number"
    elif spec is int:
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: want an integer, got {value!r}"
    else:
        assert isinstance(value, spec), f"{where}: want {spec.__name__}, got {value!r}"


def _runs(tmp: Path) -> dict[str, Path]:
    xid = tmp / "xid"
    xid.mkdir()
    (xid / "dmesg-gpu-q17.txt").write_text(XID)
    quiet = tmp / "quiet"
    quiet.mkdir()
    (quiet / "rank0.log").write_text("[rank0]: step 1 loss 2.5\n[rank0]: step 2 loss 2.4\n")
    return {"sample": SAMPLE, "xid": xid, "no failure": quiet}


@pytest.mark.parametrize("name", ["sample", "xid", "no failure"])
def test_every_key_of_the_contract_with_its_type(cli, tmp_path, name):
    r = cli("analyze", str(_runs(tmp_path)[name]), "--json")
    assert r.code == 0, r.err
    doc = r.json()
    _check(doc, CONTRACT, "$")
    assert doc["schema_version"] == SCHEMA_VERSION == 1
    assert doc["tool_version"] == __version__
    v = doc["verdict"]
    assert v["class"] in CLASSES and all(f["class"] in CLASSES for f in doc["findings"])
    assert 0.0 <= v["confidence"] <= 1.0
    assert {f["role"] for f in doc["findings"]} <= {"root", "cascade", "context"}
    assert sum(f["role"] == "root" for f in doc["findings"]) == 1
    assert v["culprit_ranks"] == sorted(v["culprit_ranks"])
    stamps = [e["ts"] for f in doc["findings"] for e in f["evidence"]] + [(v["first_failure"] or {}).get("ts")]
    assert all(ISO_SECOND.fullmatch(t) for t in stamps if t is not None), stamps


def test_what_each_case_says(cli, tmp_path):
    """The three runs above exercise the optional parts: a reproducer, a host culprit, no verdict."""
    runs = _runs(tmp_path)
    sample = cli("analyze", str(runs["sample"]), "--json").json()
    assert sample["verdict"]["class"] == "rank_divergence" and sample["verdict"]["culprit_ranks"] == [0]
    assert sample["verdict"]["collective"] == {"pg": "0", "op_type": "ALLREDUCE", "seq": 9}
    assert sample["reproducer"]["command"].startswith("torchrun --nproc-per-node 4 ")
    xid = cli("analyze", str(runs["xid"]), "--json").json()["verdict"]
    assert (xid["class"], xid["culprit_ranks"], xid["culprit_hosts"]) == ("gpu_hardware", [], ["gpu-q17"])
    assert xid["first_failure"] == {"ts": "2025-03-04T02:11:09Z", "rank": None, "file": "dmesg-gpu-q17.txt", "line": 1}
    quiet = cli("analyze", str(runs["no failure"]), "--json").json()
    v = quiet["verdict"]
    assert (v["class"], v["confidence"], v["rule"], v["culprit_ranks"], v["first_failure"]) == (
        "unknown", 0.0, None, [], None)
    assert v["collective"] == {"pg": None, "op_type": None, "seq": None}
    assert v["missing"], "an unknown verdict says which log would settle it"
    assert (quiet["reproducer"], quiet["fixes"]) == (None, [])
