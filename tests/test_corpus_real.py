"""The 60 real incidents of ../shared/corpus-real (read in place): the analyzer is right on what people
really paste, its confidence means something, and no class falls below a keyword vote (DESIGN.md §3)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from keyword_vote import case_text, vote

from ncclforensics.analysis import analyze_path

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "corpus-real"
CASES = sorted(p.parent for p in REAL.glob("*/label.json"))
ALIASES = {"nccl_network_runtime": "network_runtime", "crash": "rank_crash", "crash/oom": "oom"}

pytestmark = pytest.mark.skipif(not CASES, reason="../shared/corpus-real not present")


def _class_ok(label: dict, got: str) -> bool:
    want = ALIASES.get(label["class"], label["class"])
    return got == want or (label["class"] == "crash/oom" and got in ("oom", "rank_crash"))


@pytest.fixture(scope="module")
def results() -> list[dict]:
    out = []
    for case in CASES:
        label = json.loads((case / "label.json").read_text())
        v = analyze_path(case).diagnosis.verdict
        out.append({"case": case.name, "label": label, "class": v.root_cause.value, "confidence": v.confidence,
                    "culprits": sorted(v.culprit_ranks), "op": v.collective.op_type, "seq": v.collective.seq,
                    "vote": vote(case_text(case))})
    return out


def test_class(results):
    right = [r for r in results if _class_ok(r["label"], r["class"])]
    misses = [f"{r['case']}: {r['class']}" for r in results if r not in right]
    assert len(right) >= 0.95 * len(results), misses


def test_culprits_of_labelled_cases(results):
    scored = [r for r in results if r["label"].get("culprit_ranks")]
    right = [r for r in scored if r["culprits"] == sorted(r["label"]["culprit_ranks"])]
    misses = [f"{r['case']}: {r['culprits']}" for r in scored if r not in right]
    assert len(right) >= 0.9 * len(scored), misses


def test_collective_of_labelled_cases(results):
    scored = [r for r in results if r["label"].get("seq") is not None and r["label"].get("op_type")
              and r["label"].get("seq_visible_in", ["log"])]
    right = [r for r in scored if r["seq"] == r["label"]["seq"]
             and str(r["op"] or "").upper() == r["label"]["op_type"].upper()]
    misses = [f"{r['case']}: {r['op']}#{r['seq']}" for r in scored if r not in right]
    assert len(right) >= 0.9 * len(scored), misses


def test_confident_verdicts_are_right(results):
    """A verdict at confidence >= 0.8 is right at least 19 times in 20 (DESIGN.md §3)."""
    sure = [r for r in results if r["confidence"] >= 0.8]
    wrong = [f"{r['case']}: {r['class']} at {r['confidence']}" for r in sure if not _class_ok(r["label"], r["class"])]
    assert len(wrong) <= 0.05 * len(sure), wrong


def test_no_class_where_a_keyword_vote_does_better(results):
    """Per labelled class: the analyzer gets at least as many right as the keyword vote."""
    ours, theirs = Counter(), Counter()
    for r in results:
        cls = ALIASES.get(r["label"]["class"], r["label"]["class"])
        ours[cls] += _class_ok(r["label"], r["class"])
        theirs[cls] += _class_ok(r["label"], r["vote"])
    behind = {c: (ours[c], theirs[c]) for c in theirs if ours[c] < theirs[c]}
    assert not behind, f"class: (analyzer, keyword vote) right: {behind}"


def _hard_wrapped(text: str, width: int) -> str:
    """Text as a terminal of `width` columns shows it when pasted: every line cut into pieces of that width."""
    return "\n".join(line[i : i + width] for line in text.split("\n") for i in range(0, max(len(line), 1), width))


@pytest.mark.parametrize("width", [80, 120])
def test_class_when_hard_wrapped(tmp_path, width):
    """The same pastes copied from a terminal that hard-wrapped them (FORMATS.md §1.8): a cut may leave a
    message's literal in its continuation, or start the continuation with a space; the class holds."""
    right, misses = 0, []
    for case in CASES:
        label = json.loads((case / "label.json").read_text())
        dst = tmp_path / case.name
        dst.mkdir()
        for f in case.iterdir():
            if f.is_file() and f.name != "label.json":
                (dst / f.name).write_text(_hard_wrapped(f.read_text(errors="replace"), width))
        got = analyze_path(dst).diagnosis.verdict.root_cause.value
        if _class_ok(label, got):
            right += 1
        else:
            misses.append(f"{case.name}: {got}")
    assert right >= 0.9 * len(CASES), misses
