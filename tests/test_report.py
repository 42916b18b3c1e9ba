"""The HTML report: golden file, weight, offline assets, log text always escaped, rule docs as Markdown."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import os
import re
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import jinja2
import polars as pl
import pytest

from ncclforensics.analysis import analyze_events, analyze_path
from ncclforensics.events import IngestResult
from ncclforensics.model import EVENT_SCHEMA
from ncclforensics.report import bundle, charts, context, timeline
from ncclforensics.report.render import TEMPLATES, environment, render_report
from ncclforensics.report.richtext import to_html
from ncclforensics.rules.loader import load_rules
from tests.fixtures.hostile_run import XSS_DIR, XSS_HOST, XSS_LINE, hostile_run

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_logs"
CORPUS = ROOT.parent / "shared" / "corpus"
GOLDEN = Path(__file__).parent / "golden" / "report_sample.html"
FIXED_TIME = datetime(2030, 1, 1, tzinfo=UTC)
FAKE_REPRO = SimpleNamespace(script="import torch.distributed as dist\nprint('repro')\n",
                             command="torchrun --nproc-per-node 4 repro.py", world_size=4)
SINGLE_REPORT_GOAL = 800_000  # bytes: DESIGN.md §5 (the hard limit is 1.6 MB)


def _case(prefix: str) -> Path:
    found = sorted(CORPUS.glob(f"{prefix}_*"))
    if not found:
        pytest.skip(f"corpus case {prefix} not present")
    return found[0]


@pytest.fixture(scope="module")
def sample_analysis():
    return analyze_path(SAMPLE)


@pytest.fixture(scope="module")
def report_sample(sample_analysis) -> str:
    return render_report(sample_analysis, FAKE_REPRO, generated=FIXED_TIME)


def scrub(html: str) -> str:
    """Drop what changes between machines and releases: the plotly bundle, our CSS and JS (checked in a
    browser, not byte by byte), versions, times, random ids."""
    html = re.sub(r'(<script type="application/octet-stream" id="plotly-gz"[^>]*>).*?(</script>)',
                  r"\1[plotly.js]\2", html, flags=re.S)
    html = re.sub(r"<style>.*?</style>", "<style>[report.css]</style>", html, flags=re.S)
    html = re.sub(r"<script>\n/\* ncclforensics report: .*?</script>", "<script>[report.js]</script>", html,
                  flags=re.S)
    html = re.sub(r"ncclforensics \d+\.\d+\.\d+[\w.+-]*", "ncclforensics X.Y.Z", html)
    html = re.sub(r'("tool_version": ?")[^"]*"', r'\1X.Y.Z"', html)
    html = re.sub(r"plotly\.js-\S+ \d+\.\d+\.\d+", "plotly.js-BUNDLE X.Y.Z", html)
    html = re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d+)?)?( UTC|Z)?", "<time>", html)
    html = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<uuid>", html)
    return html


def test_golden_report_of_the_bundled_sample(report_sample: str):
    """sample_logs/ ships with the repository: this runs in a fresh clone."""
    got = scrub(report_sample)
    if os.environ.get("UPDATE_GOLDEN") == "1" or not GOLDEN.exists():
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(got, encoding="utf-8")
        if os.environ.get("UPDATE_GOLDEN") != "1":
            pytest.fail(f"wrote a new golden file {GOLDEN}: check it in")
    want = GOLDEN.read_text(encoding="utf-8")
    assert got == want, "report changed: look at it, then regenerate with UPDATE_GOLDEN=1 pytest tests/test_report.py"


# -- weight and the vendored plotly.js --------------------------------------------------------
def test_single_report_weighs_a_tenth(report_sample: str):
    size = len(report_sample.encode())
    assert size <= SINGLE_REPORT_GOAL, f"report is {size:,} bytes"
    assert report_sample.count('id="plotly-gz"') == 1 and "<script src" not in report_sample
    assert report_sample.count('class="plot"') == 2
    rest = len(scrub(report_sample).encode())
    assert rest < 120_000, f"report without plotly.js is {rest:,} bytes"


def test_scan_report_without_its_shared_asset_is_small(sample_analysis):
    html = render_report(sample_analysis, FAKE_REPRO, plotly_src="../../assets/plotly.js")
    assert 'id="plotly-gz"' not in html and '<script src="../../assets/plotly.js"></script>' in html
    assert len(html.encode()) <= 200_000


def test_vendored_bundle_matches_its_manifest():
    b = bundle.bundle()
    data = gzip.decompress(bundle.gzipped())
    assert hashlib.sha256(data).hexdigest() == b.sha256
    assert b.license == "MIT" and (bundle.ASSETS / "plotly-LICENSE.txt").read_text().startswith("MIT License")
    assert {"scatter", "heatmap"} <= b.traces
    head = data[:300].decode()
    assert f"v{b.version}" in head and "cartesian" in head
    assert len(bundle.gzipped()) < 600_000  # the partial bundle, not the 4.8 MB full one


def test_a_trace_the_bundle_cannot_draw_is_refused():
    bundle.check_traces(["scatter", "heatmap"])
    with pytest.raises(bundle.BundleError, match="scattergl"):
        bundle.check_traces(["scatter", "scattergl"])


# -- no network -------------------------------------------------------------------------------
class _Refs(HTMLParser):
    """Every URL a tag would load: script/img/iframe/source src, link href, object data."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for attr in ("src", "data", "poster", "srcset"):
            if a.get(attr):
                self.urls.append((tag, a[attr]))
        if tag == "link" and a.get("href"):
            self.urls.append((tag, a["href"]))


