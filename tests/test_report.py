"""The HTML report: golden file, offline assets, log text always escaped, and a real-browser render."""

from __future__ import annotations

import os
import re
import shutil
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
from ncclforensics.report import chartdata, context, words
from ncclforensics.report.render import TEMPLATES, environment, render_report

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus"
GOLDEN = Path(__file__).parent / "golden" / "report_002.html"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run"]
FIXED_TIME = datetime(2030, 1, 1, tzinfo=UTC)
FAKE_REPRO = SimpleNamespace(script="import torch.distributed as dist\nprint('repro')\n",
                             command="torchrun --nproc-per-node 3 repro.py", world_size=3)
XSS_LINE = "</script><script>alert(1)</script>"
XSS_DIR = "<img src=x onerror=alert(1)>"
XSS_HOST = "<img/src=x/onerror=alert(1)>"  # NCCL's host:pid:tid prefix allows no spaces


def _case(prefix: str) -> Path:
    found = sorted(CORPUS.glob(f"{prefix}_*"))
    if not found:
        pytest.skip(f"corpus case {prefix} not present")
    return found[0]


@pytest.fixture(scope="module")
def report_002() -> str:
    return render_report(analyze_path(_case("002")), FAKE_REPRO, generated=FIXED_TIME)


def scrub(html: str) -> str:
    """Drop what changes between machines and releases: plotly.js, versions, times, random ids."""
    html = re.sub(r'(<script id="plotly-js">).*?(</script>)', r"\1[plotly.js]\2", html, flags=re.S)
    html = re.sub(r"ncclforensics \d+\.\d+\.\d+\S*", "ncclforensics X.Y.Z", html)
    html = re.sub(r'("tool_version": ?")[^"]*"', r'\1X.Y.Z"', html)
    html = re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d+)?)?( UTC|Z)?", "<time>", html)
    html = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<uuid>", html)
    return html


def test_golden_report(report_002: str):
    got = scrub(report_002)
    if os.environ.get("UPDATE_GOLDEN") == "1" or not GOLDEN.exists():
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(got, encoding="utf-8")
        if os.environ.get("UPDATE_GOLDEN") != "1":
            pytest.fail(f"wrote a new golden file {GOLDEN}: check it in")
    want = GOLDEN.read_text(encoding="utf-8")
    assert got == want, "report changed: look at it, then regenerate with UPDATE_GOLDEN=1 pytest tests/test_report.py"


def test_plotly_inlined_once_and_report_small(report_002: str):
    assert report_002.count('<script id="plotly-js">') == 1
    assert report_002.count("Plotly.newPlot(") == 2
    rest = len(scrub(report_002).encode())
    assert rest < 150_000, f"report without plotly.js is {rest} bytes"


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


def _hostile_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    d = run / XSS_DIR
    d.mkdir(parents=True)
    (d / "rank0.log").write_text(
        "[rank0]:[E1102 10:00:01.000000001 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for "
        "600031 milliseconds before timing out.\n", encoding="utf-8")
    (d / "rank1.log").write_text(
        f"{XSS_HOST}:1234:1240 [0] misc/socket.cc:50 NCCL WARN {XSS_LINE}\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/srv/train.py", line 10, in <module>\n'
        "[rank1]:     step(batch)\n"
        f"[rank1]: RuntimeError: {XSS_LINE}\n", encoding="utf-8")
    return run


def _assert_escaped(html: str, *raw: str) -> None:
    for s in raw:
        assert s not in html, f"raw {s!r} in the report"
        assert s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in html, f"{s!r} not shown as text"
    assert _external(html) == []


def test_log_text_and_paths_are_text_not_markup(tmp_path: Path):
    html = render_report(analyze_path(_hostile_run(tmp_path)), None)
    _assert_escaped(html, XSS_LINE, XSS_DIR, XSS_HOST)
    # data for scripts goes through |tojson or plotly's JSON: never a raw "<" inside a script
    for body in re.findall(r"<script[^>]*>(.*?)</script>", html, flags=re.S):
        if "alert(1)" in body:
            assert "<" not in body.replace("<br>", ""), "raw '<' next to log data inside a script"


