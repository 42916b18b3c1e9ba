"""Peel line envelopes (FORMATS.md §1): launcher prefixes, rank prefixes, headers, timestamps."""

from __future__ import annotations

import datetime as dt
import re

from ncclforensics.digits import BLIND, ShapeMemo, shape_of

# ANSI colour codes, also with the ESC byte lost in a copy-paste (`[31m`, `ERROR[0m`): an SGR
# code of 1-3 digit numbers; `[10m]` (a duration in brackets) is text, not colour.
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][AB012]|\[\d{1,3}(?:;\d{1,3}){0,5}m(?!\])")


def strip_ansi(text: str) -> str:
    """`ANSI.sub("", text)`, without the search where no code can be: every code holds ESC or a `[`
    followed by a digit (most log lines hold `[` only before letters: `[rank3]:[E0914 …`)."""
    if "\x1b" not in text:
        i = text.find("[")
        while i >= 0:
            if text[i + 1 : i + 2].isdigit():
                break
            i = text.find("[", i + 1)
        else:
            return text
    return ANSI.sub("", text)

_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}
UNKNOWN_YEAR = 1  # placeholder year for year-less stamps; ingest.table gives them the run's year

# Each peeler: (name, compiled regex anchored at the start). Order only matters for speed;
# the loop retries all until none matches (envelopes nest in any order in the wild).
_PEELERS: list[tuple[str, re.Pattern[str]]] = [
    # torchrun --tee `[default3]:`, other roles `[worker3]:`, `[default3|1]:`
    ("tee", re.compile(r"\[(?!rank\d)(?P<role>[A-Za-z_][\w\-]*?)(?P<lr>\d+)(?:\|\d+)?\]:")),
    # `[rank11]:` (C++) / `[rank11]: ` (Python uncaught exception, 2.4+)
    ("rank", re.compile(r"\[rank(?P<gr>\d+)\]: ?")),
    # c10 header: `[E0914 02:11:53.518220741 ProcessGroupNCCL.cpp:665] ` and `[E ProcessGroupNCCL.cpp:833] `
    ("c10", re.compile(
        r"\[(?P<sev>[FEWIV])(?:(?P<mmdd>\d{3,4}) (?P<hms>\d\d:\d\d:\d\d)\.\d{6,9})? "
        r"(?P<src>[A-Za-z0-9_.\-]+):\d+\] (?:\[c10d\] )?")),
    # torch Python logging 2.3+: `W1122 07:44:17.428000 873 torch/distributed/run.py:874] `
    ("pylog", re.compile(
        r"(?P<sev>[VIWEC])(?P<mmdd>\d{4}) (?P<hms>\d\d:\d\d:\d\d)\.(?P<us>\d{6}) +(?P<pid>\d+) "
        r"(?P<path>[^\s:\]]+):\d+\] ?")),
    # torch Python logging 2.1-2.2: `[2025-02-17 06:30:12,408] torch.distributed.x: [WARNING] `
    ("pylog21", re.compile(
        r"\[(?P<date>\d{4}-\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d),(?P<ms>\d{3})\] (?P<logger>[\w.]+): "
        r"\[(?P<lvl>[A-Z]+)\] ")),
    # torch Python logging <=2.0: `ERROR:torch.distributed.elastic.multiprocessing.api:`
    ("pylog20", re.compile(r"(?P<lvl>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<logger>[\w.]+):(?=\S)")),
    # MPI --tag-output `[1,7]<stderr>:` (the job part's rendering varies), --timestamp-output
    # `[<datetime>]<stdout>:`
    ("mpi", re.compile(
        r"\[(?:(?P<job>[^,\[\]]{1,64}),(?P<mr>\d+)|(?P<mts>[^\[\]]{1,40}))\]<(?:stdout|stderr|stddiag)>: ?")),
    # Ray `(RayWorkerWrapper pid=61833, ip=10.42.7.19) `; tasks print `(pid=61833) `
    ("ray", re.compile(r"\((?:(?P<actor>[\w.]+) )?pid=(?P<pid>\d+)(?:, ip=(?P<ip>[\w.:\-]+))?\) ")),
    # `kubectl logs --prefix` (kubectl pkg/cmd/logs/logs.go, addPrefixIfNeeded): `[pod/<pod>/<container>] `
    # before every line; a pod of a PyTorchJob or JobSet is one node of the run (its host)
    ("kubectl", re.compile(r"\[pod/(?P<pod>[a-z0-9][a-z0-9.\-]{0,252})/(?P<ctr>[a-z0-9][a-z0-9\-]{0,62})\] ?")),
    # dmesg raw `[ 912734.602118] `
    ("uptime", re.compile(r"\[ *(?P<up>\d+\.\d{3,9})\] ")),
    # dmesg -H / --reltime (util-linux dmesg.c): `[Jun10 03:17] ` when the minute changes, else the
    # delta since the line before `[  +0.000316] ` (some builds print `[+0.000316]`); --show-delta `[<    0.000316>] `
    ("reltime", re.compile(
        r"\[(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)(?P<day>\d\d) (?P<hm>\d\d:\d\d)\] ?")),
    ("reldelta", re.compile(r"\[(?: {0,2}[+-]\d{1,9}\.\d{6}|< {0,12}\d{1,12}\.\d{6}>)\] ?")),
    # dmesg -T `[Tue Jun 10 03:17:42 2025] `
    ("ctime", re.compile(
        r"\[(?:\w{3}) (?P<mon>\w{3}) +(?P<day>\d{1,2}) (?P<hms>\d\d:\d\d:\d\d) (?P<year>\d{4})\] ")),
    # dmesg --decode columns `kern  :err   : `
    ("facility", re.compile(r"(?:kern|user|daemon|syslog|auth) *:(?:emerg|alert|crit|err|warn|notice|info|debug) *: ")),
    # ISO-ish: `2025-06-10T03:17:42,604118+02:00 `, `2025-09-14 02:11:53 `, `2026-11-22 07:44:19,330 `,
    # and bracketed `[2025-07-30 11:04:58] ` (NCCL >= 2.26 WARN lines); log collectors' exports put a tab
    # after the stamp (Grafana Explore's "Download logs" text: `<time>\t<line>`, downloadLogsModelAsTxt)
    ("iso", re.compile(
        r"\[?(?P<date>\d{4}-\d\d-\d\d)[T ](?P<hms>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d{1,9}))?"
        r"(?P<tz>Z|[+-]\d\d:?\d\d)?\]?:?[ \t]")),
    # US-style app stamp `11/22/2026 07:50:18 `
    ("usdate", re.compile(r"(?P<m>\d\d)/(?P<d>\d\d)/(?P<year>\d{4}) (?P<hms>\d\d:\d\d:\d\d)(?:[.,]\d+)? ")),
    # syslog / journal `Jun 10 03:17:42 gpu-q17 kernel: `
    ("syslog", re.compile(
        r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<day>\d{1,2}) "
        r"(?P<hms>\d\d:\d\d:\d\d)(?:\.\d{1,6})? (?P<host>[\w.\-]+) (?P<tag>kernel|[\w.\-]+(?:\[\d+\])?): ")),
    # journalctl -o short-iso / rsyslog RFC 3339: the ISO stamp peels first, then `gpu-q17 kernel: `
    ("kernhost", re.compile(r"(?P<host>[A-Za-z0-9][\w.\-]{0,253}) kernel: ")),
    # /dev/kmsg `4,88213,912734602118,-;` (prio is facility*8+level; newer kernels add `,caller=T12`)
    ("kmsg", re.compile(r"\d{1,3},\d+,(?P<usboot>\d+),[^;]{0,40};")),
    # DeepSpeed's logger after its `[<date> <time>,<ms>] ` stamp (the `iso` peeler takes that):
    # `[INFO] [launch.py:315:sigkill_handler] `; its log_dist adds the global rank `[Rank 0] ` (§18.5)
    ("dslog", re.compile(
        r"\[(?P<lvl>DEBUG|INFO|WARNING|ERROR|CRITICAL)\] \[[\w.\-]+\.py:\d+:(?P<fn>\w+)\] "
        r"(?:\[Rank (?P<dsr>-?\d+)\] )?")),
    # pdsh `<host>: ` before every remote line of a multi-node DeepSpeed run (§18.5), also before one
    # that starts with spaces (a traceback frame, C++'s `  what():  `); a host name here starts
    # lower-case and holds a digit (`gpu-a12`, `trainer-2`), unlike `RuntimeError: `
    ("pdsh", re.compile(r"(?P<host>[a-z][a-z0-9\-]{0,40}\d[a-z0-9\-]{0,20}(?:\.[a-z0-9\-]{1,40}){0,5}): (?= *\S)")),
    # srun --label ` 7: ` / `P1 7: `; the line after it may start with spaces (traceback frames)
    ("srun", re.compile(r"(?:P\d+ +)? *(?P<task>\d{1,6}): (?=[^\n])")),
    # app formats: `- train - INFO - `, `INFO `, `INFO: `, `[Rank 0/4] `, `[rank 0] `, `[rank1] `
    ("applvl", re.compile(r"(?:- [\w.]+ - )?(?P<lvl>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)(?: -|:)? (?=\S)")),
    # (a c10d `[Rank 3] ` has no slash and names a group rank: it stays in the body, §1.5)
    ("apprank", re.compile(r"\[(?:Rank (?P<ar>\d+)/(?P<aw>\d+)|rank ?(?P<ar2>\d+))\] ")),
    # torchrun --log-line-prefix-template "${hostname}:${rank}: "; not a Python warning
    # `train.py:45: UserWarning: …`
    ("hostrank", re.compile(
        r"(?P<host>[A-Za-z][\w.\-]{0,253})(?<!\.py):(?P<gr>\d{1,6}): (?![\w.]*(?:Warning|Error)\b)(?=[^\n])")),
    # a CI log viewer's gutter `  | ` before each pasted line, and pytest's `E   ` before a failure's
    # lines (as in pasted CI output: corpus INDEX.md); only at the start of a line
    ("gutter", re.compile(r" {0,4}\| (?=\S| )")),
    ("pytest", re.compile(r"E   (?=\S| )")),
    # viewer line numbers `[40218] `
    ("lineno", re.compile(r"\[\d{1,9}\] (?=\S)")),
]



