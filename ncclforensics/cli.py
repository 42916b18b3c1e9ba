"""The typer app: flags -> calls -> exit codes (DESIGN.md §4, README). Data to stdout, people to stderr.

Above ~400 lines because every command declares its flags here, each with the help text users read
(`--help` is the reference); the work behind each is a call into the module that owns it."""


import gc
import os
import sys
import tempfile
import traceback
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from ncclforensics import __version__
from ncclforensics.console import ColorMode, Progress, err, plural
from ncclforensics.errors import ForensicsError, NoInputError, UsageError

HELP = {"help_option_names": ["-h", "--help"]}
PATHS_HELP = ("Run folders, log files, compressed files or archives, read as one run; - reads standard input.")
EXIT_FAIL_ON = 1  # analyze --fail-on: the verdict is one of the classes named

app = typer.Typer(
    add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True, context_settings=HELP,
    help="Explain failed distributed PyTorch runs from their logs.",
    epilog="Exit codes: 0 done (whatever the verdict), 1 verdict named by --fail-on, 2 usage error, "
           "3 no analysable input, 4 internal error.",
)
rules_app = typer.Typer(help="List and explain the diagnosis rules.", no_args_is_help=True, context_settings=HELP)
app.add_typer(rules_app, name="rules")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ncclforensics {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", "-V", is_eager=True, callback=_version, help="Print the version and exit.")] = False,
) -> None:
    """Explain failed distributed PyTorch runs from their logs."""


def _guard(fn, *args, **kwargs):
    """Run a command: a ForensicsError is one line + its exit code; anything else saves a traceback."""
    if not getattr(fn, "reads_run", False):
        _imports_done()  # a command that reads no run imports little more: collect from here on
    try:
        return fn(*args, **kwargs)
    except typer.Exit:
        raise
    except ForensicsError as exc:
        err(f"ncclforensics: {exc.message}")
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err("ncclforensics: interrupted")
        raise typer.Exit(130) from None
    except BrokenPipeError:
        # the reader of stdout left (`| head`): stop quietly, and keep Python's exit flush quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    except Exception as exc:
        with tempfile.NamedTemporaryFile("w", prefix="ncclforensics-crash-", suffix=".txt", delete=False) as fh:
            traceback.print_exc(file=fh)
            where = fh.name
        err(f"ncclforensics: internal error ({type(exc).__name__}: {str(exc)[:200]}); traceback saved to {where}")
        raise typer.Exit(4) from None


def _jobs(jobs: int | None) -> int:
    """--jobs, by default the CPUs this process may use."""
    from ncclforensics.ingest.shares import cpus

    return cpus() if jobs is None else jobs


_GC_HELD = False  # run() holds the cyclic garbage collector until the modules are imported


def _reads_run(fn):
    """A command that reads a run (through _read_run), where the collector is let go once the reading
    modules are imported."""
    fn.reads_run = True
    return fn


def _imports_done() -> None:
    """Under the console script: the modules a command needs are imported; they live until the
    process ends, so the collector stops looking at them (gc.freeze) and starts collecting what the
    command makes. Without this, start-up spends ~40 ms walking module objects that are never garbage."""
    global _GC_HELD
    if _GC_HELD:
        _GC_HELD = False
        gc.freeze()
        gc.enable()


def _read_run(paths: list[str], progress: Progress, jobs: int = 1, aside=None):
    """build_events over the paths of one run (`aside`: work beside the reading, build_events);
    NoInputError when nothing in them is a log."""
    from ncclforensics.events import build_events

    _imports_done()
    if "-" in paths and sys.stdin is not None and sys.stdin.isatty() and progress.enabled:
        err("ncclforensics: reading a log from standard input; end it with Ctrl-D")
    res = build_events(paths if len(paths) > 1 else paths[0], progress=progress.read, jobs=jobs, aside=aside)
    # imported once read: the table's modules (polars) load while forked processes read (events._read_shared)
    from ncclforensics.analysis import looks_like_logs, no_input_message

    if not looks_like_logs(res):
        raise NoInputError(no_input_message(_label(paths), res))
    return res


def _label(paths: list[str]) -> str:
    return " ".join("standard input" if p == "-" else p for p in paths)


class EventFormat(StrEnum):
    """`events -f`: each maps to its writer in eventview.WRITERS."""

    table = "table"
    csv = "csv"
    parquet = "parquet"
    json = "json"


