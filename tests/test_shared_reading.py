"""A run read by several processes (events.build_events(jobs=N)) gives exactly the table, skips, notes
and counts that one process gives: each process reads a contiguous share of the walk's entries, and
slices of files bigger than a share (ingest.shares), and the shares' books join in walk order. A share
whose process dies is read again by the parent."""

from __future__ import annotations

import gzip
import importlib.util
import io
import itertools
import os
import shutil
import sys
import tarfile
from pathlib import Path

import polars as pl
import pytest

from ncclforensics import events
from ncclforensics.ingest import decode, shares
from ncclforensics.ingest.discover import entry_sizes, iter_sources

SHARED = Path(__file__).resolve().parents[2] / "shared"
GEN = Path(__file__).resolve().parent.parent / "bench" / "gen_run.py"
WATCHDOG = ("[rank{r}]:[E1122 07:44:{s:02d}.000000000 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=17, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=600000) ran for 600001 milliseconds before timing out.\n")

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="shares are read by forked processes")


@pytest.fixture
def fork_allowed(monkeypatch):
    """Work beside the reading goes to a forked process although this one has run polars (the tests' tasks
    run no polars query: forked_may_use_polars guards the several-runs check's)."""
    monkeypatch.setattr(events, "forked_may_use_polars", lambda: True)


