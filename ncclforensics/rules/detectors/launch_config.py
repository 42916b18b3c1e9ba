"""Launch configuration: two ranks on one GPU, /dev/shm too small or closed, wrong devices, no main guard,
the env:// rendezvous's variables unset."""

from __future__ import annotations

import re

from ncclforensics.console import plural
from ncclforensics.model import Collective, RootCause
from ncclforensics.rules.context import Context, culprits_named, extra
from ncclforensics.rules.detectors.common import Hit, detector, earliest_ts, rank_fields
from ncclforensics.vocabulary import vocabulary

# which launch problem each kind of launch_config evidence shows (the kinds' meanings are in patterns/)
_PROBLEM_KINDS = {
    "duplicate_gpu": ("nccl_duplicate_gpu",),
    "shm": ("nccl_shm_error",),
    "device": ("cuda_error", "cuda_error_hint", "wrong_device", "exception", "exception_line"),
    "main_guard": ("spawn_bootstrap", "exception"),
    "fork": ("exception", "exception_line"),
    "refused_value": ("exception", "exception_line"),
    "env": ("env_unset",),
}


def _bootstrap_stack(r: dict) -> bool:
    """An exception raised by multiprocessing's bootstrapping check (the stack the vocabulary's
    `spawn.py:_check_not_importing_main` meaning names)."""
    return "_check_not_importing_main" in str(extra(r).get("stack") or "")


# torch's refusal to use CUDA in a forked worker whose parent initialised it (torch/cuda/__init__.py _lazy_init;
# the launch_config meaning of python/exception*.toml names the same text)
_FORKED_CUDA = "Cannot re-initialize CUDA in forked subprocess"


def _forked_cuda(r: dict) -> bool:
    return _FORKED_CUDA in str(r.get("detail") or r.get("text") or "")


# torch refusing a value the launch set (the launch_config meaning of python/exception*.toml names the same
# texts): MASTER_PORT out of the TCP range (torch/distributed/rendezvous.py `_create_c10d_store`), an option of
# PYTORCH_CUDA_ALLOC_CONF the caching allocator does not know (c10/cuda/CUDAAllocatorConfig.cpp)
_REFUSED_VALUE = re.compile(r"port must have value from 0 to 65535 but was|Unrecognized CachingAllocator option")


def _refused_value(r: dict) -> bool:
    return _REFUSED_VALUE.search(str(r.get("detail") or r.get("text") or "")) is not None


# which exception rows of the launch_config class belong to which problem: the bootstrapping check's
# to the __main__ guard, CUDA in a forked worker to the start method, a refused value to the variable
# that set it, the others (torch's driver check: the node's CUDA driver) to the device
_EXCEPTION_OF = {"main_guard": _bootstrap_stack, "fork": _forked_cuda, "refused_value": _refused_value,
                 "device": lambda r: not _bootstrap_stack(r) and not _forked_cuda(r) and not _refused_value(r)}


@detector
def launch_misconfig(ctx: Context, problem: str = "duplicate_gpu") -> list[Hit]:
    kinds = vocabulary().check(*_PROBLEM_KINDS[problem])
    mine = _EXCEPTION_OF.get(problem, lambda _r: True)
    rows = [r for r in ctx.causes(RootCause.LAUNCH_CONFIG) if r["kind"] in kinds
            and (r["kind"] not in ("exception", "exception_line") or mine(r))]
    if not rows:
        return []
    rows.sort(key=lambda r: (-r["strength"], r["ts"] is None, r["ts"]))
    named = sorted({rk for r in rows for rk in culprits_named(r)})
    culprits = named or sorted({r["rank"] for r in rows if r["rank"] is not None})
    if problem == "refused_value":
        culprits = []  # the launch's value: every rank that read it fails alike, none more than another
    first = rows[0]
    errors = " ".join(str(extra(r).get("error") or "") for r in rows)
    mode = problem
    if problem == "shm":
        mode = "shm_permission" if "Permission denied" in errors else "shm"
    return [Hit(culprits=culprits, evidence=ctx.evidence_rows(rows), ts=earliest_ts(rows),
                fields={"what": (first.get("detail") or first["text"] or "")[:200], **rank_fields(culprits),
                        "var": extra(first).get("var") or "a variable",
                        "shm_problem": "not permitted" if mode == "shm_permission" else "too small"},
                hosts=sorted({r["host"] for r in rows if r["host"]}), collective=Collective(),
                confidence=1.0 if first["strength"] >= 2 else 0.6,
                params={"mode": mode})]


