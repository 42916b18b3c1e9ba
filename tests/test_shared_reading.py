"""A run read by several processes (events.build_events(jobs=N)) gives exactly the table, skips, notes
and counts that one process gives: the walk's entries, and slices of files bigger than a unit, are cut
into units (ingest.shares); each process claims units as its walk reaches them (a file's slices from
its end), and the units' books join in walk order. A unit whose process dies is read again by the parent."""

from __future__ import annotations

import gzip
import importlib.util
import io
import itertools
import os
import shutil
import sys
import tarfile
import time
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
    """Shares of any size: the small runs of the tests are shared too. Records what this process reads
    itself: ("claims", the units it read) for its claiming walk (events._read_claimed), ("again", unit)
    for each unit read again here because the process that claimed it sent no books."""
    monkeypatch.setattr(events, "SHARE_MIN_BYTES", 1)
    here: list[tuple[str, object]] = []
    read, claimed = events._read, events._read_claimed

    def again(roots, run, progress, share=None):
        if share is not None:
            here.append(("again", share.index))
        return read(roots, run, progress, share)

    def walk(roots, run, progress, claims):
        out = claimed(roots, run, progress, claims)
        here.append(("claims", sorted(out)))  # a forked process's record stays in that process
        return out

    monkeypatch.setattr(events, "_read", again)
    monkeypatch.setattr(events, "_read_claimed", walk)
    return here


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 32 KiB (and a 4 KiB head): a file of a few hundred KiB is cut into slices."""
    monkeypatch.setattr(decode, "CHUNK_SIZE", 32 << 10)
    monkeypatch.setattr(decode, "HEAD_SIZE", 4 << 10)


def _one_share_here(here: list) -> None:
    """This process walked the run once, claiming units, and read none again (every forked process
    sent its books)."""
    assert [what for what, _ in here] == ["claims"], here
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


def test_many_files_make_more_units_read_as_one(tmp_path, share_everything, monkeypatch):
    """A run of many small files is cut into more units (about FILES_PER_UNIT files each or fewer: the last unit
    is what the other processes wait for); read so, it gives the table of one reading."""
    run = _mixed_folder(tmp_path)
    few = shares.plan(events.roots_of(run), 2, min_bytes=1, per_process=1)
    monkeypatch.setattr(shares, "FILES_PER_UNIT", 1)
    plan = shares.plan(events.roots_of(run), 2, min_bytes=1, per_process=1)
    assert len(plan) > len(few) == 2
    one = events.build_events(run, jobs=1)
    share_everything.clear()
    _same(one, events.build_events(run, jobs=2))
    _one_share_here(share_everything)


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

    def dies(roots, run, units, table, me, conn, task=None):
        with table.get_lock():  # every unit is claimed by the forked processes, which then die
            for u in range(len(units)):
                if table[u] < 0:
                    table[u] = me
        os._exit(3)  # as if killed: the parent gets no books

    claimed = events._read_claimed

    def after_the_claims(roots, run, progress, claims):
        deadline = time.monotonic() + 30
        while any(claims.table[u] < 0 for u in range(len(claims.units))) and time.monotonic() < deadline:
            time.sleep(0.01)
        return claimed(roots, run, progress, claims)

    monkeypatch.setattr(events, "_share_worker", dies)
    monkeypatch.setattr(events, "_read_claimed", after_the_claims)
    share_everything.clear()
    _same(one, events.build_events(run, jobs=3))
    plan = shares.plan(events.roots_of(run), 3, min_bytes=1, per_process=shares.UNITS_PER_PROCESS)
    assert sorted(u for what, u in share_everything if what == "again") == list(range(len(plan)))


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
    plan = shares.plan(events.roots_of(run), 3, min_bytes=1, per_process=shares.UNITS_PER_PROCESS)
    assert share_everything == [("claims", list(range(len(plan))))]  # every unit claimed here, in one walk


@pytest.mark.parametrize("big", ["none", "file", "run"])
def test_numpy_is_imported_before_forking_only_for_a_run_that_will_count_with_it(tmp_path, big):
    """A run read in shares imports NumPy before it forks its readers when a share holds a file of
    NUMPY_MIN bytes or more (newline counts of large ranges), or the run has NUMPY_RUN_BYTES (its
    files' counts from NUMPY_SMALL bytes on then use it; lowered here), never for a small run of small
    files: NumPy costs ~75 ms and ~15 MB a process."""
    import subprocess
    import sys

    run = tmp_path / "run"
    run.mkdir()
    line = "[rank0]:[E1122 07:44:17.000000000 ProcessGroupNCCL.cpp:632] step 5 loss 0.1\n"
    for k in range(6):
        (run / f"rank{k}.log").write_text(line.replace("rank0", f"rank{k}") * 50)
    if big == "file":
        (run / "console.log").write_text(line * (prefilter_min() // len(line) + 10))
    run_bytes = 1000 if big == "run" else "events.NUMPY_RUN_BYTES"
    code = ("import sys; from ncclforensics import events; events.SHARE_MIN_BYTES = 1; "
            f"events.NUMPY_RUN_BYTES = {run_bytes}; "
            "from ncclforensics.parse import prefilter; "
            "forks = []; "
            "import multiprocessing.context as c; real = c.ForkProcess._Popen; "
            "c.ForkProcess._Popen = staticmethod(lambda p: (forks.append('numpy' in sys.modules), real(p))[1]); "
            f"res = events.build_events({str(run)!r}, jobs=2); "
            "print(res.events.height, forks)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 1)
    assert int(out[0]) > 0
    assert out[1].strip() == ("[False]" if big == "none" else "[True]")


@pytest.mark.parametrize(("aside", "shared"), [(False, True), (True, True), (True, False)])
def test_forked_readers_import_polars_only_for_the_work_beside(tmp_path, aside, shared):
    """The reading processes make rows, never a table: a shared reading forks them before polars is
    imported (the parent imports the table's modules while they read), unless one of them also does
    the work beside the reading (the several-runs check, which uses polars): then it is imported
    once, before forking; so it is for the process a run too small to share forks for that work
    alone. The table is the same either way."""
    import subprocess
    import sys

    run = _mixed_folder(tmp_path)
    check = "lambda: 'checked'" if aside else "None"
    code = (f"import sys; from ncclforensics import events; events.SHARE_MIN_BYTES = {1 if shared else 10**12}; "
            "forks = []; "
            "import multiprocessing.context as c; real = c.ForkProcess._Popen; "
            "c.ForkProcess._Popen = staticmethod(lambda p: (forks.append('polars' in sys.modules), real(p))[1]); "
            f"res = events.build_events({str(run)!r}, jobs=2, aside={check}); "
            "print(res.events.height, forks, res.aside.result() if res.aside else None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 1)
    assert int(out[0]) == events.build_events(run, jobs=1).events.height
    assert out[1].strip() == ("[True] checked" if aside else "[False] None")


def test_event_columns_are_the_schemas():
    """model.EVENT_COLUMNS (the names, known without polars) are EVENT_SCHEMA's, in its order."""
    from ncclforensics import model

    assert tuple(model.EVENT_SCHEMA) == model.EVENT_COLUMNS
    assert set(model.MEANING_COLUMNS) <= set(model.EVENT_COLUMNS)
    assert set(model.EVENT_COLUMNS) >= model.INT_COLUMNS


def prefilter_min() -> int:
    from ncclforensics.parse.prefilter import NUMPY_MIN

    return NUMPY_MIN


def test_units_go_to_the_process_that_reaches_them_first(tmp_path, share_everything):
    """A unit another process has claimed is skipped by this one's walk; the units' books, joined in
    unit order, whoever read them, are one reading's."""
    import multiprocessing

    run = _mixed_folder(tmp_path)
    one = events.build_events(run, jobs=1)
    roots = events.roots_of(run)
    plan = shares.plan(roots, 2, min_bytes=1, per_process=3)
    assert plan is not None and plan.procs == 2 and len(plan) >= 4
    table = multiprocessing.Array("i", [-1] * len(plan))
    theirs = {1, len(plan) - 1}
    for u in theirs:
        table[u] = 1  # claimed by another process before this one got there
    here = events._read_claimed(roots, one.run, None, shares.Claims(list(plan), table, 0))
    assert set(here) == set(range(len(plan))) - theirs
    assert all(table[u] == 0 for u in here)  # claimed by this process as its walk reached them
    books = events._new_books(one.run)
    for u, unit in enumerate(plan):
        books.merge(here[u] if u in here else events._read(roots, one.run, None, unit), None)
    _same(one, books.finish())


def test_a_file_cut_into_slices_is_read_from_its_ends(tmp_path, small_chunks):
    """A console's ends hold its rare lines (every rank's start-up, its teardown and tracebacks: the
    lines that cost most to read): its last slice and its first are claimed first, then the middle from
    the end, so the slice claimed last, which the other processes may wait for, is a cheap one."""
    import multiprocessing

    path = _console(tmp_path)
    roots = events.roots_of(path)
    plan = shares.plan(roots, 2, min_bytes=1, per_process=3)
    assert plan is not None and len(plan) == 6 and all(len(sh.slices) == 1 for sh in plan)
    table = multiprocessing.Array("i", [-1] * len(plan))
    claims = shares.Claims(list(plan), table, 0)
    assert claims.owns(0, 0)  # every process that may read a slice opens the file
    order = []
    for sl in claims.slices_of(0, 0):
        order.append((sl.k, claims.current))
    assert [k for k, _ in order] == [5, 0, 4, 3, 2, 1] and [u for _, u in order] == [5, 0, 4, 3, 2, 1]
    other = shares.Claims(list(plan), table, 1)
    assert not other.owns(0, 0) and list(other.slices_of(0, 0)) == []  # all taken: nothing left to read
    assert other.books_entry(0, 0) is False and claims.books_entry(0, 0) is True  # the last slice's reader


def _chunks_of(stream, head: bytes, size: int, keep_tail: bool = True) -> list[bytes]:
    return list(decode.iter_chunks(stream, head, size, keep_tail=keep_tail))


class _ReadOnly:
    """A stream with read() only (a decompressor's wrapper): chunks are joined from fresh reads."""

    def __init__(self, data: bytes) -> None:
        self._f = io.BytesIO(data)

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n)


@pytest.mark.parametrize("keep_tail", [True, False])
def test_chunks_read_into_a_buffer_are_the_chunks_of_fresh_reads(tmp_path, keep_tail):
    """iter_chunks reads a file into a kept buffer (one copy a chunk): the chunks are the ones a
    stream without readinto gives, cut at the same places (ingest.shares cuts files where they are)."""
    lines = [b"x" * (i * 37 % 300) + b"\x00" * (i % 7 == 0) + b"\n" for i in range(4000)]
    lines[1000] = b"y" * 5000 + b"\n"  # longer than a chunk: cut inside the line
    data = b"".join(lines) + b"no newline at the end"
    path = tmp_path / "f.log"
    path.write_bytes(data)
    size, head_size = 4096, 1000
    with open(path, "rb") as f:
        head = f.read(head_size)
        buffered = _chunks_of(f, head, size, keep_tail)
    fresh = _chunks_of(_ReadOnly(data[head_size:]), data[:head_size], size, keep_tail)
    assert buffered == fresh
    assert b"".join(fresh) == (data if keep_tail else data[: data.rfind(b"\n") + 1]).replace(b"\x00", b"")
    assert len(buffered) > 100 and all(c.endswith(b"\n") for c in buffered[:-1] if len(c) < size)


def test_a_slice_is_read_into_the_buffer_up_to_its_end(tmp_path):
    from ncclforensics.ingest.formats import _Capped

    data = b"".join(b"line %d\n" % i for i in range(3000))
    path = tmp_path / "f.log"
    path.write_bytes(data)
    with open(path, "rb") as f:
        f.seek(100)
        capped = _capped_chunks = _chunks_of(_Capped(f, 9000), b"", 4096, keep_tail=False)
    with open(path, "rb") as f:
        f.seek(100)
        fresh = _chunks_of(_ReadOnly(f.read(9000)), b"", 4096, keep_tail=False)
    assert capped == fresh and _capped_chunks


def test_the_chunk_buffer_is_kept_for_the_next_file(tmp_path):
    path = tmp_path / "f.log"
    path.write_bytes(b"a line\n" * 10000)
    with open(path, "rb") as f:
        _chunks_of(f, b"", 8192)
    kept = list(decode._BUFFERS)
    assert kept  # given back once the file was read
    with open(path, "rb") as f:
        _chunks_of(f, b"", 8192)
    assert any(any(b is k for k in kept) for b in decode._BUFFERS)  # the same buffer, not a new one


def test_what_the_line_work_remembers_is_dropped_before_the_table(tmp_path, monkeypatch):
    """Envelopes, signature matches and `extra` texts remembered while reading are dropped once the run
    is read, before its table is made (the table's making is the peak of memory)."""
    from ncclforensics.ingest import envelope
    from ncclforensics.parse import lines
    from ncclforensics.parse.signatures import load_signatures

    seen: list[tuple[int, int]] = []
    made = events._Books.finish

    def finish(self):
        seen.append((len(envelope._peeled), len(load_signatures()._matches)))
        return made(self)

    monkeypatch.setattr(events._Books, "finish", finish)
    assert events.build_events(_mixed_folder(tmp_path), jobs=1).events.height > 0
    assert seen[0][0] > 0 and seen[0][1] > 0  # the reading remembered lines
    assert not envelope._peeled and not envelope._SHAPES and not lines._EXTRA_MEMO
    assert not load_signatures()._matches and not load_signatures()._shapes