def _without_names(pattern: str) -> str:
    """A peeler's pattern with its named groups made non-capturing (to join them in one alternation)."""
    return re.sub(r"\(\?P<\w+>", "(?:", pattern)


# All peelers in one alternation, in order: at a position, the first alternative that matches is
# the first peeler that matches (an alternation tries them in turn), so one match call finds it
# (a line that starts with none of them costs one failed match instead of one per peeler).
_ANY_PEELER = re.compile("|".join(f"(?P<p{i}>{_without_names(rx.pattern)})" for i, (_, rx) in enumerate(_PEELERS)))
_PEELER_AT = {f"p{i}": i for i in range(len(_PEELERS))}

# NCCL_DEBUG line head: `gpu-q17:58213:58391 [5] ` before `NCCL INFO|WARN` or `<file>:<line> NCCL WARN`.
NCCL_HEAD = re.compile(
    r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) (?:\[(?P<dev>\d+)\] )?(?:[\d.]+ )?"
    r"(?=(?:[\w./\-]+:\d+ (?:\(\w+\) )?)?NCCL (?:INFO|WARN|TRACE|CALL|ERROR)\b)")
NCCL_SRC = re.compile(r"[\w./\-]+:\d+ (?:\(\w+\) )?(?=NCCL )")

# An envelope start glued behind a progress bar: `...loss=0.712][rank0]:[E0114 ...`, also a torch
# Python logging header `W1122 07:44:23.407000 873 torch/…:1028] `
_GLUED = re.compile(
    r"\[(?:rank\d+|default\d+)\]:|\[[FEWIV]\d{3,4} \d\d:\d\d:\d\d\.\d{6,9} "
    r"|(?<![\w.])[VIWEC]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [^\s:\]]+:\d+\] ")


