"""The five incidents of the diagnose issue and the foundation's synthetic 8-rank run, end to end:
a log folder in FORMATS.md shapes -> analyze_path -> class, culprits, collective and fixes."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import polars as pl
import pytest
from fixtures.nccl_run import SITE, NcclRun

from ncclforensics.analysis import analyze_path
from ncclforensics.model import Finding, RootCause

LAYOUTS = ("console", "rank_files", "log_dir")
TRAIN = "/srv/train/train.py"
GRAD_NUMEL = 25_557_032  # one DDP gradient bucket


def verdict(path: Path) -> Finding:
    return analyze_path(path).diagnosis.verdict


def fix_text(v: Finding) -> list[str]:
    return [f"{f.title}\n{f.code}" for f in v.fixes]


def has_fix(v: Finding, title: str = "", code: str = "") -> bool:
    """A fix whose title matches the regex `title` and whose code contains `code`."""
    return any(re.search(title, f.title, re.I) and code in f.code for f in v.fixes)


def start_run(run: NcclRun, *, network: str = "IB", nccl_debug: bool = True) -> float:
    """torchrun banner on every node, NCCL communicator creation; returns the time training starts."""
    for node in range(run.nodes):
        run.omp_banner(node, 0)
    for r in range(run.world_size):
        run.app(r, f"initializing process group backend=nccl world_size={run.world_size}", 3 + r * 0.002)
        if nccl_debug:
            run.nccl_init(r, 6 + r * 0.003, network=network)
    return 12.0


# -- 1. rank 0's diagnostics at an epoch milestone ----------------------------------------------
def diagnostics_run(out: Path, *, layout: str, rank0_in_collective: bool) -> Path:
    run = NcclRun(world_size=8)
    t = start_run(run)
    # 2 collectives at start-up (DDP's parameter check and broadcast), then 7 per step: step 10000
    # ends at SeqNum 70002 and the gradient all-reduce of the next step is #70003
    t = run.progress(list(range(8)), range(9990, 10001), t, epoch=6)
    run.app(0, "epoch 7 milestone: running diagnostics (per-layer gradient and activation statistics)", t)
    hang_at = t + 600.04
    if rank0_in_collective:
        # the diagnostics end in all_gather_object: rank 0's SeqNum 70003 is a 1-element ALLGATHER
        run.timeout(0, seq=70003, op="ALLGATHER", numel_in=1, numel_out=8, at=hang_at - 0.5)
        run.status(0, seq=70003, enq=70003, done=70002, at=hang_at - 0.5)
        run.dump_signal(0, enq=70003, done=70002, at=hang_at - 0.3)
        run.abort(0, seq=70003, op="ALLGATHER", numel_in=1, numel_out=8, at=hang_at + 0.6)
        first = run.hang(waiting=list(range(1, 8)), seq=70003, op="ALLREDUCE", numel_in=GRAD_NUMEL,
                         numel_out=GRAD_NUMEL, at=hang_at, first=4)
        exits = dict.fromkeys(range(8), -6)
    else:
        first = run.hang(waiting=list(range(1, 8)), seq=70003, op="ALLREDUCE", numel_in=GRAD_NUMEL,
                         numel_out=GRAD_NUMEL, at=hang_at, lagging={0: (70002, 70002)}, first=4)
        exits = {**dict.fromkeys(range(1, 8), -6), 0: -15}
    run.torchrun_failure(exits, hang_at + 1.5, first=first)
    return run.write(out, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rank0_in_collective", [False, True], ids=["rank0-busy", "rank0-in-allgather"])
def test_incident1_rank0_diagnostics(tmp_path: Path, layout: str, rank0_in_collective: bool):
    v = verdict(diagnostics_run(tmp_path / "run", layout=layout, rank0_in_collective=rank0_in_collective))
    assert v.root_cause.value == "rank_divergence", v.title
    assert v.culprit_ranks == [0]
    assert (v.collective.op_type, v.collective.seq) == ("ALLREDUCE", 70003)
    assert has_fix(v, r"rank-conditional|rank-0-only", "dist.barrier()"), fix_text(v)
    assert has_fix(v, code="drop_last=True"), fix_text(v)
    assert has_fix(v, r"step count", "dist.all_gather("), fix_text(v)
    assert has_fix(v, r"timeout", "timeout=datetime.timedelta("), fix_text(v)


# -- 2. rank 0 saves a large checkpoint ----------------------------------------------------------
def checkpoint_run(out: Path, *, layout: str, save_finished: bool = False) -> Path:
    run = NcclRun(world_size=8, seed=2)
    t = start_run(run)
    t = run.progress(list(range(8)), range(36, 46), t, every=1.7)
    run.app(0, "saving checkpoint to /mnt/ckpt/run-0412/step_000045.pt (model + optimizer, 71.6 GB)", t)
    run.app(0, "consolidating optimizer state on rank 0", t + 4.2)
    if save_finished:
        run.app(0, "checkpoint saved in 41.3 s", t + 41.3)
        run.app(0, "running evaluation on 5000 samples", t + 41.4)
        lag_note = t + 41.4
    else:
        lag_note = t
    # ranks 1-7 went on to step 46: its first collective is the 1-element loss all-reduce, SeqNum 47
    hang_at = lag_note + 600.03 if save_finished else t + 600.03
    first = run.hang(waiting=list(range(1, 8)), seq=47, op="ALLREDUCE", numel_in=1, numel_out=1, at=hang_at,
                     lagging={0: (46, 46)}, queued=0, first=2)
    run.torchrun_failure({**dict.fromkeys(range(1, 8), -6), 0: -15}, hang_at + 1.5, first=first)
    return run.write(out, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_incident2_rank0_checkpoint_save(tmp_path: Path, layout: str):
    v = verdict(checkpoint_run(tmp_path / "run", layout=layout))
    assert v.root_cause.value == "checkpoint_save", v.title
    assert v.culprit_ranks == [0]
    assert (v.collective.op_type, v.collective.seq) == ("ALLREDUCE", 47)
    assert has_fix(v, r"save on rank 0.*barrier", "dist.barrier()"), fix_text(v)
    assert has_fix(v, r"asynchronous|distributed checkpoint", "dcp."), fix_text(v)
    assert has_fix(v, r"timeout longer than the save", "timeout="), fix_text(v)


def test_incident2_save_that_finished_is_not_the_cause(tmp_path: Path):
    v = verdict(checkpoint_run(tmp_path / "run", layout="rank_files", save_finished=True))
    assert v.root_cause.value != "checkpoint_save", v.title
    assert v.culprit_ranks == [0]


# -- 3. 8 nodes x 8 GPUs: the store hangs up during init ----------------------------------------
def store_lost_run(out: Path, *, layout: str) -> Path:
    run = NcclRun(world_size=64, nproc_per_node=8, seed=3)
    for node in range(run.nodes):
        run.omp_banner(node, node * 0.4)
    frames = [
        (TRAIN, 241, "<module>", "main()"),
        (TRAIN, 63, "main", 'dist.init_process_group(backend="nccl", timeout=timedelta(minutes=30))'),
        (f"{SITE}/torch/distributed/c10d_logger.py", 83, "wrapper", "return func(*args, **kwargs)"),
        (f"{SITE}/torch/distributed/c10d_logger.py", 97, "wrapper", "func_return = func(*args, **kwargs)"),
        (f"{SITE}/torch/distributed/distributed_c10d.py", 1520, "init_process_group",
         "store, rank, world_size = next(rendezvous_iterator)"),
        (f"{SITE}/torch/distributed/rendezvous.py", 269, "_env_rendezvous_handler",
         "store = _create_c10d_store("),
        (f"{SITE}/torch/distributed/rendezvous.py", 189, "_create_c10d_store", "return TCPStore("),
    ]
    exc = ("torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. "
           "Did the remote server shutdown or crash?")
    for r in range(run.world_size):
        at = 20 + run.node_of(r) * 0.4 + run.local_rank(r) * 0.01
        run.app(r, "initializing process group backend=nccl world_size=64 master=gpu-n01:29500", at - 5)
        run.traceback(r, frames, exc, at, prefixed=False)  # no `[rank<r>]: ` before init set the rank
    run.torchrun_failure({r: 1 for r in range(run.world_size)}, 22)
    return run.write(out, layout=layout)


@pytest.mark.parametrize("layout", ["console", "log_dir"])
def test_incident3_multinode_store_lost_at_init(tmp_path: Path, layout: str):
    v = verdict(store_lost_run(tmp_path / "run", layout=layout))
    assert v.root_cause.value == "network_init", v.title
    assert has_fix(v, code="MASTER_ADDR=10."), fix_text(v)
    assert has_fix(v, r"port.*reachable", "29500"), fix_text(v)
    assert has_fix(v, code="NCCL_SOCKET_IFNAME="), fix_text(v)
    assert has_fix(v, code="NCCL_IB_DISABLE=1"), fix_text(v)
    assert has_fix(v, r"one node, then two|preflight", "--nnodes 2"), fix_text(v)


# -- 4. a DataLoader worker dies on one rank --------------------------------------------------
def dataloader_run(out: Path, *, layout: str, signal: str) -> Path:
    run = NcclRun(world_size=8, seed=4)
    t = start_run(run)
    t = run.progress(list(range(8)), range(1200, 1210), t, epoch=2)
    worker_pid = 90114
    if signal == "bus":
        run.raw(5, ["ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
                    "shared memory (shm)."], t + 0.2)
        exc = (f"RuntimeError: DataLoader worker (pid {worker_pid}) is killed by signal: Bus error. It is possible "
               "that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.")
    else:
        run.dmesg(0, "pt_data_worker invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), "
                     "order=0, oom_score_adj=0", t)
        run.dmesg(0, f"Out of memory: Killed process {worker_pid} (pt_data_worker) total-vm:48213352kB, "
                     "anon-rss:39128844kB, file-rss:71204kB, shmem-rss:4194304kB, UID:1001 pgtables:81220kB "
                     "oom_score_adj:0", t + 0.1)
        exc = f"RuntimeError: DataLoader worker (pid {worker_pid}) is killed by signal: Killed. "
    frames = [
        (TRAIN, 241, "<module>", "main()"),
        (f"{SITE}/torch/distributed/elastic/multiprocessing/errors/__init__.py", 355, "wrapper",
         "return f(*args, **kwargs)"),
        (TRAIN, 171, "main", "for step, batch in enumerate(loader, start=start_step):"),
        (f"{SITE}/torch/utils/data/dataloader.py", 708, "__next__", "data = self._next_data()"),
        (f"{SITE}/torch/utils/data/dataloader.py", 1458, "_next_data", "idx, data = self._get_data()"),
        (f"{SITE}/torch/utils/data/dataloader.py", 1420, "_get_data", "success, data = self._try_get_data()"),
        (f"{SITE}/torch/utils/data/dataloader.py", 1251, "_try_get_data", "raise RuntimeError("),
    ]
    run.traceback(5, frames, exc, t + 0.5)
    run.torchrun_failure({5: 1, **{r: -15 for r in range(8) if r != 5}}, t + 1.5, first=5)
    return run.write(out, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("signal", "fix_title", "fix_code"), [
    ("kill", r"host memory", "num_workers="),
    ("bus", r"/dev/shm", "--shm-size="),
])
def test_incident4_dataloader_worker_died(tmp_path: Path, layout: str, signal: str, fix_title: str, fix_code: str):
    v = verdict(dataloader_run(tmp_path / "run", layout=layout, signal=signal))
    assert v.root_cause.value == "dataloader_abort", v.title
    assert v.culprit_ranks == [5]
    assert has_fix(v, fix_title, fix_code), fix_text(v)
    other = r"/dev/shm" if signal == "kill" else r"host memory"
    assert not has_fix(v, other), fix_text(v)


# -- 5. every launch crashes in DDP's NCCL init -------------------------------------------------
def ddp_init_run(out: Path, *, layout: str, attempts: int = 3, only_rank0: bool = False) -> Path:
    run = NcclRun(world_size=8, seed=5)
    frames = [
        (TRAIN, 241, "<module>", "main()"),
        (f"{SITE}/torch/distributed/elastic/multiprocessing/errors/__init__.py", 355, "wrapper",
         "return f(*args, **kwargs)"),
        (TRAIN, 88, "main", "model = DDP(model, device_ids=[local_rank])"),
        (f"{SITE}/torch/nn/parallel/distributed.py", 825, "__init__",
         "_verify_param_shape_across_processes(self.process_group, parameters)"),
        (f"{SITE}/torch/distributed/utils.py", 288, "_verify_param_shape_across_processes",
         "return dist._verify_params_across_processes(process_group, tensors, logger)"),
    ]
    exc = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
           "ProcessGroupNCCL.cpp:2106, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version "
           f"{run.nccl}\nncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
           "device error. \nLast error:\nsocketStartConnect: Connect to 10.20.5.11<45137> failed : Software caused "
           "connection abort")
    t = 0.0
    for attempt in range(attempts):
        run.omp_banner(0, t)
        for r in range(8):
            run.app(r, "initializing process group backend=nccl world_size=8", t + 3 + r * 0.002)
            run.app(r, "wrapping the model in DistributedDataParallel", t + 9 + r * 0.002)
            run.traceback(r, frames, exc, t + 11 + r * 0.01)
        last = attempt == attempts - 1
        run.torchrun_failure(dict.fromkeys(range(8), 1), t + 12, first=0, summary=last)
        if not last:
            run.agent_log(0, f"[default] Worker group FAILED. {attempts - 1 - attempt}/{attempts - 1} attempts "
                             "left; will restart worker group", t + 13, path="torch/distributed/elastic/agent/"
                             "server/api.py", line=713)
            run.restart()
        t += 20
    return run.write(out, layout=layout, local_ranks_filter={0} if only_rank0 else None)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_incident5_every_launch_fails_in_nccl_init(tmp_path: Path, layout: str):
    v = verdict(ddp_init_run(tmp_path / "run", layout=layout))
    assert_names_init_step(v)


def test_incident5_console_filtered_to_rank0(tmp_path: Path):
    """`torchrun --local-ranks-filter 0`: one rank's traceback is not one rank's crash."""
    v = verdict(ddp_init_run(tmp_path / "run", layout="console", only_rank0=True))
    assert_names_init_step(v)


def assert_names_init_step(v: Finding) -> None:
    assert v.root_cause.value == "network_init", v.title
    assert v.culprit_ranks == []
    text = f"{v.title} {v.message}"
    assert "DistributedDataParallel" in text or "DDP" in text, text
    assert "_verify_param_shape_across_processes" in text, text
    assert "socketStartConnect" in text, text
    assert has_fix(v, code="NCCL_DEBUG=INFO"), fix_text(v)
    assert has_fix(v, code="TORCH_DISTRIBUTED_DEBUG=DETAIL"), fix_text(v)
    assert has_fix(v, r"gloo", 'init_process_group("gloo")'), fix_text(v)


# -- foundation: a synthetic 8-rank NCCL run with one lagging rank ------------------------------
LAGGARD = 5
SEQ = 1408


def lagging_run(out: Path, *, layout: str) -> Path:
    run = NcclRun(world_size=8, seed=6, start=dt.datetime(2025, 3, 9, 22, 30, 0))
    t = start_run(run)
    t = run.progress(list(range(8)), range(195, 201), t, every=1.2)
    run.app(LAGGARD, "step 201: data loading stalled, waiting on shard 17 of /data/tokens", t + 0.1)
    first = run.hang(waiting=[r for r in range(8) if r != LAGGARD], seq=SEQ, op="ALLREDUCE", numel_in=GRAD_NUMEL,
                     numel_out=GRAD_NUMEL, at=t + 600.05, lagging={LAGGARD: (SEQ - 1, SEQ - 1)}, first=6)
    run.torchrun_failure({**{r: -6 for r in range(8) if r != LAGGARD}, LAGGARD: -15}, t + 602, first=first)
    return run.write(out, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_foundation_lagging_rank_event_table(tmp_path: Path, layout: str):
    res = analyze_path(lagging_run(tmp_path / "run", layout=layout))
    ev = res.ingest.events.with_columns(pl.col("kind").cast(pl.Utf8))
    waiting = set(range(8)) - {LAGGARD}
    timeouts = ev.filter(pl.col("kind") == "watchdog_timeout")
    assert set(timeouts["rank"].to_list()) == waiting
    assert set(zip(timeouts["seq"].to_list(), timeouts["op"].to_list(), strict=True)) == {(SEQ, "ALLREDUCE")}
    assert set(timeouts["group_rank"].to_list()) == waiting  # [Rank N] of the default PG = global rank
    status = ev.filter(pl.col("kind") == "watchdog_status")
    assert sorted(status["rank"].to_list()) == sorted(waiting)
    assert set(status["pg"].to_list()) == {"0"}
    assert set(status["seq"].to_list()) == {SEQ}
    dump = ev.filter((pl.col("kind") == "dump_signal") & (pl.col("rank") == LAGGARD))
    assert dump.height == 1 and dump["pg"].to_list() == ["0"]
    fr = res.context.frontier.filter(pl.col("rank") == LAGGARD).to_dicts()
    assert fr and fr[0]["last_enqueued"] == SEQ - 1 and fr[0]["timeout_seq"] is None

    v = res.diagnosis.verdict
    assert v.root_cause.value == "rank_divergence", v.title
    assert v.culprit_ranks == [LAGGARD]
    assert (v.collective.pg, v.collective.op_type, v.collective.seq) == ("0", "ALLREDUCE", SEQ)


def test_foundation_layouts_give_the_same_collective_rows(tmp_path: Path):
    """One console interleaving 8 ranks and one file per rank: the same watchdog rows either way."""
    def rows(layout: str) -> set[tuple]:
        res = analyze_path(lagging_run(tmp_path / layout, layout=layout))
        ev = res.ingest.events.with_columns(pl.col("kind").cast(pl.Utf8))
        ev = ev.filter(pl.col("kind").is_in(["watchdog_timeout", "watchdog_status", "dump_signal"]))
        return set(ev.select("kind", "rank", "group_rank", "pg", "seq", "op", "numel_in").iter_rows())

    console = rows("console")
    assert console == rows("rank_files") == rows("log_dir")
    assert {r[1] for r in console if r[0] == "dump_signal"} == set(range(8))


# -- multi-host consoles: local ranks mean something only on their own host --------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_xid_on_one_host_of_four_tee_consoles(tmp_path: Path, seed: int):
    """Four `<host>.log` tee consoles (`[default<lr>]:` = local rank) in one folder, the same GPU bus
    ids on every host, an Xid 79 on host 3's GPU 1 before every other rank times out: the culprit is
    global rank 9 (node 2, local 1), every time, never local rank 1 of another host."""
    run = NcclRun(world_size=16, nproc_per_node=4, seed=seed)
    t = start_run(run)
    t = run.progress(list(range(16)), range(100, 120), t, epoch=1)
    bus = run.bus_id(9)  # "2a000" on every host: PCI 0000:2a:00
    run.dmesg(2, f"NVRM: Xid (PCI:0000:{bus[:2]}:00): 79, pid='<unknown>', name=<unknown>, "
                 "GPU has fallen off the bus.", t + 5)
    first = run.hang(waiting=[r for r in range(16) if r != 9], seq=2403, op="ALLREDUCE", numel_in=GRAD_NUMEL,
                     numel_out=GRAD_NUMEL, at=t + 605, lagging={9: (2402, 2402)}, first=4)
    run.torchrun_failure(dict.fromkeys(range(16), -6), t + 607, first=first)
    path = run.write(tmp_path / "run", layout="console")
    assert {p.name for p in path.iterdir()} >= {f"{run.host(n)}.log" for n in range(4)}
    res = analyze_path(path)
    v = res.diagnosis.verdict
    assert (v.root_cause.value, v.culprit_ranks) == ("gpu_hardware", [9])
    ev = res.ingest.events.with_columns(pl.col("kind").cast(pl.Utf8))
    init = ev.filter(pl.col("kind") == "nccl_init")
    # every NCCL init row keeps the global rank its own line states
    assert all(x["rank"] == json_rank(x["extra"]) for x in init.to_dicts())


def json_rank(extra: str) -> int:
    import json

    return int(json.loads(extra)["nccl_rank"])


def test_sigabrt_known_only_from_the_torchrun_summary_names_no_culprit(tmp_path: Path):
    """A paste of torchrun's ChildFailedError alone (FORMATS.md §8.2 shape): rank 3 SIGABRT, the rest
    SIGTERM. The watchdog ends a timed-out rank with SIGABRT too, so this is no verdict: unknown,
    with a note that points at rank 3's own log."""
    paste = Path(__file__).parent / "fixtures" / "pastes" / "childfailed_sigabrt_only.txt"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / paste.name).write_bytes(paste.read_bytes())
    res = analyze_path(tmp_path / "run")
    v = res.diagnosis.verdict
    assert v.root_cause is RootCause.UNKNOWN and v.culprit_ranks == [], (v.root_cause, v.culprit_ranks)
    notes = res.diagnosis.facts.notes
    assert any("rank 3" in n and "SIGABRT" in n and "own log" in n for n in notes), notes