def _external(html: str) -> list[tuple[str, str]]:
    p = _Refs()
    p.feed(html)
    out = [(t, u) for t, u in p.urls if re.match(r"\s*(https?:|//|ftp:)", u, re.I)]
    out += [("css", m) for m in re.findall(r"@import\s+[^;]+|url\(\s*['\"]?(?:https?:|//)[^)]*\)", html)]
    return out


@pytest.mark.parametrize("prefix", ["002", "005", "009", "019"])
def test_no_external_url_in_src_or_stylesheet(prefix: str):
    html = render_report(analyze_path(_case(prefix)), None)
    assert _external(html) == []
    assert "<script src" not in html and 'rel="stylesheet"' not in html
    assert "No reproducer" in html or "no reproducer" in html.lower()


# -- log text is text -----------------------------------------------------------------------------
def _assert_escaped(html: str, *raw: str) -> None:
    for s in raw:
        assert s not in html, f"raw {s!r} in the report"
        assert s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in html, f"{s!r} not shown as text"
    assert _external(html) == []


def test_log_text_and_paths_are_text_not_markup(tmp_path: Path):
    html = render_report(analyze_path(hostile_run(tmp_path)), None)
    _assert_escaped(html, XSS_LINE, XSS_DIR, XSS_HOST)
    # data for scripts goes through |tojson: never a raw "<" next to log data inside a script
    for body in re.findall(r"<script[^>]*>(.*?)</script>", html, flags=re.S):
        if "alert(1)" in body:
            assert "<" not in body, "raw '<' next to log data inside a script"


def test_safe_only_on_our_assets():
    """STYLE.md habit 8: autoescape everywhere, |safe on our own CSS and JS only."""
    env = environment()
    assert env.autoescape is True and env.undefined is jinja2.StrictUndefined
    used = set()
    for t in TEMPLATES.glob("*.j2"):
        text = t.read_text(encoding="utf-8")
        used |= set(re.findall(r"\{\{\s*([\w.]+)\s*\|\s*safe\s*\}\}", text))
        assert "Markup(" not in text
    assert used == {"css", "js"}


def _events(rows: list[dict]) -> pl.DataFrame:
    full = [{c: r.get(c) for c in EVENT_SCHEMA} for r in rows]
    return pl.DataFrame(full, schema=EVENT_SCHEMA, strict=False)


