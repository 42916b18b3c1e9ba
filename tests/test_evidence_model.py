"""The three design faults of issue 18, each on constructed pastes in FORMATS.md shapes:
evidence without a rank still counts; every wording and carrier of a message is recognised; and the
verdict is `unknown` only when the logs hold no cause and no symptom."""

from __future__ import annotations

from pathlib import Path

import pytest

from ncclforensics.analysis import analyze_path
from ncclforensics.model import RootCause


def verdict(tmp_path: Path, text: str, name: str = "console.log"):
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / name).write_text(text if text.endswith("\n") else text + "\n")
    return analyze_path(run).diagnosis.verdict


# -- 1. evidence without a rank prefix ------------------------------------------------------
RANKLESS = [
    # NCCL's own allocation failing (host:pid:tid names no global rank: FORMATS.md §10.1, §10.3)
    ("oom", "gpu-q17:58213:58391 [3] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 6291456 bytes"),
    # a one-sided DETAIL mismatch without a rank prefix (§7.1, 1.10-1.12)
    ("rank_divergence", "RuntimeError: Detected mismatch between collectives on ranks. Rank 2 is running "
                        "inconsistent collective: CollectiveFingerPrint(OpType=BROADCAST, TensorShape=[4]"),
    # a traceback through a save function, no rank anywhere (§22)
    ("checkpoint_save", 'Traceback (most recent call last):\n  File "/srv/train.py", line 88, in <module>\n'
                        "    main()\n  File \"/venv/site-packages/transformers/trainer.py\", line 2383, in "
                        "_save_checkpoint\n    os.rename(staging_output_dir, output_dir)\n"
                        "FileExistsError: [Errno 17] File exists: '/out/tmp-checkpoint-500'"),
    # CUDA runtime OOM at communicator creation (§19.2)
    ("oom", "RuntimeError: CUDA error: out of memory"),
]


@pytest.mark.parametrize(("cls", "text"), RANKLESS, ids=[c for c, _ in RANKLESS])
def test_rankless_evidence_gives_its_class_and_no_culprit(tmp_path: Path, cls: str, text: str):
    v = verdict(tmp_path, text)
    assert v.root_cause.value == cls, (v.rule, v.title)
    assert v.culprit_ranks == []


def test_ranks_named_in_the_text_are_the_culprits(tmp_path: Path):
    """NCCL names both ranks on one GPU (§20.2), after `Last error:` and without a prefix."""
    v = verdict(tmp_path, "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                          "NCCLUtils.hpp:317, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version "
                          "2.21.5\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
                          "Last error:\nDuplicate GPU detected : rank 5 and rank 1 both on CUDA device 3d000")
    assert (v.root_cause, v.culprit_ranks) == (RootCause.LAUNCH_CONFIG, [1, 5])


def test_a_fingerprint_names_the_ranks_seen(tmp_path: Path):
    res = analyze_path(_write(tmp_path, "RuntimeError: Detected mismatch between collectives on ranks. Rank 3 is "
                                        "running collective: CollectiveFingerPrint(SequenceNumber=40, "
                                        "OpType=ALLREDUCE, TensorShape=[1]"))
    assert 3 in res.diagnosis.facts.ranks_seen
    v = res.diagnosis.verdict
    assert (v.collective.op_type, v.collective.seq) == ("ALLREDUCE", 41)  # SequenceNumber + 1 (§7.1)


def test_the_absent_rank_with_the_main_processs_work_line(tmp_path: Path):
    """Ranks 1-3 time out; rank 0 shows no line of its own; the unprefixed evaluation line is the main
    process's (FORMATS.md §3.6, §22): rank 0 lagged."""
    v = verdict(tmp_path, "Evaluating on the validation set...\n" + "".join(
        f"[E ProcessGroupNCCL.cpp:821] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, "
        "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800417 milliseconds before timing out.\n" for r in (1, 2, 3)))
    assert (v.root_cause, v.culprit_ranks) == (RootCause.RANK_DIVERGENCE, [0]), v.rule


