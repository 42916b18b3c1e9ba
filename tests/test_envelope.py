"""Envelope peeling (FORMATS.md §1): every prefix shape yields its body, rank, host, pid and time."""

from __future__ import annotations

import datetime as dt
import time

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ncclforensics.ingest.envelope import ANSI, UNKNOWN_YEAR, peel, peel_all

Y = UNKNOWN_YEAR  # year-less stamps (c10 header, torch Python logging, syslog)
WATCHDOG = (
    "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7731, OpType=_REDUCE_SCATTER_BASE, "
    "NumelIn=33554432, NumelOut=4194304, Timeout(ms)=600000) ran for 600118 milliseconds before timing out."
)
XID79 = "NVRM: Xid (PCI:0000:4e:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def case(cid: str, line: str, body: str, **want: object) -> pytest.param:
    """One line and everything its envelope must tell; fields not named must stay None."""
    full = {"body": body, "rank": None, "local_rank": None, "host": None, "pid": None, "ts": None}
    full.update(want)
    return pytest.param(line, full, id=cid)


CASES = [
    # -- torchrun tee and rank prefixes (§1.5, §1.6) --------------------------------------------
    case("tee", "[default3]:step 4 loss 0.1075", "step 4 loss 0.1075", local_rank=3),
    case("tee-other-role", "[worker3|1]:loading shard 7", "loading shard 7", local_rank=3),
    case("tee-then-python-rank", "[default1]:[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/"
         "transport/tcp/unbound_buffer.cc:78] Timed out waiting 15000ms for recv operation to complete",
         "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
         "Timed out waiting 15000ms for recv operation to complete", rank=1, local_rank=1),
    case("python-rank", "[rank0]: Traceback (most recent call last):", "Traceback (most recent call last):", rank=0),
    case("python-rank-frame", "[rank0]:     main()", "    main()", rank=0),
    case("python-rank-leading-space", "[rank5]:  Original exception: ", " Original exception: ", rank=5),
    # -- c10 C++ header, three generations (§1.2) ------------------------------------------------
    case("c10-le-2.1", "[E ProcessGroupNCCL.cpp:833] [Rank 6] NCCL watchdog thread terminated with exception: "
         "CUDA error: unspecified launch failure",
         "[Rank 6] NCCL watchdog thread terminated with exception: CUDA error: unspecified launch failure"),
    case("c10-2.2", "[rank6]:[E ProcessGroupNCCL.cpp:1402] [Rank 6] NCCL watchdog thread terminated with exception: "
         "unknown", "[Rank 6] NCCL watchdog thread terminated with exception: unknown", rank=6),
    case("c10-2.4-mmdd3-c10d", "[W309 22:41:07.318204517 socket.cpp:601] [c10d] The server socket has failed to "
         "bind to [::]:29611 (errno: 98 - Address already in use).",
         "The server socket has failed to bind to [::]:29611 (errno: 98 - Address already in use).",
         ts=dt.datetime(Y, 3, 9, 22, 41, 7)),
    case("c10-2.13-before-init", "[E1122 07:47:43.382389281 socket.cpp:1028] [c10d] The client socket has timed out "
         "after 10000ms while trying to connect to (127.0.0.2, 47983).",
         "The client socket has timed out after 10000ms while trying to connect to (127.0.0.2, 47983).",
         ts=dt.datetime(Y, 11, 22, 7, 47, 43)),
    case("c10-rank-keeps-group-rank", "[rank14]:[E0603 09:27:31.902447158 ProcessGroupNCCL.cpp:665] [Rank 6] x",
         "[Rank 6] x", rank=14, ts=dt.datetime(Y, 6, 3, 9, 27, 31)),
    # -- torch Python logging, all shapes (§1.4) -------------------------------------------------
    case("pylog-le-2.0", "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 2 "
         "(pid: 40917) of binary: /opt/venv/bin/python3",
         "failed (exitcode: -9) local_rank: 2 (pid: 40917) of binary: /opt/venv/bin/python3"),
    case("pylog-2.1", "[2025-02-17 06:30:12,408] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending "
         "process 40915 closing signal SIGTERM", "Sending process 40915 closing signal SIGTERM",
         ts=dt.datetime(2025, 2, 17, 6, 30, 12, 408000)),
    case("pylog-2.3-thread-id", "W0217 06:30:12.408000 139871624029184 torch/distributed/run.py:779] Setting "
         "OMP_NUM_THREADS environment variable for each process to be 1 in default",
         "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default",
         ts=dt.datetime(Y, 2, 17, 6, 30, 12, 408000)),
    case("pylog-2.5-pid", "E1122 07:51:43.120000 2534 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
         "(exitcode: -9) local_rank: 3 (pid: 2540) of binary: /opt/conda/envs/train/bin/python3",
         "failed (exitcode: -9) local_rank: 3 (pid: 2540) of binary: /opt/conda/envs/train/bin/python3",
         pid=2534, ts=dt.datetime(Y, 11, 22, 7, 51, 43, 120000)),
    case("pylog-empty-message", "W1122 07:44:17.428000 873 torch/distributed/run.py:874] ", "",
         pid=873, ts=dt.datetime(Y, 11, 22, 7, 44, 17, 428000)),
    case("pylog-under-rank", "[rank2]:I1122 07:44:19.100000 880 torch/distributed/distributed_c10d.py:600] "
         "Added key: store_based_barrier_key:1 to store for rank: 2",
         "Added key: store_based_barrier_key:1 to store for rank: 2",
         rank=2, pid=880, ts=dt.datetime(Y, 11, 22, 7, 44, 19, 100000)),
    # -- Slurm, MPI, Ray (§1.7) ------------------------------------------------------------------
    case("srun-label", " 9: [rank9]:[E0309 22:41:07.402918350 ProcessGroupNCCL.cpp:1750] [Rank 9] To avoid data "
         "inconsistency, we are taking the entire process down.",
         "[Rank 9] To avoid data inconsistency, we are taking the entire process down.",
         rank=9, ts=dt.datetime(Y, 3, 9, 22, 41, 7)),
    case("srun-label-2-digits", "15: step 4 loss 0.1075", "step 4 loss 0.1075"),
    case("srun-heterogeneous", "P1 7: step 4 loss 0.1075", "step 4 loss 0.1075"),
    case("srun-traceback-frame", ' 3:   File "/srv/train/train.py", line 211, in main',
         '  File "/srv/train/train.py", line 211, in main'),
    case("srun-not-after-rank", "[rank0]: 12: not a label", "12: not a label", rank=0),
    case("mpi-tag", "[1,7]<stderr>:[rank7]: RuntimeError: boom", "RuntimeError: boom", rank=7),
    case("mpi-timestamp", "[Tue Jun 10 03:17:42 2025]<stdout>:step 3", "step 3"),
    case("ray-actor-ip", "(RayWorkerWrapper pid=61833, ip=10.42.7.19) [rank5]:[E0412 18:02:44.771045213 "
         "ProcessGroupNCCL.cpp:1750] [Rank 1] Some NCCL operations have failed or timed out.",
         "[Rank 1] Some NCCL operations have failed or timed out.",
         rank=5, pid=61833, host="10.42.7.19", ts=dt.datetime(Y, 4, 12, 18, 2, 44)),
    case("ray-task", "(pid=4242) loading shard 7", "loading shard 7", pid=4242),
    case("hostrank-template", "gpu-q17:12: [rank12]:[E0914 02:11:53.518220741 ProcessGroupNCCL.cpp:665] [Rank 4] x",
         "[Rank 4] x", rank=12, host="gpu-q17", ts=dt.datetime(Y, 9, 14, 2, 11, 53)),
    case("python-warning-is-not-hostrank", "train.py:45: UserWarning: the batch is empty",
         "train.py:45: UserWarning: the batch is empty"),
    # -- stacked prefixes and wrapper timestamps (§1.1, §1.9) ----------------------------------
    case("stacked", "2025-09-14 02:11:53 1: [default3]:[rank11]:[E0914 02:11:53.518220741 ProcessGroupNCCL.cpp:665] "
         + WATCHDOG, WATCHDOG, rank=11, local_rank=3, ts=dt.datetime(2025, 9, 14, 2, 11, 53)),
    case("viewer-line-number", "[40218] [rank0]: Traceback (most recent call last):",
         "Traceback (most recent call last):", rank=0),
    case("iso-with-zone", "2025-09-14T02:11:53.250+02:00 [default0]:step 4", "step 4", local_rank=0,
         ts=dt.datetime(2025, 9, 14, 0, 11, 53, 250000)),
    # a log collector's export: the stamp, a tab, the line (Grafana Explore's "Download logs" text)
    case("collector-tab", "2024-05-02 17:40:11.318\tgpu-w3:4410:4410 [1] NCCL INFO Using network IB",
         "NCCL INFO Using network IB", host="gpu-w3", pid=4410, ts=dt.datetime(2024, 5, 2, 17, 40, 11, 318000)),
    # -- NCCL_DEBUG heads (§10.1) ----------------------------------------------------------------
    case("nccl-info", "gpu-q17:58213:58213 [5] NCCL INFO Bootstrap : Using ib0:10.42.7.17<0>",
         "NCCL INFO Bootstrap : Using ib0:10.42.7.17<0>", host="gpu-q17", pid=58213),
    case("nccl-warn-2.26-timestamp", "[2025-07-30 11:04:58] gpu-q17:58213:58391 [5] transport/net_ib.cc:1702 NCCL "
         "WARN NET/IB : Got completion from peer 10.42.7.18<60117> with status=12 opcode=2 len=0 vendor err 244 (Recv)",
         "NCCL WARN NET/IB : Got completion from peer 10.42.7.18<60117> with status=12 opcode=2 len=0 vendor err 244 "
         "(Recv)", host="gpu-q17", pid=58213, ts=dt.datetime(2025, 7, 30, 11, 4, 58)),
    case("nccl-warn-function", "gpu-q17:58213:58391 [5] misc/socket.cc:538 (socketProgress) NCCL WARN "
         "socketProgress: Connection closed by remote peer gpu-q18<60117>",
         "NCCL WARN socketProgress: Connection closed by remote peer gpu-q18<60117>", host="gpu-q17", pid=58213),
    case("nccl-under-tee", "[default5]:gpu-q17:58213:58391 [5] NCCL INFO NCCL version 2.21.5+cuda12.4",
         "NCCL INFO NCCL version 2.21.5+cuda12.4", local_rank=5, host="gpu-q17", pid=58213),
    # -- kernel logs (§1.9, §12) -----------------------------------------------------------------
    case("dmesg-raw", "[ 912734.602118] " + XID79, XID79),
    case("dmesg-T", "[Tue Jun 10 03:17:42 2025] " + XID79, XID79, ts=dt.datetime(2025, 6, 10, 3, 17, 42)),
    case("dmesg-T-day-padded", "[Sun Jun  1 03:17:42 2025] " + XID79, XID79, ts=dt.datetime(2025, 6, 1, 3, 17, 42)),
    case("dmesg-iso", "2025-06-10T03:17:42,604118+02:00 " + XID79, XID79,
         ts=dt.datetime(2025, 6, 10, 1, 17, 42, 604118)),
    case("dmesg-decode", "kern  :err   : 2025-06-10T03:17:42,604118+00:00 " + XID79, XID79,
         ts=dt.datetime(2025, 6, 10, 3, 17, 42, 604118)),
    case("dmesg-decode-raw-uptime", "kern  :info  : [ 88412.907331] " + XID79, XID79),
    # dmesg -H / --reltime (util-linux dmesg.c): the minute stamp, then deltas to the line before
    case("dmesg-H-minute", "[Jun10 03:17] " + XID79, XID79, ts=dt.datetime(Y, 6, 10, 3, 17)),
    case("dmesg-H-minute-day-padded", "[Jun01 03:17] " + XID79, XID79, ts=dt.datetime(Y, 6, 1, 3, 17)),
    case("dmesg-H-delta", "[  +0.000316] " + XID79, XID79, ts=None),
    case("dmesg-H-delta-wide", "[ +12.004316] " + XID79, XID79, ts=None),
    case("dmesg-H-delta-compact", "[+0.000316]" + XID79, XID79, ts=None),
    case("dmesg-show-delta", "[<    0.000316>] " + XID79, XID79, ts=None),
    case("syslog", "Jun 10 03:17:42 gpu-q17 kernel: " + XID79, XID79, host="gpu-q17",
         ts=dt.datetime(Y, 6, 10, 3, 17, 42)),
    case("syslog-with-uptime", "Jun 10 03:17:42 gpu-q17 kernel: [ 912734.602118] " + XID79, XID79, host="gpu-q17",
         ts=dt.datetime(Y, 6, 10, 3, 17, 42)),
    case("journal-short-iso", "2025-06-10T03:17:42+0200 gpu-q17 kernel: " + XID79, XID79, host="gpu-q17",
         ts=dt.datetime(2025, 6, 10, 1, 17, 42)),
    case("kmsg", "4,88213,912734602118,-;" + XID79, XID79),
    case("kmsg-caller", "4,88214,912734602200,-,caller=T812;" + XID79, XID79),
    # -- application formats of the corpus (§1.5) ------------------------------------------------
    case("app-logging", "2026-11-22 07:51:58,657 INFO [rank1] train: initializing process group backend=gloo",
         "train: initializing process group backend=gloo", rank=1,
         ts=dt.datetime(2026, 11, 22, 7, 51, 58, 657000)),
    case("app-tee-rank", "[default2]:[rank 2] step 1/12 loss=0.0526", "step 1/12 loss=0.0526",
         rank=2, local_rank=2),
    case("app-us-date", "11/22/2026 07:50:25 - train - ERROR - data loading failed at step 10",
         "data loading failed at step 10", ts=dt.datetime(2026, 11, 22, 7, 50, 25)),
    case("app-rank-of-world", "[Rank 0/4] INFO: saving checkpoint", "saving checkpoint", rank=0),
]


