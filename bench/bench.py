#!/usr/bin/env python3
"""Time `ncclforensics events` / `analyze` against grep on generated runs: wall time, MB/s, peak RSS.

For every RUN (a run folder, or a .tar.gz of one) and every command:

  events   ncclforensics events RUN -f csv -o /dev/null
  analyze  ncclforensics analyze RUN --json           (skipped when the command does not exist yet)
  before   the same analyze from another checkout (--before DIR: PYTHONPATH=DIR), for before/after figures
  grep     LC_ALL=C grep -rcE '<pattern>' RUN          (folder)
           zcat RUN | LC_ALL=C grep -cE '<pattern>'    (.tar.gz)
  rg       rg -c -e '<pattern>' RUN                    (ripgrep; zcat RUN | rg -c for a .tar.gz)
  cat      the I/O floor (cat or zcat to /dev/null)

The pattern (--grep) is the 12 patterns an on-call engineer types (ISSUE_PATTERN, the yardstick of
issue 14), or with `--grep literals` the analyzer's own prefilter literals (signature literals +
block-start literals), escaped for ERE. One warm-up round (also fills the page cache), then --runs
timed rounds; within a round the commands alternate, so load swings hit them alike; medians are
reported. Peak RSS comes from /usr/bin/time (or a small rusage wrapper when it is absent). An
analyze verdict is checked against the run's truth file (class and culprit ranks). Also measures
start-up: `ncclforensics version` and events/analyze on a tiny input (sample_logs/ when it has files).

Writes a Markdown table to stdout and everything as JSON (--json). See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = HERE / "data"
TIME_BIN = "/usr/bin/time"
ERE_SPECIAL = re.compile(r"([\\.\[\]()*+?{}|^$])")
# issue 14: what an on-call engineer greps for (ERE; also valid for rg)
ISSUE_PATTERN = (r"Watchdog caught|WorkNCCL\(SeqNum=|Detected mismatch between collectives|NVRM: Xid|"
                 r"ChildFailedError|DataLoader worker \(pid|CUDA out of memory|DistNetworkError|DistStoreError|"
                 r"NCCL WARN|exitcode|Traceback")
# the generator's failure -> the verdict class it must get
TRUTH_CLASS = {"lagging_rank": "rank_divergence", "xid": "gpu_hardware", "oom": "oom"}

_RUSAGE_WRAPPER = r"""
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:], stdout=subprocess.DEVNULL if sys.argv[1] == "-" else open(sys.argv[1], "wb"))
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(ru.ru_maxrss, ru.ru_utime, ru.ru_stime, file=sys.stderr)
sys.exit(rc)
"""


@dataclass
class Measure:
    run: str
    command: str
    argv: list[str]
    bytes: int
    runs: list[float] = field(default_factory=list)
    rss_kb: list[int] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)  # user + sys of the command and its children
    status: str = "ok"  # ok | skipped | failed
    note: str = ""
    output: dict | None = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.runs) if self.runs else None

    @property
    def median_cpu_s(self) -> float | None:
        return statistics.median(self.cpu_s) if self.cpu_s else None

    @property
    def peak_rss_mb(self) -> float | None:
        return max(self.rss_kb) / 1024 if self.rss_kb else None

    @property
    def mb_s(self) -> float | None:
        m = self.median_s
        return self.bytes / 1e6 / m if m and self.bytes else None


def ere_escape(lit: str) -> str:
    return ERE_SPECIAL.sub(r"\\\1", lit)


def prefilter_literals() -> list[str]:
    """The literals the analyzer's block prefilter looks for (what grep is asked to find)."""
    sys.path.insert(0, str(REPO))
    from ncclforensics.parse.signatures import load_signatures

    lits = list(load_signatures().literals)
    try:  # the multi-line block starts are prefiltered too (parse/lines.py)
        from ncclforensics.parse.blocks import BLOCK_LITERALS

        lits += [x for x in BLOCK_LITERALS if x not in lits]
    except ImportError:
        pass
    return sorted(set(lits), key=lambda s: (-len(s), s))


def run_bytes(run: Path) -> int:
    """Uncompressed bytes of the logs: file sizes of a folder; for a .tar.gz, its truth file or a count."""
    if run.is_dir():
        return sum(f.stat().st_size for f in run.rglob("*") if f.is_file())
    name = run.name
    for suf in (".tar.gz", ".tgz"):
        if name.endswith(suf):
            truth = run.with_name(name[: -len(suf)] + ".truth.json")
            if truth.exists():
                return int(json.loads(truth.read_text())["bytes"])
            return count_gz(run)
    return run.stat().st_size


