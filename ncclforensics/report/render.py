"""Render the one-file HTML incident report from an Analysis (jinja2, autoescaped, offline)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import jinja2

from ncclforensics import __version__
from ncclforensics.diskcache import template_cache
from ncclforensics.incident import IncidentContext, build_context
from ncclforensics.jsonout import diagnosis_dict
from ncclforensics.outputs import HTML_CONTEXT_LINES
from ncclforensics.report import bundle, charts
from ncclforensics.report.context import build_view
from ncclforensics.times import GENERATED_MINUTE, utc_text

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class PlotlyAsset:
    """How the report gets plotly.js: inline (gzip, base64) or from a shared file next to it (a scan)."""

    package: str
    version: str
    license: str
    src: str | None  # relative URL of the shared copy
    gz_base64: str | None  # the inline bundle


@functools.cache
def environment() -> jinja2.Environment:
    # autoescape=True, not select_autoescape(): the latter leaves *.html.j2 unescaped (STYLE.md habit 8)
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, bytecode_cache=template_cache(),
    )


@functools.cache
def asset(name: str) -> str:
    """Our own CSS/JS, inlined with |safe by the template (never log data)."""
    return (TEMPLATES / name).read_text(encoding="utf-8")


def plotly_asset(src: str | None) -> PlotlyAsset:
    b = bundle.bundle()
    return PlotlyAsset(package=b.package, version=b.version, license=b.license, src=src,
                       gz_base64=None if src else bundle.gzipped_base64())


def render_report(analysis, repro=None, *, generated: datetime | None = None, plotly_src: str | None = None,
                  incident: IncidentContext | None = None) -> str:
    """The report as one HTML string. `plotly_src`: a relative URL of a shared plotly.js file (scan
    reports); None inlines the bundle. `incident`: context lines already read (else read here)."""
    if incident is None:
        incident = build_context(analysis, radius=HTML_CONTEXT_LINES)
    view = build_view(analysis, repro, incident=incident)
    frontier = charts.frontier_chart(view.frontier)
    timeline = charts.timeline_chart(view.timeline)
    diag_doc = diagnosis_dict(analysis.diagnosis, repro)
    when = utc_text(generated or datetime.now(UTC), GENERATED_MINUTE)
    return environment().get_template("report.html.j2").render(
        v=view,
        css=asset("report.css"),
        js=asset("report.js"),
        # the only |safe values of the template are our own CSS and JS; chart specs go through |tojson
        plotly=plotly_asset(plotly_src) if (frontier or timeline) else None,
        frontier_chart=frontier,
        timeline_chart=timeline,
        diagnosis_json=json.loads(json.dumps(diag_doc, default=str)),
        tool_version=__version__,
        generated=when,
    )