@pytest.mark.parametrize(("line", "want"), CASES)
def test_peel(line: str, want: dict) -> None:
    envs = peel_all(ANSI.sub("", line))
    assert len(envs) == 1
    env = envs[0]
    got = {k: getattr(env, k) for k in want}
    assert got == want


def test_srun_label_is_the_task_not_the_rank() -> None:
    env = peel(" 9: [rank11]: RuntimeError: boom")
    assert (env.task, env.rank, env.body) == (9, 11, "RuntimeError: boom")
    assert peel("P1 7: x").task == 7


def test_dmesg_uptime_is_kept_apart_from_wall_time() -> None:
    assert peel("[ 912734.602118] " + XID79).uptime == pytest.approx(912734.602118)
    assert peel("4,88213,912734602118,-;" + XID79).uptime == pytest.approx(912734.602118)
    assert peel("kern  :info  : [ 88412.907331] x").uptime == pytest.approx(88412.907331)


def test_nccl_device_is_not_a_rank() -> None:
    env = peel("gpu-q17:58213:58391 [5] NCCL INFO Bootstrap : Using ib0:10.42.7.17<0>")
    assert (env.nccl_dev, env.rank, env.local_rank) == (5, None, None)


def test_agent_lines_are_marked() -> None:
    assert peel("W1122 07:44:23.407000 873 torch/distributed/elastic/multiprocessing/api.py:1028] x").agent
    assert peel("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1)").agent
    assert not peel("[rank0]:[E1122 07:44:23.407000001 ProcessGroupGloo.cpp:67] x").agent