# -- 2. every wording and carrier ------------------------------------------------------------
WORDINGS = [
    # NCCL text after `Last error:` only (§20.1)
    ("network_init", "ncclInternalError: Internal check failed.\nLast error:\nBootstrap : no socket interface found"),
    # NCCL <= 2.9 socket text, no NCCL WARN head, no address (§20.3)
    ("network_runtime", "Net : Connection closed by remote peer\nNET/IB : Got completion with error 12, opcode 0, "
                        "len 0, vendor err 129"),
    # a paste that lost its line breaks (§1.8)
    ("network_runtime", "[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. terminate "
                        "called after throwing an instance of 'std::runtime_error' what(): NCCL error: remote process "
                        "exited or there was a network error, NCCL version 2.14.3 ncclRemoteError: A call failed "
                        "possibly due to a network error or a remote process exiting prematurely. Last error: NET/IB : "
                        "Got completion from peer 10.1.2.3<39138> with error 12, opcode 0, len 0, vendor err 129"),
    # an Xid with a redacted address (§21.4) and a follow-up Xid naming its cause (§12.1)
    ("gpu_hardware", "kernel: NVRM: Xid (PCI:...): 79, pid=<unknown>, name=<unknown>, GPU has fallen off the bus."),
    ("gpu_hardware", "kernel: NVRM: Xid (PCI:0000:5d:00): 45, pid=1811, name=python3, Ch 00000002 caused by previous "
                     "Xid 74"),
    # nvidia-smi, no Xid (§21.1)
    ("gpu_hardware", "Unable to determine the device handle for GPU 0000:4E:00.0: Unknown Error"),
    # torch 1.x THC error string (§19.1)
    ("rank_crash", "RuntimeError: cuda runtime error (59) : device-side assert triggered at "
                   "/pytorch/aten/src/THC/generic/THCTensorMath.cu:29"),
    # /dev/shm in NCCL 2.4-2.7 words (checks.h SYSCHECK; §10.3)
    ("launch_config", "include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device"),
    # a privileged store port (§9.5)
    ("network_init", "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                     "address. The server socket has failed to bind to [::]:99 (errno: 13 - Permission denied)."),
    # a c10d name-resolution failure (§9.5)
    ("network_init", "[W socket.cpp:601] [c10d] The IPv6 network addresses of (trainer-0, 29500) cannot be retrieved "
                     "(gai error: -3 - Temporary failure in name resolution)."),
    # gloo's read that timed out: the peer never closed it, the path between live ranks failed (§6.1)
    ("network_runtime", "[rank2]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
                        "[10.128.0.42]:59317: Connection timed out"),
    # the kernel's transmit watchdog on the job's NIC (net/sched/sch_generic.c)
    ("network_runtime", "[Wed Mar 12 04:21:07 2025] NETDEV WATCHDOG: enp94s0f0np0 (mlx5_core): transmit queue 12 "
                        "timed out"),
    # Slurm <= 19.05's cgroup OOM wording (§13)
    ("oom", "slurmstepd: error: Detected 1 oom-kill event(s) in step 3301245.batch cgroup. Some of your processes "
            "may have been killed by the cgroup out-of-memory handler."),
    # Kubernetes' device plugin relaying a critical Xid (§21.4)
    ("gpu_hardware", "I0812 03:14:03.118212       1 health.go:172] XidCriticalError: Xid=79 on "
                     "Device=GPU-3f1c9a7e-2d4b-4c6e-9a1f-5b7d3e8c0a92; marking device as unhealthy."),
    # no usable GPU or backend for the rank: the environment (§14)
    ("launch_config", "[rank4]: ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!"),
    ("launch_config", "[rank8]: RuntimeError: Distributed package doesn't have NCCL built in"),
    # the launcher's flag the script does not declare (argparse; §18.2)
    ("launch_config", "usage: finetune.py [-h] [--config CONFIG]\nfinetune.py: error: unrecognized arguments: "
                      "--local-rank=2"),
]


@pytest.mark.parametrize(("cls", "text"), WORDINGS, ids=[f"{i}-{c}" for i, (c, _) in enumerate(WORDINGS)])
def test_each_wording_is_recognised(tmp_path: Path, cls: str, text: str):
    v = verdict(tmp_path, text)
    assert v.root_cause.value == cls, (v.rule, v.title)


LAUNCHERS = [
    # DeepSpeed (§18.5): the argv names the last spawned child, not the failed one
    "[2024-02-24 04:37:51,021] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', "
    "'--local_rank=7'] exits with return code = -11",
    # torch.distributed.launch <= 1.8 (§18.2)
    "subprocess.CalledProcessError: Command '['/opt/conda/bin/python', '-u', 'train.py', '--local_rank=1']' died "
    "with <Signals.SIGSEGV: 11>.",
    # mp.spawn (§18.4)
    "torch.multiprocessing.spawn.ProcessExitedException: process 3 terminated with signal SIGSEGV",
    # Open MPI (§18.8)
    "mpirun noticed that process rank 13 with PID 58219 on node gpu-q18 exited on signal 11 (Segmentation fault).",
]


@pytest.mark.parametrize("text", LAUNCHERS, ids=["deepspeed", "launch", "spawn", "mpirun"])
def test_each_launchers_exit_report_gives_a_crash(tmp_path: Path, text: str):
    v = verdict(tmp_path, text)
    assert v.root_cause is RootCause.RANK_CRASH, (v.rule, v.title)
    assert "--local_rank" not in " ".join(map(str, v.culprit_ranks))


def test_the_deepspeed_argv_never_names_the_culprit(tmp_path: Path):
    v = verdict(tmp_path, "[ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', "
                          "'--local_rank=1'] exits with return code = -9")
    assert v.culprit_ranks == []


# -- 3. unknown only without cause or symptom -------------------------------------------------
@pytest.mark.parametrize(("cls", "text"), [
    ("gpu_hardware", "RuntimeError: CUDA error: uncorrectable ECC error encountered"),
    ("launch_config", "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 40"),
    ("dataloader_abort", "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
                         "shared memory (shm)."),
])
def test_one_decisive_line_is_enough(tmp_path: Path, cls: str, text: str):
    v = verdict(tmp_path, text)
    assert v.root_cause.value == cls
    assert v.confidence >= 0.8


def test_symptoms_only_get_the_class_their_shape_suggests_at_low_confidence(tmp_path: Path):
    v = verdict(tmp_path, "[E ProcessGroupNCCL.cpp:821] [Rank 3] Watchdog caught collective operation timeout: "
                          "WorkNCCL(SeqNum=9321, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800417 milliseconds "
                          "before timing out.")
    assert v.root_cause is RootCause.RANK_DIVERGENCE and v.confidence < 0.5
    assert v.doc.get("what_it_detects")


def test_a_log_without_failure_is_unknown(tmp_path: Path):
    v = verdict(tmp_path, "[rank0]: step 10 loss 1.52\n[rank0]: step 11 loss 1.49\n"
                          "[rank0]: saving checkpoint to /ckpt\n")
    assert v.root_cause is RootCause.UNKNOWN and v.confidence == 0.0


def _write(tmp_path: Path, text: str) -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "console.log").write_text(text + "\n")
    return run


