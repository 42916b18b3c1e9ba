"""The typer app: flags -> calls -> exit codes (DESIGN.md §4). Data to stdout, people to stderr."""

from __future__ import annotations

import sys
import tempfile
import traceback
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from ncclforensics import __version__
from ncclforensics.errors import ForensicsError, NoInputError, UsageError

app = typer.Typer(
    add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
    help="Explain failed distributed PyTorch runs from their logs.",
)
rules_app = typer.Typer(help="List and explain the diagnosis rules.", no_args_is_help=True)
app.add_typer(rules_app, name="rules")


def _err(msg: str) -> None:
    from rich.console import Console

    Console(stderr=True, highlight=False, soft_wrap=True).print(msg, markup=False)


def _guard(fn, *args, **kwargs):
    """Run a command: a ForensicsError is one line + its exit code; anything else saves a traceback."""
    try:
        return fn(*args, **kwargs)
    except typer.Exit:
        raise
    except ForensicsError as exc:
        _err(f"ncclforensics: {exc.message}")
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        _err("ncclforensics: interrupted")
        raise typer.Exit(130) from None
    except BrokenPipeError:
        raise typer.Exit(0) from None
    except Exception as exc:
        with tempfile.NamedTemporaryFile("w", prefix="ncclforensics-crash-", suffix=".txt", delete=False) as fh:
            traceback.print_exc(file=fh)
            where = fh.name
        _err(f"ncclforensics: internal error ({type(exc).__name__}: {str(exc)[:200]}); traceback saved to {where}")
        raise typer.Exit(4) from None


class EventFormat(StrEnum):
    table = "table"
    csv = "csv"
    parquet = "parquet"
    json = "json"


@app.command()
def events(
    path: Annotated[Path, typer.Argument(help="Run folder, log file, compressed file or archive.")],
    fmt: Annotated[EventFormat, typer.Option("--format", "-f", help="Output format.")] = EventFormat.table,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
) -> None:
    """Print the event table of a run: one row per matched log line."""
    _guard(_events, path, fmt, output)


def _events(path: Path, fmt: EventFormat, output: Path | None) -> None:
    from ncclforensics.events import build_events
    from ncclforensics.jsonout import events_json, summary_line

    res = build_events(path)
    if res.files == 0 and res.events.is_empty():
        raise NoInputError(_no_input_message(path, res))
    df = res.events
    if fmt is EventFormat.parquet:
        if output is None:
            raise ForensicsError("--format parquet needs --output FILE")
        df.write_parquet(output)
    elif fmt is EventFormat.csv:
        text = df.with_columns(df["source"].cast(str), df["kind"].cast(str)).write_csv()
        _write(text, output)
    elif fmt is EventFormat.json:
        _write(events_json(df), output)
    else:
        import polars as pl

        with pl.Config(tbl_rows=200, tbl_cols=12, fmt_str_lengths=60, tbl_width_chars=200):
            shown = df.select(["file", "line", "ts", "host", "rank", "pg", "kind", "seq", "op", "code", "detail"])
            _write(str(shown) + "\n", output)
    _err(summary_line(res))


def _no_input_message(path: Path, res) -> str:
    from ncclforensics.ingest.discover import display_name  # one line, no terminal escapes

    if res.skipped:
        reasons = "; ".join(f"{s.file}: {s.reason}" for s in res.skipped[:3])
        more = f" (+{len(res.skipped) - 3} more)" if len(res.skipped) > 3 else ""
        return display_name(f"no readable log files in {path} ({reasons}{more})")
    return display_name(f"no log files in {path}")


def _write(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        output.write_text(text, encoding="utf-8")


@app.command()
def analyze(
    path: Annotated[Path, typer.Argument(help="Run folder, log file, compressed file or archive.")],
    as_json: Annotated[bool, typer.Option("--json", help="Write the diagnosis as JSON to stdout.")] = False,
    as_md: Annotated[bool, typer.Option("--md", help="Write Markdown for a ticket comment to stdout.")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write the self-contained HTML report here.")] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--output-dir", "-o", help="Write report.html, diagnosis.json, report.md, repro.py here.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")] = False,
) -> None:
    """Diagnose a failed run: culprit rank(s), stuck collective, root cause, fixes."""
    _guard(_analyze, path, as_json=as_json, as_md=as_md, html=html, out_dir=out_dir, quiet=quiet)


