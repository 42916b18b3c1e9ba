"""Batch scan of archived runs: every run under a root analyzed, summed up in a summary table with an index page.

`scan(root, out_dir)` (DESIGN.md §7):

1. finds the runs under ROOT (the rule is in ncclforensics/scan/discover.py: folders holding logs,
   with torchrun trees, Flight Recorder dumps and per-host folders grouped with their run; archives;
   lone compressed logs; or `depth` / `glob` overrides) and computes each run's content hash;
2. skips every run whose OUTDIR/runs/<id>/result.json carries the same hash (unchanged files and
   analyzer), analyzes the others in a pool of killable worker processes (or as Ray tasks), each
   within `timeout` seconds, and writes per run diagnosis.json, report.html (when the report
   renderer exists) and, last, result.json - each by an atomic rename, so a scan killed at any
   moment loses nothing but the runs in flight, and a re-run duplicates nothing;
3. rebuilds OUTDIR/summary.parquet, summary.csv and index.html from the result.json files of the
   runs found. A run that fails, crashes its worker or times out is a row with its error.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ncclforensics.atomic import TMP_GLOB
from ncclforensics.errors import NoInputError, UsageError
from ncclforensics.ingest.discover import display_name
from ncclforensics.scan.discover import IdentityCache, RunSpec, find_runs, list_runs, run_files
from ncclforensics.scan.worker import read_result

__all__ = ["ENGINES", "RunSpec", "ScanResult", "find_runs", "list_command", "list_runs", "scan", "scan_command"]

ENGINES = ("process", "ray")
IDENTITY_CACHE = ".identities.json"  # in OUTDIR: the run-identity samples of the last scan


@dataclass
class ScanResult:
    out_dir: Path
    runs: int = 0  # runs found
    analyzed: int = 0  # analyzed by this scan
    cached: int = 0  # served from result.json
    errors: int = 0  # rows whose analysis failed, crashed or timed out (cached ones included)
    seconds: float = 0.0
    summary_parquet: Path | None = None
    summary_csv: Path | None = None
    index_html: Path | None = None
    statuses: dict[str, int] = field(default_factory=dict)


def _cache_hit(doc: dict | None, spec: RunSpec, timeout: float, reports: bool, self_contained: bool) -> bool:
    if doc is None or doc.get("key") != spec.key:
        return False
    if reports and not doc.get("reports", True):  # analyzed without a report, one is wanted now
        return False
    if reports and bool(doc.get("self_contained", True)) != self_contained:  # the report's plotly.js moves
        return False
    # a run that timed out is tried again when the new limit is longer
    return not (doc.get("status") == "timeout" and float(doc.get("timeout_s") or 0) < timeout)


class _Lock:
    """One scan per OUTDIR at a time (flock: released by the kernel when the process dies)."""

    def __init__(self, out_dir: Path) -> None:
        self.fh = open(out_dir / ".scan.lock", "w")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.close()
            raise UsageError(f"another scan is writing to {out_dir}") from None

    def release(self) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


class _Progress:
    """A rich progress bar on stderr: runs done/total, rate, elapsed, ETA."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if not enabled or total == 0:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.text import Text

        class RateColumn(ProgressColumn):
            def render(self, task) -> Text:
                speed = task.finished_speed or task.speed
                return Text(f"{speed:.1f} runs/s" if speed else "- runs/s", style="progress.data.speed")

        self.bar = Progress(
            TextColumn("[bold]scan[/]"), BarColumn(), MofNCompleteColumn(), RateColumn(),
            TextColumn("{task.fields[errors]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=Console(stderr=True), transient=False,
        )
        self.task = self.bar.add_task("scan", total=total, errors="")
        self.bar.start()
        self.n_err = 0

    def advance(self, failed: bool) -> None:
        if self.bar is None:
            return
        self.n_err += failed
        self.bar.update(self.task, advance=1, errors=f"{self.n_err} failed" if self.n_err else "")

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def scan(root: str | os.PathLike, out_dir: str | os.PathLike, *, jobs: int | None = None, depth: int | None = None,
         glob: str | None = None, timeout: float = 600, engine: str = "process", ray_address: str | None = None,
         progress: bool = True, force: bool = False, reports: bool = True,
         self_contained: bool = False) -> ScanResult:
    """Scan ROOT into OUTDIR (see the module docstring). Raises ForensicsError subclasses for user errors.

    Per-run reports load plotly.js from one shared OUTDIR/assets/ copy; `self_contained` inlines it in
    each report instead (~0.5 MB more per report)."""
    from ncclforensics.scan import engines
    from ncclforensics.scan.index import write_index
    from ncclforensics.scan.summary import summary_frame, write_tables

    t0 = time.monotonic()
    root, out = Path(root), Path(out_dir)
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if jobs is not None and jobs < 1:
        raise UsageError("--jobs must be 1 or more")
    if not timeout or timeout <= 0:
        raise UsageError("--timeout must be more than 0 seconds")
    if not root.exists():
        raise NoInputError(f"no such file or folder: {root}")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a folder")
    cache = IdentityCache(out / IDENTITY_CACHE, root.absolute()) if depth is None and glob is None else None
    specs, ignored = list_runs(root, depth=depth, glob=glob, skip=out, cache=cache)  # before OUTDIR is made
    if not specs:
        raise NoInputError(_no_runs(root, depth, glob, ignored))
    out_real = os.path.realpath(out)
    for s in specs:
        if s.kind == "folder" and (out_real + os.sep).startswith(os.path.realpath(s.path) + os.sep):
            raise UsageError(f"the output folder {out} lies inside the run {s.rel}: choose another")
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):  # distinct paths hashing alike: practically impossible
        raise UsageError("two runs map to the same id; use --glob to pick them")
    out.mkdir(parents=True, exist_ok=True)
    lock = _Lock(out)
    try:
        if cache is not None:
            cache.save()
        for stale in out.glob(TMP_GLOB):  # a summary write cut short by a kill
            stale.unlink(missing_ok=True)
        result = ScanResult(out_dir=out, runs=len(specs))
        todo = [s for s in specs
                if force or not _cache_hit(read_result(out, s.id), s, timeout, reports, self_contained)]
        if reports and not self_contained:
            from ncclforensics.scan.worker import write_shared_assets

            write_shared_assets(out)
        result.cached = len(specs) - len(todo)
        bar = _Progress(len(todo), progress)

        def on_result(spec: dict, res: dict) -> None:
            result.analyzed += 1
            bar.advance(res.get("status") != "ok")

        try:
            payload = [{**s.as_dict(), "reports": reports, "self_contained": self_contained} for s in todo]
            if todo and engine == "ray":
                engines.run_ray(payload, out, jobs=jobs, timeout=timeout, address=ray_address, on_result=on_result)
            elif todo:
                engines.run_processes(payload, out, jobs=jobs or os.cpu_count() or 1, timeout=timeout,
                                      on_result=on_result)
        finally:
            bar.stop()
        rows = []
        for s in specs:
            doc = read_result(out, s.id)
            if doc is None:  # only if a write failed (disk full): say so rather than drop the run
                from ncclforensics.scan.worker import error_result

                doc = error_result(s.as_dict(), "error", "no result was recorded for this run")
            rows.append(doc["row"])
        df = summary_frame(rows)
        result.statuses = {k: int(v) for k, v in df["status"].value_counts().iter_rows()}
        result.errors = sum(v for k, v in result.statuses.items() if k != "ok")
        result.summary_parquet, result.summary_csv = write_tables(df, out)
        result.seconds = time.monotonic() - t0
        result.index_html = write_index(df, out, root=str(root), stats={"analyzed": result.analyzed,
                                                                        "cached": result.cached})
        result.seconds = time.monotonic() - t0
        return result
    finally:
        lock.release()


