"""Find the runs under a scan root, each with the content-hash cache key of its files.

Above ~400 lines because the rule below is one algorithm whose steps (items bottom-up, the names'
proposals, splits and joins by identity, the overrides) share one walk of the folder tree.

The default rule (documented for users in the README's `scan` section). Folder names propose what
a run is; the logs decide (identity.py reads a sample of every log file: torchrun launches and run
ids, world sizes, master address, NCCL commIds, Slurm jobs, ranks, time spans).

1. A *log file* is a regular, non-hidden file that is not an archive and not a script, config or
   data file (the analyzer's NOT_LOG_SUFFIXES); compressed logs (.gz .zst .bz2 .xz) are log files.
2. Every folder is decided bottom-up from its *items*: its own log files, and each sub-folder that
   turned out to be one run (a sub-folder holding several runs keeps them; they take no further part).
   A sub-folder's name proposes its role:
   - *part* of this folder's run: torchrun `attempt_<N>` folders, anything below one, and the
     `<run_id>_<random>` folder that holds them; Flight Recorder / dump folders (`fr_*`,
     `flight_recorder*`, `*trace(s)`, `dump(s)`); log and artefact containers (`log(s)`, `torchrun_logs`,
     `output(s)`, `stdout`, `stderr`, `console`, `dmesg`, `syslog`, `kernel`, `eval*`, `profile*`,
     `tensorboard`, `wandb`, `checkpoint(s)`, `artifacts`, `metrics`, ...);
   - *per-host / per-rank* folder, also part of this folder's run: `node`, `host`, `worker`, `nid`,
     `rank`, `gpu`, `compute`, `dgx`, `hgx`, `ip` followed by a number (`node0`, `gpu-e002`,
     `rank7-crash-0412`, `ip-10-0-0-1`), or an IPv4 address;
   - *plain*: any other name, a run of its own.
   The proposal: parts and per-host folders make one run with the folder's own logs (and with its one
   plain sub-folder, if it has only one: a job folder with console.log and one log folder). A folder
   with two or more plain sub-folders is a collection: each of them is a run, and so is each of its
   own log files unless parts or per-host folders are there to take them. ROOT's own files are runs
   each (a lone `console.log.gz`) unless log containers show that ROOT is itself a run folder; a lone
   per-host folder at ROOT is a run under its own name.
3. The logs decide. Items proposed as one run are split where their identities conflict (identity.
   conflicts: different run ids, Slurm jobs or world sizes, no NCCL commId in common, time spans far
   apart or a torchrun launch after the other side had ended, all ranks from one launch beside another
   launch); an item whose logs carry no identity cannot be placed among several runs and is a run of
   its own. Runs proposed as separate are joined where their logs share a run id, Slurm job, NCCL
   commId or (non-loopback) master address and do not conflict, unless they are copies of one part
   (identity.links): one run spread over host folders with any names. A run made of some entries of
   a folder is a run with `members` ("dir/{a,b}").
4. An archive (.tar .tar.gz .tgz .tar.bz2 .tar.xz .tar.zst .zip) is one run, unless it lies in a
   folder that is one run, whose analysis reads it as part of that run (a dump tarball beside console.log).
5. A loose file is a run by itself only if it looks like a log: empty, unreadable or binary files,
   notes (`NOTES.txt`, `README`), .json/.csv/.tsv metadata and text with no log line are no runs;
   `scan --list` shows them with the reason. Inside a run, such files are read (and skipped with a
   reason) by the analysis.
6. Hidden files and folders (name starting with ".") are never items; symlinks are not followed; the
   output folder is skipped when it lies under ROOT.

Overrides: `depth=N` makes the runs exactly the folders, archives and log files (not .json/.csv/.tsv)
N levels below ROOT (0 = ROOT itself); `glob=PATTERN` makes them the paths matching PATTERN relative
to ROOT (pathlib glob, `**` allowed), a match inside another match being part of it. Neither reads
any log; the analysis of each run then says when it looks like several runs.

Cache key: sha256 over the analyzer fingerprint (tool version + the bytes of the package's source
and template files and of patterns/) and, for every file the run holds, its path relative to the
run, size and mtime in nanoseconds. Any change of a file, or of the analyzer, re-analyzes the run.
"""

