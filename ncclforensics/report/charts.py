"""View-models -> plotly figure specs (JSON data; the report's script draws them once plotly.js is loaded)."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ncclforensics.report import bundle
from ncclforensics.report.chartdata import (
    STATE_COLORS,
    STATE_SHORT,
    STATE_TEXT,
    STATES,
    FrontierView,
    RankState,
)
from ncclforensics.report.timeline import CATEGORIES, FR_STEPS, STYLES, Category, TimelineEvent, TimelineView
from ncclforensics.words import cut

COLORS = STATE_COLORS
OTHER_STYLE = Category("other", "#8d6e63", "circle")  # a category named after a source
INK = "#1f2933"
MUTED = "#607080"
GRID = "#eceff1"
FONT = dict(family="system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", size=13, color=INK)
CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False,
          "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d", "toImage"]}
STRIP_TEXT_MAX = 24  # print the state inside each rank's cell up to this many ranks
BAND_MAX = 40  # shade the culprit ranks' columns up to this many culprits
LABEL_PX = 70  # room one culprit label needs on the rank axis
NARROW_PLOT_PX = 300  # the plot area at a phone's width: culprit labels closer than this share one label


@dataclass(frozen=True)
class Chart:
    """One figure for the template: a div id, its height, and the spec plotly.newPlot reads."""

    id: str
    height: int
    spec: dict


def _e(s: object) -> str:
    """Log-derived text shown by plotly: plotly reads a few HTML tags in labels, so escape it."""
    return html.escape(str(s), quote=False) if s is not None else ""


def _chart(fig: go.Figure, div_id: str) -> Chart:
    bundle.check_traces(t.type for t in fig.data)
    spec = json.loads(fig.to_json())  # plotly's own encoder: numpy values, dates
    spec["config"] = CONFIG
    return Chart(id=div_id, height=int(fig.layout.height), spec=spec)


def _layout(fig: go.Figure, *, height: int) -> None:
    fig.update_layout(
        # "none": plotly's default template adds ~8 KB of JSON per chart; we set what we use
        template="none", height=height, font=FONT, paper_bgcolor="white", plot_bgcolor="white",
        margin=dict(l=70, r=20, t=30, b=50), hoverlabel=dict(font_size=13, align="left"),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0),
    )


# -- the frontier: ranks x SeqNum, and each rank's state ----------------------------------
def _strip_hover(s: RankState) -> str:
    lines = [f"<b>rank {s.rank}</b>"]
    if s.host:
        lines.append(f"host {_e(s.host)}")
    lines.append(STATE_TEXT[s.state])
    if s.where:
        lines.append(f"in {_e(s.where)}")
    return "<br>".join(lines)


def _cell_text(s: RankState) -> str:
    return STATE_SHORT[s.state] + ("<br>" + _e(s.where) if s.where else "")


def _strip_trace(view: FrontierView) -> go.Heatmap:
    """One cell per rank coloured by its state: legible at 1,024 ranks, hover for detail."""
    strip = view.strip
    k = len(STATES)
    scale = []
    for i, st in enumerate(STATES):
        scale += [[i / k, COLORS[st]], [(i + 1) / k, COLORS[st]]]
    show_text = len(strip) <= STRIP_TEXT_MAX
    return go.Heatmap(
        x=[s.rank for s in strip], y=["state"],
        z=[[STATES.index(s.state) + 0.5 for s in strip]], zmin=0, zmax=k, colorscale=scale, showscale=False,
        xgap=1 if len(strip) <= 256 else 0,
        text=[[_cell_text(s) if show_text else "" for s in strip]],
        # no textfont: plotly's "auto" size fits the cell and its "auto" colour contrasts with it
        texttemplate="%{text}" if show_text else None,
        customdata=[[_strip_hover(s) for s in strip]], hovertemplate="%{customdata}<extra></extra>",
        name="state",
    )


def _pos_traces(pg_index: int, view: FrontierView) -> list[go.Scatter]:
    pgf = view.pgs[pg_index]
    rows = pgf.ranks
    n = len(view.strip) or len(rows)
    size = 9 if n <= 64 else 6 if n <= 512 else 4
    first = pg_index == 0
    traces = []

    def hover(r) -> str:
        parts = [f"<b>rank {r.rank}</b>" + (f" · {_e(r.host)}" if r.host else "") + f" · PG {_e(pgf.pg)}"]
        if r.last_completed is not None:
            parts.append(f"last completed #{r.last_completed}")
        if r.last_enqueued is not None:
            parts.append(f"last enqueued #{r.last_enqueued}")
        if r.timeout_seq is not None:
            parts.append(f"timed out in {_e(r.timeout_op) or '?'} #{r.timeout_seq}")
        if r.current_seq is not None:
            parts.append(f"Flight Recorder / fingerprint: {_e(r.current_op) or '?'} #{r.current_seq}")
        parts.append("<b>culprit</b>")
        return "<br>".join(parts)

    series = (
        ("last completed", "last_completed", None,
         dict(symbol="line-ew-open", color="#2e7d32", size=size + 4, line=dict(width=2, color="#2e7d32"))),
        ("last enqueued", "last_enqueued", None, dict(symbol="triangle-up-open", color="#6a1b9a", size=size)),
        ("timed out in", "timeout_seq", "timeout_op", dict(symbol="x", color="#1565c0", size=size)),
        ("Flight Recorder / fingerprint", "current_seq", "current_op",
         dict(symbol="circle", color="#1565c0", size=size)),
    )
    for name, attr, op_attr, marker in series:
        pts = [r for r in rows if getattr(r, attr) is not None]
        if not pts:
            continue
        # numbers only per point (x, y, op): a long hover string per point would weigh ~0.5 MB at 1,024
        # ranks; the host and the full story are in the strip's and the culprit ring's hover
        traces.append(go.Scatter(
            x=[r.rank for r in pts], y=[getattr(r, attr) for r in pts], mode="markers", name=name,
            marker=marker, legendgroup=name, showlegend=first,
            customdata=[_e(getattr(r, op_attr)) for r in pts] if op_attr else None,
            hovertemplate=f"{name}{' %{customdata}' if op_attr else ''} #%{{y}}<extra>rank %{{x}}</extra>",
        ))
    bad = [r for r in rows if r.culprit]
    if bad:
        ys = [next(v for v in (r.current_seq, r.timeout_seq, r.last_enqueued, r.last_completed) if v is not None)
              for r in bad]
        traces.append(go.Scatter(
            x=[r.rank for r in bad], y=ys, mode="markers", name="culprit", legendgroup="culprit",
            showlegend=first,
            marker=dict(symbol="circle-open", size=size + 12, color=COLORS["culprit"], line=dict(width=3)),
            customdata=[hover(r) for r in bad], hovertemplate="%{customdata}<extra></extra>",
        ))
    return traces


def frontier_chart(view: FrontierView) -> Chart | None:
    """Ranks on x; per PG the SeqNum each rank reached, and below, each rank's state."""
    if not view.strip and not view.pgs:
        return None
    npg = len(view.pgs)
    rows = npg + 1
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        row_heights=[1.0] * npg + [0.28 if npg else 1.0])
    for i, pg in enumerate(view.pgs):
        for tr in _pos_traces(i, view):
            fig.add_trace(tr, row=i + 1, col=1)
        _seq_axis(fig, view, pg, row=i + 1)
    if view.strip:
        fig.add_trace(_strip_trace(view), row=rows, col=1)
        fig.update_yaxes(title_text="state", showticklabels=False, ticks="", row=rows, col=1, fixedrange=True)
    n = len(view.strip) or max((len(p.ranks) for p in view.pgs), default=1)
    fig.update_xaxes(title_text="rank", row=rows, col=1)
    fig.update_xaxes(tickformat="d", showgrid=False, zeroline=False, range=[-0.5, max(n, 1) - 0.5],
                     **(dict(dtick=1) if n <= 32 else {}))
    _mark_culprits(fig, view, n=n, rows=rows)
    _layout(fig, height=120 + 260 * npg + 110 if npg else 210)
    fig.update_layout(hovermode="x" if npg else "closest")
    return _chart(fig, "chart-frontier")