def test_an_exit_code_does_not_explain_the_fabric_error_that_caused_it(tmp_path: Path):
    """A NIC port error and completion errors (FORMATS.md §20.4, §20.5), then the worker's exit report from
    torch.distributed.launch (§18.1): the exit is the error's consequence, not a crash that explains it."""
    v = verdict(tmp_path, "\n".join([
        "node-b07:4411:4502 [1] transport/net_ib.cc:92 NCCL WARN NET/IB : Got async event : port error",
        "node-b07:4411:4490 [1] transport/net_ib.cc:816 NCCL WARN NET/IB : Got completion with error 12, "
        "opcode 0, len 0, vendor err 129",
        "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled system "
        "error, NCCL version 2.7.8",
        "Killing subprocess 4410",
        "Killing subprocess 4411",
        "subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'fit.py', '--local_rank=1']' "
        "returned non-zero exit status 1.",
    ]))
    assert v.root_cause is RootCause.NETWORK_RUNTIME, (v.rule, v.title)


def test_an_exit_code_alone_is_a_crash(tmp_path: Path):
    """With nothing stronger in the logs, a worker's non-zero exit is weak evidence of a crash (§18.1)."""
    v = verdict(tmp_path, "subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'fit.py', "
                          "'--local_rank=1']' returned non-zero exit status 1.")
    assert v.root_cause is RootCause.RANK_CRASH and v.confidence < 0.5, (v.rule, v.title)


