"""Find the runs under a scan root and the content-hash cache key of each.

The default rule (documented for users in the README's `scan` section):

1. A *log file* is a regular, non-hidden file that is not an archive and not a script, config or
   data file (the analyzer's NOT_LOG_SUFFIXES); compressed logs (.gz .zst .bz2 .xz) are log files.
2. A folder that directly holds log files is a *candidate*. The candidate climbs to its parent
   (repeatedly, never above ROOT) while its name marks it as a part of a run rather than a run:
   - torchrun `--log-dir` trees: `attempt_<N>`, anything below an `attempt_<N>`, and the
     `<run_id>_<random>` folder that holds `attempt_<N>` folders;
   - Flight Recorder / dump folders: `fr_*`, `flight_recorder*`, `*trace`/`*traces`, `dump(s)`;
   - log and artefact containers: `log`, `logs`, `torchrun_logs`, `log_dir`, `output(s)`, `stdout`,
     `stderr`, `console`, `dmesg`, `syslog`, `kernel`, `eval*`, `profile*`/`profiler*`,
     `tensorboard`, `tb`, `wandb`, `checkpoint(s)`, `ckpt(s)`, `artifacts`, `metrics`;
   - per-host / per-rank folders: `node`, `host`, `worker`, `nid`, `rank`, `gpu`, `compute`,
     `dgx`, `hgx`, `ip` followed (after optional `-`, `_`, `.` and letters) by a number —
     `node0`, `node-1`, `gpu-e002`, `nid001234`, `rank3`, `ip-10-0-0-1` — or an IPv4 address.
3. A candidate with at most one candidate below it (the nearest ones) is a run: the folder with
   everything below it (a job folder with console.log and one log subfolder of any name). A
   candidate with two or more is a collection, not a run: each of its own log files is a run of its
   own, and the candidates below it are decided by this same rule.
4. An archive (.tar .tar.gz .tgz .tar.bz2 .tar.xz .tar.zst .zip) is one run, unless it lies inside a
   run folder, whose analysis reads it as part of that run (a dump tarball beside console.log).
5. ROOT's own loose files never make ROOT a candidate: each is a run of its own (a lone
   `console.log.gz`). ROOT is a candidate only when log folders climbed up to it (ROOT is itself a
   run with node0/, node1/ or a torchrun tree); if rule 3 makes it a run, it is the only one.
   Loose .json/.csv/.tsv files (metadata beside runs) are never runs by themselves.
6. Hidden files and folders (name starting with ".") are never candidates; symlinks are not
   followed; the output folder is skipped when it lies under ROOT.

Overrides: `depth=N` makes the runs exactly the folders, archives and log files (not .json/.csv/.tsv)
N levels below ROOT (0 = ROOT itself); `glob=PATTERN` makes them the paths matching PATTERN relative
to ROOT (pathlib glob, `**` allowed), a match inside another match being part of it.

Cache key: sha256 over the analyzer fingerprint (tool version + the bytes of the package's source
and template files and of patterns/) and, for every file the run holds, its path relative to the
run, size and mtime in nanoseconds. Any change of a file, or of the analyzer, re-analyzes the run.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from ncclforensics.errors import UsageError
from ncclforensics.events import NOT_LOG_SUFFIXES
from ncclforensics.ingest import archive
from ncclforensics.ingest.discover import display_name

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
    rel: str  # path relative to ROOT, as display text ("." for ROOT itself)
    path: str  # absolute path handed to the analyzer
    kind: str  # folder | archive | file
    size: int  # bytes on disk
    nfiles: int  # files on disk
    key: str  # content hash (cache key)

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
    """Every folder under root (symlinks not followed) with its regular files' stats."""
    tree: dict[Path, _Dir] = {}
    skip_real = os.path.realpath(skip) if skip is not None else None
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        if skip_real is not None:
            dirnames[:] = [d for d in dirnames if os.path.realpath(here / d) != skip_real]
        dirnames.sort()
        files = []
        for fname in sorted(filenames):
            try:
                st = os.lstat(here / fname)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                files.append((fname, st.st_size, st.st_mtime_ns))
        tree[here] = _Dir(files, [d for d in dirnames if not os.path.islink(here / d)])
    return tree