@app.command()
def events(
    paths: Annotated[list[str], typer.Argument(help=PATHS_HELP, metavar="PATH...", show_default=False)],
    fmt: Annotated[EventFormat, typer.Option("--format", "-f", help="Output format.")] = EventFormat.table,
    output: Annotated[str | None, typer.Option(
        "--output", "-o", metavar="FILE", help="Write here instead of stdout (parquet needs a file).")] = None,
    rank: Annotated[list[str] | None, typer.Option(
        "--rank", metavar="RANKS", help="Only these global ranks: 3, 0,3 or 4-7; repeatable.")] = None,
    kind: Annotated[list[str] | None, typer.Option(
        "--kind", metavar="KIND", help="Only these event kinds (the kind column); repeatable.")] = None,
    pg: Annotated[list[str] | None, typer.Option(
        "--pg", metavar="PG", help="Only these process groups; repeatable.")] = None,
    source: Annotated[list[str] | None, typer.Option(
        "--source", metavar="SOURCE", help="Only these sources: nccl, c10d, torchrun, kernel, …; repeatable.")
    ] = None,
    since: Annotated[str | None, typer.Option(
        "--since", metavar="TIME", help="Only events at or after this UTC time: 2026-11-22T07:44:17, or 07:44 "
        "on the run's first day.")] = None,
    until: Annotated[str | None, typer.Option(
        "--until", metavar="TIME", help="Only events at or before this UTC time.")] = None,
    grep: Annotated[str | None, typer.Option(
        "--grep", metavar="REGEX", help="Only lines matching this regular expression.")] = None,
    ignore_case: Annotated[bool, typer.Option("--ignore-case", "-i", help="--grep ignores case.")] = False,
    limit: Annotated[int | None, typer.Option(
        "--limit", "-n", min=0, metavar="N", help="Rows to show: the table shows 50 by default; 0 shows all.")] = None,
    color: Annotated[ColorMode, typer.Option("--color", help="Colour in the table.")] = ColorMode.auto,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no summary on stderr.")] = False,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1, metavar="N",
        help="Processes reading the logs (default: CPU cores); only a run of many large files is shared.")
    ] = None,
) -> None:
    """Print the event table of a run: one row per matched log line, ordered by time, file and line."""
    _guard(_events, paths, fmt=fmt, output=output, quiet=quiet, color=color, limit=limit, jobs=jobs,
           filters={"ranks": rank, "kinds": kind, "pgs": pg, "sources": source, "since": since, "until": until,
                    "grep": grep, "ignore_case": ignore_case})


@_reads_run
def _events(paths: list[str], *, fmt: EventFormat, output: str | None, quiet: bool, color: ColorMode,
            limit: int | None, filters: dict, jobs: int | None = None) -> None:
    from ncclforensics import outpaths
    from ncclforensics.events import build_events

    if fmt is EventFormat.parquet and output in (None, outpaths.STDOUT):
        raise UsageError("-f parquet writes a binary file: name it with -o FILE")
    target = outpaths.file_target(output, "-o") or outpaths.STDOUT
    progress = Progress.for_terminal(quiet=quiet)
    try:
        res = build_events(paths if len(paths) > 1 else paths[0], progress=progress.read, jobs=_jobs(jobs))
    finally:
        progress.close()
    from ncclforensics import eventview  # once read (_read_run: polars loads while forked processes read)
    from ncclforensics.analysis import no_input_message

    if res.files == 0 and res.events.is_empty():
        raise NoInputError(no_input_message(_label(paths), res))
    flt = eventview.EventFilter.parse(res.events, **filters)
    df = eventview.ordered(flt.apply(res.events))
    if limit is not None and limit > 0 and fmt is not EventFormat.table:
        df = df.head(limit)
    eventview.WRITERS[fmt.value](df, target, color=color,
                                 limit=eventview.TABLE_ROWS if limit is None else limit or None)
    if not quiet:
        err(eventview.summary_line(res, df, flt))


def _fail_on(value: str | None) -> set[str]:
    """`--fail-on gpu_hardware,oom` -> the classes; `any` is every class but unknown."""
    from ncclforensics.model import RootCause

    if value is None:
        return set()
    names = {v.strip().lower() for v in value.split(",") if v.strip()}
    classes = {c.value for c in RootCause}
    bad = sorted(names - classes - {"any"})
    if bad or not names:
        raise UsageError(f"--fail-on {value}: not a class; name one or more of {', '.join(sorted(classes))}, "
                         "or any")
    if "any" in names:
        names = classes - {RootCause.UNKNOWN.value}
    return names