def test_exact_hostile_host_name_is_escaped():
    ts = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    rows = [
        {"run": "r", "file": f"{XSS_DIR}/rank{r}.log", "line": 1, "ts": ts, "host": XSS_DIR, "rank": r,
         "source": "nccl", "kind": "watchdog_timeout", "seq": 812 if r else 811, "op": "ALLREDUCE",
         "numel_in": 1024, "timeout_ms": 600000, "text": f"[Rank {r}] Watchdog caught ... {XSS_LINE}"}
        for r in range(3)
    ]
    analysis = analyze_events(IngestResult(run="r", events=_events(rows), files=3, lines=3))
    _assert_escaped(render_report(analysis, None), XSS_LINE, XSS_DIR)


# -- rule docs: Markdown in the report, escaped ---------------------------------------------------
def test_rule_docs_render_markdown_and_escape_tags():
    assert to_html("NCCL's `Duplicate GPU <b>` line") == "<p>NCCL's <code>Duplicate GPU &lt;b&gt;</code> line</p>"
    html = to_html("<script>alert(1)</script> ![x](http://example.invalid/x.png) [a](javascript:alert(1))")
    assert "<script" not in html and "<img" not in html and 'href="javascript' not in html


@pytest.mark.parametrize("rule", sorted(load_rules(), key=lambda r: r.id), ids=lambda r: r.id)
def test_every_rule_doc_renders_without_a_stray_backtick(rule):
    for key, text in rule.doc.items():
        assert "`" not in to_html(str(text)), f"{rule.id} {key}: an unpaired backtick shows literally"


def test_report_shows_rule_doc_code_not_backticks(tmp_path: Path):
    log = tmp_path / "run" / "rank0.log"
    log.parent.mkdir()
    log.write_text("gpu-a:1:2 [1] init.cc:840 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA "
                   "device 1a000\n", encoding="utf-8")
    html = render_report(analyze_path(tmp_path / "run"), None)
    doc = html[html.index('<dl class="doc">'):html.index("</dl>", html.index('<dl class="doc">'))]
    assert "<code>" in doc and "`" not in doc


# -- charts and the timeline's view-model -----------------------------------------------------------
def test_timeline_draws_flight_recorder_steps_per_rank(sample_analysis):
    tl = timeline.timeline_view(sample_analysis)
    assert tl.group_by == "rank" and tl.lanes[:4] == ("rank 0", "rank 1", "rank 2", "rank 3")
    assert tl.culprit_lanes == ("rank 0",)
    enq = [e for e in tl.events if e.category == "collective enqueued"]
    assert {e.rank for e in enq} == {0, 1, 2, 3}
    assert {e.rank: e.label for e in enq if e.label} == {0: "#8", 1: "#9", 2: "#9", 3: "#9"}
    assert not any(e.category.startswith("other") or "_" in e.category for e in tl.events)
    # the root line has no time: no star, and the culprit's last own event is marked instead
    assert tl.root is None and tl.last_seen is not None and tl.last_seen.rank == 0
    assert "ALLREDUCE #8" in tl.last_seen.text and "carries no timestamp" in tl.root_note
    # markers that share a lane and a moment are spread, never drawn on top of each other
    spots = [(e.lane, e.ts[:21], round(e.y, 3)) for e in tl.events]
    assert len(spots) == len(set(spots))


def _tl_events(n_ranks: int, culprits: dict[int, str], ts0: datetime) -> pl.DataFrame:
    rows = []
    for r in range(n_ranks):
        host = f"node{r // 8:03d}"
        if r in culprits:
            rows.append({"run": "t", "file": f"{host}/rank{r}.log", "line": 5, "ts": ts0, "host": host, "rank": r,
                         "pg": "0", "source": "cuda", "kind": "cuda_oom", "text": culprits[r],
                         "detail": culprits[r]})
        else:
            rows.append({"run": "t", "file": f"{host}/rank{r}.log", "line": 9, "ts": ts0.replace(second=30),
                         "host": host, "rank": r, "pg": "0", "source": "nccl", "kind": "watchdog_timeout",
                         "seq": 43322, "op": "ALLREDUCE", "timeout_ms": 30000,
                         "text": f"[Rank {r}] Watchdog caught collective operation timeout"})
    return _events(rows)