def scan_command(root: Path, out_dir: Path, *, jobs: int | None = None, depth: int | None = None,
                 glob: str | None = None, timeout: float = 600, engine: str = "process",
                 ray_address: str | None = None, quiet: bool = False, force: bool = False,
                 reports: bool = True, self_contained: bool = False) -> int:
    """The `ncclforensics scan` command: scan, print one summary line on stderr, return the exit code
    (0 whenever the scan completed, whatever the verdicts and failed rows)."""
    import sys

    res = scan(root, out_dir, jobs=jobs, depth=depth, glob=glob, timeout=timeout, engine=engine,
               ray_address=ray_address, progress=not quiet and sys.stderr.isatty(), force=force,
               reports=reports, self_contained=self_contained)
    if not quiet:
        from ncclforensics.console import plural

        failed = f", {res.errors:,} could not be analyzed" if res.errors else ""
        sys.stderr.write(f"Scanned {plural(res.runs, 'run')} ({res.analyzed:,} analyzed, {res.cached:,} unchanged"
                         f"{failed}) in {res.seconds:.1f} s: {res.index_html}\n")
    return 0


def _no_runs(root: Path, depth: int | None, glob: str | None, ignored: list[tuple[str, str]]) -> str:
    """The one-line error when ROOT holds no run, with the files that were looked at and why they are none."""
    how = (f"at depth {depth}" if depth is not None else f"matching {glob!r}" if glob
           else "(folders holding logs, archives, log files)")
    why = ""
    if ignored:
        shown = "; ".join(f"{r}: {w}" for r, w in ignored[:3])
        why = f"; {len(ignored)} file{'s are' if len(ignored) != 1 else ' is'} no run ({shown}" + \
            (" …)" if len(ignored) > 3 else ")")
    return display_name(f"no runs found under {root} {how}{why}")


def list_text(root: Path, *, depth: int | None = None, glob: str | None = None, files_shown: int = 8) -> str:
    """`scan --list`: the runs under ROOT, each with its files, why they were grouped and what their
    logs say (launches, world size, master, time span), then the files that are no run and why."""
    from ncclforensics.words import human_bytes

    root = Path(root)
    if not root.exists():
        raise NoInputError(f"no such file or folder: {root}")
    specs, ignored = list_runs(root, depth=depth, glob=glob)
    if not specs:
        raise NoInputError(_no_runs(root, depth, glob, ignored))
    out = [f"{len(specs)} run{'s' if len(specs) != 1 else ''} under {root}"
           + (f"; {len(ignored)} file{'s' if len(ignored) != 1 else ''} that are no run" if ignored else ""), ""]
    for s in specs:
        out.append(f"{s.rel}  ({s.kind}, {s.nfiles} file{'s' if s.nfiles != 1 else ''}, {human_bytes(s.size)})")
        for i, w in enumerate(s.why):
            out.append(f"  {'why ' if i == 0 else '    '}  {w}")
        if s.ids:
            out.append(f"  logs  {s.ids}")
        files = run_files(s)
        shown = "; ".join(files[:files_shown]) + (f"; and {len(files) - files_shown} more" if len(files) > files_shown
                                                   else "")
        out.append(f"  files {shown}")
        out.append("")
    if ignored:
        out.append("not runs:")
        width = min(60, max(len(r) for r, _ in ignored))
        out += [f"  {r:<{width}}  {why}" for r, why in ignored]
    return "\n".join(out).rstrip("\n") + "\n"


def list_command(root: Path, *, depth: int | None = None, glob: str | None = None) -> int:
    """The `ncclforensics scan --list` command: print list_text to stdout; exit code 0."""
    import sys

    sys.stdout.write(list_text(root, depth=depth, glob=glob))
    sys.stdout.flush()
    return 0