@app.command()
def analyze(
    paths: Annotated[list[str], typer.Argument(help=PATHS_HELP, metavar="PATH...", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Write the diagnosis as JSON to stdout.")] = False,
    as_md: Annotated[bool, typer.Option("--md", help="Write Markdown for a ticket comment to stdout.")] = False,
    html: Annotated[str | None, typer.Option(
        "--html", metavar="FILE", help="Write the self-contained HTML report to this file (- for stdout).")] = None,
    out_dir: Annotated[str | None, typer.Option(
        "--output-dir", "-o", metavar="DIR",
        help="Write report.html, diagnosis.json, report.md, repro.py in this folder.")] = None,
    fail_on: Annotated[str | None, typer.Option(
        "--fail-on", metavar="CLASS[,CLASS]",
        help=f"Exit {EXIT_FAIL_ON} when the verdict is one of these classes (any: every class but unknown).")
    ] = None,
    color: Annotated[ColorMode, typer.Option("--color", help="Colour in the terminal summary.")] = ColorMode.auto,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no notes on stderr.")] = False,
    context: Annotated[int | None, typer.Option(
        "--context", "-C", metavar="N", min=0, max=200,
        help="Also show N lines around each evidence line, every rank's last lines before the failure and "
        "the user code frames (terminal and --md; --md shows 3 by default).")] = None,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1, metavar="N",
        help="Processes reading the logs (default: CPU cores); only a run of many large files is shared.")
    ] = None,
) -> None:
    """Diagnose a failed run: culprit ranks, stuck collective, root cause, fixes."""
    code = _guard(_analyze, paths, as_json=as_json, as_md=as_md, html=html, out_dir=out_dir, quiet=quiet,
                  color=color, fail_on=fail_on, context=context, jobs=jobs)
    raise typer.Exit(code or 0)


@_reads_run
def _analyze(paths: list[str], *, as_json: bool, as_md: bool, html: str | None, out_dir: str | None,
             quiet: bool, color: ColorMode, fail_on: str | None, context: int | None = None,
             jobs: int | None = None) -> int:
    from ncclforensics import outpaths
    from ncclforensics.outputs import FORMATS, DocFormat, Inputs, context_lines, render, reproducer
    from ncclforensics.severalruns import several_runs_check

    fail = _fail_on(fail_on)
    to_stdout = [name for name, on in (("--json", as_json), ("--md", as_md), ("--html -", html == "-")) if on]
    if len(to_stdout) > 1:
        raise UsageError(f"{' and '.join(to_stdout)} all write to stdout: choose one")
    html_target = outpaths.file_target(html, "--html")
    folder = outpaths.folder_target(out_dir, "-o")
    # the documents asked for: where each goes (a file, stdout, or the -o folder)
    targets: dict[DocFormat, list] = {f: [] for f in FORMATS}
    if folder is not None:
        for f, spec in FORMATS.items():
            targets[f].append(folder / spec.file_name)
    if html_target is not None:
        targets[DocFormat.HTML].append(html_target)
    if as_json:
        targets[DocFormat.JSON].append(outpaths.STDOUT)
    elif as_md:
        targets[DocFormat.MARKDOWN].append(outpaths.STDOUT)
    wanted = [f for f, where in targets.items() if where]
    progress = Progress.for_terminal(quiet=quiet)
    several = None
    docs: dict[DocFormat, str] = {}
    try:
        # the several-runs check is done beside the reading (in a reading process when there are several)
        res = _read_run(paths, progress, _jobs(jobs), several_runs_check(paths[0] if len(paths) == 1 else paths))
        progress.phase(f"diagnosing {plural(res.events.height, 'event')}")
        from ncclforensics.analysis import analyze_events, note_several_runs

        analysis = analyze_events(res)
        if res.aside is not None:
            progress.phase("checking whether the folder holds several runs")
            several = note_several_runs(analysis)
        analysis.path = paths if len(paths) > 1 else paths[0]
        diag = analysis.diagnosis
        # the reproducer goes into the documents and the -o folder; the terminal summary never shows it
        repro, problem = reproducer(analysis) if wanted or folder is not None else (None, None)
        if problem:
            err(f"ncclforensics: {problem}" if problem.startswith("no reproducer")
                else f"ncclforensics: no reproducer for this verdict ({problem})")
        # the context lines are read back from the files once, as wide as the widest output wants
        radius = context_lines(wanted, context)
        incident = None
        if radius is not None:
            from ncclforensics.incident import build_context

            progress.phase("reading the lines around the evidence")
            incident = build_context(analysis, radius=radius)
        for f in wanted:
            if f is DocFormat.HTML:
                progress.phase("writing the HTML report")
            docs[f] = render(f, Inputs(analysis, repro, incident), context_arg=context)
    finally:
        progress.close()
    if several and not quiet:
        err(f"ncclforensics: {several}")
    if folder is not None:
        outpaths.make_folder(folder)
    written = []
    for f in wanted:
        for target in targets[f]:
            outpaths.write_text(target, docs[f])
            if folder is not None and target == folder / FORMATS[f].file_name:
                written.append(FORMATS[f].file_name)
    if folder is not None and repro is not None:
        outpaths.write_text(folder / "repro.py", repro.script)
        written.append("repro.py")
    if not (as_json or as_md or html_target == outpaths.STDOUT):
        _print_terminal(diag, color, incident.narrowed(context) if context is not None else None)
    if not quiet:
        if folder is not None:
            err(f"Wrote {', '.join(written[:-1])} and {written[-1]} in {folder}.")
        if html_target not in (None, outpaths.STDOUT):
            err(f"Wrote the HTML report to {html_target}.")
    if diag.verdict.root_cause.value in fail:
        err(f"ncclforensics: the verdict is {diag.verdict.root_cause.value}, named by --fail-on: "
            f"exit {EXIT_FAIL_ON}")
        return EXIT_FAIL_ON
    return 0


