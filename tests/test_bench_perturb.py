"""bench/perturb.py: the transformations keep or change what they say, and a labelled corpus is scored."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

PERTURB = Path(__file__).resolve().parent.parent / "bench" / "perturb.py"
LINE = ("[rank1]:[E216 14:31:57.868225299 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600090 "
        "milliseconds before timing out.")


@pytest.fixture(scope="module")
def perturb():
    spec = importlib.util.spec_from_file_location("bench_perturb", PERTURB)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_transformations(perturb):
    t = perturb.TRANSFORMS
    text = LINE + "\nshort line\n"
    assert t["none"][0](text) == text
    wrapped = t["wrap80"][0](text)
    assert all(len(x) <= 80 for x in wrapped.split("\n")) and wrapped.replace("\n", "") == text.replace("\n", "")
    assert t["crlf"][0](text).count("\r\n") == 2
    assert "\n" not in t["onelong"][0](text)
    assert t["prefix"][0](text).startswith("[default3]:[rank1]:")
    assert len(t["cut70"][0](text)) == int(len(text) * 0.7)


XID = ("kernel: NVRM: Xid (PCI:0000:2a:00): 79, pid=52780, name=python3, GPU has fallen off the bus.\n"
       "kernel: NVRM: GPU 0000:2a:00.0: GPU has fallen off the bus.\n")


def test_a_corpus_is_scored(tmp_path):
    for name, label in (("001_gpu-off-the-bus", "gpu_hardware"), ("002_mislabelled", "oom")):
        case = tmp_path / "corpus" / name
        case.mkdir(parents=True)
        (case / "dmesg.txt").write_text(XID)
        (case / "label.json").write_text(json.dumps({"class": label, "culprit_ranks": []}))
    out = subprocess.run([sys.executable, str(PERTURB), str(tmp_path / "corpus"), "none", "wrap80", "-v"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [[c.strip() for c in ln.split("|")[1:4]] for ln in out.stdout.splitlines() if ln.startswith("| none")
            or ln.startswith("| wrap80")]
    assert rows == [["none", "1", "2"], ["wrap80", "1", "2"]]
    assert out.stderr.count("002_mislabelled: want oom, got gpu_hardware") == 2


def test_unknown_transformation_is_refused(tmp_path):
    out = subprocess.run([sys.executable, str(PERTURB), str(tmp_path), "nosuch"], capture_output=True, text=True)
    assert out.returncode == 2 and "unknown transformation" in out.stderr