def _may_glue(body: str) -> bool:
    """Whether `body` can hold a _GLUED header at all: each of its forms holds `[rank`, `[default` or a
    time with a fraction `hh:mm:ss.` (a colon, another three characters on, a dot three more on).
    Cheap (~1 µs) where the search costs 2–12 µs on a long line (most message bodies hold two colons
    and no such time: bench/README.md, "tenth round")."""
    if "[rank" in body or "[default" in body:
        return True
    i = body.find(":")
    while i >= 0:
        if body[i + 3 : i + 4] == ":" and body[i + 6 : i + 7] == ".":
            return True
        i = body.find(":", i + 1)
    return False


# What a later piece of one physical line (after a CR or a glued envelope) takes over from the
# piece before it when it has no value of its own: the same writer produced both.
_INHERITED = ("host", "pid", "ts", "task", "rank", "local_rank", "world")
_LAUNCHERS = ("tee", "mpi", "ray", "kubectl", "srun", "hostrank", "pdsh")

PID_MAX = 4_194_304  # above this, a pylog number is a thread id (torch 2.3-2.4), not a pid
AGENT_PATHS = ("torch/distributed/run.py", "torch/distributed/elastic", "torch/distributed/launcher")


class Envelope:
    """What the prefixes of one line told: rank, host, time, level, and the message body."""

    __slots__ = (
        "agent",
        "body",
        "host",
        "kernel",
        "key",
        "local_rank",
        "nccl_dev",
        "outer",
        "pid",
        "rank",
        "sev",
        "task",
        "ts",
        "uptime",
        "world",
    )

    def __init__(self) -> None:
        self.body = ""
        self.rank: int | None = None
        self.local_rank: int | None = None
        self.host: str | None = None
        self.pid: int | None = None
        self.ts: dt.datetime | None = None
        self.sev: str | None = None
        self.task: int | None = None
        self.world: int | None = None
        self.agent = False
        self.key = ""  # the launcher/rank prefix text, to group multi-line blocks per writer
        self.outer = ""  # the launcher part of `key` (srun, MPI, Ray, tee, host:rank), no rank prefix
        self.uptime: float | None = None
        self.nccl_dev: int | None = None
        self.kernel = False  # a kernel log's stamp (dmesg, kmsg, journal `kernel:`): the kernel's own line

    def copy(self) -> Envelope:
        """A copy (every field is immutable: a shallow one)."""
        out = Envelope.__new__(Envelope)
        out.body, out.rank, out.local_rank, out.host = self.body, self.rank, self.local_rank, self.host
        out.pid = self.pid
        out.ts, out.sev, out.task, out.world, out.agent = self.ts, self.sev, self.task, self.world, self.agent
        out.key, out.outer, out.uptime, out.nccl_dev, out.kernel = (self.key, self.outer, self.uptime, self.nccl_dev,
                                                                    self.kernel)
        return out