def test_safe_only_on_our_assets():
    """STYLE.md habit 8: autoescape everywhere, |safe on our CSS/JS, plotly.js and plotly's chart divs only."""
    env = environment()
    assert env.autoescape is True and env.undefined is jinja2.StrictUndefined
    used = set()
    for t in TEMPLATES.glob("*.j2"):
        used |= set(re.findall(r"\{\{\s*([\w.]+)\s*\|\s*safe\s*\}\}", t.read_text(encoding="utf-8")))
        assert "Markup(" not in t.read_text(encoding="utf-8")
    assert used == {"css", "js", "plotly_js", "frontier_chart", "timeline_chart"}


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


def test_charts_stay_small_at_2048_ranks():
    """Thousands of ranks: the timeline is capped and the frontier carries numbers, not prose per point."""
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
    view = context.build_view(analysis)
    assert len(view.timeline.events) <= chartdata.MAX_POINTS
    assert view.timeline.total == len(rows)
    assert len(view.frontier.strip) == 2048
    html = render_report(analysis, None)
    rest = len(scrub(html).encode())
    assert rest < 1_500_000, f"report without plotly.js is {rest} bytes at 2,048 ranks"


def test_rank_ranges():
    assert words.rank_ranges([3, 0, 1, 2, 7, 9, 10]) == "0–3, 7, 9, 10 (7 ranks)"
    assert words.rank_ranges([5]) == "5"
    assert words.rank_ranges(list(range(0, 100, 2)), limit=3).endswith("… (50 ranks)")


# -- a real browser ---------------------------------------------------------------------
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


def _open(browser, path: Path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    seen = SimpleNamespace(errors=[], requests=[], dialogs=[])
    page.on("console", lambda m: seen.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen.errors.append(str(e)))
    page.on("dialog", lambda d: (seen.dialogs.append(d.message), d.dismiss()))

    def route(r):
        if r.request.url.startswith("file:"):
            r.continue_()
        else:  # the network is off: any other request is a failure of the test
            seen.requests.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, seen


def _save_screenshot(page, tmp_path: Path, name: str) -> Path:
    shot = tmp_path / f"{name}.png"
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("REPORT_SCREENSHOTS"):
        out = ROOT / "out" / "screenshots"
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, out / shot.name)
    return shot


def test_report_in_headless_chromium(browser, report_002: str, tmp_path: Path):
    path = tmp_path / "report.html"
    path.write_text(report_002, encoding="utf-8")
    page, seen = _open(browser, path)
    for chart in ("chart-frontier", "chart-timeline"):
        page.wait_for_selector(f"#{chart} .main-svg", timeout=15_000)
        assert page.locator(f"#{chart} .main-svg").count() >= 1, f"{chart} not drawn"
    assert page.locator("#verdict h1").inner_text().strip()
    page.locator("button[data-copy]").first.click()
    page.wait_for_function("document.querySelector('button[data-copy]').textContent !== 'Copy'", timeout=5_000)
    shot = _save_screenshot(page, tmp_path, "report_002")
    assert shot.stat().st_size > 10_000
    assert seen.requests == [], f"network requests attempted: {seen.requests}"
    assert seen.errors == [], f"console errors: {seen.errors}"
    page.close()


def test_hostile_report_runs_no_script(browser, tmp_path: Path):
    html = render_report(analyze_path(_hostile_run(tmp_path)), None)
    path = tmp_path / "hostile.html"
    path.write_text(html, encoding="utf-8")
    page, seen = _open(browser, path)
    page.wait_for_selector("#chart-timeline .main-svg, #timeline .note", timeout=15_000)
    page.wait_for_timeout(300)
    assert seen.dialogs == [], "a log line ran as script"
    assert page.locator("img").count() == 0, "a log line became an <img>"
    assert XSS_LINE in page.locator("#why").inner_text()
    _save_screenshot(page, tmp_path, "report_hostile")
    assert seen.requests == [] and seen.errors == []
    page.close()
