"""Evidence context: lines read back around evidence, every rank's last lines, user frames; -C N and --md."""

from __future__ import annotations

import gzip
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ncclforensics.analysis import analyze_path
from ncclforensics.incident import build_context
from ncclforensics.ingest.excerpt import read_lines
from ncclforensics.mdout import esc, markdown

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_logs"
RUN = "rank0-validation-timeout"
CONSOLE = f"{RUN}/console.log"
EXE = Path(sys.executable).parent / "ncclforensics"


@pytest.fixture(scope="module")
def analysis():
    return analyze_path(SAMPLE)


@pytest.fixture(scope="module")
def ctx(analysis):
    return build_context(analysis, radius=3)


def test_evidence_lines_come_with_their_neighbours(ctx):
    first = ctx.evidence[0]
    assert (first.file, first.line, first.rank) == (CONSOLE, 23, 0)
    assert [x.no for x in first.lines] == [20, 21, 22, 23, 24, 25, 26]
    hit = [x for x in first.lines if x.hit]
    assert len(hit) == 1 and hit[0].text == "[default0]:[rank 0] running validation on 9600 samples"
    assert len({(e.file, e.line) for e in ctx.evidence}) == len(ctx.evidence)  # each line once
    assert ctx.narrowed(1).evidence[0].lines[0].no == 22


def test_merged_view_keeps_the_consoles_interleaving(ctx):
    assert ctx.tail_ranks == "ranks 0–3" and "order of the file" in ctx.tail_order
    nos = [t.no for t in ctx.tail]
    assert nos == sorted(nos)
    # rank 0's last line is its validation; the others end with their timeout, traceback frames skipped
    last = {t.rank: t for t in ctx.tail}
    assert last[0].text.endswith("running validation on 9600 samples")
    for r in (1, 2, 3):
        assert "Timed out waiting" in last[r].text and last[r].event and last[r].skipped > 0


def test_user_frames_of_the_culprit_and_of_the_ranks_that_waited(ctx):
    culprit, others = ctx.frames[0], ctx.frames[1]
    assert culprit.culprit and culprit.who == "rank 0 (culprit)" and "ALLREDUCE #8" in culprit.what
    inner = culprit.frames[-1]
    assert (inner.file, inner.line, inner.fn, inner.code) == ("train/make_sample.py", 68, "sync_gradients",
                                                              "dist.all_reduce(flat)")
    assert others.who == "ranks 1–3" and others.frames[-1].fn == "sync_gradients"
    assert not any("site-packages" in f.file or "torch/" in f.file for g in ctx.frames for f in g.frames)


def test_archive_members_read_the_same(tmp_path: Path, ctx):
    arc = tmp_path / "run.tar.gz"
    with tarfile.open(arc, "w:gz") as tf:
        tf.add(SAMPLE / RUN, arcname=RUN)
    got = read_lines(arc, {CONSOLE: [(20, 26)]})[CONSOLE]
    assert [(x.no, x.text) for x in got.lines] == [(x.no, x.text) for x in ctx.evidence[0].lines]
    # a gzip file and a folder holding the archive: names as the event table writes them
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "console.log.gz").write_bytes(gzip.compress((SAMPLE / CONSOLE).read_bytes()))
    arc.rename(tmp_path / "d" / "run.tar.gz")
    got = read_lines(tmp_path / "d", {"console.log": [(23, 23)], f"run.tar.gz!{CONSOLE}": [(23, 23)]})
    assert got["console.log"].lines == got[f"run.tar.gz!{CONSOLE}"].lines
    assert got["console.log"].lines[0].text.endswith("running validation on 9600 samples")