ISSUE_PASTE = Path(__file__).parent / "fixtures" / "pastes" / "issue_two_nodes_unprefixed_assert.txt"


@pytest.mark.parametrize("name", ["issue.txt", "issue.md"])
def test_issue_paste_without_rank_prefixes(tmp_path: Path, name: str):
    """An issue body (built from FORMATS.md §1, §3, §8.2 shapes, torch 2.0): node 1's worker raised an
    AssertionError printed without a rank prefix, torchrun reports rank 2 exiting with code 1; 30
    minutes later node 2's watchdog aborts rank 4 (SIGABRT). The root is rank 2's exception. Saved
    as issue.md, the folder holds no log file, so the document is read as one (with a note)."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / name).write_bytes(ISSUE_PASTE.read_bytes())
    res = analyze_path(tmp_path / "run")
    v = res.diagnosis.verdict
    assert (v.root_cause, v.rule, v.culprit_ranks) == (RootCause.RANK_CRASH, "RC001", [2])
    assert v.collective.op_type == "ALLREDUCE" and v.collective.seq == 88512
    notes = res.diagnosis.facts.notes
    assert any("rank 2" in n and "exiting with code 1" in n for n in notes), notes
    if name.endswith(".md"):
        assert any("issue.md" in n and "read as logs" in n for n in notes), notes


def test_documents_are_not_read_beside_logs(tmp_path: Path):
    """A README.md beside real logs stays unread (its prose would pass for evidence)."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rank0.log").write_text("[rank0]: step 10 loss 1.0\n")
    (tmp_path / "run" / "README.md").write_bytes(ISSUE_PASTE.read_bytes())
    res = analyze_path(tmp_path / "run")
    assert res.diagnosis.verdict.rule != "RC001"
    assert any(s.file == "README.md" and "not a log" in s.reason for s in res.ingest.skipped)