def test_app_rank_of_world_gives_the_world_size() -> None:
    assert peel("[Rank 0/4] INFO: saving checkpoint").world == 4


# -- ANSI colour (§1.8) ----------------------------------------------------------------------------

RAY_WATCHDOG = ("(RayWorkerWrapper pid=61833){reset} [rank5]:[E0412 18:02:44.770991032 ProcessGroupNCCL.cpp:665] "
                "[Rank 1] Watchdog caught collective operation timeout")


@pytest.mark.parametrize("colour", ["\x1b[36m", "[36m"], ids=["with-esc", "esc-lost"])
def test_ansi_is_removed_before_peeling(colour: str) -> None:
    reset = colour.replace("36", "0")
    line = colour + RAY_WATCHDOG.format(reset=reset)
    (env,) = peel_all(ANSI.sub("", line))
    assert (env.pid, env.rank, env.body) == (61833, 5, "[Rank 1] Watchdog caught collective operation timeout")


def test_ansi_lost_esc_after_a_word() -> None:
    assert ANSI.sub("", "[1;31mERROR[0m: rank 3 failed") == "ERROR: rank 3 failed"
    assert peel(ANSI.sub("", "[31mERROR[0m: rank 3 failed")).body == "rank 3 failed"


def test_ansi_leaves_bracketed_text_alone() -> None:
    for text in ("eta [10m] left", "TensorShape=[1024]", "[rank3]:", "[E0114 03:52:10.044127601 x.cpp:1] "):
        assert ANSI.sub("", text) == text


