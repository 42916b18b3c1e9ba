"""Run identity from log content: which files belong to one run, read from a sample of each file.

`scan` and `analyze` ask this module whether pieces of an archive (files, per-host folders) are one
run or several (DESIGN.md §7). Each log file gives an `Identity` from its first HEAD_BYTES and last
TAIL_BYTES only (the head of a compressed log; a Flight Recorder dump is read whole up to
MAX_DUMP_SAMPLE), so a multi-GB run costs a few MB of reading here. What it looks for, with the
FORMATS.md section of each line shape:

- torchrun launches: the agent's OMP banner or `Starting elastic_operator` (§1.4, §8.1): agent pid and time;
- run ids: torchrun `<run_id>_<rand>` log folders and error-file paths (§2.2), `run_id :` launch
  configs (§8.1), rendezvous names (§9.4); the default run id `none` identifies nothing;
- world sizes stated at init: `world_size=N` / `world size: N` / `WORLD_SIZE=N` statements (apps,
  launchers, the store barrier §8.4), `global_world_sizes=[N, …]` (§8.1), ProcessGroupNCCL
  `size: N` (§5.2), NCCL `nranks N` (§10.2), `[Rank r/N]` (§1.5), Flight Recorder `pg_config` (§15.2);
- the master (store) address: `master=`/`MASTER_ADDR=`/`master_addr=`/`MASTER_PORT=`, `rdzv_endpoint`
  (§8.1), the address c10d clients connect to (§9.1);
- NCCL `commId 0x…` (§10.2), Slurm job ids (§13, `slurm-<job>.out` §2.2);
- global ranks (`[rank<r>]:`, `global rank: r`, `[Rank r/N]`, `[rank r]`, ChildFailedError `rank :`,
  `global_ranks=[…]`, a dump's `<prefix><rank>`), hosts (NCCL `host:pid:tid`, ChildFailedError `host :`);
- the time span: the first and last local-time stamps (c10 and torch Python headers, ISO and US
  stamps without a zone, syslog/dmesg -T); year-less stamps take the file's own year, else its mtime's.

`conflicts(a, b)` says why two pieces cannot be one run, `links(a, b)` what ties them together; the
grouping itself is in discover.py.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ncclforensics.ingest import archive, decode
from ncclforensics.parse import flight_recorder

HEAD_BYTES = 64 << 10
TAIL_BYTES = 16 << 10
MAX_DUMP_SAMPLE = 16 << 20  # Flight Recorder dumps and JSON files read whole up to this size
# Two pieces whose time spans are further apart than this are two runs ...
APART = dt.timedelta(minutes=10)
# ... and this far apart when the later one shows its own torchrun launch after the other had ended
# (the clocks of a run's hosts agree to well under this).
LAUNCH_AFTER_END = dt.timedelta(seconds=30)
DEFAULT_RUN_IDS = frozenset({"none", "default", ""})
_LOOPBACK = re.compile(r"^(?:127\.\d+\.\d+\.\d+|localhost|0\.0\.0\.0|::1?|\[::1?\]|::ffff:127\.0\.0\.1)$", re.I)

# --- line shapes (compiled once, run over a whole sample with MULTILINE) ---------------------------
_MMDD_TS = r"(?P<mmdd>\d{3,4}) (?P<hms>\d\d:\d\d:\d\d)\.(?P<frac>\d{6,9})"
# torch Python logging 2.3+: `W1122 07:44:17.428000 873 torch/distributed/run.py:874] ****`
_BANNER = re.compile(
    r"(?<![\w.])[VIWEC](?P<mmdd>\d{4}) (?P<hms>\d\d:\d\d:\d\d)\.(?P<frac>\d{6}) +(?P<pid>\d+) "
    r"(?:\S*/)?torch/distributed/(?:run\.py:\d+\] \*{5}|launcher/api\.py:\d+\] Starting elastic_operator)")
# torch Python logging 2.1-2.2: `[2025-02-17 06:30:12,408] torch.distributed.run: [WARNING] ****`
_BANNER21 = re.compile(
    r"\[(?P<date>\d{4}-\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d),(?P<frac>\d{3})\] torch\.distributed\."
    r"(?:run: \[WARNING\] \*{5}|launcher\.api: \[INFO\] Starting elastic_operator)")
_WORLD = re.compile(
    r"(?<![\w])(?<!local )(?:world[_ ]size|WORLD_SIZE)[\"']?\s*[=:]\s*[\"']?(?P<n>\d{1,7})\b"
    r"|(?<![\w])global_world_sizes=\[(?P<g>\d{1,7})"
    r"|ProcessGroupNCCL initialization options: size: (?P<pg>\d{1,7})"
    r"|\bn[Rr]anks[ =](?P<nccl>\d{1,7})\b"
    r"|\[Rank \d{1,7}/(?P<app>\d{1,7})\]", re.I)
_HOSTNAME = r"(?P<addr>\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9][\w.\-]{0,252})"
_MASTER = re.compile(
    r"(?<![\w])(?:master(?:[_ ]?addr(?:ess)?)?|MASTER_ADDR)[\"']?\s*[=:]\s*[\"']?" + _HOSTNAME
    + r"(?::(?P<port>\d{1,5})\b)?"
    r"|(?<![\w])(?:master[_ ]?port|MASTER_PORT)[\"']?\s*[=:]\s*[\"']?(?P<mport>\d{1,5})\b"
    r"|(?<![\w])rdzv[_-]endpoint\s*[=:]?\s*(?P<raddr>[A-Za-z0-9][\w.\-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\]):(?P<rport>\d{1,5})"
    r"|(?:trying to connect to|any network address of) \((?P<caddr>[^,()\s]{1,253}), (?P<cport>\d{1,5})\)"
    r"|failed to connect/validate to host (?P<taddr>[^\s]{1,253}):(?P<tport>\d{1,5}) ", re.I)
_RUN_ID = re.compile(
    r"(?:^|\] ) {1,8}run_id {0,40}: (?P<cfg>[^\s]{1,200})"
    r"|of the rendezvous '(?P<rdzv>[^'\n]{1,200})'|The rendezvous '(?P<closed>[^'\n]{1,200})' is closed"
    r"|--rdzv[_-]id[= ](?P<arg>[^\s'\"]{1,200})"
    r"|torchelastic_\w{1,40}/(?P<agent>[\w.\-]{1,200}_[a-z0-9_]{8})/attempt_\d+/", re.M)
_AGENT_DIR = re.compile(r"^(?P<run_id>.+)_[a-z0-9_]{8}$")
_SLURM = re.compile(
    r"StepId=(?P<a>\d+)|\*\*\* (?:STEP|JOB) (?P<b>\d+)(?:\.\w+)? ON |oom[-_]kill events? in (?:step )?(?P<c>\d+)\."
    r"|SLURM_JOB_?ID[\"']?\s*[=:]\s*[\"']?(?P<d>\d+)|job allocation (?P<e>\d+)|srun: job (?P<f>\d+) ")
_SLURM_FILE = re.compile(r"^slurm-(?P<job>\d+(?:_\d+)?)\.(?:out|err|log|txt)$")
_COMM_ID = re.compile(r"\bcommId (0x[0-9a-fA-F]{1,16})\b")
_RANK = re.compile(
    r"\[rank(?P<a>\d{1,7})\]:|global rank: (?P<b>\d{1,7})\b|\[Rank (?P<c>\d{1,7})/\d{1,7}\]"
    r"|(?<![\w\[])\[rank ?(?P<d>\d{1,7})\] |^ {2}rank {1,12}: (?P<e>\d{1,7}) \(local_rank", re.M)
_GLOBAL_RANKS = re.compile(r"(?<![\w])global_ranks=\[(?P<r>[\d, ]{1,20000})\]")
_HOST = re.compile(
    r"(?:^|[\]:] ?)(?P<h>[A-Za-z][\w\-]{0,62}):\d{1,9}:\d{1,9} (?:\[\d{1,4}\] )?"
    r"(?:[\w./\-]+:\d+ (?:\(\w+\) )?)?NCCL (?:INFO|WARN)"
    r"|^ {2}host {1,12}: (?P<c>[A-Za-z][\w.\-]{0,252})", re.M)
# Local-time stamps (no zone) for the time span; kernel uptimes and zoned stamps are left out.
_TS = re.compile(
    r"(?<![\w.])(?:\[[FEWIV]" + _MMDD_TS + r" "
    r"|(?P<sev>[VIWEC])(?P<mmdd2>\d{4}) (?P<hms2>\d\d:\d\d:\d\d)\.(?P<frac2>\d{6}) +\d+ [^\s:\]]+:\d+\]"
    r"|(?P<date>\d{4}-\d\d-\d\d)[T ](?P<hms3>\d\d:\d\d:\d\d)(?:[.,](?P<frac3>\d{1,9}))?(?![\d+\-]|Z|\.\d)"
    r"|(?P<m4>\d\d)/(?P<d4>\d\d)/(?P<y4>\d{4}) (?P<hms4>\d\d:\d\d:\d\d)"
    r"|\[\w{3} (?P<mon5>\w{3}) +(?P<d5>\d{1,2}) (?P<hms5>\d\d:\d\d:\d\d) (?P<y5>\d{4})\]"
    r"|^(?P<mon6>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<d6>\d{1,2}) (?P<hms6>\d\d:\d\d:\d\d) )")
_DATED = re.compile(r"(?<!\d)(?P<y>(?:19|20)\d\d)-\d\d-\d\d[T ]\d\d:\d\d")
# A line a log writer made: a timestamp, a launcher/rank prefix, a c10/NCCL/kernel header, a traceback.
_LOGGY = re.compile(
    r"^(?:\[rank\d+\]:|\[[A-Za-z_]\w*\d+\]:|\[[FEWIV]\d{0,4} |[VIWEC]\d{4} \d\d:\d\d:\d\d|"
    r"\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d|\[ *\d+\.\d{3,9}\]|\d\d/\d\d/\d{4} \d\d:|"
    r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2} \d\d:\d\d:\d\d|"
    r"[\w.\-]+:\d+:\d+ \[\d+\] |Traceback \(most recent call last\)|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)[: ]|"
    r" *\d{1,6}: \S|srun: |slurmstepd: |NCCL (?:INFO|WARN)|\w+(?:\.\w+)*(?:Error|Exception): )", re.M)
_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}
# Files that are notes about a run, not a log of one (`NOTES.txt`, `README`): never a run by themselves.
DOC_NAMES = re.compile(r"^(?:readme|notes?|changelog|changes|license|copying|todo|summary|description)"
                       r"(?:[_\-]\w+)?(?:\.txt)?$", re.I)


@dataclass
class Identity:
    """What a piece of a run (a file, a folder) says about which run it belongs to."""

    launches: set[tuple[int | None, dt.datetime]] = field(default_factory=set)  # (agent pid, time)
    run_ids: set[str] = field(default_factory=set)  # non-default torchrun / rendezvous run ids
    agents: set[str] = field(default_factory=set)  # torchrun agent log folders `<run_id>_<rand>`
    worlds: set[int] = field(default_factory=set)
    masters: set[str] = field(default_factory=set)  # store / master addresses
    ports: set[int] = field(default_factory=set)
    jobs: set[str] = field(default_factory=set)  # Slurm job ids
    comms: set[str] = field(default_factory=set)  # NCCL commIds
    ranks: set[int] = field(default_factory=set)  # global ranks seen
    hosts: set[str] = field(default_factory=set)
    first: dt.datetime | None = None
    last: dt.datetime | None = None
    loggy: int = 0  # lines that look written by a logger
    files: int = 0
    problem: str | None = None  # why a file gave nothing: empty, unreadable, binary

    def add(self, other: Identity) -> Identity:
        for name in ("launches", "run_ids", "agents", "worlds", "masters", "ports", "jobs", "comms", "ranks",
                     "hosts"):
            getattr(self, name).update(getattr(other, name))
        if other.first is not None:
            self.first = other.first if self.first is None else min(self.first, other.first)
        if other.last is not None:
            self.last = other.last if self.last is None else max(self.last, other.last)
        self.loggy += other.loggy
        self.files += other.files
        return self

    @property
    def world(self) -> int | None:
        return max(self.worlds) if self.worlds else None

    @property
    def complete(self) -> bool:
        """Every rank of the stated world size shows up (a whole run, not one host's part of it)."""
        w = self.world
        return w is not None and w <= 100_000 and self.ranks.issuperset(range(w))

    @property
    def silent(self) -> bool:
        """Nothing that could tie it to a run or tell it from one."""
        return not (self.launches or self.run_ids or self.agents or self.worlds or self.masters or self.jobs
                    or self.comms or self.first)

    def summary(self) -> str:
        """One line for `scan --list`."""
        out = []
        if self.launches:
            ls = sorted(self.launches, key=lambda x: x[1])
            shown = ", ".join(f"{_t(t)}" + (f" (pid {p})" if p is not None else "") for p, t in ls[:3])
            out.append(f"torchrun launch{'es' if len(ls) > 1 else ''} {shown}{' …' if len(ls) > 3 else ''}")
        if self.run_ids:
            out.append("run id " + ", ".join(sorted(self.run_ids)[:3]))
        if self.jobs:
            out.append("Slurm job " + ", ".join(sorted(self.jobs)[:3]))
        if self.world:
            out.append(f"world size {self.world}" + (" (all ranks seen)" if self.complete else ""))
        if self.masters:
            m = sorted(self.masters)[:2]
            out.append("master " + ", ".join(m) + (f" port {', '.join(map(str, sorted(self.ports)[:3]))}"
                                                   if self.ports else ""))
        if self.comms:
            out.append(f"{len(self.comms)} NCCL commId{'s' if len(self.comms) > 1 else ''}")
        if self.first is not None:
            out.append(f"{_t(self.first)} – {_t(self.last)}")
        return "; ".join(out) if out else "no run identity in its logs"


def _t(ts: dt.datetime | None) -> str:
    if ts is None:
        return "?"
    return ts.strftime("%Y-%m-%d %H:%M:%S") if ts.year > 1 else ts.strftime("%m-%d %H:%M:%S")


# --- reading a file's sample ---------------------------------------------------------------------

def agent_dir_identity(name: str) -> Identity:
    """A torchrun `<run_id>_<rand>` log folder (it holds attempt_N folders; FORMATS.md §2.2)."""
    ident = Identity(agents={name})
    m = _AGENT_DIR.match(name)
    if m is not None and m.group("run_id").lower() not in DEFAULT_RUN_IDS:
        ident.run_ids.add(m.group("run_id"))
    return ident


def file_identity(path: Path, name: str, size: int, mtime_ns: int) -> Identity:
    """The identity of one log file from a sample of it. Never raises: problems become `problem`."""
    ident = Identity(files=1)
    m = _SLURM_FILE.match(name.rsplit("/", 1)[-1])
    if m is not None:
        ident.jobs.add(m.group("job"))
    if size == 0:
        ident.problem = "empty file"
        return ident
    comp = archive.compression_of(name)
    try:
        with open(path, "rb") as raw:
            if comp is not None:
                stream = archive.decompressing(raw, comp, size, name)
                head, tail = stream.read(HEAD_BYTES), b""
            else:
                head = raw.read(HEAD_BYTES if size > MAX_DUMP_SAMPLE or not _maybe_whole(name) else MAX_DUMP_SAMPLE)
                tail = b""
                if size > len(head):
                    raw.seek(max(len(head), size - TAIL_BYTES))
                    tail = raw.read(TAIL_BYTES)
    except Exception as exc:  # unreadable, corrupt compressed stream: the analysis says more
        ident.problem = f"unreadable ({getattr(exc, 'strerror', None) or type(exc).__name__})"
        return ident
    try:
        kind = decode.sniff(head)
    except decode.BinaryContent as exc:
        ident.problem = str(exc)
        return ident
    if kind == "empty":
        ident.problem = "empty file"
        return ident
    if kind == "pickle" or (name.lower().endswith(".json") and head.lstrip().startswith(b"{")):
        _dump_identity(ident, head, name, is_pickle=kind == "pickle", whole=len(head) >= size)
        return ident
    if kind not in ("text", "utf-16"):
        return ident
    if kind == "utf-16":
        head = head.decode("utf-16", "replace").encode("utf-8")
        tail = b""
    text_head = _lines_of(head, cut_start=False, cut_end=len(head) < size)
    text_tail = _lines_of(tail, cut_start=True, cut_end=False) if tail else ""
    year = _year_of(text_head, text_tail, mtime_ns)
    for text in (text_head, text_tail):
        if text:
            _scan_text(ident, text, year)
    return ident


def _maybe_whole(name: str) -> bool:
    """Flight Recorder dumps (no suffix, `<prefix><rank>`) and JSON files are read whole when small."""
    leaf = name.rsplit("/", 1)[-1].lower()
    return leaf.endswith(".json") or "." not in leaf


def _lines_of(data: bytes, *, cut_start: bool, cut_end: bool) -> str:
    if cut_start:
        nl = data.find(b"\n")
        data = data[nl + 1:] if nl >= 0 else b""
    if cut_end:
        nl = data.rfind(b"\n")
        data = data[: nl + 1] if nl >= 0 else b""
    return decode.decode_bytes(decode.clean(data)).replace("\r", "\n")


def _year_of(head: str, tail: str, mtime_ns: int) -> int:
    m = _DATED.search(head) or _DATED.search(tail)
    if m is not None:
        return int(m.group("y"))
    try:
        return dt.datetime.fromtimestamp(mtime_ns / 1e9).year
    except (OverflowError, OSError, ValueError):
        return 1


def _scan_text(ident: Identity, text: str, year: int) -> None:
    ident.loggy += len(_LOGGY.findall(text, 0, 1 << 20)) if ident.loggy < 50 else 0
    for m in _BANNER.finditer(text):
        ts = _mmdd_ts(m.group("mmdd"), m.group("hms"), m.group("frac"), year)
        if ts is not None:
            ident.launches.add((int(m.group("pid")), ts))
    for m in _BANNER21.finditer(text):
        ts = _date_ts(m.group("date"), m.group("hms"), m.group("frac"))
        if ts is not None:
            ident.launches.add((None, ts))
    for m in _WORLD.finditer(text):
        n = int(next(g for g in m.groups() if g is not None))
        if 0 < n <= 10_000_000:
            ident.worlds.add(n)
    for m in _MASTER.finditer(text):
        addr = m.group("addr") or m.group("raddr") or m.group("caddr") or m.group("taddr")
        port = m.group("port") or m.group("mport") or m.group("rport") or m.group("cport") or m.group("tport")
        if addr and not addr.isdigit() and addr.lower() not in ("none", "null", "true", "false"):
            ident.masters.add(addr.strip("[]").lower())
        if port and 0 < int(port) < 65536:
            ident.ports.add(int(port))
    for m in _RUN_ID.finditer(text):
        if m.group("agent"):
            ident.add(agent_dir_identity(m.group("agent")))
            continue
        rid = m.group("cfg") or m.group("rdzv") or m.group("closed") or m.group("arg")
        if rid and rid.lower() not in DEFAULT_RUN_IDS:
            ident.run_ids.add(rid)
    for m in _SLURM.finditer(text):
        ident.jobs.add(next(g for g in m.groups() if g is not None))
    ident.comms.update(m.lower() for m in _COMM_ID.findall(text))
    for m in _RANK.finditer(text):
        ident.ranks.add(int(next(g for g in m.groups() if g is not None)))
    for m in _GLOBAL_RANKS.finditer(text):
        ident.ranks.update(int(x) for x in re.findall(r"\d+", m.group("r")))
    for m in _HOST.finditer(text):
        ident.hosts.add((m.group("h") or m.group("c")).split(".")[0].lower())
    first = last = None
    lines = text.split("\n")
    for line in lines:
        first = _line_ts(line, year)
        if first is not None:
            break
    for line in reversed(lines):
        last = _line_ts(line, year)
        if last is not None:
            break
    for ts in (first, last):
        if ts is not None:
            ident.first = ts if ident.first is None else min(ident.first, ts)
            ident.last = ts if ident.last is None else max(ident.last, ts)


def _line_ts(line: str, year: int) -> dt.datetime | None:
    m = _TS.search(line, 0, 200)
    if m is None:
        return None
    g = m.group
    if g("mmdd"):
        return _mmdd_ts(g("mmdd"), g("hms"), g("frac"), year)
    if g("mmdd2"):
        return _mmdd_ts(g("mmdd2"), g("hms2"), g("frac2"), year)
    if g("date"):
        return _date_ts(g("date"), g("hms3"), g("frac3"))
    if g("y4"):
        return _date_ts(f"{g('y4')}-{g('m4')}-{g('d4')}", g("hms4"), None)
    if g("mon5") in _MONTHS:
        return _date_ts(f"{g('y5')}-{_MONTHS[g('mon5')]:02d}-{int(g('d5')):02d}", g("hms5"), None)
    if g("mon6"):
        return _mmdd_ts(f"{_MONTHS[g('mon6')]}{int(g('d6')):02d}", g("hms6"), None, year)
    return None


def _mmdd_ts(mmdd: str, hms: str, frac: str | None, year: int) -> dt.datetime | None:
    try:
        month, day = divmod(int(mmdd), 100)
        h, mi, s = (int(x) for x in hms.split(":"))
        return dt.datetime(year, month, day, h, mi, s, int((frac or "0")[:6].ljust(6, "0")))
    except ValueError:
        return None


def _date_ts(date: str, hms: str, frac: str | None) -> dt.datetime | None:
    try:
        y, mo, d = (int(x) for x in date.split("-"))
        h, mi, s = (int(x) for x in hms.split(":"))
        return dt.datetime(y, mo, d, h, mi, s, int((frac or "0")[:6].ljust(6, "0")))
    except ValueError:
        return None


def _dump_identity(ident: Identity, data: bytes, name: str, *, is_pickle: bool, whole: bool) -> None:
    """A Flight Recorder dump: its process groups' sizes (the largest is the world) and its rank."""
    if not whole:
        return
    try:
        obj = flight_recorder.parse_dump(data, is_pickle=is_pickle)
    except Exception:  # error.json, another JSON document, a refused or broken pickle
        if not is_pickle:
            _error_json_identity(ident, data)
        return
    ident.loggy += 1
    cfg = obj.get("pg_config")
    if isinstance(cfg, dict):
        for pg in cfg.values():
            if isinstance(pg, dict) and pg.get("ranks") is not None:
                n = len(re.findall(r"\d+", str(pg["ranks"])[:1_000_000]))
                if n:
                    ident.worlds.add(n)
    rank = flight_recorder.rank_from_name(name)
    if rank is not None:
        ident.ranks.add(rank)


def _error_json_identity(ident: Identity, data: bytes) -> None:
    """A torchrun error.json (FORMATS.md §8.3) is a log line of its rank: it counts as log content."""
    try:
        obj = json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return
    if isinstance(obj, dict) and "message" in obj:
        ident.loggy += 1


# --- relations -------------------------------------------------------------------------------------

def is_loopback(addr: str) -> bool:
    return bool(_LOOPBACK.match(addr))


def conflicts(a: Identity, b: Identity) -> list[str]:
    """Why a ("here") and b ("there") cannot be parts of one run (empty: nothing says so)."""
    why = []
    if a.run_ids and b.run_ids and not a.run_ids & b.run_ids:
        why.append(f"different run ids ({_few(a.run_ids)} here, {_few(b.run_ids)} there)")
    if a.jobs and b.jobs and not a.jobs & b.jobs:
        why.append(f"different Slurm jobs ({_few(a.jobs)} here, {_few(b.jobs)} there)")
    if a.world and b.world and a.world != b.world:
        why.append(f"different world sizes ({a.world} here, {b.world} there)")
    if a.comms and b.comms and not a.comms & b.comms:
        why.append("no NCCL commId in common")
    gap = _gap(a, b)
    if gap is not None:
        early, late = (a, b) if a.last < b.first else (b, a)
        relaunch = [t for _, t in late.launches if t - early.last > LAUNCH_AFTER_END]
        if gap > APART:
            why.append(f"{_dur(gap)} apart in time ({_t(early.last)} → {_t(late.first)})")
        elif relaunch and gap > LAUNCH_AFTER_END:
            which = "here" if late is a else "there"
            why.append(f"torchrun launched {which} at {_t(min(relaunch))}, after the other side had ended "
                       f"({_t(early.last)})")
    for whole, other, where in ((a, b, "here"), (b, a, "there")):
        if whole.complete and whole.launches and other.launches - whole.launches:
            why.append(f"all {whole.world} ranks {where} come from one torchrun launch, "
                       "and the other side was launched separately")
            break
    return why


def links(a: Identity, b: Identity) -> list[str]:
    """What ties a and b to one run (shared ids), when they are not copies of the same part."""
    why = []
    if a.run_ids & b.run_ids:
        why.append(f"run id {_few(a.run_ids & b.run_ids)}")
    if a.jobs & b.jobs:
        why.append(f"Slurm job {_few(a.jobs & b.jobs)}")
    if a.comms & b.comms:
        why.append(f"NCCL commId {_few(a.comms & b.comms)}")
    shared = {m for m in a.masters & b.masters if not is_loopback(m)}
    if shared and (not a.ports or not b.ports or a.ports & b.ports):
        gap = _gap(a, b)
        if gap is None or gap <= LAUNCH_AFTER_END:
            why.append(f"master {_few(shared)}")
    if not why or duplicate(a, b):
        return []
    return why


def duplicate(a: Identity, b: Identity) -> bool:
    """Two copies of the same part: the same launch or agent folder, or the same ranks twice."""
    if a.launches & b.launches or a.agents & b.agents:
        return True
    if a.ranks and b.ranks and (a.ranks <= b.ranks or b.ranks <= a.ranks) and a.complete and b.complete:
        return True
    return bool(a.hosts and b.hosts and a.hosts == b.hosts and a.ranks == b.ranks)


def _gap(a: Identity, b: Identity) -> dt.timedelta | None:
    """How far apart two time spans are (None: they overlap, or one has no span)."""
    if a.first is None or b.first is None:
        return None
    if (a.first.year == 1) != (b.first.year == 1):
        return None
    if a.last < b.first:
        return b.first - a.last
    if b.last < a.first:
        return a.first - b.last
    return None


def _few(values: set) -> str:
    shown = sorted(map(str, values))
    return ", ".join(shown[:3]) + (" …" if len(shown) > 3 else "")


def _dur(d: dt.timedelta) -> str:
    s = int(d.total_seconds())
    if s >= 2 * 86400:
        return f"{s // 86400} days"
    if s >= 7200:
        return f"{s // 3600} h"
    if s >= 120:
        return f"{s // 60} min"
    return f"{s} s"


def stat_ns(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns
