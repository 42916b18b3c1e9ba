"""The command line as people use it: exit codes, several paths, stdin, output paths, width, colour,
--fail-on, the events view and inputs that are not logs. Most runs are in-process through `main()`
(the real argument parsing and error lines); stdin and colour need a real process."""

from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import os
import pty
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ncclforensics import __version__
from ncclforensics.cli import EventFormat
from ncclforensics.console import Progress
from ncclforensics.eventview import WRITERS
from ncclforensics.model import Collective, Diagnosis, Evidence, Finding, Fix, RootCause, RunFacts, Skipped
from ncclforensics.termout import terminal
from tests.fixtures.cli_run import Ran

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_logs"
RUN = SAMPLE / "rank0-validation-timeout"
XID = "[ 912734.602118] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"


def one_line_error(r: Ran, code: int) -> str:
    assert r.code == code, (r.code, r.err)
    assert len(r.err_lines) == 1, r.err
    assert "Traceback" not in r.err and "╭" not in r.err and "internal error" not in r.err
    return r.err_lines[0]


def process(*args: str, stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    return subprocess.run([sys.executable, "-m", "ncclforensics", *args], input=stdin, capture_output=True,
                          env={**base, **(env or {})}, timeout=120, check=False)


# -- conventions ---------------------------------------------------------------------------------

def test_version_and_short_help(cli):
    for flag in ("--version", "-V"):
        r = cli(flag)
        assert (r.code, r.out.strip()) == (0, f"ncclforensics {__version__}")
    r = cli("-h")
    assert r.code == 0 and "Usage: ncclforensics" in r.out and "Exit codes" in r.out
    r = cli("analyze", "-h")
    assert r.code == 0 and "--fail-on" in r.out and "--color" in r.out


@pytest.mark.parametrize("args", [
    ("analyze", "--bogus", "x"),
    ("analyze",),
    ("analyze", str(SAMPLE), "--color", "purple"),
    ("analyze", str(SAMPLE), "--fail-on", "gpu_hardwre"),
    ("analyze", str(SAMPLE), "--json", "--md"),
    ("analyze", str(SAMPLE), "--json", "--html", "-"),
    ("events", str(SAMPLE), "--rank", "x"),
    ("events", str(SAMPLE), "--since", "yesterday"),
    ("events", str(SAMPLE), "--source", "nvlink"),
    ("events", str(SAMPLE), "--grep", "(unclosed"),
    ("analyze", str(SAMPLE), str(RUN)),  # one path inside another
])
def test_usage_errors_are_one_line_exit_2(cli, args):
    line = one_line_error(cli(*args), 2)
    assert line.startswith("ncclforensics")


def test_missing_path_is_exit_3(cli, tmp_path):
    line = one_line_error(cli("analyze", str(RUN), str(tmp_path / "nope")), 3)
    assert "no such file or folder" in line


# -- several paths and standard input -----------------------------------------------------------

def test_several_paths_are_one_run(cli, tmp_path):
    whole = cli("analyze", str(RUN), "--json").json()
    parts = cli("analyze", str(RUN / "console.log"), str(RUN / "fr_trace"), str(RUN / "torchrun_logs"),
                "--json").json()
    assert whole["verdict"]["class"] == parts["verdict"]["class"] == "rank_divergence"
    assert whole["verdict"]["culprit_ranks"] == parts["verdict"]["culprit_ranks"] == [0]
    files = {e["file"] for f in parts["findings"] for e in f["evidence"]}
    assert "console.log" in files  # names relative to the paths' common folder
    # a kernel log given beside the rank logs joins the same run
    (tmp_path / "dmesg.txt").write_text(XID)
    shutil.copytree(RUN / "torchrun_logs", tmp_path / "torchrun_logs")
    r = cli("events", str(tmp_path / "torchrun_logs"), str(tmp_path / "dmesg.txt"), "-f", "json")
    rows = r.json()
    assert {"dmesg.txt", "torchrun_logs/none_8tgov_n9/attempt_0/1/stderr.log"} <= {e["file"] for e in rows}
    assert any(e["kind"] == "xid" for e in rows)


def test_stdin_plain_and_gzip():
    log = (RUN / "console.log").read_bytes()
    for data in (log, gzip.compress(log)):
        p = process("analyze", "-", "--json", stdin=data)
        assert p.returncode == 0, p.stderr
        d = json.loads(p.stdout)
        assert (d["verdict"]["class"], d["verdict"]["culprit_ranks"]) == ("rank_divergence", [0])
        assert d["run"]["files"] == 1 and d["run"]["path"] == "stdin"
    p = process("events", "-", str(RUN / "fr_trace"), "-f", "json", stdin=log)
    files = {e["file"] for e in json.loads(p.stdout)}
    assert "stdin" in files and any(f.startswith("fr_trace/") for f in files)


# -- output paths ------------------------------------------------------------------------------

def test_output_path_mistakes_are_usage_errors(cli, tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    assert "is a folder" in one_line_error(cli("analyze", str(RUN), "--html", str(tmp_path / "adir")), 2)
    assert "is a file" in one_line_error(cli("analyze", str(RUN), "-o", str(tmp_path / "afile")), 2)
    assert "-o FILE" in one_line_error(cli("events", str(RUN), "-f", "parquet"), 2)
    assert "not a folder" in one_line_error(cli("analyze", str(RUN), "--html", str(tmp_path / "afile" / "r.html")), 2)
    assert (tmp_path / "afile").read_text() == "x"


def test_html_into_new_folders_and_to_stdout(cli, tmp_path):
    target = tmp_path / "a" / "b" / "r.html"
    r = cli("analyze", str(RUN), "--html", str(target), "-q")
    assert r.code == 0 and target.read_text().startswith("<!DOCTYPE html")
    assert r.out.startswith("VERDICT")  # the terminal summary still goes to stdout
    r = cli("analyze", str(RUN), "--html", "-")
    assert r.code == 0 and r.out.lstrip().startswith("<!DOCTYPE html") and "VERDICT" not in r.out
    out = tmp_path / "new" / "out"
    r = cli("analyze", str(RUN), "-o", str(out))
    assert r.code == 0 and sorted(p.name for p in out.iterdir()) == ["diagnosis.json", "report.html", "report.md",
                                                                     "repro.py"]
    assert f"in {out}." in r.err


def test_events_parquet_into_new_folder(cli, tmp_path):
    import polars as pl

    target = tmp_path / "x" / "ev.parquet"
    assert cli("events", str(RUN), "-f", "parquet", "-o", str(target), "--kind", "gloo_timeout").code == 0
    assert set(pl.read_parquet(target)["kind"].cast(str)) == {"gloo_timeout"}


@pytest.mark.parametrize("fmt", list(EventFormat))
def test_every_events_format_has_its_writer(cli, tmp_path, fmt):
    assert set(WRITERS) == {f.value for f in EventFormat}
    target = tmp_path / f"ev.{fmt.value}"
    r = cli("events", str(RUN), "-f", fmt.value, "-o", str(target), "--kind", "gloo_timeout", "-q")
    assert r.code == 0 and target.stat().st_size > 0 and r.out == ""


# -- terminal width, no silent cut -------------------------------------------------------------

@pytest.mark.parametrize("columns", [40, 60, 132])
def test_terminal_follows_width_and_keeps_code_whole(cli, columns):
    doc = cli("analyze", str(RUN), "--json").json()
    r = cli("analyze", str(RUN), columns=columns)
    assert r.code == 0
    code = [ln for ln in doc["fixes"][0]["code"].splitlines() if ln.strip()]
    lines = r.out.splitlines()
    for ln in code:
        assert "    " + ln in lines, f"fix code line changed or cut: {ln!r}"
    for ln in lines:
        if ln[4:] not in code:
            assert len(ln) <= columns, f"{len(ln)} > {columns}: {ln!r}"


def _diag(code: str, *, evidence: int = 1, skipped: int = 0) -> Diagnosis:
    ev = [Evidence(file=f"very/deep/folder/structure/of/a/run/node{i}/rank{i}.log", line=10 + i, rank=i,
                   text="[rank0]:[E1122 07:44:37.123456789 ProcessGroupNCCL.cpp:616] " + "x" * 300)
          for i in range(evidence)]
    v = Finding(root_cause=RootCause.OOM, rule="OM001", title="Rank 0 ran out of GPU memory " * 4,
                message="word " * 80, confidence=0.9, culprit_ranks=[0], culprit_hosts=["gpu-a1"], evidence=ev,
                collective=Collective("0", "ALLREDUCE", 9), fixes=[Fix("Use less memory", "why", code)])
    facts = RunFacts(path="x", files=1, lines=1, bytes=1, world_size=2, ranks_seen=[0, 1], hosts=["gpu-a1"],
                     versions={}, skipped=[Skipped(f"notes/readme{i}.md", "not a log") for i in range(skipped)])
    return Diagnosis(facts=facts, verdict=v, findings=[v], ranks=[])


def test_long_code_is_never_cut_and_left_out_lines_are_counted():
    long_line = "loader = DataLoader(dataset, batch_size=8, num_workers=4, pin_memory=True, " \
                "persistent_workers=True, prefetch_factor=2)  # --master-port 29500"
    code = "\n".join([long_line, *(f"step_{i}()" for i in range(20))])
    text = [t.plain for t in terminal(_diag(code, evidence=7, skipped=11), width=60)]
    assert "    " + long_line in text
    flat = " ".join(" ".join(text).split())
    assert "… and 9 more lines of code: `ncclforensics rules explain OM001` prints it whole" in flat
    assert "… and 2 more lines (--json" in flat  # evidence past the 5 shown
    assert "… and 3 more files (--json lists every one)" in flat  # skipped past the 8 shown
    assert "Culprit: rank 0 on gpu-a1" in text
    assert "Read 1 file (1 line) and saw 2 of 2 ranks." in text
    for t in text:
        if t != "    " + long_line:
            assert len(t) <= 60, t
    cut = [t for t in text if len(t) == 60]
    assert cut and all(t.endswith("…") or " " in t for t in cut)
    # a log line that does not fit ends in a visible mark
    assert any(t.startswith("    ") and t.endswith("x…") for t in text)


# -- colour ------------------------------------------------------------------------------------

def _in_pty(args: list[str], env: dict) -> str:
    """stdout of the CLI on a pseudo-terminal (so auto colour sees a terminal)."""
    main_fd, child_fd = pty.openpty()
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    proc = subprocess.Popen([sys.executable, "-m", "ncclforensics", *args], stdout=child_fd,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            env={**base, "TERM": "xterm-256color", "COLUMNS": "100", **env})
    os.close(child_fd)
    chunks = []
    while True:
        ready, _, _ = select.select([main_fd], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(main_fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(main_fd)
    return b"".join(chunks).decode("utf-8", "replace")


def test_colour_on_a_terminal_and_no_color():
    args = ["analyze", str(RUN)]
    assert "\x1b[" in _in_pty(args, {})
    assert "\x1b[" not in _in_pty(args, {"NO_COLOR": "1"})
    assert "\x1b[" not in _in_pty([*args, "--color", "never"], {})
    assert "\x1b[" in process(*args, "--color", "always").stdout.decode()
    assert "\x1b[" not in process(*args).stdout.decode()  # a pipe


# -- --fail-on ---------------------------------------------------------------------------------

def test_fail_on(cli):
    r = cli("analyze", str(RUN), "--fail-on", "gpu_hardware,rank_divergence", "--json")
    assert r.code == 1 and json.loads(r.out)["verdict"]["class"] == "rank_divergence"
    assert "--fail-on" in r.err
    assert cli("analyze", str(RUN), "--fail-on", "gpu_hardware,oom").code == 0
    assert cli("analyze", str(RUN), "--fail-on", "any").code == 1
    assert cli("analyze", str(RUN), "--fail-on", "unknown").code == 0


# -- events ------------------------------------------------------------------------------------

def test_events_filters_and_order(cli):
    rows = cli("events", str(RUN), "-f", "json").json()
    assert rows
    def when(ts: str | None) -> dt.datetime:
        return dt.datetime.fromisoformat(ts) if ts else dt.datetime.max.replace(tzinfo=dt.UTC)

    key = [(when(r["ts"]), r["file"], r["line"]) for r in rows]
    assert key == sorted(key)

    def only(*args: str) -> list[dict]:
        r = cli("events", str(RUN), "-f", "json", *args)
        assert r.code == 0, r.err
        return r.json()

    assert {r["rank"] for r in only("--rank", "0")} == {0}
    assert {r["rank"] for r in only("--rank", "1-2,3")} == {1, 2, 3}
    assert {r["kind"] for r in only("--kind", "gloo_timeout", "--kind", "side_work")} == {"gloo_timeout",
                                                                                          "side_work"}
    assert {r["source"] for r in only("--source", "flight_recorder")} == {"flight_recorder"}
    assert {r["pg"] for r in only("--pg", "0")} == {"0"}
    grep = only("--grep", "timed OUT", "-i")
    assert grep and all("timed out" in r["text"].lower() for r in grep)
    stamped = [r["ts"] for r in rows if r["ts"]]
    mid = sorted(stamped)[len(stamped) // 2]
    since = only("--since", mid.removesuffix("Z"))
    assert since and all(r["ts"] and when(r["ts"]) >= when(mid) for r in since)
    until = only("--until", mid.removesuffix("Z"))
    assert until and all(r["ts"] and when(r["ts"]) <= when(mid) for r in until)
    assert len(since) + len(until) == len(stamped) + sum(r["ts"] == mid for r in rows)
    r = cli("events", str(RUN), "--kind", "watchdog_timout")
    assert "no event of kind watchdog_timout" in r.err


def test_events_table_says_what_it_hides(cli):
    r = cli("events", str(RUN), "-n", "3")
    assert r.code == 0
    assert "more events not shown" in r.out and "-n 0" in r.out
    full = cli("events", str(RUN), "-n", "0", columns=200)
    assert "not shown" not in full.out
    assert len(cli("events", str(RUN), "-f", "json", "-n", "3").json()) == 3


# -- inputs that are not logs, skipped files ---------------------------------------------------

def test_inputs_that_are_not_logs_exit_3(cli, tmp_path):
    conf = tmp_path / "etc"
    conf.mkdir()
    (conf / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n")
    (conf / "app.conf").write_text("# validation settings\nvalidation = strict\ncheckpoint_dir = /srv/ckpt\n")
    (conf / "hosts").write_text("127.0.0.1 localhost\n")
    line = one_line_error(cli("analyze", str(conf)), 3)
    assert "looked like a PyTorch, NCCL or launcher log" in line and "3 files" in line
    images = tmp_path / "images"
    images.mkdir()
    for i in range(4):
        (images / f"p{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(300))
    line = one_line_error(cli("analyze", str(images)), 3)
    assert "looked like a PyTorch, NCCL or launcher log" in line and "skipped 4 files" in line


def test_skipped_files_are_listed_with_reasons(cli):
    r = cli("analyze", str(SAMPLE))
    assert "Skipped 5 files:" in r.out
    assert "  make_sample.py: not a log (script, config, document or data file)" in r.out.splitlines()
    assert "Read 16 files (200 lines) and saw 4 of 4 ranks." in r.out
    assert "Culprit: rank 0 on localhost" in r.out


def test_one_file_one_line_in_the_singular(cli, tmp_path):
    (tmp_path / "dmesg.txt").write_text(XID)
    r = cli("analyze", str(tmp_path / "dmesg.txt"))
    assert "Read 1 file (1 line)" in r.out
    r = cli("events", str(tmp_path / "dmesg.txt"), "-f", "csv")
    assert "Read 1 file (1 line); found 1 event" in r.err


# -- progress ----------------------------------------------------------------------------------

def test_progress_line_after_the_delay_and_erased():
    now = [0.0]
    out = io.StringIO()
    p = Progress(enabled=True, stream=out, clock=lambda: now[0])
    p.read("rank0.log", 1 << 20)
    assert out.getvalue() == ""  # a quick run prints nothing
    now[0] = 1.0
    p.read("rank1.log", 1 << 20)
    assert "reading 2 files, 2.0 MB so far: rank1.log" in out.getvalue()
    p.read("rank1.log", 1)  # within EVERY_S: not redrawn
    assert out.getvalue().count("reading") == 1
    p.close()
    assert out.getvalue().endswith("\r\x1b[K")
    quiet = io.StringIO()
    q = Progress(enabled=False, stream=quiet, clock=lambda: now[0] + 5)
    q.read("x", 1)
    q.phase("diagnosing")
    q.close()
    assert quiet.getvalue() == ""
    assert not Progress.for_terminal(quiet=True).enabled


@pytest.mark.parametrize("args", [("analyze", str(RUN), "--json"), ("rules", "list"), ("analyze", "--no-such-flag")],
                         ids=["reads-a-run", "reads-no-run", "usage-error"])
def test_the_console_script_lets_the_collector_go_once_a_command_starts(cli, monkeypatch, args):
    """cli.run holds the cyclic garbage collector during start-up; every command lets it go (a reading
    command once its reading modules are imported), so a long run is collected as usual."""
    import gc

    from ncclforensics import cli as cli_module

    assert gc.isenabled()
    monkeypatch.setattr(cli_module, "_GC_HELD", True)
    gc.disable()
    try:
        r = cli(*args)
        held_after = cli_module._GC_HELD
        enabled_after = gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
    if args[-1] == "--no-such-flag":  # no command ran: run() exits straight away
        assert r.code == 2
        return
    assert r.code == 0, r.err
    assert enabled_after and not held_after


def test_the_reproducer_is_rendered_only_for_what_shows_it(cli, monkeypatch, tmp_path):
    """The terminal summary never shows the reproducer: a terminal-only run does not render it (the
    templates and their checks are start-up time); --json, -o and the other documents do."""
    import ncclforensics.outputs as outputs

    calls = []
    real = outputs.reproducer
    monkeypatch.setattr(outputs, "reproducer", lambda analysis: calls.append(1) or real(analysis))
    sample = str(Path(__file__).resolve().parent.parent / "sample_logs")
    assert cli("analyze", sample).code == 0
    assert calls == []
    ran = cli("analyze", sample, "--json")
    assert ran.code == 0 and calls == [1] and ran.json()["reproducer"]
    assert cli("analyze", sample, "-q", "-o", str(tmp_path / "out")).code == 0
    assert calls == [1, 1] and (tmp_path / "out" / "repro.py").is_file()