# -- progress bars: CRs and envelopes glued behind bar text (§1.8) ----------------------------------

GLUED_TIMEOUT = ("[rank0]:[E0114 03:52:10.044127601 ProcessGroupNCCL.cpp:665] [Rank 0] Watchdog caught collective "
                 "operation timeout: WorkNCCL(SeqNum=3841, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                 "Timeout(ms)=1800000) ran for 1800077 milliseconds before timing out.")


def test_tqdm_glued_header_is_split() -> None:
    bar = "step 1920/8000 [08:17<26:14, 3.86it/s, loss=0.712]"
    first, tail = peel_all(bar + GLUED_TIMEOUT)
    assert first.body == bar
    assert tail.body.startswith("[Rank 0] Watchdog caught collective operation timeout")
    assert (tail.rank, tail.ts) == (0, dt.datetime(Y, 1, 14, 3, 52, 10))


def test_tqdm_glued_under_tee_keeps_the_local_rank_and_writer_key() -> None:
    envs = peel_all("[default0]:step 1920/8000 [08:17<26:14, 3.86it/s]" + GLUED_TIMEOUT)
    assert [e.local_rank for e in envs] == [0, 0]
    assert envs[1].rank == 0
    # the same key as an ordinary line of this writer, so multi-line blocks group together
    assert envs[1].key == peel("[default0]:" + GLUED_TIMEOUT).key