def count_gz(path: Path) -> int:
    try:
        from isal import igzip as gz
    except ImportError:  # pragma: no cover
        import gzip as gz
    n = 0
    with gz.open(path, "rb") as fh:
        while chunk := fh.read(16 << 20):
            n += len(chunk)
    return n


def timed(argv: list[str], env: dict[str, str], stdout_path: str | None
          ) -> tuple[float, int | None, float | None, int, str]:
    """(wall seconds, peak RSS kB, user+sys CPU seconds, exit code, stderr tail) of one run of argv."""
    with tempfile.NamedTemporaryFile("r", suffix=".time", delete=False) as tf:
        tpath = tf.name
    try:
        if os.access(TIME_BIN, os.X_OK):
            full = [TIME_BIN, "-f", "%M %U %S", "-o", tpath, *argv]
        else:
            full = [sys.executable, "-c", _RUSAGE_WRAPPER, stdout_path or "-", *argv]
        out = open(stdout_path, "wb") if stdout_path and full[0] == TIME_BIN else subprocess.DEVNULL
        try:
            t0 = time.perf_counter()
            proc = subprocess.run(full, stdout=out, stderr=subprocess.PIPE, env=env, check=False)
            wall = time.perf_counter() - t0
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        err = proc.stderr.decode("utf-8", "replace")
        if full[0] == TIME_BIN:
            last = (Path(tpath).read_text().strip().splitlines() or [""])[-1]
        else:
            last = err.strip().rsplit("\n", 1)[-1]
            err = err.strip()[: -len(last)]
        rss, cpu = None, None
        parts = last.split()
        if len(parts) == 3 and parts[0].isdigit():
            rss, cpu = int(parts[0]), float(parts[1]) + float(parts[2])
        return wall, rss, cpu, proc.returncode, err[-800:]
    finally:
        Path(tpath).unlink(missing_ok=True)


def commands(run: Path, exe: str, pattern: str, which: list[str], before: str | None = None
             ) -> list[tuple[str, list[str]]]:
    out = []
    is_gz = run.is_file() and run.name.endswith((".tar.gz", ".tgz", ".gz"))
    for name in which:
        if name == "events":
            out.append(("events", [exe, "events", str(run), "-f", "csv", "-o", os.devnull]))
        elif name == "analyze":
            out.append(("analyze", [exe, "analyze", str(run), "--json"]))
        elif name == "before":  # analyze from another checkout (--before), same interpreter
            # that checkout's own entry point (its __main__), with -P: plain `python -m` would put the
            # working directory (a checkout too) first; the console script may name a function it lacks
            out.append(("before", ["env", f"PYTHONPATH={before}", sys.executable, "-P", "-m", "ncclforensics",
                                   "analyze", str(run), "--json"]))
        elif name == "grep":
            if is_gz:
                out.append(("grep", ["sh", "-c", 'zcat -- "$1" | LC_ALL=C grep -cE -e "$2"', "sh", str(run), pattern]))
            else:
                out.append(("grep", ["env", "LC_ALL=C", "grep", "-rcE", "-e", pattern, str(run)]))
        elif name == "rg":
            if is_gz:
                out.append(("rg", ["sh", "-c", 'zcat -- "$1" | rg -c -e "$2"', "sh", str(run), pattern]))
            else:
                out.append(("rg", ["rg", "-c", "-e", pattern, str(run)]))
        elif name == "cat":  # the I/O floor
            if is_gz:
                out.append(("cat", ["sh", "-c", 'zcat -- "$1" > /dev/null', "sh", str(run)]))
            else:
                out.append(("cat", ["sh", "-c", 'find "$1" -type f -exec cat {} + > /dev/null', "sh", str(run)]))
        else:
            raise SystemExit(f"unknown command {name!r}")
    return out


def measure(run: Path, name: str, argv: list[str], nbytes: int, warmup: int, runs: int, env: dict[str, str],
            quiet: bool) -> Measure:
    """One command's rounds, back to back (start-up figures)."""
    return measure_alternated(run, [(name, argv)], nbytes, warmup, runs, env, quiet)[0]