def _mmdd(mmdd: str, hms: str, frac_us: int = 0) -> dt.datetime | None:
    if not frac_us:
        # c10 headers give the second only (their fraction is not wall time): the lines of one
        # second share it, and every rank prints its timeout lines in the same few seconds
        key = (mmdd, hms)
        known = _SECONDS.get(key, _MISSING)
        if known is _MISSING:
            if len(_SECONDS) >= _SECONDS_MAX:
                _SECONDS.clear()
            known = _SECONDS[key] = _stamp(mmdd, hms, 0)
        return known  # type: ignore[return-value]
    return _stamp(mmdd, hms, frac_us)


_SECONDS: dict[tuple[str, str], dt.datetime | None] = {}
_SECONDS_MAX = 4096
_MISSING = object()


def _stamp(mmdd: str, hms: str, frac_us: int) -> dt.datetime | None:
    try:
        month, day = divmod(int(mmdd), 100)
        h, m, s = (int(x) for x in hms.split(":"))
        return dt.datetime(UNKNOWN_YEAR, month, day, h, m, s, frac_us)
    except ValueError:
        return None


def _date(date: str, hms: str, frac: str | None = None) -> dt.datetime | None:
    try:
        y, mo, d = (int(x) for x in date.split("-"))
        h, m, s = (int(x) for x in hms.split(":"))
        us = int((frac or "0")[:6].ljust(6, "0"))
        return dt.datetime(y, mo, d, h, m, s, us)
    except ValueError:
        return None


def _tz(ts: dt.datetime | None, tz: str | None) -> dt.datetime | None:
    if ts is None or not tz or tz == "Z":
        return ts
    sign = -1 if tz[0] == "-" else 1
    hh, mm = int(tz[1:3]), int(tz[-2:])
    try:
        return ts - sign * dt.timedelta(hours=hh, minutes=mm)
    except OverflowError:  # a stamp at the edge of time (year 1, year 9999): keep it unshifted
        return ts


# peel's answers for the lines peeled last: a line is often peeled twice (as the next line of a matched
# one, to tell a hard-wrapped continuation, then as a selected line itself). Up to PEEL_MEMO_LINES lines
# of at most PEEL_MEMO_CHARS; each caller gets its own copy (callers change `body`).
PEEL_MEMO_LINES = 256
PEEL_MEMO_CHARS = 4096
_peeled: dict[str, Envelope] = {}