def test_carriage_returns_split_and_inherit_the_launcher_prefix() -> None:
    line = (" 0:  50%|#####     | 5/10 [00:01<00:01,  4.95it/s]\r 60%|######    | 6/10 [00:01<00:00,  4.96it/s]\r"
            + GLUED_TIMEOUT)
    envs = peel_all(line)
    assert len(envs) == 3
    assert [e.task for e in envs] == [0, 0, 0]
    assert envs[1].body.startswith(" 60%|######")
    last = envs[-1]
    assert (last.rank, last.body[:8]) == (0, "[Rank 0]")
    assert last.key == peel(" 0: " + GLUED_TIMEOUT).key


def test_glued_python_logging_header() -> None:
    line = ("100%|##########| 10/10 [00:02<00:00,  4.97it/s]W1122 07:44:23.407000 873 "
            "torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 876 closing signal SIGTERM")
    bar, tail = peel_all(line)
    assert bar.body.startswith("100%|")
    assert (tail.body, tail.pid, tail.agent) == ("Sending process 876 closing signal SIGTERM", 873, True)


def test_two_glued_headers_in_one_line() -> None:
    line = "10%|#[rank1]: RuntimeError: first[rank1]:[E0114 03:52:10.044127601 ProcessGroupNCCL.cpp:665] second"
    assert [e.body for e in peel_all(line)] == ["10%|#", "RuntimeError: first", "second"]


def test_crlf_and_blank_segments() -> None:
    (env,) = peel_all("[rank0]: RuntimeError: boom\r")
    assert (env.rank, env.body) == (0, "RuntimeError: boom")


def test_peeling_is_bounded_on_hostile_lines() -> None:
    t0 = time.perf_counter()
    env = peel("[default1]:" * 50 + "x" * 1_000_000)
    assert env.local_rank == 1
    assert env.body.endswith("x" * 1000)
    peel_all(("12: [rank" + "9" * 50) * 20_000)
    peel_all("[E0114 03:52:10.044127601 " * 20_000)
    assert time.perf_counter() - t0 < 2.0


def test_nccl_lines_are_their_own_writer() -> None:
    # an NCCL line never reads as the hard-wrapped continuation of the line before it
    a = peel("gpu-q17:58213:58391 [5] NCCL INFO Bootstrap : Using ib0:10.42.7.17<0>")
    b = peel("[default5]:gpu-q17:58213:58213 [5] NCCL INFO NCCL version 2.21.5+cuda12.4")
    assert a.key == "gpu-q17:58213 "
    assert b.key == "[default5]:gpu-q17:58213 "
    assert peel("[default5]:step 4").key == "[default5]:"


@pytest.mark.parametrize(("name", "host"), [
    ("dmesg-gpu-q17.txt", "gpu-q17"), ("kern.gpu-b.log", "gpu-b"), ("syslog_node05", "node05"),
    ("dmesg.txt", None), ("dmesg.log", None), ("kern.log", None), ("node05/dmesg.txt", "node05"),
    # one kernel log per host in a kernel-log folder, named by the host
    ("dmesg/gpu-b27.txt", "gpu-b27"), ("kern_logs/node05.log", "node05"), ("run/dmesg/gpu-k51.log", "gpu-k51"),
    ("dmesg/rank3.log", None), ("dmesg/dmesg.txt", None), ("logs/node05.log", None),
    # dmesg's option letters in the name (`dmesg -T > dmesg-T.txt`) are no host
    ("dmesg-T.txt", None), ("dmesg-H.log", None), ("node05/dmesg-T.txt", "node05"),
])
def test_kernel_log_names_give_the_host(name: str, host: str | None):
    from ncclforensics.ingest.attribution import path_hints

    assert path_hints(name).host == host


@pytest.mark.parametrize(("name", "rank"), [
    ("out/1/rank.12/stderr", 12), ("ompi/3/rank.007/stdout", 7), ("run/1/rank.0/stddiag", 0),
    ("logs/rank3.log", 3), ("rank.5/notes.txt", None), ("out/1/rank.x/stdout", None),
])
def test_open_mpi_output_filename_trees_name_the_rank(name: str, rank: int | None):
    from ncclforensics.ingest.attribution import path_hints

    assert path_hints(name).rank == rank