def measure_alternated(run: Path, cmds: list[tuple[str, list[str]]], nbytes: int, warmup: int, runs: int,
                       env: dict[str, str], quiet: bool) -> list[Measure]:
    """Every command once per round (warm-up rounds first), in turn, so load swings hit them alike."""
    ms = [Measure(run=str(run), command=name, argv=argv, bytes=nbytes) for name, argv in cmds]
    with tempfile.TemporaryDirectory() as td:
        outs = {m.command: (str(Path(td) / m.command) if m.command in ("analyze", "before", "grep", "rg") else None)
                for m in ms}
        for i in range(warmup + runs):
            for m in ms:
                if m.status != "ok":
                    continue
                wall, rss, cpu, rc, err = timed(m.argv, env, outs[m.command])
                if rc != 0 and not (m.command in ("grep", "rg") and rc == 1):  # 1: no line matched
                    # analyze is being written: a missing or crashing command is skipped, not a bench failure
                    m.status = "skipped" if m.command in ("analyze", "before") else "failed"
                    why = "command does not exist yet" if _missing_command(rc, err) else (
                        err.strip().splitlines()[-1] if err.strip() else "")
                    m.note = f"exit {rc}: {why}"[:300]
                    m.runs, m.rss_kb, m.cpu_s = [], [], []
                    continue
                if i >= warmup:
                    m.runs.append(wall)
                    if rss is not None:
                        m.rss_kb.append(rss)
                    if cpu is not None:
                        m.cpu_s.append(cpu)
                if not quiet:
                    tag = "warm-up" if i < warmup else f"run {i - warmup + 1}/{runs}"
                    rss_s = f", {rss / 1024:.0f} MB, cpu {cpu:.2f} s" if rss is not None and cpu is not None else ""
                    print(f"  {m.command:8s} {tag:9s} {wall:8.2f} s{rss_s}", file=sys.stderr)
        for m in ms:
            out_path = outs[m.command]
            if m.status == "ok" and out_path and Path(out_path).exists():
                m.output = _summarize_output(m.command, Path(out_path))
                if m.command in ("analyze", "before"):
                    m.output["truth"] = check_truth(m.output, truth_of(run))
    return ms


def check_truth(verdict: dict, truth: dict | None) -> str:
    """"ok", "no truth file", or what differs from the generator's truth (class, culprit ranks)."""
    if truth is None:
        return "no truth file"
    want_class = TRUTH_CLASS.get(truth.get("failure"))
    want_culprits = [truth.get("culprit_rank")]
    bad = []
    if verdict.get("class") != want_class:
        bad.append(f"class {verdict.get('class')} != {want_class}")
    if verdict.get("culprit_ranks") != want_culprits:
        bad.append(f"culprits {verdict.get('culprit_ranks')} != {want_culprits}")
    return "; ".join(bad) or "ok"


def _missing_command(rc: int, err: str) -> bool:
    return rc == 2 and ("No such command" in err or "no such command" in err.lower())


def _summarize_output(name: str, path: Path) -> dict | None:
    text = path.read_text(encoding="utf-8", errors="replace")
    if name in ("grep", "rg"):
        total = 0
        for line in text.splitlines():
            tail = line.rsplit(":", 1)[-1]
            if tail.strip().isdigit():
                total += int(tail)
        return {"matching_lines": total}
    try:
        doc = json.loads(text)
    except ValueError:
        return {"error": "stdout is not one JSON document", "head": text[:200]}
    verdict = doc.get("verdict", {}) if isinstance(doc, dict) else {}
    coll = verdict.get("collective") or {}
    return {"class": verdict.get("class"), "culprit_ranks": verdict.get("culprit_ranks"),
            "op_type": coll.get("op_type"), "seq": coll.get("seq"), "rule": verdict.get("rule")}


def truth_of(run: Path) -> dict | None:
    name = run.name
    for suf in (".tar.gz", ".tgz"):
        if name.endswith(suf):
            name = name[: -len(suf)]
    p = run.with_name(name + ".truth.json")
    return json.loads(p.read_text()) if p.exists() else None


def startup(exe: str, target: Path, warmup: int, runs: int, env: dict[str, str], quiet: bool,
            before: str | None = None) -> list[Measure]:
    out = [measure(Path("-"), "version", [exe, "version"], 0, warmup, runs, env, quiet)]
    nbytes = run_bytes(target)
    for name, argv in commands(target, exe, "", ["events", "analyze"] + (["before"] if before else []), before):
        out.append(measure(target, name, argv, nbytes, warmup, runs, env, quiet))
    return out