def test_a_file_that_vanished_or_changed_gives_a_note(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    log = run / "rank0.log"
    log.write_text("[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered\n" * 3)
    a = analyze_path(run)
    log.write_text("something else entirely\n" * 3)
    changed = build_context(a, radius=2).evidence[0]
    assert "changed since it was read" in changed.note
    log.unlink()
    gone = build_context(a, radius=2)
    assert not gone.evidence[0].lines and any("no longer there" in n for n in gone.notes)
    assert read_lines(run, {"missing.log": [(1, 3)]})["missing.log"].note


def test_binary_and_flight_recorder_files_give_notes_not_errors(tmp_path: Path):
    (tmp_path / "blob.log").write_bytes(bytes(range(256)) * 100)
    got = read_lines(tmp_path, {"blob.log": [(1, 2)], f"{RUN}/fr_trace/fr_trace_rank_0": [(1, 2)]})
    assert "could not be read again" in got["blob.log"].note
    got = read_lines(SAMPLE, {f"{RUN}/fr_trace/fr_trace_rank_0": [(1, 2)]})
    assert "Flight Recorder" in got[f"{RUN}/fr_trace/fr_trace_rank_0"].note


def test_reading_is_bounded(tmp_path: Path):
    (tmp_path / "big.log").write_text("".join(f"line {i}\n" for i in range(200_000)))
    got = read_lines(tmp_path, {"big.log": [(199_990, 199_995)]}, max_bytes=100_000)["big.log"]
    assert not got.lines and "budget" in got.note
    got = read_lines(tmp_path, {"big.log": [(199_990, 199_995)]})["big.log"]
    assert [x.text for x in got.lines] == [f"line {i}" for i in range(199_989, 199_995)]


def test_context_lines_are_clean_text(tmp_path: Path):
    (tmp_path / "x.log").write_bytes(b"\x1b[31mred\x1b[0m and a bell\x07 and \xff bytes\n")
    (line,) = read_lines(tmp_path, {"x.log": [(1, 1)]})["x.log"].lines
    assert line.text == "red and a bell and \ufffd bytes"


# -- the outputs ---------------------------------------------------------------------------------
def test_markdown_mirrors_the_verdict_with_context_and_no_html_entities(analysis, ctx):
    md = markdown(analysis.diagnosis, None, context=ctx)
    assert md.startswith("### ncclforensics: `rank_divergence`")
    assert "&lt;" not in md and "&gt;" not in md and "&amp;" not in md
    assert "SeqNum is 8 \\< 9" in md  # Markdown's own escape
    assert ">    23  [default0]:[rank 0] running validation on 9600 samples" in md
    assert "**Last lines of ranks 0–3 before the failure**" in md
    assert "`train/make_sample.py:68` in `sync_gradients`: `dist.all_reduce(flat)`" in md
    assert "**Files skipped** (5)" in md and "`make_sample.py`: not a log" in md
    assert md.count("```") % 2 == 0


def test_markdown_escapes_without_entities():
    assert esc("a <b> | c_d `e`") == "a \\<b\\> \\| c\\_d \\`e\\`"


def test_cli_context_flag(tmp_path: Path):
    def run(*args: str) -> str:
        res = subprocess.run([str(EXE), "analyze", str(SAMPLE), *args], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        return res.stdout

    plain = run()
    assert "Context (" not in plain and "Where in your code" not in plain
    out = run("-C", "2")
    assert "Context (2 lines around each evidence line):" in out
    assert "    23: [default0]:[rank 0] running validation on 9600 samples" in out
    assert "    22- [default3]:[rank 3] step 4/12 loss=28.1920" in out
    assert "train/make_sample.py:68 in sync_gradients: dist.all_reduce(flat)" in out
    ctx_lines = out[out.index("Context ("):out.index("Top fix")].splitlines()
    assert max(len(line) for line in ctx_lines) <= 80
    md = run("--md", "-C", "1")
    assert ">    23  [default0]:[rank 0]" in md and "     22  " in md and "     21  " not in md
    out_dir = tmp_path / "out"
    run("-o", str(out_dir))
    report_md = (out_dir / "report.md").read_text()
    assert "     20  [default3]" in report_md  # report.md: 3 lines around by default
    assert "10 lines before and after it" in (out_dir / "report.html").read_text()
