"""Render the one-file HTML incident report from an Analysis (jinja2, autoescaped, offline)."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from pathlib import Path

import jinja2

from ncclforensics import __version__
from ncclforensics.jsonout import diagnosis_dict
from ncclforensics.report import charts
from ncclforensics.report.chartdata import STATE_TEXT, STATES
from ncclforensics.report.context import build_view

TEMPLATES = Path(__file__).parent / "templates"


@functools.cache
def environment() -> jinja2.Environment:
    # autoescape=True, not select_autoescape(): the latter leaves *.html.j2 unescaped (STYLE.md habit 8)
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
    )


@functools.cache
def _asset(name: str) -> str:
    """Our own CSS/JS, inlined with |safe by the template (never log data)."""
    return (TEMPLATES / name).read_text(encoding="utf-8")


def render_report(analysis, repro=None, *, generated: datetime | None = None) -> str:
    view = build_view(analysis, repro)
    frontier = charts.frontier_chart(view.frontier)
    timeline = charts.timeline_chart(view.timeline)
    diag_doc = diagnosis_dict(analysis.diagnosis, repro)
    when = (generated or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    return environment().get_template("report.html.j2").render(
        v=view,
        css=_asset("report.css"),
        js=_asset("report.js"),
        # the only |safe values of the template: our CSS/JS, plotly.js, and plotly's own chart divs
        # (log text inside a chart is JSON-escaped by plotly and HTML-escaped by charts._e)
        plotly_js=charts.plotly_js() if (frontier or timeline) else None,
        frontier_chart=frontier,
        timeline_chart=timeline,
        states=[(s, STATE_TEXT[s], charts.COLORS[s]) for s in STATES],
        diagnosis_json=json.loads(json.dumps(diag_doc, default=str)),
        tool_version=__version__,
        generated=when,
    )