def peel(line: str) -> Envelope:
    """Strip every envelope from `line` (ANSI already removed), recording what each tells."""
    known = _peeled.get(line)
    if known is not None:
        return known.copy()
    env = _peel(line)
    if len(line) <= PEEL_MEMO_CHARS:
        if len(_peeled) >= PEEL_MEMO_LINES:
            _peeled.clear()
        _peeled[line] = env.copy()
    return env


# Peeling by shape (ncclforensics/digits.py): a line that differs from one peeled before only in its
# digits (another rank's copy of it: `[rank7]:[E0216 14:31:57.8…` for `[rank3]:[E0216 14:31:56.1…`)
# holds the same envelopes at the same places, as long as the same fields are known after each (a
# stamp of a day that does not exist, a pid above PID_MAX tell nothing): every pattern here is
# digit-blind, and _apply decides only by which fields are known and by text without digits. Such
# a line replays its shape's envelopes (each one's match and _apply again, for this line's values),
# checking where each ends and which fields are known after it; any difference peels it afresh.
# The one text with digits a peeler reads is c10's `[c10d] ` (§1.2): a line whose shape holds its
# shape (digits.digit_guards) is peeled afresh; in every other line it matches nowhere.
PEEL_SHAPES = 2048
_SHAPES = ShapeMemo(PEEL_SHAPES)  # shape -> the envelopes taken (_peel_fresh's steps)
# [the shapes of the texts with digits the patterns read, or None where one sees digits otherwise]
_GUARDS: list[tuple[str, ...] | None] = []
_NCCL = -1  # a step of the NCCL head, in a shape's steps


def _peel(line: str) -> Envelope:
    if not _GUARDS:
        each = [BLIND.get(rx.pattern) for rx in (*(rx for _, rx in _PEELERS), _ANY_PEELER, NCCL_HEAD, NCCL_SRC)]
        _GUARDS.append(None if None in each else tuple(sorted({g for gs in each for g in gs})))  # type: ignore[union-attr]
    guards = _GUARDS[0]
    if guards is None:
        return _peel_fresh(line, None)
    shape = shape_of(line)
    if any(g in shape for g in guards):
        return _peel_fresh(line, None)
    steps = _SHAPES.get(shape)
    if steps is not None:
        env = _replay(line, steps)
        if env is not None:
            return env
    elif not _SHAPES.admit(shape):
        return _peel_fresh(line, None)  # met once so far: nothing kept
    found: list[tuple] = []
    env = _peel_fresh(line, found)
    _SHAPES[shape] = tuple(found)
    return env


def forget() -> None:
    """Drop what peeling remembers (the run is read: the memory goes to its table)."""
    for memo in (_SHAPES, _peeled, _SECONDS):
        memo.clear()


def _known(env: Envelope) -> tuple:
    """Which fields an envelope knows: all that _apply's decisions read."""
    return (env.rank is None, env.local_rank is None, env.host is None, env.pid is None, env.ts is None,
            env.sev is None, env.task is None, env.world is None, env.uptime is None, env.nccl_dev is None,
            env.agent, env.kernel)


def _peel_fresh(line: str, steps: list[tuple] | None) -> Envelope:
    """Peel `line`; `steps` (when given) gets each envelope taken: (peeler index or _NCCL, start, end, the
    NCCL source's end or -1, _known after it)."""
    env = Envelope()
    pos = 0
    key_parts: list[str] = []
    outer_parts: list[str] = []
    n = len(line)
    for _ in range(12):  # bounded: each pass removes at least one envelope
        if pos >= n:
            break
        hit = False
        first = _ANY_PEELER.match(line, pos)
        start = len(_PEELERS) if first is None else _PEELER_AT[first.lastgroup]
        for i in range(start, len(_PEELERS)):
            name, rx = _PEELERS[i]
            m = rx.match(line, pos)
            if m is None or m.end() == pos:
                continue
            if _apply(env, name, m):
                if steps is not None:
                    steps.append((i, pos, m.end(), -1, _known(env)))
                pos = m.end()
                if name == "rank" or name in _LAUNCHERS:
                    key_parts.append(m.group())
                if name in _LAUNCHERS:
                    outer_parts.append(m.group())
                hit = True
                break
        if not hit:
            m = NCCL_HEAD.match(line, pos)
            if m is not None:
                at = pos
                _nccl_head(env, m, key_parts)
                pos = m.end()
                s = NCCL_SRC.match(line, pos)
                if s is not None:
                    pos = s.end()
                if steps is not None:
                    steps.append((_NCCL, at, m.end(), -1 if s is None else s.end(), _known(env)))
            break
    env.key = "".join(key_parts)
    env.outer = "".join(outer_parts)
    env.body = line[pos:]
    return env


