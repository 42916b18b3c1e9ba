"""A scan's summary -> the view-model of its index.html (one self-contained page: inline CSS/JS/SVG, no network)."""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from pathlib import Path

import polars as pl

from ncclforensics import __version__
from ncclforensics.atomic import atomic_write
from ncclforensics.model import CAUSES
from ncclforensics.times import GENERATED_SECOND, TABLE, now_text, utc_text
from ncclforensics.words import human_bytes

TEMPLATE = "scan_index.html.j2"  # in report/templates, with scan_index.css and scan_index.js
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
    """The page, from report/templates/scan_index.html.j2 and the report's one jinja environment."""
    from ncclforensics.report.render import asset, environment

    return environment().get_template(TEMPLATE).render(
        page_context(df, root=root, stats=stats), css=asset("scan_index.css"), js=asset("scan_index.js"))


def write_index(df: pl.DataFrame, out_dir: Path, *, root: str, stats: dict) -> Path:
    path = out_dir / "index.html"
    atomic_write(path, render_index(df, root=root, stats=stats))
    return path
