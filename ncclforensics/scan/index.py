"""index.html of a scan: one self-contained page (inline CSS/JS/SVG, no network) over the summary."""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from pathlib import Path

import jinja2
import polars as pl

from ncclforensics import __version__
from ncclforensics.atomic import atomic_write
from ncclforensics.model import CAUSES
from ncclforensics.times import GENERATED_SECOND, TABLE, now_text, utc_text
from ncclforensics.words import human_bytes

TABLE_LIMIT = 20_000  # rows in the page's run table; summary.csv always has them all
OFFENDER_LIMIT = 200
FAILED = "analysis failed"  # the row of a run whose analysis failed, beside the root causes
COLORS = {**{c.value: cause.color for c, cause in CAUSES.items()}, FAILED: "#333333"}


def _cls(r: dict) -> str:
    return r["root_cause"] if r["status"] == "ok" and r["root_cause"] else FAILED


def _href(r: dict) -> str | None:
    if r.get("report"):
        return f"runs/{r['id']}/report.html"
    if r["status"] == "ok":
        return f"runs/{r['id']}/diagnosis.json"
    return f"runs/{r['id']}/result.json"


def _when(r: dict) -> dt.datetime | None:
    return r.get("first_failure") or r.get("last_event")


def _offenders(rows: list[dict], key_xid: str, key_culprit: str) -> list[dict]:
    """Hosts (or GPUs) named by Xids or as culprits in two or more runs."""
    xid_runs: dict[str, set[str]] = defaultdict(set)
    culprit_runs: dict[str, set[str]] = defaultdict(set)
    codes: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        for h in r.get(key_xid) or []:
            xid_runs[h].add(r["id"])
        for h in r.get(key_culprit) or []:
            culprit_runs[h].add(r["id"])
        if key_xid == "xid_hosts":
            for x in r.get("xids") or []:
                code, _, host = x.partition("@")
                codes[host][code] += 1
    by_id = {r["id"]: r for r in rows}
    out = []
    for name in set(xid_runs) | set(culprit_runs):
        ids = sorted(xid_runs[name] | culprit_runs[name], key=lambda i: by_id[i]["path"])
        if len(ids) < 2:
            continue
        out.append({
            "name": name, "runs": len(ids), "xid_runs": len(xid_runs[name]), "culprit_runs": len(culprit_runs[name]),
            "codes": ", ".join(f"{c}×{n}" for c, n in codes[name].most_common()),
            "links": [{"path": by_id[i]["path"], "href": _href(by_id[i])} for i in ids[:30]],
            "more": max(0, len(ids) - 30),
        })
    out.sort(key=lambda o: (-o["runs"], -o["xid_runs"], o["name"]))
    return out[:OFFENDER_LIMIT]


MAX_BUCKETS = 180


def _start(d: dt.date, unit: str) -> dt.date:
    if unit == "day":
        return d
    if unit == "week":
        return d - dt.timedelta(days=d.weekday())
    return d.replace(day=1)


def _next(d: dt.date, unit: str) -> dt.date:
    if unit == "day":
        return d + dt.timedelta(days=1)
    if unit == "week":
        return d + dt.timedelta(days=7)
    return (d.replace(day=28) + dt.timedelta(days=4)).replace(day=1)


CHART_W, CHART_H, LEFT, RIGHT, TOP, BASE = 960, 270, 44, 16, 16, 200  # the SVG's own units (viewBox)
MIN_BUCKETS = 7  # a run or two on one day still sits on a readable axis: a week around it


