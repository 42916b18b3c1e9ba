"""The dev corpus: ingest finds what each real run holds, and the scorer passes every case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from ncclforensics.events import build_events

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus"
CASES = sorted(p.parent for p in CORPUS.glob("*/label.json"))
EXE = Path(sys.executable).parent / "ncclforensics"

pytestmark = pytest.mark.skipif(not CASES, reason="../shared/corpus not present")


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name[:3])
def test_every_rank_present_with_its_global_rank(case: Path):
    label = json.loads((case / "label.json").read_text())
    df = build_events(case).events
    ranks = set(df["rank"].drop_nulls().to_list())
    kinds = set(df["kind"].cast(pl.Utf8).to_list())
    if label["class"] == "network_init":
        assert kinds & {"socket_connect_failed", "store_timeout", "rendezvous_error"}
        return
    assert ranks == set(range(label["world_size"])), f"ranks {sorted(ranks)}"
    assert "label.json" not in set(df["file"].to_list()), "label.json is not a log"


def _kind_rows(case_prefix: str, kind: str) -> pl.DataFrame:
    case = next(c for c in CASES if c.name.startswith(case_prefix))
    df = build_events(case).events
    return df.filter(pl.col("kind").cast(pl.Utf8) == kind)


def test_detail_fingerprint_rows():
    rows = _kind_rows("001", "fingerprint_mismatch").to_dicts()
    assert {r["rank"] for r in rows} == {0, 1}
    x = json.loads(rows[0]["extra"])
    assert x["seq_a"] == 4 and rows[0]["op"] == "ALLREDUCE"


def test_gloo_timeout_rows():
    rows = _kind_rows("002", "gloo_timeout")
    assert set(rows["rank"].to_list()) == {0, 1, 2}
    assert set(rows["timeout_ms"].to_list()) == {15000}


def test_dataloader_rows():
    rows = _kind_rows("013", "worker_killed").to_dicts()
    assert rows and rows[0]["rank"] == 1 and rows[0]["code"] == 9


def test_torchrun_summary_rows():
    rows = _kind_rows("019", "child_failed").to_dicts()
    by_rank = {r["rank"]: r for r in rows}
    assert by_rank[3]["code"] == -9
    assert json.loads(by_rank[3]["extra"])["root_cause"] is True
    assert {by_rank[r]["code"] for r in (0, 1, 2)} == {-15}


def test_flight_recorder_rows():
    rows = _kind_rows("002", "fr_entry")
    last = rows.filter(pl.col("seq") == 6).unique(subset=["rank", "op"])
    assert dict(zip(last["rank"].to_list(), last["op"].to_list(), strict=True)) == {
        0: "ALLREDUCE", 1: "ALLREDUCE", 2: "BARRIER"}
    assert rows["ts"].null_count() == 0


def test_score_corpus_script():
    script = ROOT.parent / "shared" / "tools" / "score_corpus.py"
    r = subprocess.run([sys.executable, str(script), str(EXE), str(CORPUS), "--min-class-acc=1.0"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "crashes 0" in r.stdout


def test_save_then_barrier_job_is_not_told_to_save_then_barrier():
    """006: rank 0 saves, then every rank enters a barrier that times out. The job already does
    'save on rank 0, then barrier': the fixes must not lead with it."""
    from ncclforensics.analysis import analyze_path

    case = next((c for c in CASES if c.name.startswith("006_")), None)
    if case is None:
        pytest.skip("corpus case 006 not present")
    v = analyze_path(case).diagnosis.verdict
    assert v.root_cause.value == "checkpoint_save" and v.collective.op_type == "BARRIER"
    titles = [f.title for f in v.fixes]
    assert titles and not any("then barrier" in t for t in titles), titles
    assert any("asynchronous or distributed" in t for t in titles), titles
