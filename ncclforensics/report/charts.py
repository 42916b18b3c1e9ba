"""View-model -> plotly figures as HTML fragments (plotly.js itself is inlined once by render.py)."""

from __future__ import annotations

import functools
import html
from datetime import datetime, timedelta

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ncclforensics.report.chartdata import STATE_TEXT, STATES, FrontierView, RankState, TimelineView

COLORS = {
    "culprit": "#c62828",
    "crashed": "#ef6c00",
    "waiting": "#1565c0",
    "seen": "#90a4ae",
    "no_log": "#e6e6e6",
}
INK = "#1f2933"
MUTED = "#607080"
GRID = "#eceff1"
FONT = dict(family="system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", size=13, color=INK)
CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False,
          "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d", "toImage"]}
STRIP_TEXT_MAX = 24  # print the op inside each rank's cell up to this many ranks
BAND_MAX = 40  # shade the culprit ranks' columns up to this many culprits


def _e(s: object) -> str:
    """Log-derived text shown by plotly: plotly reads a few HTML tags in labels, so escape it."""
    return html.escape(str(s), quote=False) if s is not None else ""


@functools.cache
def plotly_js() -> str:
    """The plotly.js bundle shipped inside the installed plotly package (no network)."""
    import plotly.offline

    return plotly.offline.get_plotlyjs()


def _to_div(fig: go.Figure, div_id: str) -> str:
    # a fixed div id keeps the page deterministic (golden test) and lets the tests find the chart
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=CONFIG,
                       default_width="100%", default_height=f"{int(fig.layout.height)}px")


def _layout(fig: go.Figure, *, height: int) -> None:
    fig.update_layout(
        # "none": plotly's default template adds ~8 KB of JSON per chart; we set what we use
        template="none", height=height, font=FONT, paper_bgcolor="white", plot_bgcolor="white",
        margin=dict(l=70, r=20, t=30, b=50), hoverlabel=dict(font_size=13, align="left"),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0),
    )


def _strip_hover(s: RankState) -> str:
    lines = [f"<b>rank {s.rank}</b>"]
    if s.host:
        lines.append(f"host {_e(s.host)}")
    lines.append(STATE_TEXT[s.state])
    if s.where:
        lines.append(f"in {_e(s.where)}")
    return "<br>".join(lines)


def _cell_text(s: RankState) -> str:
    text = f"<b>{STATE_TEXT[s.state]}</b>"
    return text + ("<br>" + _e(s.where) if s.where else "")


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
        texttemplate="%{text}" if show_text else None, textfont=dict(size=12, color="white"),
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