def _timeline(rows: list[dict]) -> dict:
    """Stacked bars per day, week or month (the finest that fits MAX_BUCKETS), empty ones included,
    laid out in a fixed viewBox the page scales to the card's width."""
    dated = [(t.astimezone(dt.UTC).date(), _cls(r)) for r in rows if (t := _when(r)) is not None]
    if not dated:
        return {"bars": [], "undated": len(rows), "unit": "day", "labels": [], "max": 0, "ticks": []}
    lo, hi = min(d for d, _ in dated), max(d for d, _ in dated)
    span = (hi - lo).days
    unit = "day" if span < MAX_BUCKETS else "week" if span < 7 * MAX_BUCKETS else "month"
    counts: dict[dt.date, Counter] = defaultdict(Counter)
    for d, c in dated:
        counts[_start(d, unit)][c] += 1
    keys, k = [], _start(lo, unit)
    while k <= hi:
        keys.append(k)
        k = _next(k, unit)
    while unit == "day" and len(keys) < MIN_BUCKETS:  # pad both sides with empty days
        keys = [keys[0] - dt.timedelta(days=1), *keys] if len(keys) % 2 else [*keys, keys[-1] + dt.timedelta(days=1)]
    top = max(sum(c.values()) for c in counts.values())
    n = len(keys)
    slot = (CHART_W - LEFT - RIGHT) / n
    bar_w = max(1.0, min(slot * 0.8, 56.0))
    chart_h = BASE - TOP
    bars, labels = [], []
    step = max(1, -(-90 // int(max(slot, 1))))  # a label every ~90 units
    for i, key in enumerate(keys):
        label = key.strftime("%Y-%m") if unit == "month" else key.isoformat()
        x = LEFT + i * slot + (slot - bar_w) / 2
        y = float(BASE)
        segs = []
        for cls, cnt in sorted(counts.get(key, Counter()).items()):
            h = max(1.0, chart_h * cnt / top)
            y -= h
            segs.append({"y": round(y, 1), "h": round(h, 1), "color": COLORS.get(cls, "#888"),
                         "tip": f"{label}: {cls} {cnt}"})
        bars.append({"x": round(x, 1), "w": round(bar_w, 1), "segs": segs})
        if i % step == 0:
            labels.append({"x": round(LEFT + i * slot + slot / 2, 1), "text": label})
    ticks = sorted({0, top} | ({top // 2} if top >= 4 else set()))
    return {"bars": bars, "undated": len(rows) - len(dated), "unit": unit, "labels": labels, "max": top,
            "ticks": [{"y": round(BASE - chart_h * t / top, 1), "text": t} for t in ticks],
            "w": CHART_W, "h": CHART_H, "left": LEFT, "base": BASE}


def page_context(df: pl.DataFrame, *, root: str, stats: dict) -> dict:
    rows = df.to_dicts()
    by_class = Counter(_cls(r) for r in rows)
    total = max(1, len(rows))
    most = max(by_class.values(), default=1)
    classes = [{"name": c, "n": n, "pct": round(100 * n / total, 1), "width": round(100 * n / most, 1),
                "color": COLORS.get(c, "#888")} for c, n in by_class.most_common()]
    table = []
    for r in rows[:TABLE_LIMIT]:
        when = _when(r)
        table.append({
            "path": r["path"], "href": _href(r), "status": r["status"], "cls": _cls(r),
            "color": COLORS.get(_cls(r), "#888"),
            "conf": "" if r["confidence"] is None else f"{r['confidence']:.2f}",
            "conf_v": "" if r["confidence"] is None else r["confidence"],
            "culprits": ", ".join(map(str, r["culprit_ranks"] or [])),
            "culprit_hosts": ", ".join(r["culprit_hosts"] or []),
            "collective": " #".join(str(x) for x in (r["op"], r["seq"]) if x is not None),
            "when": utc_text(when, TABLE) or "", "when_v": when.isoformat() if when else "",
            "xids": ", ".join(r["xids"] or []), "hosts": len(r["hosts"] or []),
            "hosts_list": ", ".join((r["hosts"] or [])[:50]),
            "world": "" if r["world_size"] is None else r["world_size"],
            "size": human_bytes(r["bytes"]), "size_v": r["bytes"] or 0,
            "note": r["error"] or r["title"] or "",
        })
    return {
        "root": root, "generated": now_text(GENERATED_SECOND),
        "version": __version__, "stats": stats, "n_runs": len(rows),
        "n_failed": sum(1 for r in rows if r["status"] != "ok"), "classes": classes,
        "hosts": _offenders(rows, "xid_hosts", "culprit_hosts"),
        "gpus": _offenders(rows, "xid_gpus", "culprit_gpus"),
        "timeline": _timeline(rows), "table": table, "truncated": max(0, len(rows) - TABLE_LIMIT),
        "colors": [{"name": k, "color": v} for k, v in COLORS.items() if k in by_class],
    }


def render_index(df: pl.DataFrame, *, root: str, stats: dict) -> str:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.from_string(TEMPLATE).render(page_context(df, root=root, stats=stats))


def write_index(df: pl.DataFrame, out_dir: Path, *, root: str, stats: dict) -> Path:
    path = out_dir / "index.html"
    atomic_write(path, render_index(df, root=root, stats=stats))
    return path


TEMPLATE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ncclforensics scan: {{ root }}</title>
<style>
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1f2937;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header .sub{color:#cbd5e1;font-size:13px;overflow-wrap:anywhere}
main{padding:16px 24px;max-width:1500px}
section{background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:12px 16px;margin:0 0 16px;min-width:0}
h2{font-size:16px;margin:0 0 10px}
.facts span{display:inline-block;margin-right:18px}.facts b{font-size:18px}
.bars .row{display:flex;align-items:center;margin:3px 0;gap:8px}.bars .lbl{flex:0 0 150px;overflow-wrap:anywhere}
.bars .track{flex:0 1 420px;min-width:0}
.bars .bar{display:block;height:16px;border-radius:2px;min-width:2px}.bars .n{flex:0 0 auto;color:#555}
/* a table wider than its card scrolls inside it; the page itself never does */
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #eee;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f3f4f6;position:sticky;top:0}
table.sortable th{cursor:pointer;user-select:none;white-space:nowrap}
table.sortable th[data-dir=asc]::after{content:" \25B2"}table.sortable th[data-dir=desc]::after{content:" \25BC"}
td.path{overflow-wrap:anywhere;min-width:9em;max-width:26em}td.note{min-width:10em;max-width:30em;color:#444}
td.links{overflow-wrap:anywhere;min-width:12em}
td.nw{white-space:nowrap}td.when{min-width:6.5em}
.chip{display:inline-block;padding:0 6px;border-radius:8px;color:#fff;font-size:12px;white-space:nowrap}
.muted{color:#777}.err{color:#b91c1c}
input#filter{padding:4px 8px;width:320px;max-width:100%;margin-bottom:8px}
.legend span{margin-right:12px;white-space:nowrap;display:inline-block}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
svg.over-time{display:block;width:100%;min-width:520px;height:auto}
svg.over-time text{font-size:13px;fill:#555}
.opt-note{display:none}
@media (max-width:1100px){.opt{display:none}.opt-note{display:block}table.sortable th{white-space:normal}
td.nw{white-space:normal}
/* the seven columns left share the card's width; below ~560 px the table scrolls inside its card */
#runs{table-layout:fixed;min-width:520px}#runs td{overflow-wrap:anywhere;min-width:0;max-width:none}
#runs th:nth-child(1){width:22%}#runs th:nth-child(2){width:18%}#runs th:nth-child(3){width:7%}
#runs th:nth-child(4){width:9%}#runs th:nth-child(6){width:13%}#runs th:nth-child(7){width:13%}
#runs .chip{white-space:normal;overflow-wrap:anywhere}}
@media (max-width:600px){main{padding:10px}header{padding:10px 12px}.bars .lbl{flex-basis:110px}}
</style></head>
<body>
{% macro links(h) %}{% for l in h.links %}<a href="{{ l.href }}">{{ l.path }}</a>{% if not loop.last %}, {% endif %}
{% endfor %}{% if h.more %} … and {{ h.more }} more{% endif %}{% endmacro %}
<header><h1>ncclforensics scan</h1>
<div class="sub">{{ root }} · {{ generated }} · ncclforensics {{ version }}</div></header>
<main>
<section class="facts">
<span><b>{{ n_runs }}</b> runs</span>
<span><b>{{ n_failed }}</b> could not be analyzed</span>
<span><b>{{ stats.analyzed }}</b> analyzed this scan</span>
<span><b>{{ stats.cached }}</b> unchanged (from cache)</span>
</section>

<section><h2>Root causes</h2><div class="bars">
{% for c in classes %}
<div class="row"><span class="lbl">{{ c.name }}</span>
<span class="track"><span class="bar" style="width:{{ c.width }}%;background:{{ c.color }}"></span></span>
<span class="n">{{ c.n }} ({{ c.pct }} %)</span></div>
{% endfor %}
</div></section>

<section><h2>Repeat-offender hosts</h2>
{% if hosts %}
<p class="muted">Hosts with Xids or culprit ranks in two or more runs.</p>
<div class="scroll"><table class="sortable"><thead><tr><th>host</th><th data-t="n">runs</th>
<th data-t="n">with Xids</th><th data-t="n">as culprit</th><th>Xid codes (runs)</th><th>runs</th></tr></thead><tbody>
{% for h in hosts %}
<tr><td class="nw">{{ h.name }}</td><td>{{ h.runs }}</td><td>{{ h.xid_runs }}</td><td>{{ h.culprit_runs }}</td>
<td>{{ h.codes }}</td><td class="links">{{ links(h) }}</td></tr>
{% endfor %}
</tbody></table></div>
{% else %}<p class="muted">No host has Xids or culprit ranks in more than one run.</p>{% endif %}
</section>

<section><h2>Repeat-offender GPUs</h2>
{% if gpus %}
<p class="muted">GPUs named by Xids (host + PCI bus id) or holding a culprit rank (host + local rank)
in two or more runs.</p>
<div class="scroll"><table class="sortable"><thead><tr><th>GPU</th><th data-t="n">runs</th><th data-t="n">with Xids</th>
<th data-t="n">as culprit</th><th>runs</th></tr></thead><tbody>
{% for h in gpus %}
<tr><td class="nw">{{ h.name }}</td><td>{{ h.runs }}</td><td>{{ h.xid_runs }}</td><td>{{ h.culprit_runs }}</td>
<td class="links">{{ links(h) }}</td></tr>
{% endfor %}
</tbody></table></div>
{% else %}<p class="muted">No GPU is named in more than one run.</p>{% endif %}
</section>

<section><h2>Failures over time</h2>
{% if timeline.bars %}
<p class="muted">Runs per {{ timeline.unit }}{% if timeline.unit == "week" %} (starting Mondays){% endif %}
 by first failure time (else the run's last log timestamp), UTC.
{% if timeline.undated %} {{ timeline.undated }} run(s) have no timestamp.{% endif %}</p>
<div class="scroll">
<svg class="over-time" viewBox="0 0 {{ timeline.w }} {{ timeline.h }}" preserveAspectRatio="xMinYMin meet"
 role="img" aria-label="failures over time">
<line x1="{{ timeline.left - 4 }}" y1="{{ timeline.base }}" x2="{{ timeline.w }}" y2="{{ timeline.base }}"
 stroke="#999"/>
{% for t in timeline.ticks %}<text x="{{ timeline.left - 8 }}" y="{{ t.y + 4 }}" text-anchor="end">{{ t.text }}</text>
{% endfor %}
{% for b in timeline.bars %}{% for s in b.segs %}
<rect x="{{ b.x }}" y="{{ s.y }}" width="{{ b.w }}" height="{{ s.h }}" fill="{{ s.color }}">
<title>{{ s.tip }}</title></rect>
{% endfor %}{% endfor %}
{% for l in timeline.labels %}
<text x="{{ l.x }}" y="{{ timeline.base + 16 }}"
 transform="rotate(35 {{ l.x }} {{ timeline.base + 16 }})">{{ l.text }}</text>
{% endfor %}
</svg></div>
<div class="legend">
{% for c in colors %}<span><i style="background:{{ c.color }}"></i>{{ c.name }}</span>{% endfor %}
</div>
{% else %}<p class="muted">No run has a timestamp.</p>{% endif %}
</section>

<section><h2>Runs</h2>
<input id="filter" type="search" placeholder="filter rows (any text)" aria-label="filter rows">
{% if truncated %}
<p class="muted">The first {{ table|length }} runs by path; {{ truncated }} more are in summary.csv.</p>
{% endif %}
<p class="muted opt-note">Narrow window: culprit hosts, Xids, hosts, world size and size are in summary.csv and in
each report; widen the window to see them here.</p>
<div class="scroll">
<table class="sortable" id="runs"><thead><tr>
<th>run</th><th>root cause</th><th data-t="n">conf.</th><th>culprit ranks</th><th class="opt">culprit hosts</th>
<th>collective</th><th>first failure (UTC)</th><th class="opt">Xids</th><th class="opt" data-t="n">hosts</th>
<th class="opt" data-t="n">world</th><th class="opt" data-t="n">size</th><th>title / error</th>
</tr></thead><tbody>
{% for r in table %}
<tr><td class="path">{% if r.href %}<a href="{{ r.href }}">{{ r.path }}</a>{% else %}{{ r.path }}{% endif %}</td>
<td><span class="chip" style="background:{{ r.color }}">{{ r.cls }}</span>
{% if r.status != "ok" %} <span class="err">{{ r.status }}</span>{% endif %}</td>
<td data-v="{{ r.conf_v }}">{{ r.conf }}</td>
<td>{{ r.culprits }}</td><td class="opt">{{ r.culprit_hosts }}</td><td class="nw">{{ r.collective }}</td>
<td class="when" data-v="{{ r.when_v }}">{{ r.when }}</td><td class="opt">{{ r.xids }}</td>
<td class="opt" title="{{ r.hosts_list }}">{{ r.hosts }}</td><td class="opt" data-v="{{ r.world }}">{{ r.world }}</td>
<td class="opt nw" data-v="{{ r.size_v }}">{{ r.size }}</td>
<td class="note{% if r.status != 'ok' %} err{% endif %}">{{ r.note }}</td></tr>
{% endfor %}
</tbody></table>
</div>
</section>
</main>
<script>
(function () {
  function key(td) { return td.dataset.v !== undefined ? td.dataset.v : td.textContent.trim(); }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var ths = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(ths, function (th, i) {
      th.addEventListener("click", function () {
        var dir = th.dataset.dir === "asc" ? "desc" : "asc";
        Array.prototype.forEach.call(ths, function (h) { delete h.dataset.dir; });
        th.dataset.dir = dir;
        var num = th.dataset.t === "n", sign = dir === "asc" ? 1 : -1;
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a.cells[i]), y = key(b.cells[i]);
          if (num) {
            if (x === "" || y === "") { return x === y ? 0 : (x === "" ? 1 : -1); }
            return sign * (parseFloat(x) - parseFloat(y));
          }
          return sign * x.localeCompare(y);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  var f = document.getElementById("filter");
  f.addEventListener("input", function () {
    var q = f.value.toLowerCase();
    Array.prototype.forEach.call(document.getElementById("runs").tBodies[0].rows, function (r) {
      r.hidden = q !== "" && r.textContent.toLowerCase().indexOf(q) < 0;
    });
  });
})();
</script>
</body></html>
"""