def _nccl_head(env: Envelope, m: re.Match[str], key_parts: list[str]) -> None:
    env.host = env.host or m.group("host")
    env.pid = int(m.group("pid"))
    # the NCCL process is a writer of its own: its lines never continue another line
    key_parts.append(f"{m.group('host')}:{m.group('pid')} ")
    if m.group("dev") is not None:
        env.nccl_dev = int(m.group("dev"))


def _replay(line: str, steps: tuple) -> Envelope | None:
    """`line` peeled by the steps of its shape (see above), or None where it differs."""
    env = Envelope()
    key_parts: list[str] = []
    outer_parts: list[str] = []
    pos = 0
    for i, start, end, src_end, known in steps:
        if i == _NCCL:
            m = NCCL_HEAD.match(line, start)
            if m is None or m.end() != end:
                return None
            _nccl_head(env, m, key_parts)
            s = NCCL_SRC.match(line, end)
            if (s is None) != (src_end < 0) or (s is not None and s.end() != src_end):
                return None
            pos = end if s is None else src_end
        else:
            name, rx = _PEELERS[i]
            m = rx.match(line, start)
            if m is None or m.end() != end or not _apply(env, name, m):
                return None
            if name == "rank" or name in _LAUNCHERS:
                key_parts.append(m.group())
            if name in _LAUNCHERS:
                outer_parts.append(m.group())
            pos = end
        if _known(env) != known:
            return None
    env.key = "".join(key_parts)
    env.outer = "".join(outer_parts)
    env.body = line[pos:]
    return env


def _apply(env: Envelope, name: str, m: re.Match[str]) -> bool:
    g = m.group
    if name == "tee":
        if env.local_rank is None:
            env.local_rank = int(g("lr"))
    elif name in ("rank", "hostrank"):
        if name == "hostrank" and (env.sev is not None or env.rank is not None):
            return False
        if env.rank is None:
            env.rank = int(g("gr"))
        if name == "hostrank":
            env.host = env.host or g("host")
    elif name == "c10":
        env.sev = env.sev or g("sev")
        if g("mmdd") and env.ts is None:
            env.ts = _mmdd(g("mmdd"), g("hms"))  # the ns fraction is monotonic, not wall time
    elif name == "pylog":
        env.sev = env.sev or g("sev")
        if env.ts is None:
            env.ts = _mmdd(g("mmdd"), g("hms"), int(g("us")))
        path = g("path")
        env.agent = env.agent or path.startswith(AGENT_PATHS) or "/torch/distributed/elastic" in path
        pid = int(g("pid"))
        if pid <= PID_MAX and env.pid is None:
            env.pid = pid
    elif name == "pylog21":
        if env.ts is None:
            env.ts = _date(g("date"), g("hms"), g("ms") + "000")
        env.sev = env.sev or g("lvl")[0]
        env.agent = env.agent or g("logger").startswith("torch.distributed")
    elif name == "pylog20":
        env.sev = env.sev or g("lvl")[0]
        env.agent = env.agent or g("logger").startswith("torch.distributed")
    elif name == "mpi":
        if env.rank is None and g("mr") is not None:
            env.rank = int(g("mr"))
    elif name == "ray":
        env.pid = env.pid or int(g("pid"))
        env.host = env.host or g("ip")
    elif name == "kubectl":
        if key_started(env) or env.ts is not None:
            return False  # kubectl's prefix comes first on the line
        env.host = env.host or g("pod")
    elif name == "uptime":
        env.uptime = float(g("up"))
    elif name == "reltime":
        if env.ts is None:
            env.ts = _mmdd(f"{_MONTHS[g('mon')]}{g('day')}", g("hm") + ":00")
    elif name == "ctime":
        if env.ts is None and g("mon") in _MONTHS:
            env.ts = _date(f"{g('year')}-{_MONTHS[g('mon')]:02d}-{int(g('day')):02d}", g("hms"))
    elif name == "iso":
        if env.ts is None:
            env.ts = _tz(_date(g("date"), g("hms"), g("frac")), g("tz"))
    elif name == "usdate":
        if env.ts is None:
            env.ts = _date(f"{g('year')}-{g('m')}-{g('d')}", g("hms"))
    elif name == "syslog":
        if env.ts is None:
            env.ts = _mmdd(f"{_MONTHS[g('mon')]}{int(g('day')):02d}", g("hms"))
        env.host = env.host or g("host")
        env.kernel = env.kernel or g("tag") == "kernel"
    elif name == "kernhost":
        if env.ts is None or env.host is not None:
            return False  # only right after a syslog-style ISO stamp
        env.host = g("host")
    elif name == "kmsg":
        env.uptime = int(g("usboot")) / 1e6
    elif name == "srun":
        if (env.task is not None or env.rank is not None or env.local_rank is not None
                or env.sev is not None):
            return False  # a label comes first; a number later in the line is message text
        env.task = int(g("task"))
    elif name == "dslog":
        env.sev = env.sev or g("lvl")[0]
        if g("dsr") is not None and int(g("dsr")) >= 0 and env.rank is None:
            env.rank = int(g("dsr"))
        env.agent = env.agent or g("fn") in ("sigkill_handler", "main")
    elif name == "pdsh":
        if env.ts is not None or env.sev is not None or env.rank is not None or key_started(env):
            return False  # pdsh's prefix comes first on the line
        env.host = g("host")
    elif name in ("gutter", "pytest"):
        if key_started(env) or env.ts is not None or env.sev is not None:
            return False  # both come first on the line
    elif name == "applvl":
        env.sev = env.sev or g("lvl")[0]
    elif name == "apprank":
        if env.rank is None:
            env.rank = int(g("ar") or g("ar2"))
        if g("aw"):
            env.world = int(g("aw"))
    if name in _KERNEL_STAMPS or (name == "facility" and m.group(0).startswith("kern")):
        env.kernel = True
    return True