def small_input(exe: str) -> Path:
    """sample_logs/ when it holds files, else a tiny generated run (8 ranks, 1 MB)."""
    sample = REPO / "sample_logs"
    if sample.is_dir() and any(p.is_file() for p in sample.rglob("*")):
        return sample
    tiny = DATA / "tiny_startup"
    if not tiny.exists():
        subprocess.run([sys.executable, str(HERE / "gen_run.py"), "--ranks", "8", "--size", "1M", "--seed", "1",
                        "--out", str(tiny)], check=True, stdout=subprocess.DEVNULL)
    return tiny


def fmt(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def markdown(results: list[Measure], start: list[Measure]) -> str:
    lines = ["| run | MB | command | median wall s | MB/s | × grep | × rg | median CPU s | × grep (CPU) | peak RSS MB "
             "| runs | note |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    grep_of = {m.run: m.median_s for m in results if m.command == "grep" and m.median_s}
    rg_of = {m.run: m.median_s for m in results if m.command == "rg" and m.median_s}
    grep_cpu = {m.run: m.median_cpu_s for m in results if m.command == "grep" and m.median_cpu_s}
    for m in results:
        g, gc = grep_of.get(m.run), grep_cpu.get(m.run)
        ratio = m.median_s / g if g and m.median_s else None
        rg = rg_of.get(m.run)
        rg_ratio = m.median_s / rg if rg and m.median_s else None
        cratio = m.median_cpu_s / gc if gc and m.median_cpu_s else None
        note = m.note or ""
        if m.output and m.command in ("analyze", "before"):
            note = (f"verdict {m.output.get('class')} culprits {m.output.get('culprit_ranks')} seq "
                    f"{m.output.get('seq')}: truth {m.output.get('truth')}")
        elif m.output and m.command in ("grep", "rg"):
            note = f"{m.output.get('matching_lines')} matching lines"
        lines.append(f"| {Path(m.run).name} | {m.bytes / 1e6:.0f} | {m.command} | {fmt(m.median_s, '.2f')} | "
                     f"{fmt(m.mb_s, '.0f')} | {fmt(ratio, '.2f')} | {fmt(rg_ratio, '.2f')} | "
                     f"{fmt(m.median_cpu_s, '.2f')} | "
                     f"{fmt(cratio, '.2f')} | {fmt(m.peak_rss_mb, '.0f')} | {len(m.runs)} | "
                     f"{m.status if m.status != 'ok' else ''} {note} |")
    if start:
        lines += ["", "Start-up (tiny input):", "", "| command | input | median s | peak RSS MB | note |",
                  "|---|---|---:|---:|---|"]
        for m in start:
            lines.append(f"| {m.command} | {Path(m.run).name if m.run != '-' else '–'} | {fmt(m.median_s, '.3f')} | "
                         f"{fmt(m.peak_rss_mb, '.0f')} | {m.status if m.status != 'ok' else ''} {m.note} |")
    return "\n".join(lines) + "\n"


def machine() -> dict:
    info: dict = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        with open("/proc/meminfo") as fh:
            info["mem_gib"] = round(int(fh.readline().split()[1]) / (1 << 20), 1)
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        info["git"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True, check=False).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "ncclforensics", "patterns"],
                               capture_output=True, text=True, check=False).stdout.strip()
        info["package_tree_dirty"] = bool(dirty)
    except OSError:
        pass
    try:
        import polars

        info["polars"] = polars.__version__
    except ImportError:
        pass
    grep = subprocess.run(["grep", "--version"], capture_output=True, text=True, check=False).stdout.split("\n")[0]
    info["grep"] = grep
    info["loadavg_1_5_15"] = list(os.getloadavg())
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog="See bench/README.md.")
    ap.add_argument("runs_in", nargs="*", metavar="RUN", help="run folders or .tar.gz files")
    ap.add_argument("--matrix", action="store_true",
                    help="add the 1 GB matrix of bench/matrix.py (generated first where missing)")
    ap.add_argument("--extra", action="store_true", help="with --matrix: also its 4 GB and 100 MB shapes")
    ap.add_argument("--commands", default="analyze,grep,rg",
                    help="comma list of events, analyze, grep, rg, cat (default analyze,grep,rg)")
    ap.add_argument("--grep", choices=("issue", "literals"), default="issue",
                    help="the pattern of grep and rg: issue 14's 12 patterns (default) or the prefilter literals")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per command (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up runs per command (default 1)")
    ap.add_argument("--exe", default=None, help="ncclforensics executable (default: the venv's, else PATH)")
    ap.add_argument("--before", default=None, metavar="CHECKOUT",
                    help="another checkout (e.g. a worktree of main): adds the command `before`, its analyze run by "
                         "the same interpreter with PYTHONPATH=CHECKOUT, alternated with the others")
    ap.add_argument("--json", dest="json_out", default=str(DATA / "bench_results.json"),
                    help="write results here (default bench/data/bench_results.json)")
    ap.add_argument("--no-startup", action="store_true", help="skip the start-up measurement")
    ap.add_argument("--startup-input", default=None, help="tiny input for the start-up figures")
    ap.add_argument("-q", "--quiet", action="store_true", help="no per-run progress on stderr")
    args = ap.parse_args(argv)

    exe = args.exe or (str(REPO / ".venv/bin/ncclforensics") if (REPO / ".venv/bin/ncclforensics").exists()
                       else shutil.which("ncclforensics"))
    if not exe:
        raise SystemExit("ncclforensics not found: pass --exe")
    which = [c.strip() for c in args.commands.split(",") if c.strip()]
    if args.before and "before" not in which:
        which.insert(which.index("analyze") + 1 if "analyze" in which else 0, "before")
    env = dict(os.environ)
    lits = prefilter_literals()
    pattern = "|".join(ere_escape(x) for x in lits) if args.grep == "literals" else ISSUE_PATTERN
    if args.matrix:
        import matrix

        names = [*matrix.MATRIX, *(matrix.EXTRA if args.extra else ())]
        matrix.main(names)
        args.runs_in = [str(p) for n in names for p in matrix.paths(n)] + list(args.runs_in)

    load_before = os.getloadavg()
    results: list[Measure] = []
    for r in args.runs_in:
        run = Path(r)
        if not run.exists():
            raise SystemExit(f"no such run: {run}")
        nbytes = run_bytes(run)
        if not args.quiet:
            print(f"{run} ({nbytes / 1e6:.0f} MB)", file=sys.stderr)
        results += measure_alternated(run, commands(run, exe, pattern, which, args.before), nbytes, args.warmup,
                                      args.runs, env, args.quiet)

    start: list[Measure] = []
    if not args.no_startup:
        target = Path(args.startup_input) if args.startup_input else small_input(exe)
        if not args.quiet:
            print(f"start-up: {target}", file=sys.stderr)
        start = startup(exe, target, args.warmup, max(args.runs, 5), env, args.quiet, args.before)

    table = markdown(results, start)
    load = os.getloadavg()
    table += (f"\nLoad average (1 min) before/after: {load_before[0]:.2f} / {load[0]:.2f} on {os.cpu_count()} CPUs "
              "(other processes on the machine skew the figures).\n")
    sys.stdout.write(table)
    doc = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "exe": exe,
        "grep_pattern": pattern if args.grep == "issue" else f"<{len(lits)} prefilter literals>",
        "results": [_row(m, results) for m in results],
        "startup": [_row(m, start) for m in start],
        "truth": {str(Path(r)): truth_of(Path(r)) for r in args.runs_in},
        "markdown": table,
    }
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    if not args.quiet:
        print(f"results: {out}", file=sys.stderr)
    return 0 if all(m.status != "failed" for m in results + start) else 1


def _row(m: Measure, group: list[Measure]) -> dict:
    d = asdict(m)
    grep = next((g.median_s for g in group if g.run == m.run and g.command == "grep" and g.median_s), None)
    grep_cpu = next((g.median_cpu_s for g in group if g.run == m.run and g.command == "grep" and g.median_cpu_s), None)
    d.update(median_s=m.median_s, mb_s=m.mb_s, peak_rss_mb=m.peak_rss_mb, median_cpu_s=m.median_cpu_s,
             ratio_to_grep=(m.median_s / grep) if grep and m.median_s else None,
             cpu_ratio_to_grep=(m.median_cpu_s / grep_cpu) if grep_cpu and m.median_cpu_s else None)
    if m.command == "grep":
        d["argv"] = [a if len(a) < 200 else f"<pattern: {len(a)} chars>" for a in m.argv]
    return d


if __name__ == "__main__":
    raise SystemExit(main())