@pytest.mark.parametrize(("month", "day", "ref", "year"), [
    (12, 31, dt.datetime(2026, 1, 1, 0, 5), 2025),   # across New Year: the night before
    (1, 1, dt.datetime(2025, 12, 31, 23, 50), 2026),  # and the morning after
    (6, 10, dt.datetime(2025, 6, 10, 3, 0), 2025),
])
def test_yearless_stamps_take_the_nearest_year(month: int, day: int, ref: dt.datetime, year: int):
    from ncclforensics.ingest.envelope import UNKNOWN_YEAR
    from ncclforensics.ingest.table import nearest_year

    assert nearest_year(dt.datetime(UNKNOWN_YEAR, month, day, 12, 0), ref).year == year


@pytest.mark.parametrize(("line", "body"), [
    # pdsh prefixes every remote line, also one that starts with spaces (FORMATS.md §18.5)
    ("gpu-c07:   what():  [Rank 4] Watchdog caught collective operation timeout", "  what():  [Rank 4] Watchdog"),
    ('trainer-3:   File "/opt/app/train.py", line 41, in step', '  File "/opt/app/train.py", line 41, in step'),
])
def test_pdsh_prefix_before_an_indented_line(line: str, body: str) -> None:
    env = peel(line)
    assert env.host == line.split(":", 1)[0]
    assert env.body.startswith(body)


@pytest.mark.parametrize("line", ["gpu-c07: ", "ValueError:   bad shape", "node3:"])
def test_no_pdsh_prefix_without_a_message(line: str) -> None:
    assert peel(line).host is None


def test_kubectl_prefix_names_the_pod() -> None:
    # `kubectl logs --prefix` (kubectl pkg/cmd/logs/logs.go): `[pod/<pod>/<container>] ` before each line
    env = peel("[pod/llm-sft-worker-3/pytorch] [rank13]: RuntimeError: CUDA error: an illegal memory access")
    assert (env.host, env.rank) == ("llm-sft-worker-3", 13)
    assert env.body.startswith("RuntimeError: CUDA error")
    assert env.key.startswith("[pod/llm-sft-worker-3/pytorch] ")
    stamped = peel("[pod/llm-sft-master-0/trainer] 2025-02-03T11:20:05.118204Z NCCL WARN x")
    assert stamped.host == "llm-sft-master-0" and stamped.ts is not None and stamped.ts.year == 2025
    assert peel("[pod/Not_A_Pod/x] text").host is None  # pod names are lower-case DNS names


def _nearest_year_by_search(t: dt.datetime, ref: dt.datetime, not_after: bool) -> dt.datetime | None:
    """The year around ref that puts t nearest it, by trying all three (nearest_year's definition)."""
    best = None
    for year in (ref.year - 1, ref.year, ref.year + 1):
        try:
            cand = t.replace(year=year)
        except ValueError:
            continue
        gap = (cand - ref).total_seconds()
        if not_after and gap > 86_400:
            continue
        if best is None or abs(gap) < best[0]:
            best = (abs(gap), cand)
    return best[1] if best else None


def test_nearest_year_equals_trying_every_year() -> None:
    import random

    from ncclforensics.ingest.envelope import UNKNOWN_YEAR
    from ncclforensics.ingest.table import nearest_year

    rnd = random.Random(14)
    refs = [dt.datetime(2024, 2, 29, 12), dt.datetime(2025, 12, 31, 23, 59), dt.datetime(2026, 1, 1, 0, 1),
            dt.datetime(2025, 7, 2, 6), dt.datetime(2025, 6, 1)]
    for _ in range(4000):
        ref = rnd.choice(refs) + dt.timedelta(seconds=rnd.randrange(-86_400 * 3, 86_400 * 3))
        day = dt.date(2024, 1, 1) + dt.timedelta(days=rnd.randrange(366))  # 2024: 29 February too
        t = dt.datetime(UNKNOWN_YEAR if day != dt.date(2024, 2, 29) else 4, day.month, day.day,
                        rnd.randrange(24), rnd.randrange(60), rnd.randrange(60))
        for not_after in (False, True):
            assert nearest_year(t, ref, not_after=not_after) == _nearest_year_by_search(t, ref, not_after), (t, ref)