def _absorbed(d: Path, root: Path, tree: dict[Path, _Dir]) -> bool:
    """True when folder d is a part of a run (its logs belong to the parent's run)."""
    if d == root:
        return False
    name = d.name
    if _ATTEMPT.match(name) or _PART_OF_RUN.match(name) or _HOST_DIR.match(name):
        return True
    if any(_ATTEMPT.match(p.name) for p in d.relative_to(root).parents if p.name):
        return True  # anything below an attempt_N folder
    node = tree.get(d)
    return node is not None and any(_ATTEMPT.match(s) for s in node.subdirs)


def _lift(d: Path, root: Path, tree: dict[Path, _Dir]) -> Path:
    while d != root and _absorbed(d, root, tree):
        d = d.parent
    return d


def _default_runs(root: Path, tree: dict[Path, _Dir]) -> list[tuple[Path, str]]:
    candidates: dict[Path, list[Path]] = {}  # candidate folder -> its log files
    archives: list[Path] = []
    root_files: list[Path] = []
    for d, node in tree.items():
        rel_parts = d.relative_to(root).parts
        if any(p.startswith(".") for p in rel_parts):
            continue
        logs = [d / f for f, _, _ in node.files if is_log_file(f)]
        archives += [d / f for f, _, _ in node.files if not f.startswith(".") and archive.is_archive(f)]
        if d == root:
            root_files = [f for f in logs if is_lone_log(f.name)]
        elif logs:
            candidates.setdefault(_lift(d, root, tree), []).extend(logs)
    # nearest candidate above each candidate: the candidates form a tree
    subs: dict[Path | None, list[Path]] = {}
    for cand in sorted(candidates, key=lambda p: len(p.parts)):
        parent = next((a for a in cand.parents if a in candidates), None)
        subs.setdefault(parent, []).append(cand)
    runs: list[tuple[Path, str]] = []
    folder_runs: set[Path] = set()
    stack = list(subs.get(None, []))
    while stack:
        cand = stack.pop()
        below = subs.get(cand, [])
        if len(below) <= 1:  # a run, with its one log subfolder if any (rule 3)
            folder_runs.add(cand)
        else:  # a collection: its own logs are runs each, the candidates below are decided alike
            runs += [(f, "file") for f in candidates[cand] if is_lone_log(f.name)]
            stack += below
    if root in folder_runs:  # everything climbed to ROOT: ROOT is the one run (rule 5)
        return [(root, "folder")]
    runs += [(f, "file") for f in root_files]
    runs += [(d, "folder") for d in folder_runs]
    runs += [(a, "archive") for a in archives if not any(p in folder_runs for p in a.parents)]
    return runs


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


def _file_stats(run: Path, kind: str, index: _TreeIndex | None) -> list[tuple[str, int, int]]:
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
    if depth is not None and glob is not None:
        raise UsageError("use either --depth or --glob, not both")
    root = root.absolute()
    if root.is_file():
        k = _kind(root)
        pairs = [(root, k or "file")]
        index = None
    else:
        tree = _walk(root, skip)
        if depth is not None:
            pairs = _depth_runs(root, depth, skip)
        elif glob is not None:
            pairs = _glob_runs(root, glob, skip)
        else:
            pairs = _default_runs(root, tree)
        index = _TreeIndex(tree)
    fp = analyzer_fingerprint()
    specs = []
    for p, kind in sorted(set(pairs)):
        try:
            stats = _file_stats(p, kind, index)
        except OSError:
            continue
        rel = "." if p == root else p.relative_to(root).as_posix()
        if root.is_file():
            rel = root.name
        rel = display_name(rel)
        specs.append(RunSpec(
            id=run_id(rel), rel=rel, path=str(p), kind=kind, size=sum(s for _, s, _ in stats),
            nfiles=len(stats), key=content_key(stats, fp),
        ))
    return specs