# the kernel's own stamps (util-linux dmesg.c: raw, -H/--reltime, -T, --decode; /dev/kmsg; journal `kernel:`,
# FORMATS.md §1.9, §12): a line behind one is the kernel's, never a Python exception
_KERNEL_STAMPS = frozenset({"uptime", "reltime", "reldelta", "ctime", "kernhost", "kmsg"})


def key_started(env: Envelope) -> bool:
    """Whether an envelope was peeled already (launcher prefixes only come first)."""
    return bool(env.key or env.task is not None or env.local_rank is not None or env.pid is not None)


def peel_all(line: str) -> list[Envelope]:
    """Envelopes of one physical line: split at CRs (progress bars) and at an envelope start
    glued behind progress-bar text (FORMATS.md §1.8). A later piece takes over what the piece
    before it knew (launcher prefix, rank, time) unless it carries its own."""
    segments = [p for p in line.split("\r") if p.strip()] if "\r" in line else [line]
    out: list[Envelope] = []
    for seg in segments:
        env = peel(seg)
        if out:
            _inherit(env, out[-1])
        out.append(env)
        for _ in range(8):  # bounded: a few glued headers per line at most
            m = _GLUED.search(env.body, 1) if _may_glue(env.body) else None
            if m is None:
                break
            tail = peel(env.body[m.start():])
            env.body = env.body[: m.start()]
            _inherit(tail, env)
            out.append(tail)
            env = tail
    return out


# Every envelope (peeler, NCCL head, glued header, colour code) holds one of these characters or
# starts the line with a level word, `- ` or pytest's `E   `; a CR splits the line (peel_all).
ENVELOPE_CHARS = r"[\[(:|;/\r\x1b]"
ENVELOPE_STARTS = r"^(?:E   |- |DEBUG|INFO|WARN|ERROR|CRITICAL|FATAL)"
_ENVELOPE_HINT = re.compile(f"{ENVELOPE_CHARS}|{ENVELOPE_STARTS}")


def plain(line: str) -> bool:
    """True when `line` can hold no envelope: peel_all gives one envelope that tells nothing (no
    key, rank, host, time …) and whose body is the whole line. Cheap: for lines that repeat by the
    thousand (progress lines), to skip peeling those of a writer already known."""
    return _ENVELOPE_HINT.search(line) is None


def _inherit(env: Envelope, before: Envelope) -> None:
    for attr in _INHERITED:
        if getattr(env, attr) is None:
            setattr(env, attr, getattr(before, attr))
    if before.outer and not env.key.startswith(before.outer):
        env.key = before.outer + env.key
        env.outer = before.outer + env.outer