def test_restart_keeps_the_first_attempts_collective(tmp_path: Path):
    """torchrun --log-dir with a worker-group restart (FORMATS.md §2.2): SeqNums start again in
    attempt_1, so the collective the ranks hung in is attempt_0's."""
    line = ("[rank{r}]:[E0612 0{h}:10:00.000000000 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum={seq}, OpType=BARRIER, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
            "ran for 600010 milliseconds before timing out.\n")
    for attempt, seq, h in ((0, 72009, 1), (1, 12004, 3)):
        for r in (1, 2, 3):
            d = tmp_path / "run" / "node0" / "run0612_9f2kq1xa" / f"attempt_{attempt}" / str(r)
            d.mkdir(parents=True)
            (d / "stderr.log").write_text(line.format(r=r, seq=seq, h=h))
    res = analyze_path(tmp_path / "run")
    c = res.diagnosis.verdict.collective
    assert (c.op_type, c.seq) == ("BARRIER", 72009), c


def test_a_task_files_unprefixed_lines_are_its_ranks(tmp_path: Path):
    """Per-task output files (logs/job-N/task-R/output.txt, one process each): rank 0's app logger
    writes no rank prefix, its c10 lines do. Its last news is a checkpoint save while the others
    time out in the barrier after it (FORMATS.md §3, §4 shapes): CK001 names rank 0."""
    run = tmp_path / "run"
    d0 = run / "logs" / "job-1234" / "task-0"
    d0.mkdir(parents=True)
    (d0 / "output.txt").write_text(
        "09/08/2025 02:09:58 - train - INFO - step 12000 loss 1.912\n"
        "09/08/2025 02:09:59 - train - INFO - saving checkpoint to /mnt/nfs/ckpt/run42/step_12000.pt\n"
        "[rank0]:[E908 02:20:00.104118231 ProcessGroupNCCL.cpp:1598] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
        "Received a dump signal due to a collective timeout from  rank 3 and we will try our best to dump the "
        "debug info. Last enqueued NCCL work: 3200, last completed NCCL work: 3200.This is most likely caused "
        "by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is "
        "not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this "
        "can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications "
        "library (e.g. NCCL), etc.\n")
    for r in range(1, 4):
        d = run / "logs" / "job-1234" / f"task-{r}"
        d.mkdir(parents=True)
        (d / "output.txt").write_text(
            f"[rank{r}]:[E908 02:19:59.{r}00000000 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=3201, OpType=BARRIER, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=600000) ran for 600090 milliseconds before timing out.\n")
    v = analyze_path(run).diagnosis.verdict
    assert (v.root_cause, v.rule, v.culprit_ranks) == (RootCause.CHECKPOINT_SAVE, "CK001", [0])
    assert (v.collective.op_type, v.collective.seq) == ("BARRIER", 3201)