from __future__ import annotations

import bisect
import datetime as dt
import functools
import hashlib
import itertools
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ncclforensics.atomic import atomic_write
from ncclforensics.errors import UsageError
from ncclforensics.ingest import archive
from ncclforensics.ingest.discover import display_name, list_folder
from ncclforensics.ingest.filekinds import NOT_LOG_SUFFIXES
from ncclforensics.scan.identity import (
    DOC_NAMES,
    Identity,
    agent_dir_identity,
    conflicts,
    identities,
    is_loopback,
    links,
    looks_like_log,
)

_SIDECAR_SUFFIXES = (".json", ".csv", ".tsv")
_ATTEMPT = re.compile(r"^attempt_\d+$")
_PART_OF_RUN = re.compile(
    r"^(?:fr(?:[_-]\w*)?|flight[_-]?recorder\w*|\w*traces?|dumps?"
    r"|logs?|torchrun[_-]?logs?|log[_-]?dir|outputs?|stdout|stderr|console|dmesg|syslog|kernel"
    r"|eval\w*|profiler?\w*|tensorboard|tb|wandb|checkpoints?|ckpts?|artifacts?|metrics)$",
    re.I,
)
_HOST_DIR = re.compile(
    r"^(?:(?:node|host|worker|nid|rank|gpu|compute|dgx|hgx|ip)[-_.]?[A-Za-z]{0,8}[-_.]?\d[\w.\-]{0,60}"
    r"|\d{1,3}(?:[.\-_]\d{1,3}){3})$",
    re.I,
)


@dataclass(frozen=True)
class RunSpec:
    """One run to analyze. Plain fields only: it crosses process and Ray boundaries."""

    id: str  # folder name under OUTDIR/runs: a slug of `rel` plus a short hash, unique per ROOT
    rel: str  # path relative to ROOT, as display text ("." for ROOT itself; "dir/{a,b}" for members)
    path: str  # absolute path handed to the analyzer
    kind: str  # folder | archive | file
    size: int  # bytes on disk
    nfiles: int  # files on disk
    key: str  # content hash (cache key)
    members: tuple[str, ...] = ()  # entries of `path` (relative) that make the run; () = all of it
    why: tuple[str, ...] = ()  # why these files are one run (scan --list)
    ids: str = ""  # what the logs say about the run: launches, world size, master, time span
    check_runs: bool = False  # picked by --depth/--glob: the analysis says whether it looks like several runs

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def is_log_file(name: str) -> bool:
    low = name.lower()
    if name.startswith(".") or archive.is_archive(low):
        return False
    return not archive.strip_compression(low).endswith(NOT_LOG_SUFFIXES)


def is_lone_log(name: str) -> bool:
    """A log file that may be a run by itself: JSON and CSV files beside runs are metadata."""
    return is_log_file(name) and not archive.strip_compression(name.lower()).endswith(_SIDECAR_SUFFIXES)


