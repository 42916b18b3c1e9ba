"""What a file's path says about its writer: rank, local rank, host, node (FORMATS.md §2.2)."""

from __future__ import annotations

import re

from ncclforensics.parse.lines import FileContext

_TORCHRUN_TREE = re.compile(r"(?:^|/)(?P<node>(?:[^/]+/)*?[^/]+)/attempt_(?P<attempt>\d+)/(?P<lr>\d+)/(?P<leaf>[^/]+)$")
# Open MPI 3+ `mpirun --output-filename DIR`: DIR/<job>/rank.<r>/stdout|stderr|stddiag, <r> the
# MPI_COMM_WORLD rank, zero-filled (mpirun(1), docs/man-openmpi/man1/mpirun.1.rst; open-mpi/ompi#7133)
_OMPI_TREE = re.compile(r"(?:^|/)rank\.(?P<r>\d{1,7})/(?:stdout|stderr|stddiag)$")
_RANK_NAME = re.compile(r"(?:^|[^a-z])rank[_\-]?(?P<r>\d{1,6})(?![\d])", re.I)
# node05, gpu-q17, ip-10-0-0-1, worker12.cluster: letters, then a number that ends the short name
_HOSTISH = re.compile(r"^[A-Za-z][A-Za-z\-_]{0,40}\d[\d\-]{0,20}(?:\.[A-Za-z][\w\-]{0,62}){0,6}$")
_DMESG_HOST = re.compile(r"^(?:dmesg|kern|syslog|messages)[-_.](?P<host>[A-Za-z][\w.\-]*?)(?:\.(?:log|txt|out))?$")
_KERNEL_DIR = re.compile(r"^(?:dmesg|kern|kernel|syslog|messages)(?:[-_.]?logs?)?$", re.I)
_STEM = re.compile(r"(?:\.(?:log|txt|out))+$", re.I)
_EXTENSIONS = frozenset({"txt", "log", "out", "err", "gz", "bz2", "zst", "xz", "json"})
_NOT_HOST_DIRS = re.compile(
    r"^(?:attempt_\d+|\d+|logs?|torchrun_logs|fr_trace\w*|run\w*|job\w*|step\w*|output\w*|tmp|rank\w*|"
    r"epoch\w*|case\w*|test\w*|exp\w*|v\d+)$", re.I)


def path_hints(name: str) -> FileContext:
    """Rank, local rank, host and node key a file's path suggests (FORMATS.md §2.2)."""
    ctx = FileContext(name=name)
    parts = name.split("!")[-1].split("/")
    leaf = parts[-1]
    m = _TORCHRUN_TREE.search(name)
    if m is not None and m.group("leaf") in ("stdout.log", "stderr.log", "error.json"):
        ctx.local_rank = int(m.group("lr"))
        ctx.attempt = int(m.group("attempt"))
        ctx.one_process = True
        ctx.node = m.group("node")
        dirs = m.group("node").split("/")[:-1]  # the part before <run_id>_<random>
    else:
        dirs = parts[:-1]
        om = _OMPI_TREE.search(name)
        rm = _RANK_NAME.search(leaf) or om
        if rm is not None:
            ctx.rank = int(rm.group("r"))
        ctx.one_process = om is not None
    dm = _DMESG_HOST.match(leaf)
    # dmesg.txt names no host, nor does dmesg-T.txt: one letter is dmesg's option (util-linux dmesg(1): -T
    # --ctime, -H --human, -e --reltime, -x --decode), never a host name
    if dm is not None and dm.group("host").lower() not in _EXTENSIONS and len(dm.group("host")) > 1:
        ctx.host = dm.group("host")
    elif len(parts) > 1 and _KERNEL_DIR.match(parts[-2]):
        stem = _STEM.sub("", leaf)  # dmesg/gpu-b27.txt: one kernel log per host, named by the host
        if _HOSTISH.match(stem) and not _RANK_NAME.search(stem):
            ctx.host = stem
    for d in reversed(dirs):
        if _HOSTISH.match(d) and not _NOT_HOST_DIRS.match(d):
            ctx.host = ctx.host or d
            break
    if not ctx.node:
        ctx.node = ctx.host or ""
    return ctx