def _seq_axis(fig: go.Figure, view: FrontierView, pg, *, row: int) -> None:
    seqs = [x for r in pg.ranks for x in (r.last_completed, r.last_enqueued, r.timeout_seq, r.current_seq)
            if x is not None]
    lo, hi = min(seqs), max(seqs)
    # a few SeqNums apart: one tick per collective, and room around a flat line
    fig.update_yaxes(title_text=_e(f"PG {pg.pg} SeqNum"), tickformat="d", row=row, col=1, gridcolor=GRID,
                     zeroline=False, **(dict(dtick=1, range=[lo - 1.5, hi + 1.5]) if hi - lo <= 12 else {}))
    if pg.pg == view.stuck_pg and view.stuck_seq is not None:
        # the dotted line is named in the legend, not by a text inside the plot: legend entries never
        # collide with a culprit's label, whatever the width and the number of ranks
        fig.add_hline(y=view.stuck_seq, line=dict(color=MUTED, dash="dot", width=1), row=row, col=1)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=dict(color=MUTED, dash="dot", width=1),
                                 name=_e(f"stuck: {view.stuck_op or '?'} #{view.stuck_seq}"), hoverinfo="skip"),
                      row=row, col=1)


def culprit_labels(culprits: tuple[int, ...], n: int) -> list[tuple[int, str]]:
    """(x, text) per label: culprits closer on the axis than a label's width at a narrow plot share one,
    so labels cannot overlap at any width (the report's script still separates what it measures)."""
    min_gap = max(1.0, n * LABEL_PX / NARROW_PLOT_PX)
    groups: list[list[int]] = []
    for r in sorted(culprits):
        if groups and r - groups[-1][0] < min_gap:
            groups[-1].append(r)
        else:
            groups.append([r])
    out = []
    for g in groups:
        text = f"rank {g[0]}" if len(g) == 1 else (f"ranks {g[0]}, {g[1]}" if len(g) == 2 else
                                                    f"ranks {g[0]}–{g[-1]} ({len(g)})")
        out.append(((g[0] + g[-1]) // 2, text))
    return out


def _mark_culprits(fig: go.Figure, view: FrontierView, *, n: int, rows: int) -> None:
    """A red band down each culprit's column, and a label on the strip where one rank is a pixel wide."""
    if not 0 < len(view.culprits) <= BAND_MAX:
        return
    half = max(0.5, n / 300)  # at 1,024 ranks one rank is a pixel: keep the band visible
    axis = str(rows) if rows > 1 else ""
    for r in view.culprits:
        fig.add_vrect(x0=r - half, x1=r + half, fillcolor=COLORS["culprit"], opacity=0.18, line_width=0,
                      layer="above", row="all", col=1)
    if not (view.strip and n > STRIP_TEXT_MAX):
        return
    for x, text in culprit_labels(view.culprits, n):
        fig.add_annotation(x=x, y=1, xref=f"x{axis}", yref=f"y{axis} domain", text=f"<b>{text}</b>",
                           showarrow=True, arrowhead=2, arrowcolor=COLORS["culprit"], ax=0, ay=-22,
                           font=dict(color=COLORS["culprit"], size=13), bgcolor="white")


# -- the timeline ---------------------------------------------------------------------------------
def _tl_hover(e: TimelineEvent) -> str:
    who = []
    if e.rank is not None:
        who.append(f"rank {e.rank}")
    if e.host:
        who.append(_e(e.host))
    head = f"<b>{_e(e.category)}</b>" + (" · " + " · ".join(who) if who else "")
    return "<br>".join([head, _e(e.ts[:23]) + " UTC", _e(e.where), _e(e.text)])


def _lane_label(lane: str, culprit: bool) -> str:
    text = _e(cut(lane, 28, fold=False))
    return f'<span style="color:{COLORS["culprit"]}"><b>{text}</b></span>' if culprit else text


def timeline_chart(view: TimelineView) -> Chart | None:
    """Key events and Flight Recorder steps over time, one lane per rank (or host); the root is a star."""
    if not view.events:
        return None
    fig = go.Figure()
    for cat in view.categories:
        pts = [e for e in view.events if e.category == cat and not e.root]
        if not pts:
            continue
        style = STYLES.get(cat, OTHER_STYLE)
        color, symbol = style.color, style.symbol
        small = cat in FR_STEPS or cat == CATEGORIES["step"].label
        labelled = any(e.label for e in pts)
        fig.add_trace(go.Scatter(
            x=[e.ts for e in pts], y=[e.y for e in pts], mode="markers+text" if labelled else "markers",
            name=_e(cat), text=[e.label for e in pts] if labelled else None, textposition="middle right",
            textfont=dict(size=11, color=MUTED),
            marker=dict(color=color, symbol=symbol, size=7 if small else 10, line=dict(width=1.5, color=color)),
            customdata=[_tl_hover(e) for e in pts], hovertemplate="%{customdata}<extra></extra>",
        ))
    if view.root is not None:
        fig.add_trace(go.Scatter(
            x=[view.root.ts], y=[view.root.y], mode="markers", name="root event",
            marker=dict(color=COLORS["culprit"], size=20, symbol="star", line=dict(color="#5d0000", width=1)),
            customdata=[_tl_hover(view.root)], hovertemplate="%{customdata}<extra></extra>",
        ))
    for e, label, color in _annotations(view):
        fig.add_annotation(x=e.ts, y=e.y, text=label, showarrow=True, arrowhead=2, ax=0, ay=-30,
                           font=dict(color=color, size=12), bgcolor="rgba(255,255,255,0.85)")
    ticks = list(reversed(view.lanes))
    culprit = set(view.culprit_lanes)
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(ticks))),
                     ticktext=[_lane_label(x, x in culprit) for x in ticks],
                     # headroom above the top row for the labels that point at its markers
                     range=[-0.6, len(ticks) - 1 + (1.6 if view.root or view.last_seen or view.first_timeout else 0.6)],
                     gridcolor=GRID, zeroline=False, fixedrange=True)
    fig.update_xaxes(title_text="time (UTC)", gridcolor=GRID,
                     **({"range": list(view.x_range)} if view.x_range else {}))
    _layout(fig, height=170 + 30 * len(view.lanes))
    longest = max((len(cut(x, 28, fold=False)) for x in view.lanes), default=8)
    fig.update_layout(margin=dict(l=min(230, 24 + 8 * longest), t=60), hovermode="closest",
                      legend=dict(y=1.0, yanchor="bottom"))
    return _chart(fig, "chart-timeline")


def _annotations(view: TimelineView) -> list[tuple[TimelineEvent, str, str]]:
    out = []
    if view.root is not None:
        who = f"rank {view.root.rank}" if view.root.rank is not None else _e(view.root.host)
        out.append((view.root, "<b>root" + (f" · {who}" if who else "") + "</b>", COLORS["culprit"]))
    elif view.last_seen is not None:
        e = view.last_seen
        who = f"rank {e.rank}" if e.rank is not None else _e(e.host)
        out.append((e, f"<b>{who}: last sign of its own</b>", COLORS["culprit"]))
    if view.first_timeout is not None:
        out.append((view.first_timeout, "first timeout", MUTED))
    return out
