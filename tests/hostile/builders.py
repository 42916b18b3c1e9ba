"""Builders and checks for the hostile-input suite: every case is made under tmp_path at test time.

Each test looks at two levels: `build_events` (the library) and the `events` command (the CLI,
run as a subprocess so a traceback or a stray print on the real stderr would show; `cli_inproc`
in conftest runs it in-process, for cases that lower module constants).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from ncclforensics.events import IngestResult, build_events

CORPUS = Path("/work/shared/corpus")
CLI_TIMEOUT_S = 120

# One line each signature family recognises, with a SeqNum to tell copies apart.
WATCHDOG = ("[rank1]:[E1122 07:44:37.123456789 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=600000) ran for 600011 milliseconds before timing out.")

# Used when the shared corpus is not on this machine: a short failure log of the same shapes.
FALLBACK_GOOD = "\n".join([
    "W1122 07:44:17.428000 873 torch/distributed/run.py:874] *****************************************",
    "2026-11-22 07:44:19,330 INFO [rank1] train: initializing process group backend=nccl world_size=2",
    WATCHDOG.format(seq=41),
    "[rank0]:[E1122 07:44:38.000000000 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=42, OpType=BROADCAST, NumelIn=8, NumelOut=8, Timeout(ms)=600000) "
    "ran for 600020 milliseconds before timing out.",
    "W1122 07:44:40.407000 873 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 874 "
    "closing signal SIGTERM",
]) + "\n"


def watchdog(seq: int) -> str:
    return WATCHDOG.format(seq=seq)


def rows_of(res: IngestResult, file: str) -> set[tuple[int, str]]:
    df = res.events
    sub = df.filter(df["file"] == file)
    return set(zip(sub["line"].to_list(), sub["kind"].cast(str).to_list(), strict=True))


def json_rows_of(events: list[dict], file: str) -> set[tuple[int, str]]:
    return {(e["line"], e["kind"]) for e in events if e["file"] == file}


def reasons(res: IngestResult) -> dict[str, str]:
    return {s.file: s.reason for s in res.skipped}


def cpu_seconds() -> float:
    """CPU time of this process and its finished children: a bound on work that a busy shared
    machine does not break (wall-clock time does, and a hang shows as CPU time all the same)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def ingest(path: Path, limit_s: float = 30.0) -> IngestResult:
    """build_events, which must return (never raise) within `limit_s` of CPU time."""
    t0 = cpu_seconds()
    res = build_events(path)
    took = cpu_seconds() - t0
    assert took < limit_s, f"build_events took {took:.1f} s of CPU"
    for s in res.skipped:
        assert s.reason and s.reason.strip(), f"empty skip reason for {s.file!r}"
        assert "\n" not in s.reason and "\n" not in s.file
    return res


@dataclass
class CliOutcome:
    code: int
    stdout: str
    stderr: str
    cpu_seconds: float  # of the CLI process (subprocess) or of this process (in-process run)

    @property
    def events(self) -> list[dict]:
        return json.loads(self.stdout)


def check_cli(out: CliOutcome, code: int) -> CliOutcome:
    assert "Traceback" not in out.stderr, out.stderr
    assert "internal error" not in out.stderr, out.stderr
    assert out.code == code, f"exit {out.code}, wanted {code}; stderr: {out.stderr}"
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, f"want one line on stderr, got: {out.stderr!r}"
    if code == 0:
        assert isinstance(out.events, list)
    elif code == 3:
        assert lines[0].startswith("ncclforensics: "), lines[0]
        assert out.stdout == ""
    return out


class CliRun:
    """`ncclforensics events PATH -f json` started in a subprocess: the library-level checks of a
    test can run meanwhile (two cores), then `finish` checks exit code and a clean stderr."""

    def __init__(self, path: Path) -> None:
        self.kids0 = _children_cpu()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ncclforensics", "events", os.fsdecode(path), "-f", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=path.parent if path.parent.exists() else None,
            # a UTF-8 locale: stdout is then strict UTF-8, as on a user's terminal or in a pipe
            env={**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHONIOENCODING", "PYTHONUTF8"))},
                 "LC_ALL": "C.UTF-8"},
        )

    def finish(self, code: int) -> CliOutcome:
        try:
            stdout, stderr = self.proc.communicate(timeout=CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise AssertionError(f"the CLI did not finish in {CLI_TIMEOUT_S} s") from None
        # the child's own CPU time, read from /proc would need it alive: wait4 gave it to Popen
        # only as a return code, so take the children's total before and after instead
        out = CliOutcome(self.proc.returncode, stdout.decode("utf-8"), stderr.decode("utf-8", "replace"),
                         _children_cpu() - self.kids0)
        return check_cli(out, code)


def _children_cpu() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def run_cli(path: Path, code: int) -> CliOutcome:
    """`ncclforensics events PATH -f json` in a subprocess; checks exit code and a clean stderr."""
    return CliRun(path).finish(code)


# -- builders -------------------------------------------------------------------------------

def put(folder: Path, name: str | bytes, data: bytes | str) -> Path:
    """Write one file; `name` may be bytes (a name that is not valid UTF-8)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = os.path.join(os.fsencode(folder), name if isinstance(name, bytes) else os.fsencode(name))
    with open(target, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
    return Path(os.fsdecode(target))


def random_bytes(n: int, seed: int) -> bytes:
    import random

    return random.Random(seed).randbytes(n)


def elf_like(n: int = 20_000) -> bytes:
    header = (b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x02\x00\x3e\x00\x01\x00\x00\x00"
              + b"\x40\x10\x40\x00\x00\x00\x00\x00" + bytes(40))
    return header + random_bytes(n - len(header), 7)


def gzip_stream_of_zeros(path: Path, megabytes: int, *, level: int = 9) -> Path:
    """A gzip file of `megabytes` MiB of zeros, compressed chunk by chunk (no big buffer)."""
    comp = zlib.compressobj(level, zlib.DEFLATED, 31)
    zero = bytes(1 << 20)
    with open(path, "wb") as fh:
        for _ in range(megabytes):
            fh.write(comp.compress(zero))
        fh.write(comp.flush())
    return path


class ZeroReader(io.RawIOBase):
    """n zero bytes, as a stream (tarfile.addfile and zip writes read from it)."""

    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        k = min(len(b), self.left)
        b[:k] = bytes(k)
        self.left -= k
        return k


def tar_add(tf: tarfile.TarFile, name: str, data: bytes = b"", *, kind: bytes = tarfile.REGTYPE,
            linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o777 if kind == tarfile.SYMTYPE else 0o644
    info.mtime = 1_700_000_000
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tf.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def zip_add_symlink(zf: zipfile.ZipFile, name: str, target: str) -> None:
    info = zipfile.ZipInfo(name)
    info.create_system = 3  # unix
    info.external_attr = (0o120777 << 16)
    zf.writestr(info, target)


def gz(data: bytes) -> bytes:
    return gzip.compress(data, 6)


def listing(folder: Path) -> set[str]:
    """Every path under `folder` (links not followed)."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(folder):
        for n in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, n), folder))
    return out