@pytest.mark.parametrize(("driver", "cls"), [("mlx5_core", RootCause.NETWORK_RUNTIME),
                                           ("nvidia", RootCause.GPU_HARDWARE)])
def test_a_ports_aer_lines_take_the_class_of_the_device_below(tmp_path: Path, driver: str, cls: RootCause):
    """The root port reports the error of the device below it; the device's own lines name its driver
    (FORMATS.md §21.3): a Mellanox NIC (mlx5_core) makes the port's fatal error and failed recovery a
    network fault, a GPU (nvidia) a GPU one."""
    v = verdict(tmp_path, "\n".join([
        "[ 77120.100201] pcieport 0000:a0:03.1: AER: Uncorrected (Fatal) error message received from 0000:a1:00.0",
        f"[ 77120.100209] {driver} 0000:a1:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), "
        "type=Transaction Layer, (Requester ID)",
        "[ 77122.904311] pcieport 0000:a0:03.1: AER: device recovery failed",
    ]), name="dmesg-node-k04.txt")
    assert v.root_cause is cls, (v.rule, v.title)


def _run_of(tmp_path: Path, files: dict[str, str]) -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    for name, text in files.items():
        (run / name).write_text(text.strip("\n") + "\n")
    return run


def test_a_gpu_the_driver_could_not_start_explains_the_invalid_ordinal(tmp_path: Path):
    """`invalid device ordinal` on a node whose driver failed to start one GPU at boot (`RmInitAdapter
    failed`, FORMATS.md §21.2): the node shows one GPU fewer than the job asks for; the hardware is the
    root, not the device mapping (LC004 yields to gpu_hardware)."""
    run = _run_of(tmp_path, {
        "slurm-4411.out": """
15: [rank15]: Traceback (most recent call last):
15: [rank15]:   File "/srv/train.py", line 40, in main
15: [rank15]:     torch.cuda.set_device(local_rank)
15: [rank15]: RuntimeError: CUDA error: invalid device ordinal
srun: error: gpu-c22: task 15: Exited with exit code 1
""",
        "gpu-c22.dmesg.txt": """
[   30.531000] NVRM: GPU 0000:c1:00.0: RmInitAdapter failed! (0x62:0x40:1860)
[   30.531000] NVRM: GPU 0000:c1:00.0: rm_init_adapter failed, device minor number 6
""",
    })
    v = analyze_path(run).diagnosis.verdict
    assert v.root_cause is RootCause.GPU_HARDWARE, (v.rule, v.title)
    # without the kernel's lines the same traceback is a device-mapping problem
    (run / "gpu-c22.dmesg.txt").unlink()
    v = analyze_path(run).diagnosis.verdict
    assert v.root_cause is RootCause.LAUNCH_CONFIG and v.rule == "LC004", (v.rule, v.title)


def test_a_failed_dcgm_diagnostic_makes_a_cuda_error_the_gpus(tmp_path: Path):
    """`dcgmi diag` failing the GPU a rank crashed on (`| | Fail - GPU: 3 |`): the GPU is faulty, and the
    rank's `unspecified launch failure` its consequence."""
    run = _run_of(tmp_path, {
        "console.log": """
[default3]:[rank3]: RuntimeError: CUDA error: unspecified launch failure
[default3]:[rank3]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace
""",
        "dcgmi-diag.txt": """
| Diagnostic                | Pass - GPUs: 0, 1, 2, 4, 5, 6, 7               |
|                           | Fail - GPU: 3                                  |
""",
    })
    v = analyze_path(run).diagnosis.verdict
    assert v.root_cause is RootCause.GPU_HARDWARE, (v.rule, v.title)


