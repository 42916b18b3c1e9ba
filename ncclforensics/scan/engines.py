"""Run the per-run function over many runs: a killable process pool, or Ray tasks on a cluster."""

from __future__ import annotations

import collections
import ctypes
import faulthandler
import os
import signal
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path

from ncclforensics.errors import ForensicsError, UsageError
from ncclforensics.scan.worker import analyze_run, error_result, write_run

OnResult = Callable[[dict, dict], None]  # (spec, result) -> None, called in the parent
LOG_NAME = "scan.log"  # workers' stderr (warnings, faulthandler dumps of hard crashes)
_MAX_START_FAILURES = 3
_TICK = 0.5


def _die_with_parent(parent_pid: int) -> None:
    """Linux: the kernel SIGKILLs this worker when the scan process dies, even by SIGKILL."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _worker_main(conn, out_dir: str, parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        fd = os.open(os.path.join(out_dir, LOG_NAME), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        faulthandler.enable(file=sys.stderr)
    except OSError:
        pass
    import ncclforensics.analysis  # noqa: F401  (import before "ready": not on a run's clock)

    conn.send(("ready", os.getpid()))
    while True:
        try:
            spec = conn.recv()
        except (EOFError, OSError):
            return
        if spec is None:
            return
        conn.send(("done", analyze_run(spec, out_dir)))


class _Slot:
    def __init__(self, ctx, out_dir: Path, threads: int | None = None) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, str(out_dir), os.getpid()), daemon=True)
        saved = os.environ.get("POLARS_MAX_THREADS")
        if threads is not None and saved is None:  # the spawned worker inherits the environment
            os.environ["POLARS_MAX_THREADS"] = str(threads)
        try:
            self.proc.start()
        finally:
            if threads is not None and saved is None:
                del os.environ["POLARS_MAX_THREADS"]
        child.close()
        self.ready = False
        self.spec: dict | None = None
        self.deadline = 0.0

    def stop(self, kill: bool) -> None:
        if kill and self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        self.conn.close()

    def recv(self):
        """The worker's next message, None if none is waiting, or EOFError if it is gone."""
        if not self.conn.poll():
            return None
        return self.conn.recv()


def run_processes(specs: list[dict], out_dir: Path, *, jobs: int, timeout: float, on_result: OnResult) -> None:
    """Analyze specs in `jobs` worker processes; a run past `timeout` seconds has its worker killed
    and becomes a timeout row, a worker that dies makes its run an error row; both are replaced."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # polars' threads make fork unsafe
    pending = collections.deque(specs)
    # jobs workers share the cores: each one's polars gets its share instead of all of them
    threads = max(1, (os.cpu_count() or 1) // jobs)
    slots = [_Slot(ctx, out_dir, threads) for _ in range(min(jobs, len(specs)))]
    start_failures = 0

    def finish(slot: _Slot, result: dict) -> None:
        spec, slot.spec = slot.spec, None
        if "_files" in result or result.get("status") in ("timeout", "crashed"):
            write_run(out_dir, spec["id"], result, result.pop("_files", {}))
        on_result(spec, result)

    try:
        while pending or any(s.spec is not None for s in slots):
            for s in slots:
                if s.ready and s.spec is None and pending:
                    s.spec = pending.popleft()
                    s.deadline = time.monotonic() + timeout
                    s.conn.send(s.spec)
            busy = [s.deadline for s in slots if s.spec is not None]
            tick = min([_TICK, *(max(0.0, d - time.monotonic()) for d in busy)])
            wait([s.conn for s in slots] + [s.proc.sentinel for s in slots], timeout=tick)
            for i, s in enumerate(slots):
                try:
                    msg = s.recv()
                except (EOFError, OSError):
                    msg = ("gone", None)
                if msg is not None and msg[0] == "ready":
                    s.ready, start_failures = True, 0
                    continue
                if msg is not None and msg[0] == "done" and s.spec is not None:
                    finish(s, msg[1])
                    continue
                dead = (msg is not None and msg[0] == "gone") or not s.proc.is_alive()
                overdue = s.spec is not None and time.monotonic() > s.deadline
                if not dead and not overdue:
                    continue
                s.stop(kill=True)
                if s.spec is not None:
                    started = s.deadline - timeout
                    if dead:
                        code = s.proc.exitcode
                        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                        finish(s, error_result(s.spec, "crashed", f"worker process died ({how}) analyzing this run;"
                                               f" see {LOG_NAME}", time.monotonic() - started))
                    else:
                        finish(s, error_result(s.spec, "timeout", f"analysis took longer than {timeout:g} s"
                                               " (worker killed)", time.monotonic() - started, timeout_s=timeout))
                elif not s.ready:
                    start_failures += 1
                    if start_failures >= _MAX_START_FAILURES:
                        raise ForensicsError(f"scan worker processes fail to start; see {out_dir / LOG_NAME}")
                slots[i] = None
            slots = [s for s in slots if s is not None]
            busy_n = sum(s.spec is not None for s in slots)
            for _ in range(min(jobs, len(pending) + busy_n) - len(slots)):
                slots.append(_Slot(ctx, out_dir, threads))
    except BaseException:  # Ctrl-C or a bug: the workers go at once, finished results are on disk
        for s in slots:
            s.stop(kill=True)
        raise
    for s in slots:
        try:
            s.conn.send(None)
        except (OSError, ValueError):
            pass
    for s in slots:
        s.stop(kill=False)


def run_ray(specs: list[dict], out_dir: Path, *, jobs: int | None, timeout: float, address: str | None,
            on_result: OnResult) -> None:
    """The same per-run function as Ray tasks (one CPU each); results come back to this process,
    which writes them, so OUTDIR need only exist here. The runs' paths must be readable on every
    node (a shared file system)."""
    try:
        import ray
    except ImportError:
        raise UsageError("--engine ray needs Ray: pip install 'ncclforensics[ray]'") from None
    started = False
    if not ray.is_initialized():
        try:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, logging_level="ERROR",
                     include_dashboard=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UsageError(f"cannot start or reach Ray at {address or 'a local instance'}: {exc}") from None
        started = True
    task = ray.remote(num_cpus=1, max_retries=0)(analyze_run)
    limit = jobs or max(1, int(ray.cluster_resources().get("CPU", 1)))
    pending = collections.deque(specs)
    inflight: dict = {}  # ObjectRef -> (spec, deadline)
    try:
        while pending or inflight:
            while pending and len(inflight) < limit:
                spec = pending.popleft()
                inflight[task.remote(spec, None)] = (spec, time.monotonic() + timeout)
            tick = min([_TICK, *(max(0.0, d - time.monotonic()) for _, d in inflight.values())])
            done, _ = ray.wait(list(inflight), num_returns=len(inflight), timeout=tick)
            for ref in done:
                spec, _deadline = inflight.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as exc:  # the task or its worker failed
                    result = error_result(spec, "crashed", f"Ray task failed ({type(exc).__name__}: "
                                          f"{str(exc).splitlines()[0][:300] if str(exc) else ''})")
                write_run(out_dir, spec["id"], result, result.pop("_files", {}))
                on_result(spec, result)
            now = time.monotonic()
            for ref, (spec, deadline) in list(inflight.items()):
                if now > deadline:
                    ray.cancel(ref, force=True)
                    del inflight[ref]
                    result = error_result(spec, "timeout", f"analysis took longer than {timeout:g} s (task "
                                          "cancelled)", timeout, timeout_s=timeout)
                    write_run(out_dir, spec["id"], result, {})
                    on_result(spec, result)
    finally:
        for ref in inflight:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()