def test_a_console_of_several_workers_keeps_its_unprefixed_lines_rankless(tmp_path: Path):
    """A torchrun console without --tee (launcher lines, workers' prints unprefixed) where only rank 1
    printed a prefixed traceback: the other lines are not rank 1's."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "console.log").write_text(
        "W1122 07:44:17.428000 873 torch/distributed/run.py:874] Setting OMP_NUM_THREADS environment "
        "variable for each process to be 1 in default, to avoid your system being overloaded, please further "
        "tune the variable for optimal performance in your application as needed. \n"
        "saving checkpoint to /ckpt/step_5.pt\n"
        "[rank1]: RuntimeError: boom\n"
        "E1122 07:45:57.900000 873 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) "
        "local_rank: 1 (pid: 880) of binary: /usr/bin/python3\n")
    ev = analyze_path(tmp_path / "run").ingest.events
    saves = ev.filter(pl.col("kind") == "ckpt_save")
    assert saves.height == 1 and saves["rank"].to_list() == [None]


def test_log_dir_ties_a_busy_ranks_unprefixed_stdout_to_it(tmp_path: Path):
    """torchrun --log-dir, 2 nodes x 4: rank 6 (node 1, local rank 2) is saving a checkpoint (HF
    Trainer's unprefixed line in its stdout.log, nothing in stderr.log) while the others time out in
    a one-element all-reduce (FORMATS.md §2.2, §8.1, §22). Its files carry no rank prefix at all:
    the node's other local ranks give the offset (global ranks are consecutive per node)."""
    run = tmp_path / "run"
    for node in range(2):
        for lr in range(4):
            rank = node * 4 + lr
            d = run / f"gpu-n0{node + 1}" / "trainrun_ab12cd34" / "attempt_0" / str(lr)
            d.mkdir(parents=True)
            out = [f"{{'loss': 1.{rank}12, 'learning_rate': 2e-05, 'epoch': 0.98}}"]
            if rank == 6:
                (d / "stdout.log").write_text("\n".join(out) + "\nSaving model checkpoint to /out/checkpoint-1000\n")
                (d / "stderr.log").write_text("")
                continue
            (d / "stdout.log").write_text("\n".join(out) + "\n")
            (d / "stderr.log").write_text(
                f"[rank{rank}]:[E0612 03:10:00.{rank:09d} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught "
                "collective operation timeout: WorkNCCL(SeqNum=8801, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                "Timeout(ms)=1800000) ran for 1800071 milliseconds before timing out.\n")
    v = verdict(run)
    assert (v.root_cause, v.culprit_ranks) == (RootCause.CHECKPOINT_SAVE, [6]), (v.rule, v.title)
    assert (v.collective.op_type, v.collective.seq) == ("ALLREDUCE", 8801)
    ff = analyze_path(run).diagnosis.first_failure
    assert ff is not None and ff.rank == 6 and "Saving model checkpoint" in ff.text