def test_a_store_that_some_joined_is_a_moderate_network_init(tmp_path: Path):
    """`Timed out after <s> seconds waiting for clients. 8/16 clients joined.` alone (FORMATS.md §9.3): the
    store was reachable to those that joined; the others could not connect, were never started, or the
    world size is larger than what was launched. network_init, but not at >= 0.8; a client's failed
    connection to the store makes it a confident one."""
    store = ("torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. "
             "8/16 clients joined.")
    v = verdict(tmp_path, store)
    assert v.root_cause is RootCause.NETWORK_INIT and v.confidence < 0.8, (v.rule, v.confidence)
    (tmp_path / "b").mkdir()
    v = verdict(tmp_path / "b", store + "\n[W412 18:02:11.118204517 TCPStore.cpp:358] [c10d] TCP client failed to "
                "connect/validate to host 10.42.7.17:29501 - retrying (try=0, timeout=900000ms, delay=1312ms): "
                "The client socket has failed to connect to [10.42.7.17]:29501 (errno: 111 - Connection refused).")
    assert v.root_cause is RootCause.NETWORK_INIT and v.confidence >= 0.8, (v.rule, v.confidence)


# -- a launcher's table of its workers ties pids to ranks -------------------------------------
# Ray Train's worker table (ray/train/_internal/backend_executor.py) and Ray's memory monitor's kill message
RAY_TABLE = (
    "(TorchTrainer pid=4102, ip=10.1.0.7) Started distributed worker processes: \n"
    "(TorchTrainer pid=4102, ip=10.1.0.7) - (node_id=aa01, ip=10.1.0.7, pid=4200) world_rank=0, local_rank=0, "
    "node_rank=0\n"
    "(TorchTrainer pid=4102, ip=10.1.0.7) - (node_id=aa01, ip=10.1.0.7, pid=4201) world_rank=1, local_rank=1, "
    "node_rank=0\n"
    "(TorchTrainer pid=4102, ip=10.1.0.7) - (node_id=bb02, ip=10.1.0.8, pid=4200) world_rank=2, local_rank=0, "
    "node_rank=1\n"
)


def test_a_ray_memory_monitor_kill_names_the_rank_of_its_pid(tmp_path: Path):
    """The kill message names a pid on a node; the worker table says which rank that is (pid 4200 is two
    workers on two nodes: the node's IP tells them apart)."""
    v = verdict(tmp_path, RAY_TABLE + (
        "(RayTrainWorker pid=4201, ip=10.1.0.7) [rank1]:[E1102 10:00:03.1 ProcessGroupNCCL.cpp:1316] [PG 0 "
        "(default_pg) Rank 1] Process group watchdog thread terminated with exception: NCCL error: remote process "
        "exited or there was a network error, NCCL version 2.20.5\n"
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
        "Memory on the node (IP: 10.1.0.8, ID: bb02) where the task (actor ID: 9f00, name=RayTrainWorker.__init__, "
        "pid=4200, memory used=30.10GB) was running was 120.1GB / 124.4GB (0.9654), which exceeds the memory usage "
        "threshold of 0.95."))
    assert (v.root_cause, v.culprit_ranks) == (RootCause.OOM, [2])


def test_a_rankless_line_of_a_tabled_pid_is_that_ranks(tmp_path: Path):
    """A worker's exception printed under its Ray prefix without a `[rank]` one: the table's pid says whose."""
    res = analyze_path(_write(tmp_path, RAY_TABLE + (
        "(RayTrainWorker pid=4201, ip=10.1.0.7) Traceback (most recent call last):\n"
        '(RayTrainWorker pid=4201, ip=10.1.0.7)   File "/app/train.py", line 40, in train_loop\n'
        "(RayTrainWorker pid=4201, ip=10.1.0.7)     label = vocab[token]\n"
        "(RayTrainWorker pid=4201, ip=10.1.0.7) KeyError: 'unk'")))
    v = res.diagnosis.verdict
    assert (v.root_cause, v.culprit_ranks) == (RootCause.RANK_CRASH, [1])
    # the table is the driver's line: it is no line of the ranks it lists
    assert res.diagnosis.facts.ranks_seen == [1]


