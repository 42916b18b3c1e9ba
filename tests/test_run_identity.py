"""Run boundaries from the logs, not from folder names (issue 13): scan rows, `scan --list`, and
analyze's warning on a folder that holds several runs. Corpus cases are copied into tmp folders."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from ncclforensics.analysis import analyze_path
from ncclforensics.scan import find_runs, list_runs, scan
from ncclforensics.scan.identity import Identity, conflicts, file_identity, links

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus"
CORPUS_REAL = ROOT.parent / "shared" / "corpus-real"
SAMPLE = ROOT / "sample_logs" / "rank0-validation-timeout"
GEN = ROOT / "bench" / "gen_run.py"
CASES = {p.parent.name[:3]: p.parent for p in CORPUS.glob("*/label.json")}

needs_corpus = pytest.mark.skipif(not CASES, reason="../shared/corpus not present")


def _label(case: Path) -> dict:
    return json.loads((case / "label.json").read_text())


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("label.json"))
    return dest


def _rows(root: Path, out: Path) -> dict[str, dict]:
    scan(root, out, jobs=2, progress=False, reports=False)
    df = pl.read_parquet(out / "summary.parquet")
    return {r["path"]: r for r in df.iter_rows(named=True)}


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ncclforensics", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@needs_corpus
def test_four_runs_named_like_host_folders_are_four_rows(tmp_path):
    """Incident folders named like per-rank / per-host folders: each is a run, told apart by its logs."""
    picks = {"rank7-crash-0412": "002", "node3-oom-retry": "019", "gpu-h004-hang": "013",
             "ip-10-0-0-12-eu-west": "011"}  # 011 itself spreads over node0/ and node1/
    root = tmp_path / "archive"
    for name, case in picks.items():
        _copy(CASES[case], root / name)
    rows = _rows(root, tmp_path / "out")
    assert sorted(rows) == sorted(picks)
    for name, case in picks.items():
        assert rows[name]["status"] == "ok", rows[name]["error"]
        assert rows[name]["root_cause"] == _label(CASES[case])["class"], name
    assert rows["ip-10-0-0-12-eu-west"]["files"] == 2  # its node0/ and node1/ stayed together


@needs_corpus
def test_two_runs_side_by_side_in_one_folder_are_two_rows(tmp_path):
    root = tmp_path / "archive"
    # the bundled sample, in a folder whose name reads like a per-rank folder, next to another run
    _copy(SAMPLE, root / "incident" / "rank0-validation-timeout")
    _copy(CASES["017"], root / "incident" / "other")
    # two runs' console logs dropped into one folder
    (root / "pasted").mkdir(parents=True)
    shutil.copy(CASES["001"] / "console.log", root / "pasted" / "first.log")
    shutil.copy(CASES["013"] / "console.log", root / "pasted" / "second.log")
    rows = _rows(root, tmp_path / "out")
    expect = {"incident/rank0-validation-timeout": "rank_divergence", "incident/other": "rank_crash",
              "pasted/first.log": _label(CASES["001"])["class"], "pasted/second.log": _label(CASES["013"])["class"]}
    assert {p: r["root_cause"] for p, r in rows.items()} == expect
    assert all(r["status"] == "ok" for r in rows.values())
    sample = rows["incident/rank0-validation-timeout"]
    assert sample["files"] == sum(1 for p in SAMPLE.rglob("*") if p.is_file() and p.name != "label.json")


@needs_corpus
def test_multi_host_run_stays_one_row(tmp_path):
    root = tmp_path / "archive"
    _copy(CASES["011"], root / "job-netinit")  # node0/ and node1/: one run
    # a generated 2-host run whose host folders have names that say nothing; their NCCL commId ties them
    run = tmp_path / "gen"
    subprocess.run([sys.executable, str(GEN), "--ranks", "8", "--per-host", "4", "--size", "1M", "--seed", "5",
                    "--out", str(run)], check=True, capture_output=True, timeout=300)
    truth = json.loads(run.with_name("gen.truth.json").read_text())
    hosts = sorted(p for p in run.iterdir() if p.is_dir())
    assert len(hosts) == 2
    for p, name in zip(hosts, ("alpha", "beta"), strict=True):
        shutil.copytree(p, root / "multi" / name)
    _copy(CASES["017"], root / "multi" / "gamma")  # another run beside it
    specs = {s.rel: s for s in find_runs(root)}
    assert sorted(specs) == ["job-netinit", "multi/gamma", "multi/{alpha,beta}"]
    assert any("NCCL commId" in w for w in specs["multi/{alpha,beta}"].why)
    rows = _rows(root, tmp_path / "out")
    assert rows["job-netinit"]["root_cause"] == "network_init"
    both = rows["multi/{alpha,beta}"]
    assert both["status"] == "ok" and both["world_size"] == truth["world_size"] == 8
    assert both["root_cause"] == "rank_divergence" and both["culprit_ranks"] == [truth["culprit_rank"]]
    assert rows["multi/gamma"]["root_cause"] == "rank_crash"


@needs_corpus
def test_scan_list_shows_runs_files_and_why(tmp_path):
    root = tmp_path / "archive"
    _copy(CASES["002"], root / "rank7-crash-0412")
    _copy(CASES["019"], root / "node3-oom-retry")
    (root / "NOTES.txt").write_text("node3 was drained after this; see the ticket\n")
    before = sorted(tmp_path.rglob("*"))
    res = _cli("scan", "--list", str(root), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.startswith(f"2 runs under {root}; 1 file that are no run")
    for rel in ("rank7-crash-0412  (folder, 13 files", "node3-oom-retry  (folder, 1 file"):
        assert rel in out
    assert ("names propose one run: node3-oom-retry/, rank7-crash-0412/ (per-host/per-rank folders by name); "
            "their logs tell 2 runs apart") in out
    assert "different world sizes" in out  # 3 ranks vs 4
    assert "files console.log; fr_trace/ (3 files); fr_trace_json/ (3 files); torchrun_logs/ (6 files)" in out
    assert "logs  torchrun launch" in out and "world size 4 (all ranks seen)" in out
    assert "not runs:\n  NOTES.txt  notes, not a log" in out
    assert sorted(tmp_path.rglob("*")) == before  # a dry run writes nothing (no ./ncclforensics-scan)
    res = _cli("scan", "--list", "--depth", "1", str(root))
    assert res.returncode == 0 and "3 runs under" in res.stdout and "why   --depth 1" in res.stdout


@needs_corpus
def test_analyze_on_several_runs_warns(tmp_path):
    root = tmp_path / "two"
    _copy(CASES["001"], root / "a")
    _copy(CASES["013"], root / "b")
    res = _cli("analyze", str(root), "--json", "--html", str(tmp_path / "r.html"))
    assert res.returncode == 0, res.stderr
    warning = [ln for ln in res.stderr.splitlines() if "looks like" in ln]
    assert warning == ["ncclforensics: this folder looks like 2 runs (a, b); analyzing them as one — "
                       "use `ncclforensics scan` to get one verdict per run"]
    notes = json.loads(res.stdout)["run"]["notes"]
    assert notes[0] == warning[0].removeprefix("ncclforensics: ")
    html = (tmp_path / "r.html").read_text()
    verdict = html[html.index('<section id="verdict"'):html.index("</section>")]
    assert "this folder looks like 2 runs (a, b)" in verdict
    # the same when the folder is read in shares (the check is then done by a share's process)
    code = ("import sys; from ncclforensics import events; events.SHARE_MIN_BYTES = 1; "
            f"sys.argv = ['ncclforensics', 'analyze', {str(root)!r}, '--json', '-j', '2']; "
            "from ncclforensics.cli import run; run()")
    shared = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert shared.returncode == 0, shared.stderr
    assert [ln for ln in shared.stderr.splitlines() if "looks like" in ln] == warning
    assert json.loads(shared.stdout)["run"]["notes"] == notes
    # one run: no warning, also when its parts sit in per-host folders
    assert analyze_path(SAMPLE).several_runs is None
    assert analyze_path(CASES["011"]).several_runs is None
    assert not any("looks like" in n for n in analyze_path(SAMPLE).diagnosis.facts.notes)


@pytest.mark.parametrize("name", ["rank7-crash-0412", "node3", "gpu-h004-hang", "ip-10-0-0-12-eu-west",
                                  "rank0-validation-timeout", "logs", "job 7 (copy)"])
def test_sample_is_one_run_under_any_folder_name(tmp_path, name):
    _copy(SAMPLE, tmp_path / "archive" / name)
    (tmp_path / "archive" / "README").write_text("what is in here\n")
    specs = find_runs(tmp_path / "archive")
    n_files = sum(1 for p in SAMPLE.rglob("*") if p.is_file() and p.name != "label.json")
    assert len(specs) == 1 and specs[0].nfiles == n_files + (1 if specs[0].rel == "." else 0)


def test_sample_scans_as_one_row_with_its_empty_file_skipped(tmp_path):
    root = tmp_path / "archive"
    _copy(SAMPLE, root / "rank0-validation-timeout")
    (root / "NOTES.txt").write_text("Validation hang, Nov 23. Logs copied from the login node.\n")
    (root / "empty.log").write_text("")
    rows = _rows(root, tmp_path / "out")
    assert list(rows) == ["rank0-validation-timeout"]
    row = rows["rank0-validation-timeout"]
    assert row["status"] == "ok" and row["root_cause"] == "rank_divergence" and row["files_skipped"] >= 1
    diag = json.loads((tmp_path / "out" / "runs" / row["id"] / "diagnosis.json").read_text())
    skipped = {s["file"]: s["reason"] for s in diag["run"]["skipped"]}
    assert skipped["torchrun_logs/none_8tgov_n9/attempt_0/0/stderr.log"] == "empty file"


@pytest.mark.parametrize("corpus", [CORPUS, CORPUS_REAL], ids=["corpus", "corpus-real"])
def test_corpus_gives_one_run_per_case_folder(corpus):
    cases = sorted(p.parent.name for p in corpus.glob("*/label.json"))
    if not cases:
        pytest.skip(f"{corpus} not present")
    specs, ignored = list_runs(corpus)
    assert sorted(s.rel for s in specs) == cases
    assert all(s.kind == "folder" and not s.members for s in specs)
    assert ignored == []


def _ident(tmp_path: Path, name: str, text: str) -> Identity:
    p = tmp_path / name
    p.write_text(text)
    st = p.stat()
    return file_identity(p, name, st.st_size)


def test_identity_signals_from_log_lines(tmp_path):
    a = _ident(tmp_path, "a.log", "\n".join([
        "W0522 23:24:53.382000 24914 torch/distributed/run.py:766] *****************************************",
        "I0522 23:24:53.400000 24914 torch/distributed/launcher/api.py:222]   run_id           : job42",
        "gpu-q17:58213:58391 [5] NCCL INFO ncclCommInitRankConfig comm 0x7f3c4c00a9e0 rank 13 nranks 16 cudaDev 5 "
        "nvmlDev 5 busId 9a000 commId 0x41d9c0e27b3a5f18 - Init COMPLETE",
        "[rank13]:[E0522 23:30:01.000000000 ProcessGroupNCCL.cpp:665] [Rank 13] Watchdog caught collective "
        "operation timeout",
        "MASTER_ADDR=10.42.7.3 MASTER_PORT=29500",
        "slurmstepd: error: *** STEP 4417203.0 ON gpu-q17 CANCELLED AT 2025-05-22T23:31:00 ***",
    ]) + "\n")
    assert a.run_ids == {"job42"} and a.comms == {"0x41d9c0e27b3a5f18"} and a.world == 16
    assert a.ranks == {13} and a.hosts == {"gpu-q17"} and a.jobs == {"4417203"}
    assert a.masters == {"10.42.7.3"} and a.ports == {29500}
    assert [p for p, _ in a.launches] == [24914] and a.first.strftime("%m%d %H:%M") == "0522 23:24"
    assert a.last.strftime("%H:%M:%S") == "23:31:00" and a.years == {2025}
    # another host of the same run: tied by the commId and the master; not a copy (other ranks)
    b = _ident(tmp_path, "b.log", "\n".join([
        "W0522 23:24:54.100000 31000 torch/distributed/run.py:766] *****************************************",
        "gpu-q18:61207:61388 [5] NCCL INFO ncclCommInitRank comm 0x55d1f0c3b2a0 rank 5 nranks 16 cudaDev 5 "
        "nvmlDev 5 busId 9a000 commId 0x41d9c0e27b3a5f18 - Init COMPLETE",
        "[rank5]:[E0522 23:30:02.000000000 ProcessGroupNCCL.cpp:665] [Rank 5] Watchdog caught collective",
        "MASTER_ADDR=10.42.7.3",
    ]) + "\n")
    assert conflicts(a, b) == [] and "NCCL commId 0x41d9c0e27b3a5f18" in links(a, b)
    assert links(a, a) == []  # the same part twice is a copy, not a second host
    # a later run of the same job on the same master: other world size, other communicator
    c = _ident(tmp_path, "c.log", "\n".join([
        "W0523 08:00:00.000000 777 torch/distributed/run.py:766] *****************************************",
        "gpu-q17:1:2 [0] NCCL INFO comm 0x1 rank 0 nranks 8 cudaDev 0 busId 18000 commId 0x99 - Init COMPLETE",
        "MASTER_ADDR=10.42.7.3",
    ]) + "\n")
    why = conflicts(a, c)
    assert any("world sizes (16 here, 8 there)" in w for w in why)
    assert any("NCCL commId" in w for w in why) and any("apart in time" in w for w in why)
    assert links(a, c) == [] or conflicts(a, c)
    empty = _ident(tmp_path, "e.log", "")
    assert empty.problem == "empty file" and empty.silent


@needs_corpus
def test_rescan_uses_the_identity_cache_and_sees_changed_files(tmp_path):
    root = tmp_path / "archive"
    _copy(CASES["019"], root / "job" / "node0")
    _copy(CASES["019"], root / "job" / "node1")  # a copy of the same host's logs: nothing splits them
    out = tmp_path / "out"
    scan(root, out, jobs=1, progress=False, reports=False)
    assert [s.rel for s in find_runs(root)] == ["job"]
    cache = json.loads((out / ".identities.json").read_text())
    assert sorted(cache["files"]) == ["job/node0/console.log", "job/node1/console.log"]
    # node1's log is now another run's: the re-scan samples it again and splits the folder
    shutil.copy(CASES["013"] / "console.log", root / "job" / "node1" / "console.log")
    res = scan(root, out, jobs=1, progress=False, reports=False)
    assert res.runs == 2
    rows = pl.read_parquet(out / "summary.parquet")
    assert sorted(rows["path"].to_list()) == ["job/node0", "job/node1"]


def test_torchrun_restarts_stay_one_run(tmp_path):
    """attempt_0 and attempt_1 of one agent's log folder: new communicators, even a new world size
    (elastic), hours apart — still one run (the first attempt's failure is part of it)."""
    agent = tmp_path / "archive" / "job" / "torchrun_logs" / "job42_k3x9q0ab"
    for attempt, comm, nranks, hhmm in ((0, "0xaaaa", 4, "07:00"), (1, "0xbbbb", 2, "09:30")):
        d = agent / f"attempt_{attempt}" / "0"
        d.mkdir(parents=True)
        (d / "stdout.log").write_text(
            f"gpu-q17:100:101 [0] NCCL INFO comm 0x55 rank 0 nranks {nranks} cudaDev 0 busId 18000 commId {comm}"
            " - Init COMPLETE\n")
        (d / "stderr.log").write_text(
            f"[rank0]:[E1122 {hhmm}:00.000000001 ProcessGroupNCCL.cpp:665] [Rank 0] Watchdog caught collective "
            "operation timeout\n")
    (tmp_path / "archive" / "job" / "console.log").write_text(
        "W1122 06:59:58.000000 99 torch/distributed/run.py:766] *****************************************\n")
    specs = find_runs(tmp_path / "archive")
    assert [s.rel for s in specs] == ["job"] and specs[0].nfiles == 5
    assert "run id job42" in specs[0].ids


def test_root_of_notes_only_is_no_run(tmp_path):
    from ncclforensics.errors import NoInputError

    (tmp_path / "NOTES.txt").write_text("rerun after the driver update\n")
    (tmp_path / "empty.log").write_text("")
    with pytest.raises(NoInputError, match=r"2 files are no run \(NOTES.txt: notes, not a log; empty.log: empty"):
        scan(tmp_path, tmp_path.parent / "out", progress=False)
    assert not (tmp_path.parent / "out").exists()


def test_a_hung_workers_stdout_and_stderr_stay_one_run(tmp_path):
    """A torchrun worker's folder (attempt_N/<local_rank>/, FORMATS.md §2.2) holds one process: its last
    print and its watchdog timeout an hour later are one run, not two told apart by time."""
    run = tmp_path / "job" / "node-a" / "fit_x1y2z3w4" / "attempt_0"
    for lr in range(2):
        (run / str(lr)).mkdir(parents=True)
        (run / str(lr) / "stdout.log").write_text(
            f"[2025-04-02 01:00:00,000] step 100 loss 2.31\n[2025-04-02 01:20:00,000] rank {lr} step 2000 loss 1.90\n")
        (run / str(lr) / "stderr.log").write_text(
            f"[rank{lr}]:[E402 02:20:01.500000000 ProcessGroupNCCL.cpp:632] [Rank {lr}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=4001, OpType=ALLREDUCE, NumelIn=64, NumelOut=64, "
            "Timeout(ms)=3600000) ran for 3600042 milliseconds before timing out.\n")
    specs = find_runs(tmp_path / "job")
    assert len(specs) == 1, [(s.rel, s.why) for s in specs]


@needs_corpus
def test_identities_do_not_depend_on_the_batch_size(monkeypatch):
    """The samples are searched in batches of BATCH_CHARS (which bounds the memory they take): one
    sample per batch gives every file the identity one batch of all gives."""
    from ncclforensics.scan import identity

    files = sorted(p for case in CASES.values() for p in case.rglob("*") if p.is_file() and p.name != "label.json")
    specs = [(p, p.name, p.stat().st_size) for p in files]
    whole = identity.identities(specs)
    monkeypatch.setattr(identity, "BATCH_CHARS", 1)
    assert identity.identities(specs) == whole
    assert len(files) > 20 and any(i.run_ids or i.first for i in whole)


@pytest.mark.parametrize(("minutes_before", "runs"), [(12, 1), (31, 1), (120, 2)])
def test_a_kernel_log_a_collective_timeout_before_the_workers_stays_with_them(tmp_path, minutes_before, runs):
    """A piece that says nothing but its times (a kernel log) ends a whole collective timeout (up to 30 min
    by default) before the workers' first stamped line when its GPU fault is what they waited for: it is
    not another run. Hours apart, it is."""
    import datetime as dt

    from ncclforensics.scan.discover import several_runs

    t0 = dt.datetime(2025, 6, 27, 3, 41, 13)
    fault = t0 - dt.timedelta(minutes=minutes_before)
    run = tmp_path / "run"
    run.mkdir()
    (run / "slurm-7712.out").write_text(
        "gpu-h5:5120:5120 [3] NCCL INFO ncclCommInitRank comm 0x55d1 rank 3 nranks 8 cudaDev 3 busId c1000 "
        "commId 0x1f2e3d4c5b6a7988 - Init COMPLETE\n"
        f"[rank3]:[E{t0:%m%d %H:%M:%S}.112233 4410 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
        "ran for 600021 milliseconds before timing out.\n")
    (run / "dmesg-gpu-h5.txt").write_text(
        f"[{fault:%a %b %d %H:%M:%S %Y}] NVRM: Xid (PCI:0000:c1:00): 79, pid=5121, name=python, "
        "GPU has fallen off the bus.\n")
    found = several_runs(run)
    assert len(found) == (0 if runs == 1 else runs), found
