"""Run identity from log content: which files belong to one run, read from a sample of each file.

Above ~400 lines because of the many line shapes listed below, each a pattern with a few lines of
reading; `conflicts` and `links` compare the fields they fill, so they stay beside them.

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
  `size: N` (§5.2), NCCL `nranks N` of init lines (§10.2), Flight Recorder `pg_config` (§15.2);
- the master (store) address: `master=`/`MASTER_ADDR=`/`master_addr=`/`MASTER_PORT=`, `rdzv_endpoint`
  (§8.1), the address c10d clients connect to (§9.1);
- NCCL `commId 0x…` (§10.2), Slurm job ids (§13, `slurm-<job>.out` §2.2);
- global ranks (`[rank<r>]:`, `global rank: r`, `[rank r]`, ChildFailedError `rank :`,
  `global_ranks=[…]`, a dump's `<prefix><rank>`), hosts (NCCL `host:pid:tid`, ChildFailedError `host :`);
- the time span: the first and last local-time stamps (c10 and torch Python headers, ISO and US
  stamps without a zone, syslog/dmesg -T), compared without their year (most torch stamps have none;
  guessing it from a file's mtime would tell copies of one run apart), plus the years that dated
  stamps name.

`conflicts(a, b)` says why two pieces cannot be one run, `links(a, b)` what ties them together; the
grouping itself is in discover.py.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ncclforensics.ingest import archive, decode
from ncclforensics.parse import flight_recorder

HEAD_BYTES = 32 << 10
TAIL_BYTES = 8 << 10
MAX_DUMP_SAMPLE = 16 << 20  # Flight Recorder dumps and JSON files read whole up to this size
BATCH_CHARS = 8 << 20  # sample text searched in one batch (its text and polars' copy are held at once)
# Two pieces whose time spans are further apart than this are two runs ...
APART = dt.timedelta(minutes=10)
# ... unless one of them says nothing but its times (a kernel log, an nvidia-smi dump beside a run): a GPU
# fault comes a whole collective timeout (10 or 30 min by default, FORMATS.md §3) before the first stamped
# line of the workers that waited for it
APART_TIME_ONLY = dt.timedelta(minutes=35)
# ... and this far apart when the later one shows its own torchrun launch after the other had ended
# (the clocks of a run's hosts agree to well under this).
LAUNCH_AFTER_END = dt.timedelta(seconds=30)
SPAN_YEAR = 2000  # a leap year: every month-day of a year-less stamp exists in it
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
_WORLD = re.compile(  # a preceding letter, `_` or "local " is checked in _scan_candidates
    r"(?:world[_ ]size|World[_ ][Ss]ize|WORLD_SIZE)[\"']?\s{0,3}[=:]\s{0,3}[\"']?(?P<n>\d{1,7})\b"
    r"|global_world_sizes=\[(?P<g>\d{1,7})"
    r"|ProcessGroupNCCL initialization options: size: (?P<pg>\d{1,7})"
    r"|\bnranks (?P<nccl>\d{1,7})\b")
_HOSTNAME = r"(?P<addr>\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9][\w.\-]{0,252})"
_MASTER = re.compile(
    r"(?:[Mm]aster(?:_addr(?:ess)?| addr(?:ess)?)?|MASTER_ADDR)[\"']?\s{0,3}[=:]\s{0,3}[\"']?" + _HOSTNAME
    + r"(?::(?P<port>\d{1,5})\b)?"
    r"|(?:[Mm]aster[_ ]port|MASTER_PORT)[\"']?\s{0,3}[=:]\s{0,3}[\"']?(?P<mport>\d{1,5})\b"
    r"|rdzv[_-]endpoint\s{0,40}[=:]?\s{0,3}(?P<raddr>[A-Za-z0-9][\w.\-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\]):(?P<rport>\d{1,5})"
    r"|(?:trying to connect to|any network address of) \((?P<caddr>[^,()\s]{1,253}), (?P<cport>\d{1,5})\)"
    r"|failed to connect/validate to host (?P<taddr>[^\s]{1,253}):(?P<tport>\d{1,5}) ")
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
_RANK_PREFIX = re.compile(r"\[rank ?(\d{1,7})\][: ]")  # `[rank3]:` (torch), `[rank 3] `, `[rank3] ` (apps)
_RANK = re.compile(r"global rank: (?P<b>\d{1,7})\b|^ {2}rank {1,12}: (?P<e>\d{1,7}) \(local_rank", re.M)
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
_DIGITS = re.compile(r"\d+")
# The same local-time stamps as _TS, for polars' Rust regex (no look-around): the first stamp of a
# sample and the last one in its last LAST_LOOK characters; _line_ts parses what they match.
_STAMP_RS = (
    r"(?m)(?:^|[^\w.])(?:\[[FEWIV]\d{3,4} \d\d:\d\d:\d\d\.\d{6,9} "
    r"|[VIWEC]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [^\s:\]]+:\d+\]"
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:[^\d+\-Z.]|$)"
    r"|\d\d/\d\d/\d{4} \d\d:\d\d:\d\d"
    r"|\[\w{3} \w{3} +\d{1,2} \d\d:\d\d:\d\d \d{4}\]"
    r"|^(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2} \d\d:\d\d:\d\d )")
_YEAR_RS = r"(?:^|[^\d])(?:19|20)\d\d-[01]\d-[0-3]\d[T ][0-2]\d:"
_YEAR = re.compile(r"(?:19|20)\d\d")
LAST_LOOK = 8192
MAX_CANDIDATES = 4000  # identity lines read per sample
_WORD_BEFORE = re.compile(r"([A-Za-z]+)[ \-]$")
_QUALIFIERS = frozenset({"local", "parallel", "group", "node", "pipeline", "expert", "tensor", "data", "model",
                         "context", "sequence", "role"})
_CLOCK = re.compile(r":\d\d:\d\d")  # the end of a time of day: lines worth parsing for a stamp
# Literals of the lines _scan_candidates reads (every regex above has one of them in each variant).
_LITERALS = (  # lower case: the lines are found case-blind
    "torch/distributed/run.py", "elastic_operator", "torch.distributed.run:", "world_size", "world size",
    "initialization options: size", "init complete", "commid", "master", "rdzv", "run_id", "rendezvous '",
    "torchelastic_", "connect to", "network address of", "stepid=", "*** step ", "*** job ", "kill event",
    "slurm_job", "job allocation", "srun: job ", "global rank: ", "global_ranks=[", "(local_rank: ", "  host ",
)
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
    first: dt.datetime | None = None  # first and last stamp, in the year SPAN_YEAR (see _gap)
    last: dt.datetime | None = None
    years: set[int] = field(default_factory=set)  # years that dated stamps name
    loggy: int = 0  # lines that look written by a logger
    files: int = 0
    problem: str | None = None  # why a file gave nothing: empty, unreadable, binary

    def add(self, other: Identity) -> Identity:
        for name in ("launches", "run_ids", "agents", "worlds", "masters", "ports", "jobs", "comms", "ranks",
                     "hosts", "years"):
            getattr(self, name).update(getattr(other, name))
        if other.first is not None:
            self.first = other.first if self.first is None else min(self.first, other.first)
        if other.last is not None:
            self.last = other.last if self.last is None else max(self.last, other.last)
        self.loggy += other.loggy
        self.files += other.files
        return self

    def to_json(self) -> dict:
        """Plain JSON values (the scan's identity cache)."""
        out: dict = {k: sorted(v) for k, v in self.__dict__.items() if isinstance(v, set) and k != "launches"}
        out["launches"] = sorted([p, t.isoformat()] for p, t in self.launches)
        for k in ("first", "last"):
            out[k] = getattr(self, k).isoformat() if getattr(self, k) is not None else None
        out.update(loggy=self.loggy, files=self.files, problem=self.problem)
        return out

    @classmethod
    def from_json(cls, d: dict) -> Identity:
        ident = cls(loggy=int(d["loggy"]), files=int(d["files"]), problem=d["problem"])
        for k, v in d.items():
            if k != "launches" and isinstance(getattr(ident, k, None), set):
                getattr(ident, k).update(v)
        ident.launches = {(p, dt.datetime.fromisoformat(t)) for p, t in d["launches"]}
        for k in ("first", "last"):
            setattr(ident, k, dt.datetime.fromisoformat(d[k]) if d[k] else None)
        return ident

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
            end = self.last.strftime("%H:%M:%S") if self.last.date() == self.first.date() else _t(self.last)
            year = f" ({_few(self.years)})" if self.years else ""
            out.append(f"{_t(self.first)} – {end}{year}")
        return "; ".join(out) if out else "no run identity in its logs"


def _t(ts: dt.datetime | None) -> str:
    return "?" if ts is None else ts.strftime("%m-%d %H:%M:%S")


# --- reading a file's sample ---------------------------------------------------------------------

def agent_dir_identity(name: str) -> Identity:
    """A torchrun `<run_id>_<rand>` log folder (it holds attempt_N folders; FORMATS.md §2.2)."""
    ident = Identity(agents={name})
    m = _AGENT_DIR.match(name)
    if m is not None and m.group("run_id").lower() not in DEFAULT_RUN_IDS:
        ident.run_ids.add(m.group("run_id"))
    return ident


def file_identity(path: Path, name: str, size: int) -> Identity:
    """The identity of one log file from a sample of it (see identities)."""
    return identities([(path, name, size)])[0]


def identities(files: list[tuple[Path, str, int]]) -> list[Identity]:
    """The identity of each (path, name, size) from a sample of the file. Never raises: problems
    become `problem`. The samples are searched in batches: polars' Aho-Corasick kernel finds the few
    samples holding an identity literal (NCCL_DEBUG noise holds none), Python reads only those."""
    out = [Identity(files=1) for _ in files]
    texts: list[str] = []
    owners: list[int] = []
    held = 0
    for k, (path, name, size) in enumerate(files):
        for text in _sample(out[k], path, name, size):
            texts.append(text)
            owners.append(k)
            held += len(text)
        if held >= BATCH_CHARS:
            _scan_batch(out, texts, owners)
            texts, owners, held = [], [], 0
    if texts:
        _scan_batch(out, texts, owners)
    return out


def _sample(ident: Identity, path: Path, name: str, size: int) -> list[str]:
    """The head (and tail) of a log as text; a small Flight Recorder dump is read into ident instead."""
    m = _SLURM_FILE.match(name.rsplit("/", 1)[-1])
    if m is not None:
        ident.jobs.add(m.group("job"))
    if size == 0:
        ident.problem = "empty file"
        return []
    comp = archive.compression_of(name)
    try:
        with open(path, "rb") as raw:
            if comp is not None:
                head, tail = archive.decompressing(raw, comp, size, name).read(HEAD_BYTES), b""
                whole = False
            else:
                head = raw.read(HEAD_BYTES)
                whole = len(head) >= size
                if not whole and size <= MAX_DUMP_SAMPLE and head.startswith(decode.PICKLE_MAGIC + (b"{",)):
                    head += raw.read(MAX_DUMP_SAMPLE)  # a dump or a JSON document: read whole
                    whole = True
                tail = b""
                if not whole:
                    raw.seek(max(len(head), size - TAIL_BYTES))
                    tail = raw.read(TAIL_BYTES)
    except Exception as exc:  # unreadable, corrupt compressed stream: the analysis says more
        ident.problem = f"unreadable ({getattr(exc, 'strerror', None) or type(exc).__name__})"
        return []
    try:
        kind = decode.sniff(head)
    except decode.BinaryContent as exc:
        ident.problem = str(exc)
        return []
    if kind == "empty":
        ident.problem = "empty file"
        return []
    if kind == "pickle" or (name.lower().endswith(".json") and head.lstrip().startswith(b"{")):
        _dump_identity(ident, head, name, is_pickle=kind == "pickle", whole=whole)
        return []
    if kind not in ("text", "utf-16"):
        return []
    if kind == "utf-16":
        head, tail = head.decode("utf-16", "replace").encode("utf-8"), b""
    texts = [_lines_of(head, cut_start=False, cut_end=not whole)]
    if tail:
        texts.append(_lines_of(tail, cut_start=True, cut_end=False))
    return [t for t in texts if t]


def _lines_of(data: bytes, *, cut_start: bool, cut_end: bool) -> str:
    """Sample bytes as text, without the partial lines at a cut."""
    if cut_start:
        nl = data.find(b"\n")
        data = data[nl + 1:] if nl >= 0 else b""
    if cut_end:
        nl = data.rfind(b"\n")
        data = data[: nl + 1] if nl >= 0 else b""
    return decode.decode_bytes(decode.clean(data)).replace("\r", "\n")


def looks_like_log(path: Path, name: str) -> bool:
    """Whether a file's head holds a line a logger wrote (a stamp, a rank or launcher prefix, a c10,
    NCCL or kernel header, a traceback) or a literal of the analyzer's signatures (pasted console
    output without prefixes still names its errors)."""
    from ncclforensics.parse.signatures import load_signatures

    try:
        with open(path, "rb") as fh:
            comp = archive.compression_of(name)
            stream = archive.decompressing(fh, comp, None, name) if comp else fh
            text = decode.decode_bytes(stream.read(HEAD_BYTES))
    except Exception:
        return False
    return _LOGGY.search(text) is not None or any(a in text for a in load_signatures().anchors)


def _scan_batch(out: list[Identity], texts: list[str], owners: list[int]) -> None:
    import polars as pl

    frame = pl.DataFrame({"t": pl.Series(texts, dtype=pl.String)}).select(
        hits=pl.col("t").str.find_many(list(_LITERALS), ascii_case_insensitive=True),
        ranks=pl.col("t").str.extract_all(_RANK_PREFIX.pattern).list.unique(),
        first=pl.col("t").str.extract(_STAMP_RS, 0),
        last=pl.col("t").str.slice(-LAST_LOOK).str.extract_all(_STAMP_RS).list.last(),
        years=pl.concat_str(pl.col("t").str.head(4096), pl.col("t").str.tail(4096), separator="\n")
        .str.extract_all(_YEAR_RS).list.unique(),
    )
    for text, k, row in zip(texts, owners, frame.iter_rows(), strict=True):
        hits, ranks, first, last, years = row
        ident = out[k]
        if hits:
            _scan_candidates(ident, _candidate_lines(text, hits), SPAN_YEAR)
        if ranks:
            ident.ranks.update(int(_DIGITS.search(x).group()) for x in ranks)
        first = _line_ts(first, SPAN_YEAR) if first else None
        last = _line_ts(last, SPAN_YEAR) if last else None
        if last is None and first is not None and len(text) > LAST_LOOK:
            last = _last_ts(text, SPAN_YEAR)
        for ts in (first, last):
            if ts is not None:
                ident.first = ts if ident.first is None else min(ident.first, ts)
                ident.last = ts if ident.last is None else max(ident.last, ts)
        if years:
            ident.years.update(int(_YEAR.search(y).group()) for y in years)


def _candidate_lines(text: str, hits: list[int]) -> str:
    """The lines of text at the literal hits' offsets (bytes offsets: the same as character offsets
    in ASCII text; other text is searched again here), joined."""
    if not text.isascii():
        low = text.lower()
        if len(low) != len(text):
            low = text
        hits = []
        for lit in _LITERALS:
            i = low.find(lit)
            while i >= 0 and len(hits) < 5000:
                hits.append(i)
                i = low.find(lit, i + 1)
    starts = sorted({text.rfind("\n", 0, i) + 1 for i in hits[:5000]})
    out = []
    for st in starts:
        e = text.find("\n", st)
        out.append(text[st:] if e < 0 else text[st:e])
    return "\n".join(out)


def _scan_candidates(ident: Identity, text: str, year: int) -> None:
    """Read the identity lines among the candidate lines; each shape is tried only on the lines that
    hold one of its literals."""
    for line in text.split("\n")[:MAX_CANDIDATES]:
        low = line.lower()
        if "torch/distributed" in low or "torch.distributed.run:" in low:
            for m in _BANNER.finditer(line):
                ts = _mmdd_ts(m.group("mmdd"), m.group("hms"), m.group("frac"), year)
                if ts is not None:
                    ident.launches.add((int(m.group("pid")), ts))
            for m in _BANNER21.finditer(line):
                ts = _date_ts(f"{year}{m.group('date')[4:]}", m.group("hms"), m.group("frac"))
                if ts is not None:
                    ident.launches.add((None, ts))
        if "world" in low or "options: size" in low or "init complete" in low:
            for m in _WORLD.finditer(line):
                if m.group("n") is not None and _qualified(line, m.start()):
                    continue  # local_world_size, group_world_size, "data parallel world size"
                n = int(next(g for g in m.groups() if g is not None))
                if 0 < n <= 10_000_000:
                    ident.worlds.add(n)
        if "master" in low or "rdzv" in low or "connect" in low or "network address" in low:
            for m in _MASTER.finditer(line):
                addr = m.group("addr") or m.group("raddr") or m.group("caddr") or m.group("taddr")
                port = m.group("port") or m.group("mport") or m.group("rport") or m.group("cport") or m.group("tport")
                if addr and not addr.isdigit() and addr.lower() not in ("none", "null", "true", "false"):
                    ident.masters.add(addr.strip("[]").lower())
                if port and 0 < int(port) < 65536:
                    ident.ports.add(int(port))
        if "run_id" in low or "rendezvous '" in low or "rdzv" in low or "torchelastic_" in low:
            for m in _RUN_ID.finditer(line):
                if m.group("agent"):
                    ident.add(agent_dir_identity(m.group("agent")))
                    continue
                rid = m.group("cfg") or m.group("rdzv") or m.group("closed") or m.group("arg")
                if rid and rid.lower() not in DEFAULT_RUN_IDS:
                    ident.run_ids.add(rid)
        if "job" in low or "step" in low or "kill event" in low:
            ident.jobs.update(next(g for g in m.groups() if g is not None) for m in _SLURM.finditer(line))
        if "commid" in low:
            ident.comms.update(c.lower() for c in _COMM_ID.findall(line))
        if "global rank" in low or "(local_rank: " in low:
            ident.ranks.update(int(next(g for g in m.groups() if g is not None)) for m in _RANK.finditer(line))
        if "global_ranks=[" in low:
            for m in _GLOBAL_RANKS.finditer(line):
                ident.ranks.update(int(x) for x in _DIGITS.findall(m.group("r")))
        if "  host " in low or "init complete" in low:
            ident.hosts.update((m.group("h") or m.group("c")).split(".")[0].lower() for m in _HOST.finditer(line))


def _qualified(line: str, at: int) -> bool:
    """Whether the `world size` at `at` is some group's (`local_world_size`, `tensor parallel world
    size`), not the job's."""
    if at and (line[at - 1].isalnum() or line[at - 1] == "_"):
        return True
    m = _WORD_BEFORE.search(line, max(0, at - 24), at)
    return m is not None and m.group(1).lower() in _QUALIFIERS


def _last_ts(text: str, year: int) -> dt.datetime | None:
    """The stamp of the last line that has one (the last 64 lines holding `:MM:SS`, last first)."""
    for window in (4096, 32768, len(text)):
        start = max(0, len(text) - window)
        hits = [m.start() for m in _CLOCK.finditer(text, start)]
        for i in reversed(hits[-64:]):
            st = text.rfind("\n", 0, i) + 1
            e = text.find("\n", i)
            ts = _line_ts(text[st:] if e < 0 else text[st:e], year)
            if ts is not None:
                return ts
        if start == 0 or len(hits) >= 64:
            return None
    return None


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
        return _date_ts(f"{year}{g('date')[4:]}", g("hms3"), g("frac3"))
    if g("y4"):
        return _date_ts(f"{year}-{g('m4')}-{g('d4')}", g("hms4"), None)
    if g("mon5") in _MONTHS:
        return _date_ts(f"{year}-{_MONTHS[g('mon5')]:02d}-{int(g('d5')):02d}", g("hms5"), None)
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
    if a.agents & b.agents:
        return []  # one torchrun agent's log folder: its restarts (attempt_N) are one run, whatever changed
    why = []
    if a.run_ids and b.run_ids and not a.run_ids & b.run_ids:
        why.append(f"different run ids ({_few(a.run_ids)} here, {_few(b.run_ids)} there)")
    if a.jobs and b.jobs and not a.jobs & b.jobs:
        why.append(f"different Slurm jobs ({_few(a.jobs)} here, {_few(b.jobs)} there)")
    if a.world and b.world and a.world != b.world:
        why.append(f"different world sizes ({a.world} here, {b.world} there)")
    if a.years and b.years and not a.years & b.years:
        why.append(f"different years ({_few(a.years)} here, {_few(b.years)} there)")
    if a.comms and b.comms and not a.comms & b.comms:
        why.append("no NCCL commId in common")
    gap = _gap(a, b)
    if gap is not None:
        early, late = (a, b) if a.last < b.first else (b, a)
        relaunch = [t for _, t in late.launches if t - early.last > LAUNCH_AFTER_END]
        if gap > (APART_TIME_ONLY if _time_only(a) or _time_only(b) else APART):
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


def _time_only(x: Identity) -> bool:
    """A piece that names no launch, run id, agent, world, master, port, job, commId or rank."""
    return not (x.launches or x.run_ids or x.agents or x.worlds or x.masters or x.ports or x.jobs or x.comms
                or x.ranks)


def _gap(a: Identity, b: Identity) -> dt.timedelta | None:
    """How far apart two time spans are (None: they overlap, or one has no span). Spans are compared
    within one year: a run from another year on the same day goes unnoticed unless both name years."""
    if a.first is None or b.first is None:
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