def _analyze(path: Path, *, as_json: bool, as_md: bool, html: Path | None, out_dir: Path | None,
             quiet: bool) -> None:
    import json

    from ncclforensics.analysis import analyze_path
    from ncclforensics.jsonout import diagnosis_dict
    from ncclforensics.textout import markdown, terminal

    if as_json and as_md:
        raise UsageError("choose one of --json and --md")
    analysis = analyze_path(path)
    diag = analysis.diagnosis
    repro = _reproducer(diag)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "diagnosis.json").write_text(json.dumps(diagnosis_dict(diag, repro), indent=2, default=str) + "\n",
                                                encoding="utf-8")
        (out_dir / "report.md").write_text(markdown(diag, repro), encoding="utf-8")
        if repro is not None:
            (out_dir / "repro.py").write_text(repro.script, encoding="utf-8")
        html = html or out_dir / "report.html"
    if html is not None:
        from ncclforensics.report.render import render_report

        html.write_text(render_report(analysis, repro), encoding="utf-8")
    if as_json:
        _write(json.dumps(diagnosis_dict(diag, repro), indent=2, default=str) + "\n", None)
    elif as_md:
        _write(markdown(diag, repro), None)
    else:
        _write(terminal(diag), None)
    if not quiet and (html is not None or out_dir is not None):
        _err(f"report written to {html}")


def _reproducer(diag):
    if diag.verdict.reproducer is None:
        return None
    try:
        from ncclforensics.repro.render import render_reproducer

        return render_reproducer(diag.verdict, diag.facts)
    except Exception as exc:
        _err(f"ncclforensics: no reproducer for this verdict ({type(exc).__name__}: {str(exc)[:160]})")
        return None


@app.command()
def repro(
    path: Annotated[Path, typer.Argument(help="Run folder, log file, compressed file or archive.")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the script here.")] = None,
    real_world_size: Annotated[bool, typer.Option(
        "--real-world-size", help="Use the run's world size instead of a laptop-sized one.")] = False,
) -> None:
    """Write a torch script that recreates the diagnosed failure (and proves the fix with --fixed)."""
    _guard(_repro, path, output, real_world_size)


def _repro(path: Path, output: Path | None, real_world_size: bool) -> None:
    from ncclforensics.analysis import analyze_path
    from ncclforensics.repro.render import render_reproducer

    diag = analyze_path(path).diagnosis
    rep = render_reproducer(diag.verdict, diag.facts, real_world_size=real_world_size)
    if output is None:
        _write(rep.script, None)
    else:
        output.write_text(rep.script, encoding="utf-8")
        _err(f"wrote {output}: run it with `{rep.command.replace('repro.py', str(output))}`")


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
    force: Annotated[bool, typer.Option("--force", help="Analyze every run again, ignoring the cache.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary on stderr.")] = False,
) -> None:
    """Analyze every run under ROOT in parallel: summary table, index.html, per-run reports."""
    from ncclforensics.scan import scan_command

    code = _guard(scan_command, root, out_dir, jobs=jobs, depth=depth, glob=glob, timeout=timeout,
                  engine=engine.value, ray_address=ray_address, quiet=quiet, force=force,
                  reports=not no_reports)
    raise typer.Exit(code or 0)


@rules_app.command("list")
def rules_list() -> None:
    """List every rule: id, root cause, name."""
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
        raise UsageError(f"no rule {rule_id!r}; see `ncclforensics rules list`")
    out = [f"{r.id} {r.name} ({r.root_cause.value})", ""]
    for key in ("what_it_detects", "why_it_happens", "known_false_positives"):
        out += [key.replace("_", " ").capitalize() + ":", "  " + r.doc.get(key, ""), ""]
    for fx in r.fixes:
        out += [f"Fix: {fx.title}", f"  {fx.why}", *("    " + ln for ln in fx.code.splitlines()), ""]
    typer.echo("\n".join(out))


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main() -> None:
    app()