def _print_terminal(diag, color: ColorMode, context=None) -> None:
    from ncclforensics.console import stdout_console, terminal_width
    from ncclforensics.termout import terminal

    width = terminal_width()
    console = stdout_console(color, width)
    for line in terminal(diag, width=width, context=context):
        console.print(line)


@app.command()
def repro(
    paths: Annotated[list[str], typer.Argument(help=PATHS_HELP, metavar="PATH...", show_default=False)],
    output: Annotated[str | None, typer.Option(
        "--output", "-o", metavar="FILE", help="Write the script to this file.")] = None,
    real_world_size: Annotated[bool, typer.Option(
        "--real-world-size", help="Use the run's world size instead of a laptop-sized one.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no notes on stderr.")] = False,
) -> None:
    """Write a torch script that recreates the diagnosed failure (and proves the fix with --fixed)."""
    _guard(_repro, paths, output, real_world_size=real_world_size, quiet=quiet)


@_reads_run
def _repro(paths: list[str], output: str | None, *, real_world_size: bool, quiet: bool) -> None:
    from ncclforensics import outpaths
    from ncclforensics.analysis import analyze_events
    from ncclforensics.repro.render import render_reproducer

    target = outpaths.file_target(output, "-o") or outpaths.STDOUT
    progress = Progress.for_terminal(quiet=quiet)
    try:
        diag = analyze_events(_read_run(paths, progress, _jobs(None))).diagnosis
    finally:
        progress.close()
    name = target.name if isinstance(target, Path) else "repro.py"  # the docstring names the file
    rep = render_reproducer(diag.verdict, diag.facts, real_world_size=real_world_size, script_name=name)
    outpaths.write_text(target, rep.script)
    if target != outpaths.STDOUT and not quiet:
        err(f"Wrote {target}: run it with `{rep.command.rsplit(' ', 1)[0]} {target}`.")


class ScanEngine(StrEnum):
    process = "process"
    ray = "ray"


@app.command()
def scan(
    root: Annotated[Path, typer.Argument(
        help="Folder of archived runs: run folders, .tar/.tar.gz/.tgz/.zip archives, lone .gz logs.")],
    out_dir: Annotated[Path, typer.Option(
        "--output-dir", "-o", help="Write summary.parquet, summary.csv, index.html and runs/<id>/ here.")
    ] = Path("ncclforensics-scan"),
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1, help="Runs analyzed in parallel (default: CPU cores).")] = None,
    depth: Annotated[int | None, typer.Option(
        "--depth", min=0, help="Runs are exactly the folders/archives/logs this many levels below ROOT.")] = None,
    glob: Annotated[str | None, typer.Option(
        "--glob", help="Runs are the paths under ROOT matching this pattern, e.g. 'jobs/*'.")] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1, help="Seconds one run may take; past it the run becomes an error row.")] = 600,
    engine: Annotated[ScanEngine, typer.Option(
        "--engine", help="process: local process pool; ray: Ray tasks on a cluster (extra 'ray').")
    ] = ScanEngine.process,
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", help="Ray cluster to join, e.g. 'auto' (default: RAY_ADDRESS, else local).")] = None,
    no_reports: Annotated[bool, typer.Option(
        "--no-reports", help="Skip runs/<id>/report.html; diagnosis.json is always written.")] = False,
    self_contained: Annotated[bool, typer.Option(
        "--self-contained", help="Inline plotly.js in every report (+0.5 MB each) instead of one shared "
        "OUTDIR/assets/ copy.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Analyze every run again, ignoring the cache.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary on stderr.")] = False,
    list_only: Annotated[bool, typer.Option(
        "--list", help="Dry run: print the runs found, their files and why they were grouped; analyze nothing.")
    ] = False,
) -> None:
    """Analyze every run under ROOT in parallel: summary table, index.html, per-run reports."""
    from ncclforensics import outpaths
    from ncclforensics.scan import list_command, scan_command

    if list_only:
        raise typer.Exit(_guard(list_command, root, depth=depth, glob=glob) or 0)
    _guard(_catalogue)
    _guard(outpaths.folder_target, out_dir, "-o")
    code = _guard(scan_command, root, out_dir, jobs=jobs, depth=depth, glob=glob, timeout=timeout,
                  engine=engine.value, ray_address=ray_address, quiet=quiet, force=force,
                  reports=not no_reports, self_contained=self_contained)
    raise typer.Exit(code or 0)