def test_years_worked_out_once_a_day_equal_nearest_year() -> None:
    """event_table's day-by-day years (ingest.table._years_near) give every stamp nearest_year's
    year, also on the days where the year changes: half a year from `ref` (the midpoint between
    two candidates) and `ref` + 1 day (not_after)."""
    import random

    from ncclforensics.ingest.envelope import UNKNOWN_YEAR
    from ncclforensics.ingest.table import _years_near, nearest_year

    rnd = random.Random(27)
    for _ in range(60):
        ref = dt.datetime(2025, 1, 1) + dt.timedelta(seconds=rnd.randrange(-86_400 * 40, 86_400 * 400))
        for not_after in (False, True):
            year_of = _years_near(ref, not_after=not_after)
            # days around the switch points: ref ± half a year, ref + 1 day, and any day
            centres = [ref + dt.timedelta(days=182.6), ref - dt.timedelta(days=182.6), ref + dt.timedelta(days=1),
                       ref + dt.timedelta(days=rnd.randrange(-366, 366))]
            for centre in centres:
                for _ in range(40):
                    at = centre + dt.timedelta(seconds=rnd.randrange(-86_400 * 2, 86_400 * 2))
                    leap = (at.month, at.day) == (2, 29)
                    t = at.replace(year=4 if leap else UNKNOWN_YEAR)
                    assert year_of(t) == nearest_year(t, ref, not_after=not_after), (t, ref, not_after)


@pytest.mark.parametrize(("name", "host"), [
    ("dmesg-T-gpu-h3.txt", "gpu-h3"),  # the `dmesg -T` flag in the name
    ("kern_node-gpu-h3.log", "gpu-h3"),
    ("dmesg-gpu-h3.txt", "gpu-h3"),
    ("dmesg-T-gpu-h9.txt", "T-gpu-h9"),  # no worker names gpu-h9: the name stays as it is
])
def test_a_kernel_logs_host_is_the_workers_host_its_name_ends_with(tmp_path, name: str, host: str):
    from ncclforensics.events import build_events

    run = tmp_path / "run"
    run.mkdir()
    (run / "rank3.log").write_text("gpu-h3:5120:5120 [3] NCCL INFO Bootstrap : Using ib0:10.1.0.3<0>\n")
    (run / name).write_text("[Fri Jun 27 03:31:10 2025] NVRM: Xid (PCI:0000:c1:00): 79, pid=5120, name=python, "
                            "GPU has fallen off the bus.\n")
    ev = build_events(run).events
    assert ev.filter(pl.col("source") == "kernel")["host"].to_list() == [host]


# pieces of lines that hold, nearly hold or glue envelopes (§1.5–§1.8)
_PIECES = ["[rank3]:", "[default1]:", "[E1125 07:44:17.123456789 ", "W1122 07:44:23.407000 873 torch/x.py:12] ",
           "step 5 ", "loss=0.7]", ":", "07:44", "[", "]", " ", "x", "12", "\r", "gpu-a:12:34 [0] NCCL INFO ", "é",
           "07:44:17", ".", "07:44:17.1234", "123456 ", "[rank", "[default", "E1125 "]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(_PIECES), max_size=10))
def test_peeling_a_line_again_answers_the_same(pieces: list[str]) -> None:
    """peel remembers the lines it peeled last: a second peel of a line gives an equal envelope, a copy
    of its own (a caller that changes its body changes nobody else's), and peel_all is unchanged."""
    from ncclforensics.ingest import envelope

    line = "".join(pieces)
    envelope._peeled.clear()
    first = peel(line)
    fields = {n: getattr(first, n) for n in envelope.Envelope.__slots__}
    first.body = "changed"
    again = peel(line)
    assert again is not first
    assert {n: getattr(again, n) for n in envelope.Envelope.__slots__} == fields
    assert {n: getattr(envelope._peel(line), n) for n in envelope.Envelope.__slots__} == fields
    seq = [{n: getattr(e, n) for n in envelope.Envelope.__slots__} for e in peel_all(line)]
    assert [{n: getattr(e, n) for n in envelope.Envelope.__slots__} for e in peel_all(line)] == seq


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(_PIECES), max_size=10))
def test_the_glued_header_test_is_never_wrong(pieces: list[str]) -> None:
    """_may_glue is the cheap test before the glued-header search: whenever the search finds a header,
    the test said it might."""
    from ncclforensics.ingest import envelope

    body = "".join(pieces)
    if envelope._GLUED.search(body, 1) is not None:
        assert envelope._may_glue(body)


