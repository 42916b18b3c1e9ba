"""The report and the scan index in a real browser (headless Chromium, network blocked): charts drawn,
no console error, nothing overflowing its card, no two chart labels on top of each other."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from ncclforensics.analysis import analyze_events, analyze_path
from ncclforensics.events import IngestResult
from ncclforensics.model import EVENT_SCHEMA
from ncclforensics.report.render import render_report
from ncclforensics.scan import scan
from tests.fixtures.browser_checks import ANNOTATIONS_JS, CELL_TEXT_JS, OVERFLOW_JS, OVERLAP_JS
from tests.fixtures.hostile_run import XSS_LINE, hostile_run

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_logs"
GEN = ROOT / "bench" / "gen_run.py"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-quic", "--disable-sync"]
WIDTHS = (1400, 1024, 800, 390)


def _playwright():
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright not installed (pip install playwright)")
    return sync_playwright


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _playwright()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


def _open(browser, path: Path, width: int = 1280):
    page = browser.new_page(viewport={"width": width, "height": 900})
    seen = SimpleNamespace(errors=[], requests=[], dialogs=[])
    page.on("console", lambda m: seen.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen.errors.append(str(e)))
    page.on("dialog", lambda d: (seen.dialogs.append(d.message), d.dismiss()))

    def route(r):
        if r.request.url.startswith(("file:", "data:", "blob:")):
            r.continue_()
        else:  # the network is off: any other request is a failure of the test
            seen.requests.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, seen


def _charts_drawn(page, ids=("chart-frontier", "chart-timeline")) -> None:
    for chart in ids:
        page.wait_for_selector(f"#{chart} .main-svg", timeout=20_000)
        page.wait_for_function(f"document.getElementById('{chart}').dataset.drawn === '1'", timeout=20_000)
    page.wait_for_timeout(400)  # the annotation pass relayouts once or twice


def _screenshot(page, name: str) -> None:
    if os.environ.get("REPORT_SCREENSHOTS"):
        out = ROOT / "out" / "screenshots"
        out.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def sample_report(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(render_report(analyze_path(SAMPLE), None), encoding="utf-8")
    return path


@pytest.mark.parametrize("width", WIDTHS)
def test_sample_report_at_every_width(browser, sample_report: Path, width: int):
    page, seen = _open(browser, sample_report, width)
    _charts_drawn(page)
    assert page.locator("#verdict h1").inner_text().strip() == "The ranks took different code paths"
    checks = page.evaluate(OVERFLOW_JS)
    assert checks["overflow"] == [], checks
    assert page.evaluate(OVERLAP_JS) == []
    assert page.evaluate(CELL_TEXT_JS) == []
    _screenshot(page, f"report_sample_{width}")
    assert seen.requests == [], f"network requests attempted: {seen.requests}"
    assert seen.errors == [], f"console errors: {seen.errors}"
    page.close()


def test_context_panel_opens_and_buttons_work(browser, sample_report: Path):
    page, seen = _open(browser, sample_report, 800)
    _charts_drawn(page)
    panel = page.locator("#tail-panel")
    assert panel.get_attribute("open") is None and not page.locator("table.tail").is_visible()
    panel.locator("summary").click()
    assert panel.get_attribute("open") is not None and page.locator("table.tail").is_visible()
    assert page.locator("table.tail tr.event").count() >= 4
    first = page.locator("details.context").first
    assert not first.locator("pre.ctx").is_visible()
    first.locator("summary").click()
    hit = first.locator("pre.ctx span.hit")
    assert hit.is_visible() and "running validation on 9600 samples" in hit.inner_text()
    assert "make_sample.py:68 in sync_gradients" in page.locator("#context").inner_text()
    page.locator("button[data-copy]").first.click()
    page.wait_for_function("document.querySelector('button[data-copy]').textContent !== 'Copy'", timeout=5_000)
    assert page.evaluate(OVERFLOW_JS)["overflow"] == []
    # print layout: navigation hidden, nothing wider than the page
    page.emulate_media(media="print")
    assert not page.locator("header.top nav").is_visible()
    assert page.evaluate(OVERFLOW_JS)["overflow"] == []
    assert seen.errors == [] and seen.requests == []
    page.close()


def test_hostile_report_runs_no_script(browser, tmp_path: Path):
    path = tmp_path / "hostile.html"
    path.write_text(render_report(analyze_path(hostile_run(tmp_path)), None), encoding="utf-8")
    page, seen = _open(browser, path)
    page.wait_for_selector("#chart-frontier .main-svg, #frontier .note", timeout=20_000)
    page.wait_for_timeout(300)
    assert seen.dialogs == [], "a log line ran as script"
    assert page.locator("img").count() == 0, "a log line became an <img>"
    assert XSS_LINE in page.locator("#why").inner_text()
    assert seen.requests == [] and seen.errors == []
    page.close()


# -- many ranks: labels never collide ------------------------------------------------------------
@pytest.fixture(scope="module")
def run_256(tmp_path_factory) -> Path:
    """A generated 256-rank run (bench/gen_run.py): a lagging rank, every other rank timing out."""
    spec = importlib.util.spec_from_file_location("bench_gen_run", GEN)
    gen = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gen
    spec.loader.exec_module(gen)
    out = tmp_path_factory.mktemp("gen") / "run256"
    assert gen.main(["--ranks", "256", "--per-host", "8", "--size", "1M", "--seed", "3", "--out", str(out)]) == 0
    html = out.parent / "report.html"
    html.write_text(render_report(analyze_path(out), None), encoding="utf-8")
    return html


@pytest.mark.parametrize("width", (1400, 800))
def test_256_rank_report_labels_do_not_overlap(browser, run_256: Path, width: int):
    assert len(run_256.read_bytes()) <= 1_600_000
    page, seen = _open(browser, run_256, width)
    _charts_drawn(page)
    counts = dict(page.evaluate(ANNOTATIONS_JS))
    assert counts["chart-frontier"] >= 1 and counts["chart-timeline"] >= 2  # culprit label; root/first timeout
    assert page.evaluate(OVERLAP_JS) == []
    assert page.evaluate(OVERFLOW_JS)["overflow"] == []
    _screenshot(page, f"report_256_{width}")
    assert seen.errors == [] and seen.requests == []
    page.close()


def test_neighbouring_culprits_and_a_stuck_line_do_not_collide(browser, tmp_path: Path):
    """Culprits a few ranks apart on a 256-rank axis, one with no SeqNum, and the stuck collective."""
    ts = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    culprits = {14, 15, 17, 120}
    rows = []
    for r in range(256):
        host = f"node{r // 8:03d}"
        if r in culprits:
            rows.append({"run": "c", "file": f"{host}/rank{r}.log", "line": 3, "ts": ts, "host": host, "rank": r,
                         "source": "python", "kind": "segfault", "text": "Segmentation fault (core dumped)"})
            continue
        rows.append({"run": "c", "file": f"{host}/rank{r}.log", "line": 7, "ts": ts.replace(second=40),
                     "host": host, "rank": r, "pg": "0", "source": "nccl", "kind": "watchdog_timeout",
                     "seq": 43322, "op": "ALLREDUCE", "timeout_ms": 40000, "text": f"[Rank {r}] Watchdog caught"})
    df = pl.DataFrame([{c: r.get(c) for c in EVENT_SCHEMA} for r in rows], schema=EVENT_SCHEMA, strict=False)
    analysis = analyze_events(IngestResult(run="c", events=df, files=256, lines=256))
    path = tmp_path / "c.html"
    path.write_text(render_report(analysis, None), encoding="utf-8")
    for width in (1400, 800):
        page, seen = _open(browser, path, width)
        _charts_drawn(page)
        assert page.evaluate(OVERLAP_JS) == [], width
        assert seen.errors == []
        page.close()


# -- a scan: shared plotly.js, offline, and its index page ------------------------------------------
def test_scan_reports_and_index_offline(browser, tmp_path: Path):
    shutil.copytree(SAMPLE / "rank0-validation-timeout", tmp_path / "root" / "run-a")
    scan(tmp_path / "root", tmp_path / "out", jobs=1, progress=False)
    (report,) = (tmp_path / "out").glob("runs/*/report.html")
    page, seen = _open(browser, report, 800)
    _charts_drawn(page)
    assert page.evaluate(OVERFLOW_JS)["overflow"] == []
    assert seen.errors == [] and seen.requests == []
    page.close()
    for width in (1400, 800):
        page, seen = _open(browser, tmp_path / "out" / "index.html", width)
        checks = page.evaluate(OVERFLOW_JS)
        assert checks["overflow"] == [] and checks["scrolled"] == [], (width, checks)
        svg = page.locator("svg.over-time").bounding_box()
        card = page.locator("svg.over-time").locator("xpath=ancestor::section").bounding_box()
        assert svg["width"] >= 0.9 * (card["width"] - 32), "the chart fills its card"
        _screenshot(page, f"scan_index_{width}")
        assert seen.errors == [] and seen.requests == []
        page.close()