@pytest.fixture
def share_everything(monkeypatch):
    """Shares of any size: the small runs of the tests are shared too. Counts the shares this process
    reads itself: one, unless a forked process failed (its share is then read here again)."""
    monkeypatch.setattr(events, "SHARE_MIN_BYTES", 1)
    here: list[object] = []
    read = events._read

    def counted(roots, run, progress, share=None):
        here.append(share)
        return read(roots, run, progress, share)

    monkeypatch.setattr(events, "_read", counted)
    return here


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 32 KiB (and a 4 KiB head): a file of a few hundred KiB is cut into slices."""
    monkeypatch.setattr(decode, "CHUNK_SIZE", 32 << 10)
    monkeypatch.setattr(decode, "HEAD_SIZE", 4 << 10)


def _one_share_here(here: list) -> None:
    """The shares read in this process: the first only (every forked process sent its books)."""
    shared = [s for s in here if s is not None]
    assert len(shared) == 1 and shared[0].index == 0, [getattr(s, "index", None) for s in shared]
    here.clear()


def _same(one: events.IngestResult, many: events.IngestResult) -> None:
    assert one.events.height > 0
    assert many.events.equals(one.events)
    assert [(s.file, s.reason) for s in many.skipped] == [(s.file, s.reason) for s in one.skipped]
    assert many.notes == one.notes
    assert (many.files, many.bytes, many.lines, many.year_source) == (one.files, one.bytes, one.lines,
                                                                        one.year_source)


def _mixed_folder(tmp: Path) -> Path:
    """Logs, skipped files, an archive, a compressed file cut short, an empty file, a document."""
    run = tmp / "run"
    (run / "node0").mkdir(parents=True)
    (run / "node1").mkdir()
    for r in range(8):
        noise = "".join(f"[rank{r}]: step {i} loss 2.{i:03d}\n" for i in range(200))
        (run / f"node{r // 4}" / f"rank_{r}.log").write_text(noise + (WATCHDOG.format(r=r, s=r) if r % 3 else ""))
    (run / "node0" / "empty.log").write_bytes(b"")
    (run / "node1" / "train.py").write_text("print('not a log')\n")
    (run / "README.md").write_text("# notes\n")
    lines = "".join(f"[rank9]: step {i} loss {i * 7919 % 10007}\n" for i in range(20000))
    whole = gzip.compress((WATCHDOG.format(r=9, s=41) + lines).encode())
    (run / "node1" / "cut.log.gz").write_bytes(whole[: len(whole) // 2])  # read in part
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for r in (10, 11):
            data = WATCHDOG.format(r=r, s=r).encode()
            info = tarfile.TarInfo(f"logs/rank_{r}.log")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (run / "node1" / "more.tar.gz").write_bytes(buf.getvalue())
    (run / "node0" / "outside").symlink_to("/etc/hostname")
    return run


def test_entries_number_what_the_walk_yields(tmp_path):
    run = _mixed_folder(tmp_path)
    sizes = entry_sizes(run)
    every = [(s.name, s.entry) for s in iter_sources(run)]
    by_entry = [[(s.name, s.entry) for s in iter_sources(run, lambda i, k=k: i == k)] for k in range(len(sizes))]
    assert [n for names in by_entry for n in names] == every  # each source in exactly one entry, in order
    assert all(entry == k for k, names in enumerate(by_entry) for _, entry in names)
    archive = [k for k, (_, full) in enumerate(sizes) if full is not None and full.name.endswith(".tar.gz")]
    assert len(archive) == 1 and [n for n, _ in by_entry[archive[0]]] == ["node1/more.tar.gz!logs/rank_10.log",
                                                                          "node1/more.tar.gz!logs/rank_11.log"]
    assert sum(size for size, _ in sizes) == sum(
        p.stat().st_size for p in run.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.parametrize("jobs", [2, 3, 5])
def test_shares_read_as_one(tmp_path, share_everything, jobs):
    run = _mixed_folder(tmp_path)
    one = events.build_events(run, jobs=1)
    share_everything.clear()
    many = events.build_events(run, jobs=jobs)
    _one_share_here(share_everything)
    _same(one, many)
    assert any(s.file == "node1/train.py" for s in many.skipped)
    assert any("read only in part" in n for n in many.notes)


def test_several_paths_of_one_run(tmp_path, share_everything):
    run = _mixed_folder(tmp_path)
    paths = [run / "node0", run / "node1", run / "README.md"]
    _same(events.build_events(paths, jobs=1), events.build_events(paths, jobs=2))


@pytest.mark.skipif(not (SHARED / "corpus").is_dir(), reason="../shared/corpus is not beside the checkout")
def test_real_runs(tmp_path, share_everything):
    for case in sorted((SHARED / "corpus").iterdir())[:4]:
        if case.is_dir():
            _same(events.build_events(case, jobs=1), events.build_events(case, jobs=2))


def test_generated_multi_host_run(tmp_path, share_everything):
    spec = importlib.util.spec_from_file_location("bench_gen_run_shared", GEN)
    gen = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gen  # dataclasses look their module up
    spec.loader.exec_module(gen)
    out = tmp_path / "gen"
    assert gen.main(["--ranks", "16", "--per-host", "4", "--size", "2M", "--layout", "logdir", "--seed", "5",
                     "--progress", "all", "--out", str(out)]) == 0
    _same(events.build_events(out, jobs=1), events.build_events(out, jobs=4))


def test_a_share_whose_process_dies_is_read_again(tmp_path, share_everything, monkeypatch):
    run = _mixed_folder(tmp_path)
    one = events.build_events(run, jobs=1)

    def dies(*_args):
        os._exit(3)  # as if killed: the parent gets no books

    monkeypatch.setattr(events, "_share_worker", dies)
    share_everything.clear()
    _same(one, events.build_events(run, jobs=3))
    assert sorted(s.index for s in share_everything if s is not None) == [0, 1, 2]  # two read again here


def _pid_once(calls: list[int]):
    """Work beside the reading that says which process did it (and counts calls made here)."""
    parent = os.getpid()

    def task() -> int:
        if os.getpid() == parent:
            calls.append(parent)
        return os.getpid()

    return task


@pytest.mark.parametrize("jobs", [2, 3])
def test_work_beside_the_reading_is_done_by_the_last_share(tmp_path, share_everything, fork_allowed, jobs):
    run = _mixed_folder(tmp_path)
    one = events.build_events(run, jobs=1)
    calls: list[int] = []
    share_everything.clear()
    many = events.build_events(run, jobs=jobs, aside=_pid_once(calls))
    _one_share_here(share_everything)
    _same(one, many)  # the table is the one of a reading without it
    pid = many.aside.result()
    assert pid != os.getpid() and not calls  # a share's process did it, not this one
    assert many.aside.result() == pid  # once


def test_work_beside_a_run_too_small_to_share_has_a_process_of_its_own(tmp_path, fork_allowed):
    run = _mixed_folder(tmp_path)
    calls: list[int] = []
    res = events.build_events(run, jobs=2, aside=_pid_once(calls))  # too small to be shared
    pid = res.aside.result()
    assert pid != os.getpid() and not calls and res.aside.result() == pid
    assert events.build_events(run).aside is None


_AFTER_POLARS = """
import sys
import polars as pl
from ncclforensics import events
from ncclforensics.events import forked_may_use_polars

fresh = forked_may_use_polars()
pl.DataFrame({"a": list(range(300_000, 0, -1))}).sort("a")  # the thread pool starts
events.SHARE_MIN_BYTES = int(sys.argv[2])

def check():  # polars work, as the several-runs check's
    return pl.DataFrame({"a": list(range(300_000, 0, -1))}).sort("a").height