def test_a_rankless_failure_goes_to_the_one_rank_that_exited_of_itself(tmp_path: Path):
    """Rank 0's bind warning (it went on: §9.1) is a failure of its own, yet only rank 3 ended: torchrun
    stopped the others (§8.2), so the unprefixed CPU allocator failure is rank 3's."""
    v = verdict(tmp_path, (
        "[rank0]:[W socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - "
        "Address already in use).\n"
        "RuntimeError: [enforce fail at alloc_cpu.cpp:83] err == 0. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 70400000000 bytes. Error code 12 (Cannot allocate memory)\n"
        "[2024-04-02 11:35:21,118] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 7012 "
        "closing signal SIGTERM\n"
        "[2024-04-02 11:35:22,551] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) "
        "local_rank: 3 (pid: 7015) of binary: /usr/bin/python"))
    assert (v.root_cause, v.culprit_ranks) == (RootCause.OOM, [3])


# -- start-up failures of other wordings -------------------------------------------------------
def test_a_relaunch_that_cannot_start_after_a_run_that_trained_is_network_init(tmp_path: Path):
    """A paste of a run that trained, then of a relaunch on two nodes whose daemon cannot connect back to
    mpirun (Open MPI's oob_tcp_connection.c): the start-up failure comes after every step line of its file."""
    v = verdict(tmp_path, (
        "[1,0]<stdout>:epoch 0 step 190/200 loss 6.1449\n"
        "[1,0]<stdout>:epoch 0 step 200/200 loss 6.1287\n"
        "$ mpirun -np 16 -H node1:8,node2:8 python train.py\n"
        "------------------------------------------------------------\n"
        "A process or daemon was unable to complete a TCP connection\n"
        "to another process:\n"
        "  Local host:    node2\n"
        "  Remote host:   10.20.4.11\n"
        "This is usually caused by a firewall on the remote host. Please"))
    assert v.root_cause == RootCause.NETWORK_INIT, (v.rule, v.title)


def test_a_start_up_failure_before_the_steps_is_no_verdict_of_its_own(tmp_path: Path):
    """The same line before the run's steps: the run started after it (a retry), so it explains nothing."""
    v = verdict(tmp_path, (
        "A process or daemon was unable to complete a TCP connection\n"
        "[1,0]<stdout>:epoch 0 step 190/200 loss 6.1449\n"
        "[1,0]<stdout>:epoch 0 step 200/200 loss 6.1287"))
    assert v.root_cause != RootCause.NETWORK_INIT, (v.rule, v.title)