# pieces of lines with colour codes, codes whose ESC a paste lost, and brackets that are text (§1.8)
_COLOURED = ["\x1b[31m", "\x1b[0m", "\x1b(B", "[1;31m", "[0m", "[10m]", "[31", "m", "[", "]", "3", ";", "[rank3]:",
             "[E0914 ", "ERROR", " ", "\x1b", "[2K", "é", "[0] NCCL INFO "]


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.sampled_from(_COLOURED), max_size=10))
def test_stripping_colour_skips_only_lines_that_hold_none(pieces: list[str]) -> None:
    """strip_ansi answers ANSI.sub("", …): it only skips the search on a line with no ESC and no `[`
    before a digit, where no code can be."""
    from ncclforensics.ingest.envelope import strip_ansi

    line = "".join(pieces)
    assert strip_ansi(line) == ANSI.sub("", line)


def test_a_c10_second_is_worked_out_once_and_answers_the_same() -> None:
    """c10 stamps (a second, no fraction) are remembered by (MMDD, hh:mm:ss): the same datetime as
    working it out, None for a date that does not exist, and the memory stays bounded."""
    from ncclforensics.ingest import envelope

    envelope._SECONDS.clear()
    first = envelope._mmdd("0216", "14:31:57")
    assert first == dt.datetime(UNKNOWN_YEAR, 2, 16, 14, 31, 57) == envelope._stamp("0216", "14:31:57", 0)
    assert envelope._mmdd("0216", "14:31:57") is first
    assert envelope._mmdd("0230", "14:31:57") is None  # February 30th
    assert envelope._mmdd("0230", "14:31:57") is None
    assert envelope._mmdd("1122", "07:44:17", 428000) == dt.datetime(UNKNOWN_YEAR, 11, 22, 7, 44, 17, 428000)
    for s in range(envelope._SECONDS_MAX + 10):
        envelope._mmdd("0101", f"{s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}")
    assert len(envelope._SECONDS) <= envelope._SECONDS_MAX


# pieces of envelopes whose digits decide what they tell: a day that does not exist, a pid above
# PID_MAX, DeepSpeed's rank -0, Ray's pid=0, c10's `[c10d] ` (§1.2-§1.8, §18.5)
_SHAPED = ["[rank3]:", "[rank 3] ", "[E0216 14:31:57.868225299 ProcessGroupNCCL.cpp:632] ",
           "[E0230 14:31:57.868225299 x.cpp:1] ", "[W216 14:20:09.027029 socket.cpp:601] [c10d] ", "[c10d] ",
           "W1122 07:44:17.428000 873 torch/distributed/run.py:874] ", "I0101 00:00:00.000000 4194305 a.py:1] ",
           "gpu-m188:52780:53376 [3] NCCL INFO ", "node1:12:34 [0] init.cc:5 NCCL WARN ",
           "[2025-02-17 06:30:12,408] torch.distributed.run: [WARNING] ", "(RayWorkerWrapper pid=0, ip=10.0.0.1) ",
           "(pid=61833) ", "[INFO] [launch.py:315:sigkill_handler] [Rank -0] ", "[Rank 0/4] ", "[default3]:", " 7: ",
           "gpu-a12: ", "[ 912734.602118] ", "Jun 10 03:17:42 gpu-q17 kernel: ", "2025-06-10T03:17:42,604118+02:00 ",
           "[pod/w-0/c] ", "4,88213,912734602118,-;", "[40218] ", "step 12 ", "Watchdog caught ", "12", ":", " ", "x"]


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.sampled_from(_SHAPED), min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_a_line_peeled_by_its_shape_is_peeled_as_afresh(pieces: list[str], seed: int) -> None:
    """Another rank's copy of a line (other digits, same places) peeled by the shape of the first gives
    every field peeling it afresh gives."""
    import random
    import re

    from ncclforensics.ingest import envelope

    line = "".join(pieces)
    rnd = random.Random(seed)
    other = re.sub(r"[0-9]", lambda _: rnd.choice("0123456789"), line)
    envelope._SHAPES.clear()
    for text in (line, line, other):  # met once: nothing kept; twice: its envelopes kept; then replayed
        got = envelope._peel(text)
        want = envelope._peel_fresh(text, None)
        assert {n: getattr(got, n) for n in envelope.Envelope.__slots__} == {
            n: getattr(want, n) for n in envelope.Envelope.__slots__}, text


def test_shapes_are_kept_once_met_twice_and_within_bounds() -> None:
    """A shape's first sighting leaves its hash only, the second keeps its answers; at most `entries`."""
    from ncclforensics.digits import ShapeMemo

    memo = ShapeMemo(3)
    assert not memo.admit("[rank0]: a") and memo.admit("[rank0]: a")
    for k in range(20):
        shape = f"x{'y' * k}"
        if memo.admit(shape) or memo.admit(shape):
            memo[shape] = k
        assert len(memo) <= 3
    assert memo  # the last shapes are kept