def frontier_chart(view: FrontierView) -> str | None:
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
    if npg:
        placed = {r.rank for pg in view.pgs for r in pg.ranks if r.culprit}
        for r in [c for c in view.culprits if c not in placed][:BAND_MAX // 4]:
            fig.add_annotation(x=r, y=0.8, xref="x", yref="y domain", text=f"rank {r}:<br>no SeqNum<br>in its logs",
                               showarrow=False, font=dict(color=COLORS["culprit"], size=13))
    if view.strip:
        fig.add_trace(_strip_trace(view), row=rows, col=1)
        fig.update_yaxes(title_text="state", showticklabels=False, ticks="", row=rows, col=1, fixedrange=True)
    n = len(view.strip) or max((len(p.ranks) for p in view.pgs), default=1)
    fig.update_xaxes(title_text="rank", row=rows, col=1)
    fig.update_xaxes(tickformat="d", showgrid=False, zeroline=False, range=[-0.5, max(n, 1) - 0.5],
                     **(dict(dtick=1) if n <= 32 else {}))
    _mark_culprits(fig, view, n=n, rows=rows)
    _layout(fig, height=120 + 260 * npg + (110 if npg else 150))
    fig.update_layout(hovermode="x" if npg else "closest")
    return _to_div(fig, "chart-frontier")


def _seq_axis(fig: go.Figure, view: FrontierView, pg, *, row: int) -> None:
    seqs = [x for r in pg.ranks for x in (r.last_completed, r.last_enqueued, r.timeout_seq, r.current_seq)
            if x is not None]
    lo, hi = min(seqs), max(seqs)
    # a few SeqNums apart: one tick per collective, and room around a flat line
    fig.update_yaxes(title_text=_e(f"PG {pg.pg} SeqNum"), tickformat="d", row=row, col=1, gridcolor=GRID,
                     zeroline=False, **(dict(dtick=1, range=[lo - 1.5, hi + 1.5]) if hi - lo <= 12 else {}))
    if pg.pg == view.stuck_pg and view.stuck_seq is not None:
        fig.add_hline(y=view.stuck_seq, line=dict(color=MUTED, dash="dot", width=1), row=row, col=1,
                      annotation_text=_e(f"stuck: {view.stuck_op or '?'} #{view.stuck_seq}"),
                      annotation_position="top left", annotation_font=dict(color=MUTED, size=12))


def _mark_culprits(fig: go.Figure, view: FrontierView, *, n: int, rows: int) -> None:
    """A red band down each culprit's column, and a label on the strip where one rank is a pixel wide."""
    if not 0 < len(view.culprits) <= BAND_MAX:
        return
    half = max(0.5, n / 300)  # at 1,024 ranks one rank is a pixel: keep the band visible
    label = view.strip and n > STRIP_TEXT_MAX and len(view.culprits) <= 8
    axis = str(rows) if rows > 1 else ""
    for r in view.culprits:
        fig.add_vrect(x0=r - half, x1=r + half, fillcolor=COLORS["culprit"], opacity=0.18, line_width=0,
                      layer="above", row="all", col=1)
        if label:
            fig.add_annotation(x=r, y=1, xref=f"x{axis}", yref=f"y{axis} domain", text=f"<b>rank {r}</b>",
                               showarrow=True, arrowhead=2, arrowcolor=COLORS["culprit"], ax=0, ay=-22,
                               font=dict(color=COLORS["culprit"], size=13), bgcolor="white")


def _tl_hover(e) -> str:
    who = []
    if e.rank is not None:
        who.append(f"rank {e.rank}")
    if e.host:
        who.append(_e(e.host))
    head = f"<b>{_e(e.kind)}</b>" + (" · " + " · ".join(who) if who else "")
    return "<br>".join([head, _e(e.ts[:23]) + " UTC", _e(e.where), _e(e.text)])


def _time_range(view: TimelineView) -> dict:
    """Events within a second or two: widen the axis so it reads in seconds, not microseconds."""
    first = datetime.fromisoformat(view.events[0].ts)
    last = datetime.fromisoformat(view.events[-1].ts)
    if last - first >= timedelta(seconds=4):
        return {}
    mid = first + (last - first) / 2
    return {"range": [(mid - timedelta(seconds=3)).isoformat(sep=" "), (mid + timedelta(seconds=3)).isoformat(sep=" ")]}


def timeline_chart(view: TimelineView) -> str | None:
    """Key events over time, one lane per kind of event; the root event is a star."""
    if not view.events:
        return None
    fig = go.Figure()
    groups = (
        ("other events", lambda e: not e.culprit and not e.root,
         dict(color="#78909c", size=8, symbol="circle", opacity=0.75)),
        ("on the culprit", lambda e: e.culprit and not e.root,
         dict(color=COLORS["culprit"], size=10, symbol="diamond")),
        ("root event", lambda e: e.root,
         dict(color=COLORS["culprit"], size=20, symbol="star", line=dict(color="#5d0000", width=1))),
    )
    for name, pick, marker in groups:
        pts = [e for e in view.events if pick(e)]
        if not pts:
            continue
        fig.add_trace(go.Scatter(
            x=[e.ts for e in pts], y=[e.lane for e in pts], mode="markers", name=name, marker=marker,
            customdata=[_tl_hover(e) for e in pts], hovertemplate="%{customdata}<extra></extra>",
        ))
    ft = view.first_timeout
    if ft is not None:
        fig.add_annotation(x=ft.ts, y=ft.lane, text="first timeout", showarrow=True, arrowhead=2, ax=0, ay=-28,
                           font=dict(color=MUTED, size=12))
    root = next((e for e in view.events if e.root), None)
    if root is not None:
        who = f"rank {root.rank}" if root.rank is not None else _e(root.host)
        label = "root" + (f" · {who}" if who else "")
        fig.add_annotation(x=root.ts, y=root.lane, text=f"<b>{label}</b>", showarrow=True, arrowhead=2, ax=0,
                           ay=-32, font=dict(color=COLORS["culprit"], size=13))
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(view.lanes)), type="category",
                     gridcolor=GRID, fixedrange=True)
    fig.update_xaxes(title_text="time (UTC)", gridcolor=GRID, **_time_range(view))
    _layout(fig, height=150 + 34 * len(view.lanes))
    fig.update_layout(margin=dict(l=170, t=40))
    return _to_div(fig, "chart-timeline")
