"""`ncclforensics scan`: run discovery, summary, cache, crash safety, error rows, Ray parity."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest

from ncclforensics.errors import NoInputError, UsageError
from ncclforensics.scan import find_runs, list_runs, scan

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus"
CASES = sorted(p.parent for p in CORPUS.glob("*/label.json"))

pytestmark = pytest.mark.skipif(not CASES, reason="../shared/corpus not present")


def _label(case: Path) -> dict:
    return json.loads((case / "label.json").read_text())


def _copy_case(case: Path, dest: Path) -> None:
    shutil.copytree(case, dest, ignore=shutil.ignore_patterns("label.json"))


def _files(case: Path):
    for p in sorted(case.rglob("*")):
        if p.is_file() and p.name != "label.json":
            yield p, p.relative_to(case).as_posix()


def build_root(root: Path) -> dict[str, str]:
    """Every corpus case as a folder, a .tar.gz and a .zip, plus one lone console.log.gz and a
    corrupt archive; returns {path relative to root: expected class or "error"}."""
    expect: dict[str, str] = {}
    for case in CASES:
        cls = _label(case)["class"]
        _copy_case(case, root / "folders" / case.name)
        expect[f"folders/{case.name}"] = cls
        (root / "tars").mkdir(exist_ok=True)
        with tarfile.open(root / "tars" / f"{case.name}.tar.gz", "w:gz") as tf:
            for p, rel in _files(case):
                tf.add(p, arcname=f"{case.name}/{rel}")
        expect[f"tars/{case.name}.tar.gz"] = cls
        (root / "zips").mkdir(exist_ok=True)
        with zipfile.ZipFile(root / "zips" / f"{case.name}.zip", "w", zipfile.ZIP_DEFLATED) as zf:
            for p, rel in _files(case):
                zf.write(p, arcname=rel)
        expect[f"zips/{case.name}.zip"] = cls
    lone = next(c for c in CASES if c.name.startswith("013"))
    (root / "console-013.log.gz").write_bytes(gzip.compress((lone / "console.log").read_bytes()))
    expect["console-013.log.gz"] = _label(lone)["class"]
    (root / "tars" / "corrupt.tar.gz").write_bytes(b"\x1f\x8b\x08\x00 this is not a gzip stream" * 10)
    expect["tars/corrupt.tar.gz"] = "error"
    return expect


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    root = tmp_path_factory.mktemp("archive")
    expect = build_root(root)
    out = tmp_path_factory.mktemp("out")
    res = scan(root, out, jobs=2, progress=False, reports=False)  # reports: test_report_per_run_and_escaping
    return root, out, expect, res


def test_summary_has_one_correct_row_per_run(scanned):
    _, out, expect, res = scanned
    assert len(expect) >= 30
    df = pl.read_parquet(out / "summary.parquet")
    assert res.runs == len(expect) == df.height
    assert sorted(df["path"].to_list()) == sorted(expect)
    got = {r["path"]: (r["root_cause"] if r["status"] == "ok" else "error") for r in df.iter_rows(named=True)}
    assert got == expect
    csv = pl.read_csv(out / "summary.csv")
    assert csv.height == df.height and csv.columns == df.columns
    bad = df.filter(pl.col("path") == "tars/corrupt.tar.gz").row(0, named=True)
    assert bad["status"] == "error" and bad["error"] and bad["root_cause"] is None
    for r in df.iter_rows(named=True):  # every analyzed run has its diagnosis (and report when rendered)
        d = out / "runs" / r["id"]
        assert (d / "result.json").is_file()
        if r["status"] == "ok":
            assert json.loads((d / "diagnosis.json").read_text())["verdict"]["class"] == r["root_cause"]
            assert (d / "report.html").is_file() == r["report"]
    assert not list(out.rglob("*.tmp"))


def test_nested_hosts_and_torchrun_trees_are_one_run(scanned):
    root, _, _, _ = scanned
    kinds = {s.rel: s.kind for s in find_runs(root)}
    assert kinds["folders/011_netinit-static-node1-wrong-master-port"] == "folder"  # node0/ node1/
    assert kinds["folders/006_ckpt-rank0-save-then-barrier-tee"] == "folder"  # torchrun_logs/, fr_trace/
    assert kinds["console-013.log.gz"] == "file"
    assert not any("/node" in rel or "fr_trace" in rel or "attempt_" in rel for rel in kinds)


def test_index_is_self_contained_and_links_every_run(scanned):
    _, out, expect, _ = scanned
    html = (out / "index.html").read_text()
    assert "<script src" not in html and "http://" not in html and "https://" not in html
    hrefs: list[str] = []

    class Links(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if tag == "a":
                hrefs.append(dict(attrs)["href"])

    Links().feed(html)
    assert len({h.split("/")[1] for h in hrefs}) == len(expect)
    assert all((out / h).is_file() for h in hrefs)
    for cls in set(expect.values()) - {"error"}:
        assert cls in html


def test_unchanged_rescan_is_served_from_cache(scanned):
    root, out, expect, _ = scanned
    before = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/result.json")}
    res = scan(root, out, jobs=2, progress=False, reports=False)
    assert (res.analyzed, res.cached, res.runs) == (0, len(expect), len(expect))
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/result.json")} == before
    assert pl.read_parquet(out / "summary.parquet").height == len(expect)


def test_changed_run_is_analyzed_again(tmp_path):
    case = next(c for c in CASES if c.name.startswith("017"))
    _copy_case(case, tmp_path / "root" / "a")
    _copy_case(case, tmp_path / "root" / "b")
    out = tmp_path / "out"
    assert scan(tmp_path / "root", out, jobs=1, progress=False, reports=False).analyzed == 2
    with open(tmp_path / "root" / "b" / "console.log", "a") as fh:
        fh.write("one more line\n")
    res = scan(tmp_path / "root", out, jobs=1, progress=False, reports=False)
    assert (res.analyzed, res.cached) == (1, 1)


def test_kill_and_resume_loses_and_duplicates_nothing(tmp_path):
    root = tmp_path / "root"
    small = [c for c in CASES if (c / "console.log").is_file()]
    n = 0
    while n < 40:  # enough runs that the kill lands mid-scan
        for case in small:
            _copy_case(case, root / f"r{n:02d}")
            n += 1
    out = tmp_path / "out"
    code = textwrap.dedent(f"""
        from ncclforensics.scan import scan
        scan({str(root)!r}, {str(out)!r}, jobs=1, progress=False, reports=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while len(list(out.glob("runs/*/result.json"))) < 3:
        assert proc.poll() is None, "the scan ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)  # the worker dies with its parent (PR_SET_PDEATHSIG): nothing more is written
    done = len(list(out.glob("runs/*/result.json")))
    time.sleep(0.5)
    assert len(list(out.glob("runs/*/result.json"))) == done
    assert 0 < done < n
    res = scan(root, out, jobs=2, progress=False, reports=False)
    assert (res.cached, res.analyzed) == (done, n - done)
    df = pl.read_parquet(out / "summary.parquet")
    assert df.height == n and df["path"].n_unique() == n and df["id"].n_unique() == n
    assert set(df["status"].to_list()) == {"ok"}
    assert not list(out.rglob("*.tmp"))


def test_timeout_kills_the_worker_and_becomes_a_row(tmp_path):
    for case in CASES[:2]:
        _copy_case(case, tmp_path / "root" / case.name)
    res = scan(tmp_path / "root", tmp_path / "out", jobs=2, timeout=0.001, progress=False, reports=False)
    df = pl.read_parquet(tmp_path / "out" / "summary.parquet")
    assert res.errors == 2 and df["status"].to_list() == ["timeout", "timeout"]
    assert all("longer than" in e for e in df["error"].to_list())
    # a longer limit retries the runs that timed out
    res = scan(tmp_path / "root", tmp_path / "out", jobs=2, timeout=120, progress=False, reports=False)
    assert (res.analyzed, res.errors) == (2, 0)


def test_discovery_rule(tmp_path):
    r = tmp_path
    line = "2026-11-22 07:44:19,330 INFO [rank0] train: step 1 loss 0.09\n"  # no identity: names decide
    for rel in ["job1/console.log", "job1/torchrun_logs/none_ab12cd34/attempt_0/0/stdout.log",
                "job1/fr_trace/fr_trace_rank_0", "job1/train.py", "job2/node0/console.log", "job2/gpu-e002/x.log",
                "job3/slurm-7.out", "job3/tlogs/none_ab12cd34/attempt_1/3/stderr.log",
                "batch/notes.log", "batch/jobA/a.log", "batch/jobB/logs/rank0.log", ".git/logs/HEAD",
                "meta.json", "README.md", "x<img src=q onerror=alert(1)>/console.log"]:
        (r / rel).parent.mkdir(parents=True, exist_ok=True)
        (r / rel).write_text(line)
    (r / "lone.log.gz").write_bytes(gzip.compress(line.encode()))
    (r / "job1" / "dump.tar.gz").write_bytes(b"")
    (r / "run9.tar.gz").write_bytes(b"")
    # not runs: notes beside the runs, an empty file, a folder whose only log is empty
    (r / "NOTES.txt").write_text("Failed on Nov 22 after the driver update; ask Bob about node3.\n")
    (r / "empty.log").write_text("")
    (r / "batch" / "jobC").mkdir()
    (r / "batch" / "jobC" / "stderr.log").write_text("")
    specs, ignored = list_runs(r)
    got = {s.rel: s.kind for s in specs}
    assert got == {
        "job1": "folder", "job2": "folder", "job3": "folder", "batch/notes.log": "file", "batch/jobA": "folder",
        "batch/jobB": "folder", "lone.log.gz": "file", "run9.tar.gz": "archive",
        "x<img src=q onerror=alert(1)>": "folder",
    }
    assert dict(ignored) == {"NOTES.txt": "notes, not a log", "empty.log": "empty file", "batch/jobC/stderr.log":
                             "empty file", "meta.json": "metadata beside runs (.json/.csv/.tsv)"}
    assert {s.rel for s in find_runs(r, depth=1)} == {"job1", "job2", "job3", "batch", "lone.log.gz", "run9.tar.gz",
                                                      "x<img src=q onerror=alert(1)>", "NOTES.txt", "empty.log"}
    assert {s.rel for s in find_runs(r, glob="batch/job*")} == {"batch/jobA", "batch/jobB", "batch/jobC"}
    one = {s.rel: s for s in specs}["job1"]
    assert one.nfiles == 5 and one.id != "job1" and "/" not in one.id
    with pytest.raises(UsageError):
        find_runs(r, depth=1, glob="*")


def test_report_per_run_and_escaping(tmp_path):
    case = next(c for c in CASES if c.name.startswith("013"))
    _copy_case(case, tmp_path / "root" / "x<img src=q onerror=alert(1)>")
    scan(tmp_path / "root", tmp_path / "out", jobs=1, progress=False)
    html = (tmp_path / "out" / "index.html").read_text()
    assert "<img src=q" not in html and "&lt;img src=q onerror=alert(1)&gt;" in html
    row = pl.read_parquet(tmp_path / "out" / "summary.parquet").row(0, named=True)
    report = tmp_path / "out" / "runs" / row["id"] / "report.html"
    if row["report"]:  # the report renderer exists: the index links the report
        assert report.is_file() and f'href="runs/{row["id"]}/report.html"' in html
    else:
        assert not report.exists() and row["report_error"] is None


def test_reports_share_one_plotly_copy(tmp_path):
    """Per-run reports load plotly.js from OUTDIR/assets/ (one copy for the scan); --self-contained
    inlines it in each, and switching re-renders the cached runs."""
    from ncclforensics.report.bundle import bundle

    for prefix in ("013", "019"):
        case = next(c for c in CASES if c.name.startswith(prefix))
        _copy_case(case, tmp_path / "root" / case.name)
    out = tmp_path / "out"
    scan(tmp_path / "root", out, jobs=1, progress=False)
    asset = out / "assets" / bundle().asset_name
    assert asset.is_file() and (out / "assets" / "plotly-LICENSE.txt").is_file()
    reports = sorted(out.glob("runs/*/report.html"))
    assert len(reports) == 2
    for rep in reports:
        html = rep.read_text()
        assert f'<script src="../../assets/{bundle().asset_name}"></script>' in html
        assert 'id="plotly-gz"' not in html and len(html.encode()) <= 200_000
        assert (rep.parent / "../../assets" / bundle().asset_name).resolve() == asset.resolve()
    res = scan(tmp_path / "root", out, jobs=1, progress=False, self_contained=True)
    assert res.analyzed == 2
    for rep in reports:
        html = rep.read_text()
        assert 'id="plotly-gz"' in html and "<script src" not in html and len(html.encode()) <= 1_600_000
    assert scan(tmp_path / "root", out, jobs=1, progress=False, self_contained=True).analyzed == 0


def test_user_errors(tmp_path):
    with pytest.raises(NoInputError):
        scan(tmp_path / "missing", tmp_path / "out", progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoInputError):
        scan(tmp_path / "empty", tmp_path / "out", progress=False)
    with pytest.raises(UsageError):
        scan(tmp_path / "empty", tmp_path / "out", engine="spark", progress=False)


def test_ray_engine_matches_process_pool(tmp_path):
    ray = pytest.importorskip("ray")
    root = tmp_path / "root"
    for case in CASES[:4]:
        _copy_case(case, root / case.name)
    base = scan(root, tmp_path / "p", jobs=2, progress=False, reports=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        res = scan(root, tmp_path / "r", engine="ray", progress=False, reports=False)
    finally:
        ray.shutdown()
    assert res.analyzed == base.analyzed == 4
    drop = ["elapsed_s", "analyzed_at"]
    a = pl.read_parquet(tmp_path / "p" / "summary.parquet").drop(drop)
    b = pl.read_parquet(tmp_path / "r" / "summary.parquet").drop(drop)
    assert a.equals(b)
    for rid in a["id"]:
        assert (tmp_path / "r" / "runs" / rid / "diagnosis.json").read_text() == \
            (tmp_path / "p" / "runs" / rid / "diagnosis.json").read_text()