def run_id(rel: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", rel).strip("._-")[:60] or "root"
    return f"{slug}-{hashlib.sha1(rel.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"


@dataclass
class _Dir:
    files: list[tuple[str, int, int]]  # (name, size, mtime_ns) of regular files
    subdirs: list[str]


def _walk(root: Path, skip: Path | None) -> dict[Path, _Dir]:
    """Every folder under root (symlinks not followed) with its regular files' stats, in os.walk's
    top-down order; by os.scandir (a file's type from its directory entry, one lstat a file)."""
    tree: dict[Path, _Dir] = {}
    skip_real = os.path.realpath(skip) if skip is not None else None
    top = os.fspath(root)
    stack: list[tuple[str, Path]] = [(top, Path(top))]
    while stack:
        dirpath, here = stack.pop()
        listed = list_folder(dirpath)
        if listed is None:
            continue  # os.walk leaves out a folder it cannot list
        dirnames = [d.name for d in listed[0]]
        if skip_real is not None:
            dirnames = [d for d in dirnames if os.path.realpath(here / d) != skip_real]
        files = []
        for e in listed[1]:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                files.append((e.name, st.st_size, st.st_mtime_ns))
        real = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        tree[here] = _Dir(files, real)
        stack.extend((os.path.join(dirpath, d), here / d) for d in reversed(real))
    return tree


@dataclass
class Found:
    """A run the default rule found: the paths that make it, why they were grouped, what they say."""

    base: Path  # the run's folder, archive or file; or the folder holding `members`
    members: tuple[str, ...]  # entries below `base` (relative paths) that make the run; () = all of base
    kind: str  # folder | archive | file
    ident: Identity
    why: list[str] = field(default_factory=list)

    def paths(self) -> list[Path]:
        return [self.base / m for m in self.members] if self.members else [self.base]


@dataclass
class Plan:
    """The runs under a root and the files that are none (for `scan --list`)."""

    root: Path
    runs: list[Found]
    ignored: list[tuple[str, str]]  # (path relative to root, reason)


class IdentityCache:
    """Identities of the files of an earlier scan, by path relative to ROOT, size and mtime: an unchanged
    re-scan samples nothing again. Stored in OUTDIR with the analyzer fingerprint (new code: new samples)."""

    def __init__(self, path: Path, root: Path) -> None:
        self.path, self.root = path, root
        self.old: dict[str, list] = {}
        self.new: dict[str, list] = {}
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if doc.get("fingerprint") == analyzer_fingerprint() and isinstance(doc.get("files"), dict):
                self.old = doc["files"]
        except (OSError, ValueError, AttributeError):
            pass

    def get(self, p: Path, size: int, mtime: int) -> Identity | None:
        key = p.relative_to(self.root).as_posix()
        hit = self.old.get(key)
        if not hit or hit[0] != size or hit[1] != mtime:
            return None
        try:
            ident = Identity.from_json(hit[2])
        except (KeyError, TypeError, ValueError):
            return None
        self.new[key] = hit
        return ident

    def put(self, p: Path, size: int, mtime: int, ident: Identity) -> None:
        self.new[p.relative_to(self.root).as_posix()] = [size, mtime, ident.to_json()]

    def save(self) -> None:
        """Write the identities of the files seen this time (atomically; a failed write is no error)."""
        try:
            atomic_write(self.path, json.dumps({"fingerprint": analyzer_fingerprint(), "files": self.new}))
        except OSError:
            pass


@dataclass
class _Item:
    name: str  # entry name in its folder
    role: str  # own (a log file of the folder) | part | host | plain (sub-folders) | opaque (archive run)
    run: Found
    ident: Identity
    loose_ok: bool = True  # a loose file that may be a run by itself


def _role(d: Path, root: Path, tree: dict[Path, _Dir]) -> str:
    """What a sub-folder's name proposes: part of its parent's run, a per-host/per-rank folder, or plain."""
    name = d.name
    if _ATTEMPT.match(name) or _PART_OF_RUN.match(name):
        return "part"
    if any(_ATTEMPT.match(name) for name in _parts_below(d, root)[:-1]):
        return "part"  # anything below an attempt_N folder
    node = tree.get(d)
    if node is not None and any(_ATTEMPT.match(s) for s in node.subdirs):
        return "part"  # torchrun's <run_id>_<rand> folder
    if _HOST_DIR.match(name):
        return "host"
    return "plain"


def _parts_below(d: Path, root: Path) -> tuple[str, ...]:
    """d.relative_to(root).parts, for a folder of root's walk (its path starts with root's parts)."""
    return d.parts[len(root.parts):]


class _Grouper:
    """The default rule (module docstring): names propose, the logs' identities decide."""

    def __init__(self, root: Path, tree: dict[Path, _Dir], prior: str, cache: IdentityCache | None = None) -> None:
        self.root, self.tree, self.prior = root, tree, prior
        self.ignored: list[tuple[str, str]] = []
        self.done: list[Found] = []  # runs decided below a folder that holds several
        # every log file's identity: from the cache when its size and mtime are unchanged, the others
        # sampled in one batch (identity.identities)
        logs = [(d / f, f, size, mtime) for d, node in tree.items()
                if not any(p.startswith(".") for p in _parts_below(d, root))
                for f, size, mtime in node.files if is_log_file(f)]
        self.idents: dict[Path, Identity] = {}
        todo = []
        for p, f, size, mtime in logs:
            hit = cache.get(p, size, mtime) if cache is not None else None
            if hit is not None:
                self.idents[p] = hit
            else:
                todo.append((p, f, size, mtime))
        for (p, _, size, mtime), ident in zip(todo, identities([t[:3] for t in todo]), strict=True):
            self.idents[p] = ident
            if cache is not None:
                cache.put(p, size, mtime, ident)

    def rel(self, p: Path) -> str:
        return "." if p == self.root else display_name(p.relative_to(self.root).as_posix())

    def plan(self) -> Plan:
        runs = self.folder(self.root)
        return Plan(self.root, self.done + runs, self.ignored)

    def folder(self, d: Path) -> list[Found]:
        node = self.tree.get(d)
        if node is None:
            return []
        items: list[_Item] = []
        archives: list[Found] = []
        split_below = False
        agent = agent_dir_identity(d.name) if any(_ATTEMPT.match(s) for s in node.subdirs) else None
        for fname, _size, _ in node.files:
            if fname.startswith("."):
                continue
            p = d / fname
            if archive.is_archive(fname):
                archives.append(Found(p, (), "archive", Identity(), [f"{fname}: an archive is read as one run"]))
            elif is_log_file(fname):
                ident = self.idents[p]
                items.append(_Item(fname, "own", Found(p, (), "file", ident), ident, is_lone_log(fname)))
        for sub in node.subdirs:
            if sub.startswith("."):
                continue
            found = self.folder(d / sub)
            if len(found) == 1:
                f = found[0]
                role = "opaque" if f.kind == "archive" else _role(d / sub, self.root, self.tree)
                items.append(_Item(sub, role, f, f.ident))
            elif found:
                self.done += found
                split_below = True
        if agent is not None:
            for it in items:
                it.ident = Identity().add(it.ident).add(agent)
        if not items:
            return archives
        groups = self._groups(d, items)
        runs = []
        for g in groups:
            run = self._found(d, g, items, archives, split_below, several=len(groups) > 1)
            if run is not None:
                runs.append(run)
        if len(runs) == 1 and runs[0].base == d and not runs[0].members:
            return runs  # the folder's own archives are read as part of it
        return runs + archives

    # -- grouping --------------------------------------------------------------------------------
    def _groups(self, d: Path, items: list[_Item]) -> list[tuple[list[_Item], list[str]]]:
        """Items -> groups (each a run), with the reasons."""
        if any(_ATTEMPT.match(name) for name in d.parts):  # d or a folder above it
            # one torchrun attempt (FORMATS.md §2.2): its workers' stdout/stderr are one run even when a
            # hang leaves hours between a worker's last print and its timeout report
            return [(items, [f"one run: the files of {d.name}/ in a torchrun attempt_N folder"])]
        own = [i for i in items if i.role == "own"]
        parts = [i for i in items if i.role in ("part", "host")]
        plain = [i for i in items if i.role == "plain"]
        opaque = [i for i in items if i.role == "opaque"]
        if self.prior == "run":
            joint, alone = own + parts + plain, opaque
        else:
            joint, alone = list(parts), list(opaque)
            collection = d == self.root or len(plain) >= 2
            containers = any(i.role == "part" for i in parts)
            if not collection or (containers if d == self.root else joint):
                joint += own
            else:
                alone += own
            if len(plain) == 1 and joint:
                joint += plain
            else:
                alone += plain
        groups: list[tuple[list[_Item], list[str]]] = []
        if joint:
            groups += self._split(joint)
        groups += [([i], []) for i in alone]
        return self._join(groups)

    def _split(self, items: list[_Item]) -> list[tuple[list[_Item], list[str]]]:
        """Items that names put in one run, split where their logs say they are several."""
        speaking = sorted((i for i in items if not i.ident.silent),
                          key=lambda i: (i.ident.first or dt.datetime.max, i.name))
        silent = [i for i in items if i.ident.silent]
        clusters: list[list] = []  # [items, identity, reasons]
        for it in speaking:
            for c in clusters:
                if not conflicts(c[1], it.ident):
                    c[0].append(it)
                    c[1] = Identity().add(c[1]).add(it.ident)
                    break
            else:
                reasons = []
                if clusters:  # say why against the run nearest in time
                    near = min(clusters, key=lambda c: _distance(c[1], it.ident))
                    reasons = [f"told apart from {_names(_shown(x) for x in near[0])} by its logs: "
                               + "; ".join(conflicts(it.ident, near[1]))]
                clusters.append([[it], Identity().add(it.ident), reasons])
        if len(clusters) <= 1:
            group = (clusters[0][0] if clusters else []) + silent
            why = [_basis(group, agree=len(clusters[0][0]) > 1 if clusters else False)] if len(group) > 1 else []
            return [(group, why)]
        head = f"names propose {_basis(items, agree=False)}; their logs tell {len(clusters)} runs apart"
        out = []
        for c in clusters:
            why = [head] + c[2]
            if len(c[0]) > 1:
                why.append(_basis(c[0], agree=True))
            out.append((c[0], why))
        for it in silent:  # no identity: it cannot be placed in one of several runs
            out.append(([it], [head, f"{_shown(it)}: no run identity in its logs, so a run of its own"]))
        return out

    def _join(self, groups: list[tuple[list[_Item], list[str]]]) -> list[tuple[list[_Item], list[str]]]:
        """Groups whose logs share a run id, Slurm job, NCCL commId or master address become one run."""
        if len(groups) < 2:
            return groups
        idents = [Identity().add(_ident_of(g)) for g, _ in groups]
        parent = list(range(len(groups)))
        notes: dict[int, list[str]] = {}

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        buckets: dict[str, list[int]] = {}
        for i, ident in enumerate(idents):
            keys = ({f"r:{x}" for x in ident.run_ids} | {f"j:{x}" for x in ident.jobs}
                    | {f"c:{x}" for x in ident.comms} | {f"m:{x}" for x in ident.masters if not is_loopback(x)})
            for k in keys:
                buckets.setdefault(k, []).append(i)
        for members in buckets.values():
            members.sort(key=lambda i: (idents[i].first or dt.datetime.max, i))
            for a, b in itertools.pairwise(members):
                ra, rb = find(a), find(b)
                if ra == rb or conflicts(idents[ra], idents[rb]):
                    continue
                tie = links(idents[ra], idents[rb])
                if not tie:
                    continue
                parent[rb] = ra
                idents[ra] = Identity().add(idents[ra]).add(idents[rb])
                names_a = _names(_shown(i) for i in groups[a][0])
                names_b = _names(_shown(i) for i in groups[b][0])
                notes.setdefault(ra, []).append(f"{names_a} and {names_b} joined: same {', '.join(tie)}")
                notes[ra] += notes.pop(rb, [])
        merged: dict[int, tuple[list[_Item], list[str]]] = {}
        for i, (items, why) in enumerate(groups):
            r = find(i)
            tgt = merged.setdefault(r, ([], []))
            tgt[0].extend(items)
            tgt[1].extend(why)
        return [(items, why + notes.get(r, [])) for r, (items, why) in merged.items()]

    # -- groups -> runs ---------------------------------------------------------------------------
    def _found(self, d: Path, group: tuple[list[_Item], list[str]], items: list[_Item], archives: list[Found],
               split_below: bool, *, several: bool) -> Found | None:
        members, why = group
        ident = _ident_of(members)
        one = members[0] if len(members) == 1 else None
        if one is not None and (one.role in ("plain", "opaque") or (one.role != "own" and several)
                                or (one.role == "host" and d == self.root)):
            f = one.run  # a sub-folder's run (a part of this folder's run only when the folder is one run)
            return Found(f.base, f.members, f.kind, f.ident, why + f.why)
        if all(i.role == "own" for i in members):
            if all(i.ident.problem for i in members):
                self.ignored += [(self.rel(d / i.name), i.ident.problem or "") for i in members]
                return None
            if all(not i.loose_ok and i.ident.silent for i in members):
                self.ignored += [(self.rel(d / i.name), "metadata beside runs (.json/.csv/.tsv)") for i in members]
                return None
        if one is not None and one.role == "own" and (several or d == self.root):  # a loose file beside runs
            it = members[0]
            reason = self._not_alone(d / it.name, it)
            if reason is not None:
                self.ignored.append((self.rel(d / it.name), reason))
                return None
            return Found(d / it.name, (), "file", it.ident, why or [f"{it.name}: a log file of its own"])
        if len(members) == len(items) and not split_below:
            return Found(d, (), "folder", ident, why)
        paths: list[str] = []
        for it in sorted(members, key=lambda i: i.name):
            if it.role == "own":
                paths.append(it.name)
            else:
                paths += [p.relative_to(d).as_posix() for p in it.run.paths()]
        return Found(d, tuple(paths), "folder", ident, why)

    def _not_alone(self, p: Path, it: _Item) -> str | None:
        """Why a loose file is no run by itself (None: it is one)."""
        if it.ident.problem:
            return it.ident.problem
        if not it.loose_ok:
            return "metadata beside runs (.json/.csv/.tsv)"
        if DOC_NAMES.match(archive.strip_compression(it.name)):
            return "notes, not a log"
        if it.ident.loggy or not it.ident.silent or looks_like_log(p, it.name):
            return None
        return "no log lines"


def _distance(a: Identity, b: Identity) -> float:
    if a.first is None or b.first is None:
        return float("inf")
    return abs((a.first - b.first).total_seconds())


def _shown(it: _Item) -> str:
    return it.name if it.role == "own" else it.name + "/"


def _basis(items: list[_Item], *, agree: bool) -> str:
    """Why items are one run: what their names say, and that their logs agree."""
    parts = []
    for role, what in (("own", "the folder's own logs"), ("part", "log containers by name"),
                       ("host", "per-host/per-rank folders by name"), ("plain", "the folder's one log sub-folder"),
                       ("opaque", "an archive")):
        names = [_shown(i) for i in items if i.role == role]
        if names:
            parts.append(f"{_names(names)} ({what})")
    return "one run: " + ", ".join(parts) + ("; their logs agree" if agree else "")


def _ident_of(items: list[_Item]) -> Identity:
    ident = Identity()
    for i in items:
        ident.add(i.ident)
    return ident


def _names(names) -> str:
    shown = sorted(names)
    return ", ".join(shown[:4]) + (f" and {len(shown) - 4} more" if len(shown) > 4 else "")


def run_files(spec: RunSpec) -> list[str]:
    """A run's files for display: its files in its top folder, then each sub-folder with its file count."""
    base = Path(spec.path)
    if spec.kind != "folder":
        return [base.name]
    stats = _file_stats(base, "folder", None, spec.members)
    top: dict[str, int] = {}
    for name, _, _ in sorted(stats):
        head, sep, _ = name.partition("/")
        if spec.members and name in spec.members:
            top[name] = 0
        elif sep:
            top[head + "/"] = top.get(head + "/", 0) + 1
        else:
            top[name] = 0
    return [display_name(k if not n else f"{k} ({n} file{'s' if n != 1 else ''})") for k, n in top.items()]


def several_runs(path: Path) -> list[str]:
    """The runs a folder given to `analyze` holds when its logs tell several apart (names relative
    to it); one or none: []. The folder is taken for one run that only content may split."""
    plan = plan_runs(path, prior="run")
    if len(plan.runs) < 2:
        return []
    return sorted(_run_rel(f, plan.root) for f in plan.runs)


def _run_rel(f: Found, root: Path) -> str:
    """A run's path relative to root as display text: "." for root, "dir/{a,b}" for entries of dir."""
    rel = "." if f.base == root else f.base.relative_to(root).as_posix()
    if f.members:
        rel = ("" if rel == "." else rel + "/") + "{" + ",".join(f.members) + "}"
    return display_name(rel)


_DEFAULT_WHY = {"folder": "a folder holding the logs of one run", "file": "a log file of its own",
                "archive": "an archive is read as one run"}


def plan_runs(root: Path, *, skip: Path | None = None, prior: str = "scan") -> Plan:
    """The default rule's runs under root (a folder), with reasons. prior="run" treats root as one run
    that only its logs may split (what `analyze` assumes)."""
    root = root.absolute()
    tree = _walk(root, skip)
    return _Grouper(root, tree, prior).plan()


def _kind(p: Path, *, lone: bool = False) -> str | None:
    """folder, archive or file (a log) for a run candidate path; None for anything else."""
    if p.is_symlink():
        return None
    if p.is_dir():
        return "folder"
    if p.is_file():
        if archive.is_archive(p.name):
            return "archive"
        return "file" if (is_lone_log if lone else is_log_file)(p.name) else None
    return None


def _depth_runs(root: Path, depth: int, skip: Path | None) -> list[tuple[Path, str]]:
    if depth < 0:
        raise UsageError("--depth must be 0 or more")
    skip_real = os.path.realpath(skip) if skip is not None else None
    out = []
    for p in _entries_at(root, depth):
        if skip_real is not None and os.path.realpath(p) == skip_real:
            continue
        k = _kind(p, lone=True)
        if k is not None:
            out.append((p, k))
    return out


def _entries_at(root: Path, depth: int) -> list[Path]:
    """Non-hidden entries exactly `depth` levels below root (folders are walked, not followed)."""
    level = [root]
    for i in range(depth):
        nxt: list[Path] = []
        for d in level:
            try:
                entries = sorted(os.scandir(d), key=lambda e: e.name)
            except OSError:
                continue
            for e in entries:
                if e.name.startswith("."):
                    continue
                if e.is_dir(follow_symlinks=False) or i == depth - 1:
                    nxt.append(Path(e.path))
        level = nxt
    return level


def _glob_runs(root: Path, pattern: str, skip: Path | None) -> list[tuple[Path, str]]:
    if not pattern or Path(pattern).is_absolute() or ".." in Path(pattern).parts:
        raise UsageError("--glob takes a relative pattern, e.g. 'jobs/*' or '**/*.tar.gz'")
    skip_real = os.path.realpath(skip) if skip is not None else None
    found = []
    for p in sorted(root.glob(pattern)):
        rel = p.relative_to(root).parts
        if any(s.startswith(".") for s in rel):
            continue
        if skip_real is not None and (os.path.realpath(p) + os.sep).startswith(skip_real + os.sep):
            continue
        k = _kind(p)
        if k is not None:
            found.append((p, k))
    folders = {p for p, k in found if k == "folder"}
    return [(p, k) for p, k in found if not any(a in folders for a in p.parents)]


@functools.cache
def analyzer_fingerprint() -> str:
    """Tool version + the bytes of the analyzer's code, templates and patterns."""
    import ncclforensics
    from ncclforensics.parse.signatures import PATTERNS_DIR

    h = hashlib.sha256(ncclforensics.__version__.encode())
    pkg = Path(ncclforensics.__file__).resolve().parent
    for base in (pkg, Path(PATTERNS_DIR)):
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if "__pycache__" in p.parts or not p.is_file() or p.suffix in (".pyc", ".pyo"):
                continue
            h.update(p.relative_to(base).as_posix().encode() + b"\0")
            try:
                h.update(p.read_bytes())
            except OSError:
                h.update(b"?")
    return h.hexdigest()


class _TreeIndex:
    """Folders of a walk sorted by path text, so a folder's subtree is one contiguous slice."""

    def __init__(self, tree: dict[Path, _Dir]) -> None:
        self.tree = tree
        self.keys = sorted(str(d) + os.sep for d in tree)

    def subtree(self, run: Path) -> list[Path]:
        prefix = str(run) + os.sep
        lo = bisect.bisect_left(self.keys, prefix)
        hi = lo
        while hi < len(self.keys) and self.keys[hi].startswith(prefix):
            hi += 1
        return [Path(k[:-1]) for k in self.keys[lo:hi]]


def _file_stats(run: Path, kind: str, index: _TreeIndex | None,
                members: tuple[str, ...] = ()) -> list[tuple[str, int, int]]:
    if members:
        out = []
        for m in members:
            p = run / m
            sub = _file_stats(p, "folder" if p.is_dir() and not p.is_symlink() else "file", index)
            out += [(f"{m}/{n}" if p.is_dir() else m, s, t) for n, s, t in sub]
        return out
    if kind != "folder":
        st = os.stat(run)
        return [(run.name, st.st_size, st.st_mtime_ns)]
    if index is None or run not in index.tree:
        index = _TreeIndex(_walk(run, None))
    out = []
    for d in index.subtree(run):
        reld = d.relative_to(run).as_posix()
        out += [(f if reld == "." else f"{reld}/{f}", s, m) for f, s, m in index.tree[d].files]
    return out


def content_key(stats: list[tuple[str, int, int]], fingerprint: str) -> str:
    h = hashlib.sha256(fingerprint.encode() + b"\n")
    for name, size, mtime in sorted(stats):
        h.update(f"{name}\0{size}\0{mtime}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def find_runs(root: Path, *, depth: int | None = None, glob: str | None = None,
              skip: Path | None = None) -> list[RunSpec]:
    """The runs under root, per the default rule or the depth/glob override, sorted by path."""
    return list_runs(root, depth=depth, glob=glob, skip=skip)[0]


def list_runs(root: Path, *, depth: int | None = None, glob: str | None = None, skip: Path | None = None,
              cache: IdentityCache | None = None) -> tuple[list[RunSpec], list[tuple[str, str]]]:
    """(runs, ignored): the runs sorted by path and the files that are no run, with the reason."""
    if depth is not None and glob is not None:
        raise UsageError("use either --depth or --glob, not both")
    root = root.absolute()
    ignored: list[tuple[str, str]] = []
    found: list[Found] = []
    index = None
    if root.is_file():
        k = _kind(root)
        found = [Found(root, (), k or "file", Identity(), ["the file given"])]
    else:
        tree = _walk(root, skip)
        index = _TreeIndex(tree)
        if depth is not None:
            found = [Found(p, (), k, Identity(), [f"--depth {depth}"]) for p, k in _depth_runs(root, depth, skip)]
        elif glob is not None:
            found = [Found(p, (), k, Identity(), [f"--glob {glob}"]) for p, k in _glob_runs(root, glob, skip)]
        else:
            plan = _Grouper(root, tree, "scan", cache).plan()
            found, ignored = plan.runs, plan.ignored
    fp = analyzer_fingerprint()
    override = depth is not None or glob is not None
    specs = []
    seen: set[tuple[Path, tuple[str, ...]]] = set()
    for f in sorted(found, key=lambda f: (f.base, f.members)):
        if (f.base, f.members) in seen:
            continue
        seen.add((f.base, f.members))
        try:
            stats = _file_stats(f.base, f.kind, index, f.members)
        except OSError:
            continue
        rel = display_name(root.name) if root.is_file() else _run_rel(f, root)
        specs.append(RunSpec(
            id=run_id(rel), rel=rel, path=str(f.base), kind=f.kind, size=sum(s for _, s, _ in stats),
            nfiles=len(stats), key=content_key(stats, fp), members=f.members,
            why=tuple(w for w in f.why if w) or (_DEFAULT_WHY[f.kind],),
            ids="" if override else f.ident.summary(), check_runs=override,
        ))
    return specs, sorted(ignored)