res = events.build_events(sys.argv[1], jobs=2, aside=check)
print(fresh, forked_may_use_polars(), res.aside.result(), res.events.height)
"""


@pytest.mark.parametrize("share_min", [1, 1 << 40], ids=["shared", "too-small-to-share"])
def test_work_beside_the_reading_after_polars_ran_here_is_done_here(tmp_path, share_min):
    # a process whose polars thread pool has started (a test runner's, a scan worker's) hands no polars
    # work to a forked process: fork copies no thread, and the child's query would wait for the pool
    # forever (both xdist workers hung there once). A fresh process may (the CLI's).
    import subprocess

    run = _mixed_folder(tmp_path)
    out = subprocess.run([sys.executable, "-c", _AFTER_POLARS, str(run), str(share_min)], capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    fresh, after, value, height = out.stdout.split()
    assert (fresh, after, value) == ("True", "False", "300000")
    assert int(height) == events.build_events(run).events.height


def test_work_beside_a_reading_in_one_process_is_done_when_asked(tmp_path):
    run = _mixed_folder(tmp_path)
    calls: list[int] = []
    res = events.build_events(run, jobs=1, aside=_pid_once(calls))
    assert not calls  # not before it is asked for
    assert res.aside.result() == os.getpid() and res.aside.result() == os.getpid() and len(calls) == 1


def test_work_that_fails_beside_the_reading_is_done_here(tmp_path, share_everything, fork_allowed):
    run = _mixed_folder(tmp_path)
    parent = os.getpid()

    def fails_there() -> str:
        if os.getpid() != parent:
            raise RuntimeError("only in the share's process")
        return "here"

    res = events.build_events(run, jobs=2, aside=fails_there)
    assert res.aside.result() == "here"

    def fails_everywhere() -> str:
        raise ValueError("a bug in the check")

    res = events.build_events(run, jobs=2, aside=fails_everywhere)
    with pytest.raises(ValueError, match="a bug in the check"):  # this process's error, as without a share
        res.aside.result()


def test_work_beside_a_share_whose_process_dies_is_done_here(tmp_path, share_everything, fork_allowed,
                                                              monkeypatch):
    run = _mixed_folder(tmp_path)

    def dies(*_args):
        os._exit(3)

    monkeypatch.setattr(events, "_share_worker", dies)
    calls: list[int] = []
    res = events.build_events(run, jobs=2, aside=_pid_once(calls))
    assert res.aside.result() == os.getpid() and len(calls) == 1


def test_documents_only_are_read_by_one_reader(tmp_path, share_everything):
    # a folder of pasted output saved as documents is read as logs; no share decides that alone
    run = tmp_path / "issue"
    run.mkdir()
    (run / "issue.md").write_text(WATCHDOG.format(r=3, s=1))
    (run / "comment.txt.md").write_text(WATCHDOG.format(r=5, s=2))
    one = events.build_events(run, jobs=1)
    many = events.build_events(run, jobs=2)
    _same(one, many)
    assert sorted(many.events["rank"].to_list()) == [3, 5]


def test_small_runs_and_stdin_are_not_shared(tmp_path):
    run = _mixed_folder(tmp_path)
    roots = events.roots_of(run)
    assert shares.plan(roots, 8) is None  # far below SHARE_MIN_BYTES a share
    plan = shares.plan(roots, 2, min_bytes=1)
    assert plan is not None and len(plan) == 2 and not any(sh.slices for sh in plan)
    first, second = (sorted(sh.whole) for sh in plan)
    assert first and second and max(first) < min(second)  # contiguous in walk order
    assert shares.plan(events.roots_of("-"), 2, min_bytes=1) is None
    assert shares.plan(roots, 1, min_bytes=1) is None
    single = tmp_path / "one.log"
    shutil.copy(run / "node0" / "rank_1.log", single)
    assert shares.plan(events.roots_of(single), 4, min_bytes=1) is None  # one small file: not cut


def _console(tmp: Path, ranks: int = 8, steps: int = 900) -> Path:
    """One interleaved console of a few hundred KiB: progress lines, an init line per rank, a
    traceback in the middle and watchdog timeouts at the end."""
    out = []
    for r in range(ranks):
        out.append(f"[default{r}]:[rank{r}]: NCCL INFO ncclCommInitRank comm 0x55d{r:03x} rank {r} nranks {ranks} "
                   f"cudaDev {r} busId {r + 1}0000 - Init COMPLETE\n")
    for i in range(steps):
        for r in range(ranks):
            out.append(f"[default{r}]:[rank{r}]: step {i} loss {2 + (i * 7 + r) % 100 / 100:.2f}\n")
        if i == steps // 2:
            out.append("[default3]:Traceback (most recent call last):\n"
                       '[default3]:  File "/srv/train.py", line 88, in <module>\n'
                       "[default3]:    main()\n"
                       "[default3]:ValueError: a warning the job survived\n")
    for r in range(ranks):
        if r != 5:
            out.append(WATCHDOG.format(r=r, s=r).replace(f"[rank{r}]:", f"[default{r}]:[rank{r}]:", 1))
    path = tmp / "console.log"
    path.write_text("".join(out))
    return path


@pytest.mark.parametrize("jobs", [2, 3, 4])
def test_a_big_file_is_cut_into_slices(tmp_path, share_everything, small_chunks, jobs):
    path = _console(tmp_path)
    assert path.stat().st_size > 6 * decode.CHUNK_SIZE
    plan = shares.plan(events.roots_of(path), jobs, min_bytes=1)
    assert plan is not None and len(plan) == jobs
    cuts = sorted((sl for sh in plan for sls in sh.slices.values() for sl in sls), key=lambda sl: sl.k)
    assert [sl.k for sl in cuts] == list(range(jobs)) and all(sl.n == jobs for sl in cuts)
    data = path.read_bytes()
    for a, b in itertools.pairwise(cuts):
        assert data[b.start - 1 : b.start] == b"\n"  # every slice starts a line
        assert a.end == b.grid
    one = events.build_events(path, jobs=1)
    share_everything.clear()
    many = events.build_events(path, jobs=jobs)
    _one_share_here(share_everything)
    _same(one, many)
    assert many.lines == data.count(b"\n")
    assert sorted(many.events.filter(pl.col("kind") == "step_progress")["rank"].to_list()) == sorted(
        [r for r in range(8) for _ in range(2)])


def test_a_folder_with_one_big_console_beside_small_files(tmp_path, share_everything, small_chunks):
    run = _mixed_folder(tmp_path)
    _console(run / "node1")
    one = events.build_events(run, jobs=1)
    share_everything.clear()
    many = events.build_events(run, jobs=3)
    _one_share_here(share_everything)
    _same(one, many)


def test_files_that_are_not_cut(tmp_path, small_chunks):
    path = _console(tmp_path)
    for name, data in [("console.log.gz", gzip.compress(path.read_bytes())),
                       ("utf16.log", path.read_text().encode("utf-16")),
                       ("cr.log", path.read_bytes().replace(b"\n", b"\r")),
                       ("lines.json", path.read_bytes())]:
        other = tmp_path / "other" / name
        other.parent.mkdir(exist_ok=True)
        other.write_bytes(data)
        plan = shares.plan(events.roots_of(other), 4, min_bytes=1)
        assert plan is None, name
        other.unlink()


def test_a_daemon_process_reads_every_share_itself(tmp_path, share_everything, monkeypatch):
    # a pool's worker process is a daemon: starting a process of its own raises (multiprocessing)
    import multiprocessing.context

    def refused(self):
        raise AssertionError("daemonic processes are not allowed to have children")

    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", refused)
    run = _mixed_folder(tmp_path)
    one = events.build_events(run, jobs=1)
    share_everything.clear()
    _same(one, events.build_events(run, jobs=3))
    assert sorted(s.index for s in share_everything if s is not None) == [0, 1, 2]


@pytest.mark.parametrize("big", [False, True])
def test_numpy_is_imported_before_forking_only_for_a_run_that_will_count_with_it(tmp_path, big):
    """A run read in shares imports NumPy before it forks its readers when a share holds a file of
    NUMPY_MIN bytes or more (newline counts of large ranges), never for a run of small files: NumPy
    costs ~75 ms and ~15 MB a process."""
    import subprocess
    import sys

    run = tmp_path / "run"
    run.mkdir()
    line = "[rank0]:[E1122 07:44:17.000000000 ProcessGroupNCCL.cpp:632] step 5 loss 0.1\n"
    for k in range(6):
        (run / f"rank{k}.log").write_text(line.replace("rank0", f"rank{k}") * 50)
    if big:
        (run / "console.log").write_text(line * (prefilter_min() // len(line) + 10))
    code = ("import sys; from ncclforensics import events; events.SHARE_MIN_BYTES = 1; "
            "from ncclforensics.parse import prefilter; "
            "forks = []; "
            "import multiprocessing.context as c; real = c.ForkProcess._Popen; "
            "c.ForkProcess._Popen = staticmethod(lambda p: (forks.append('numpy' in sys.modules), real(p))[1]); "
            f"res = events.build_events({str(run)!r}, jobs=2); "
            "print(res.events.height, forks)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 1)
    assert int(out[0]) > 0
    assert out[1].strip() == ("[True]" if big else "[False]")


def prefilter_min() -> int:
    from ncclforensics.parse.prefilter import NUMPY_MIN

    return NUMPY_MIN