# torch's OOM message lists each process NVML sees on the GPU (FORMATS.md §14.2); the own one is
# `this process`, or a plain `Process <pid>` when NVML's pids are a container host's
_PROC = re.compile(r"(?:Process (\d+)|(this process)) has (\d+(?:\.\d+)?) (bytes|[KMGTPE]iB) memory in use")
_UNIT = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50, "EiB": 2**60}


def gpu_others(procs: str) -> list[float]:
    """The memory (bytes) other processes hold on the OOM's GPU when together they hold more of it than
    the process that ran out; else []. The own process is the `this process` sentence; without one
    (NVML's pids are a container host's) it is one of the `Process` entries, the largest, and then
    two or more others are needed: one entry alone may be the own process."""
    listed = [(bool(own), float(n) * _UNIT[unit]) for _, own, n, unit in _PROC.findall(procs or "")]
    own = [b for is_own, b in listed if is_own]
    others = sorted((b for is_own, b in listed if not is_own), reverse=True)
    if not own:
        if len(others) < 3:
            return []
        own, others = others[:1], others[1:]
    return others if others and sum(others) > own[0] else []


@detector
def shared_gpu(ctx: Context) -> list[Hit]:
    """A CUDA OOM whose GPU is held mostly by other processes: ranks placed on one GPU (no
    `torch.cuda.set_device(LOCAL_RANK)`, a `--local_rank` flag the launcher never passes, more
    processes than CUDA_VISIBLE_DEVICES lists), not a model too big for it (FORMATS.md §14.2:
    `Process <pid> has …` lists other processes on the same GPU)."""
    rows = []
    for r in ctx.rows("cuda_oom"):
        others = gpu_others(str(extra(r).get("gpu_procs") or ""))
        if others:
            rows.append((r, others))
    if not rows:
        return []
    first, others = rows[0]
    devices = sorted({d for r, _ in rows if (d := extra(r).get("device")) is not None})
    return [Hit(culprits=[], evidence=ctx.evidence_rows([r for r, _ in rows]), ts=earliest_ts([r for r, _ in rows]),
                fields={"others": "another process" if len(others) == 1 else f"{len(others)} other processes",
                        "gib": f"{sum(others) / 2**30:.1f}",
                        "device": ", ".join(f"GPU {d}" for d in devices) or "one GPU",
                        "what": (first.get("detail") or first["text"] or "")[:200]},
                hosts=sorted({r["host"] for r, _ in rows if r["host"]}), collective=Collective(),
                confidence=0.75, params={"mode": "shared_gpu"})]


# torch.multiprocessing's report that a child it started raised (torch/multiprocessing/spawn.py, ProcessContext.join;
# FORMATS.md §18.2): the process that printed it started ranks itself
_SPAWN_RAISED = "ProcessRaisedException"


@detector
def nested_launch(ctx: Context) -> list[Hit]:
    """A torchrun worker (its rows carry the local rank torchrun's prefix or log-dir gives) that started ranks
    itself with torch.multiprocessing (mp.spawn's ProcessRaisedException), whose children then failed to form
    their process group (a start-up network or launch failure after it in the same file): two launchers, each
    making its own group on the same MASTER_PORT and GPUs."""
    spawned = [r for r in ctx.rows("exception", "exception_line") if r["local_rank"] is not None
               and str(extra(r).get("exc_type") or "").endswith(_SPAWN_RAISED)]
    if not spawned:
        return []
    inner = [r for r in ctx.causes(RootCause.NETWORK_INIT) + ctx.causes(RootCause.LAUNCH_CONFIG)
             if any(r["file"] == s["file"] and r["line"] > s["line"] for s in spawned)]
    if not inner:
        return []
    inner.sort(key=lambda r: (-r["strength"], r["file"], r["line"]))
    first = inner[0]
    return [Hit(culprits=[], evidence=ctx.evidence_rows(spawned[:2] + inner[:3]), ts=earliest_ts(spawned + inner),
                fields={"what": (first.get("detail") or first["text"] or "")[:200],
                        "workers": plural(len({(s["file"], s["local_rank"]) for s in spawned}), "worker")},
                hosts=sorted({r["host"] for r in spawned if r["host"]}), collective=Collective(),
                params={"mode": "nested_launch"})]