def test_nccl_net_naming_a_missing_network_is_network_init(tmp_path: Path):
    """NCCL_NET=IB where the pod has no RDMA device: NCCL's `Error: network IB not found.` (src/net.cc)."""
    v = verdict(tmp_path, (
        "worker-0:88:301 [0] NCCL INFO NET/IB : No device found.\n"
        "worker-0:88:301 [0] net.cc:772 NCCL WARN Error: network IB not found.\n"
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:121, "
        "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.20.5\n"
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library."))
    assert v.root_cause == RootCause.NETWORK_INIT, (v.rule, v.title)


def test_the_spawn_bootstrap_message_over_several_lines_is_a_missing_main_guard(tmp_path: Path):
    """CPython's triple-quoted RuntimeError (Lib/multiprocessing/spawn.py): the traceback prints `RuntimeError: `
    alone, then the message's lines as written."""
    v = verdict(tmp_path, (
        "    _check_not_importing_main()\n"
        '  File "/usr/lib/python3.10/multiprocessing/spawn.py", line 134, in _check_not_importing_main\n'
        "    raise RuntimeError('''\n"
        "RuntimeError: \n"
        "        An attempt has been made to start a new process before the\n"
        "        current process has finished its bootstrapping phase.\n"
        "\n"
        "        This probably means that you are not using fork to start your"))
    assert v.root_cause == RootCause.LAUNCH_CONFIG, (v.rule, v.title)


def test_a_worker_the_agent_killed_after_its_sigterm_did_not_die_of_its_own_sigkill(tmp_path: Path):
    # torchrun's escalation (torch/distributed/elastic/multiprocessing/api.py `_close`): the -9 is the agent's
    # kill of a worker stuck in the kernel, whose hung-task trace (kernel/hung_task.c) runs through NFS removal
    text = (
        "[Mon Mar 18 02:16:05 2024] INFO: task python:4410 blocked for more than 122 seconds.\n"
        "[Mon Mar 18 02:16:05 2024] task:python          state:D stack:    0 pid: 4410 ppid:  4400 flags:0x00004002\n"
        "[Mon Mar 18 02:16:05 2024] Call Trace:\n"
        "[Mon Mar 18 02:16:05 2024]  rpc_wait_bit_killable+0x11/0x70 [sunrpc]\n"
        "[Mon Mar 18 02:16:05 2024]  nfs4_proc_remove+0x5d/0x110 [nfsv4]\n"
        "[Mon Mar 18 02:16:05 2024]  nfs_unlink+0xba/0x1b0 [nfs]\n"
        "[rank1]:[E ProcessGroupNCCL.cpp:523] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=901, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=1800000) ran for 1800791 "
        "milliseconds before timing out.\n"
        "[2024-03-18 02:38:14,102] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 4410 "
        "closing signal SIGTERM\n"
        "[2024-03-18 02:38:44,131] torch.distributed.elastic.multiprocessing.api: [WARNING] Unable to shutdown "
        "process 4410 via Signals.SIGTERM, forcefully exiting via Signals.SIGKILL\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
        "train.py FAILED\n"
        "------------------------------------------------------------\n"
        "Failures:\n"
        "[1]:\n"
        "  time      : 2024-03-18_02:38:44\n"
        "  host      : node-a\n"
        "  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : -9 (pid: 4410)\n"
        "  error_file: <N/A>\n"
        "  traceback : Signal 9 (SIGKILL) received by PID 4410\n"
        "------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  time      : 2024-03-18_02:38:14\n"
        "  host      : node-a\n"
        "  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -6 (pid: 4411)\n"
        "  error_file: <N/A>\n"
        "  traceback : Signal 6 (SIGABRT) received by PID 4411\n"
        "============================================================\n")
    v = verdict(tmp_path, text)
    assert (v.root_cause, v.rule, v.culprit_ranks) == (RootCause.CHECKPOINT_SAVE, "CK003", [0])


def test_the_agent_losing_its_store_while_the_workers_run_is_no_start_up_failure(tmp_path: Path):
    # the agent's membership check runs only while the workers are healthy (elastic/agent/server/api.py
    # `_invoke_run` -> `num_nodes_waiting`): the store lost mid-run, beside the peers' transport errors
    text = (
        "node-a:77302:77561 [3] transport/net_ib.cc:1672 NCCL WARN NET/IB : Got completion from peer "
        "10.50.1.12<55213> with status=12 opcode=0 len=0 vendor err 129 (Send)\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/local/bin/torchrun", line 8, in <module>\n'
        "    sys.exit(main())\n"
        '  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/elastic/agent/server/api.py", line 901, '
        "in _invoke_run\n"
        "    num_nodes_waiting = rdzv_handler.num_nodes_waiting()\n"
        '  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/elastic/rendezvous/dynamic_rendezvous.py", '
        "line 1185, in num_nodes_waiting\n"
        "    self._state_holder.sync()\n"
        "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has "
        "failed. See inner exception for details.\n")
    assert verdict(tmp_path, text).root_cause is RootCause.NETWORK_RUNTIME
    # the same error on the way into the rendezvous is start-up's
    start = text.replace("_invoke_run\n    num_nodes_waiting = rdzv_handler.num_nodes_waiting()",
                         "_rendezvous\n    store, group_rank, group_world_size = spec.rdzv_handler.next_rendezvous()"
                         ).replace("in num_nodes_waiting", "in next_rendezvous").split("Traceback", 1)
    (tmp_path / "start").mkdir()
    assert verdict(tmp_path / "start", "Traceback" + start[1]).root_cause is RootCause.NETWORK_INIT