def _catalogue() -> None:
    """Load the pattern catalogue once: a broken install fails here, not in every run of a scan."""
    from ncclforensics.parse.signatures import load_signatures
    from ncclforensics.rules.loader import load_rules

    load_signatures()
    load_rules()


@rules_app.command("list")
def rules_list() -> None:
    """List every rule: id, root cause, name."""
    _guard(_rules_list)


def _rules_list() -> None:
    from ncclforensics.rules.loader import load_rules

    for r in sorted(load_rules(), key=lambda r: r.id):
        typer.echo(f"{r.id}  {r.root_cause.value:<17} {r.name}")


@rules_app.command("explain")
def rules_explain(rule_id: Annotated[str, typer.Argument(help="Rule id, e.g. RD001.")]) -> None:
    """Print a rule's documentation and fixes."""
    _guard(_explain, rule_id)


def _explain(rule_id: str) -> None:
    from ncclforensics.rules.loader import rule_by_id

    r = rule_by_id(rule_id)
    if r is None:
        raise UsageError(f"no rule {rule_id!r}; `ncclforensics rules list` lists them")
    out = [f"{r.id} {r.name} ({r.root_cause.value})", ""]
    for key in ("what_it_detects", "why_it_happens", "known_false_positives"):
        out += [key.replace("_", " ").capitalize() + ":", "  " + r.doc.get(key, ""), ""]
    for fx in r.fixes:
        out += [f"Fix: {fx.title}", f"  {fx.why}", *("    " + ln for ln in fx.code.splitlines()), ""]
    typer.echo("\n".join(out))


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(f"ncclforensics {__version__}")


def _click_error(name: str) -> type[Exception]:
    """click's exception class `name`: typer vendors click from 0.24 on, so look it up through a
    class typer exports rather than by module path."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


def main() -> None:
    """Run the app with usage errors as one line (click prints the usage and a framed message)."""
    usage_error, click_exception = _click_error("UsageError"), _click_error("ClickException")
    try:
        code = app(standalone_mode=False, prog_name="ncclforensics")
    except usage_error as exc:
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError":  # `ncclforensics` alone: the help
            text = ctx.get_help() if ctx is not None else ""  # rich prints it itself and returns ""
            if text:
                typer.echo(text, err=True)
            sys.exit(2)
        cmd = ctx.command_path if ctx is not None else "ncclforensics"
        err(f"{cmd}: {exc.format_message()} (`{cmd} -h` shows the options)")
        sys.exit(2)
    except click_exception as exc:
        err(f"ncclforensics: {exc.format_message()}")
        sys.exit(getattr(exc, "exit_code", 1))
    except typer.Abort:
        err("ncclforensics: interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def run() -> None:
    """The console script: main(), then a quick exit.

    Once the command is done and only this thread is left, the exit handlers run (caches written,
    readers joined), the streams are flushed and the process ends without tearing every module down
    (about 40 ms of a run on sample_logs/, more after a large run). With another thread still running,
    or when the streams cannot be flushed, the interpreter exits the usual way."""
    import atexit
    import threading

    global _GC_HELD
    if gc.isenabled():
        gc.disable()
        _GC_HELD = True
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if threading.active_count() > 1 or not (code is None or isinstance(code, int)):
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe (`| head`): let the interpreter report it as it always does
        sys.exit(code)
    os._exit(code or 0)