def test_root_marker_is_the_culprits_cause_never_a_peers_timeout():
    ts0 = datetime(2026, 1, 1, 10, 0, 0, tzinfo=UTC)
    df = _tl_events(8, {5: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}, ts0)
    analysis = analyze_events(IngestResult(run="t", events=df, files=8, lines=8))
    assert analysis.diagnosis.verdict.culprit_ranks == [5]
    tl = timeline.timeline_view(analysis)
    assert tl.root is not None and tl.root.rank == 5 and tl.root.category == "out of memory"
    assert tl.first_timeout is not None and tl.first_timeout.rank != 5


def test_lanes_are_hosts_at_256_ranks_and_markers_fold():
    ts0 = datetime(2026, 1, 1, 10, 0, 0, tzinfo=UTC)
    df = _tl_events(256, {14: "CUDA out of memory"}, ts0)
    analysis = analyze_events(IngestResult(run="t", events=df, files=256, lines=256))
    tl = timeline.timeline_view(analysis)
    assert tl.group_by == "host" and len(tl.lanes) == 32 and tl.culprit_lanes == ("node001",)
    assert len(tl.events) < 100 and tl.total == 256  # 255 timeouts in 32 lanes: one marker per host
    assert any(e.text.startswith("8 events on ranks 0–7") for e in tl.events)


def test_culprit_labels_never_share_room():
    assert charts.culprit_labels((14,), 256) == [(14, "rank 14")]
    labels = charts.culprit_labels((14, 15, 200, 203), 256)
    assert [t for _, t in labels] == ["ranks 14, 15", "ranks 200, 203"]
    xs = [x for x, _ in labels]
    assert all(b - a >= 256 * charts.LABEL_PX / charts.NARROW_PLOT_PX for a, b in itertools.pairwise(xs))


def test_legend_lists_only_states_some_rank_has(sample_analysis, report_sample: str):
    view = context.build_view(sample_analysis, incident=_no_context(sample_analysis))
    assert [s.state for s in view.states] == ["culprit", "waiting"]
    legend = report_sample[report_sample.index('<ul class="legend">'):]
    legend = legend[:legend.index("</ul>")]
    assert "no log lines" not in legend and "failed or exited" not in legend


def _no_context(analysis):
    from ncclforensics.incident import build_context

    return build_context(analysis, radius=0, read=False)


def test_charts_stay_small_at_2048_ranks():
    """Thousands of ranks: the timeline is capped and folded, the frontier carries numbers, not prose."""
    ts = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    rows = []
    for r in range(2048):
        host = f"node{r // 8:04d}"
        seq = 99 if r == 1500 else 100
        for k, kind in enumerate(("watchdog_timeout", "teardown", "child_failed")):
            rows.append({"run": "big", "file": f"{host}/rank{r}.log", "line": k + 1,
                         "ts": ts.replace(second=k * 10, microsecond=r), "host": host, "rank": r, "pg": "0",
                         "source": "nccl", "kind": kind, "seq": seq if k == 0 else None,
                         "op": "ALLREDUCE" if k == 0 else None, "timeout_ms": 600000, "text": f"{kind} {r}"})
    analysis = analyze_events(IngestResult(run="big", events=_events(rows), files=2048, lines=len(rows)))
    view = context.build_view(analysis, incident=_no_context(analysis))
    assert len(view.timeline.events) <= timeline.MAX_POINTS
    assert view.timeline.total == len(rows)
    assert len(view.frontier.strip) == 2048
    html = render_report(analysis, None, incident=_no_context(analysis))
    assert len(html.encode()) < 1_600_000, f"{len(html.encode()):,} bytes at 2,048 ranks"
