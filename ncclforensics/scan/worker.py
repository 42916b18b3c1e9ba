"""Analyze one run of a scan: the per-run function every engine calls, with its atomic outputs."""

from __future__ import annotations

import json
import time
import traceback
import warnings
from pathlib import Path

from ncclforensics import __version__
from ncclforensics.atomic import TMP_GLOB, atomic_write
from ncclforensics.outputs import FORMATS, DocFormat
from ncclforensics.times import SUMMARY, now_text, utc_text

RESULT_SCHEMA = 1
RESULT = "result.json"
DIAGNOSIS = FORMATS[DocFormat.JSON].file_name
REPORT = FORMATS[DocFormat.HTML].file_name
_TRACEBACK_LIMIT = 20_000


def base_row(spec: dict) -> dict:
    """The columns every row has, analysis or not."""
    return {
        "id": spec["id"], "path": spec["rel"], "kind": spec["kind"], "bytes": spec["size"],
        "files": spec["nfiles"], "tool_version": __version__, "content_hash": spec["key"],
    }


def result_doc(spec: dict, status: str, row: dict, *, error: str | None = None, elapsed: float = 0.0,
               **extra) -> dict:
    """The result.json document of one run: the cache entry and the source of its summary row."""
    full = {**base_row(spec), **row, "status": status, "error": error, "elapsed_s": round(elapsed, 3),
            "analyzed_at": now_text(SUMMARY)}
    return {"schema": RESULT_SCHEMA, "id": spec["id"], "key": spec["key"], "status": status,
            "reports": bool(spec.get("reports", True)), "self_contained": bool(spec.get("self_contained", False)),
            "row": full, **extra}


def error_result(spec: dict, status: str, message: str, elapsed: float = 0.0, **extra) -> dict:
    return result_doc(spec, status, {}, error=message, elapsed=elapsed, **extra)


def _xids(events) -> list[dict]:
    import polars as pl

    if events.is_empty():
        return []
    rows = events.filter(pl.col("kind").cast(pl.Utf8) == "xid").select("host", "code", "extra").to_dicts()
    out = []
    for r in rows:
        pci = None
        try:
            pci = (json.loads(r["extra"]) or {}).get("pci") if r["extra"] else None
        except (ValueError, AttributeError):
            pci = None
        out.append({"code": r["code"], "host": r["host"], "pci": pci})
    return out


def _culprit_gpus(events, culprits: list[int], rank_hosts: dict[int, str | None]) -> list[str]:
    """`host lr<N>` for each culprit rank whose host and local rank the logs name."""
    import polars as pl

    if events.is_empty() or not culprits:
        return []
    lr = (events.filter(pl.col("rank").is_in(culprits) & pl.col("local_rank").is_not_null())
          .group_by("rank").agg(pl.col("local_rank").first()).to_dicts())
    out = []
    for r in sorted(lr, key=lambda x: x["rank"]):
        host = rank_hosts.get(r["rank"])
        if host:
            out.append(f"{host} lr{r['local_rank']}")
    return out


def diagnosis_row(doc: dict, analysis) -> dict:
    """Summary columns from the --json document and the event table."""
    run, v = doc["run"], doc["verdict"]
    events = analysis.ingest.events
    xids = _xids(events)
    rank_hosts = {r["rank"]: r.get("host") for r in doc.get("ranks") or []}
    ff = v.get("first_failure") or {}
    last = events["ts"].max() if not events.is_empty() else None
    coll = v.get("collective") or {}
    return {
        "bytes_read": analysis.ingest.bytes,
        "files_read": run["files"], "files_skipped": len(run.get("skipped") or []), "lines": run["lines"],
        "world_size": run["world_size"], "ranks": len(run.get("ranks_seen") or []),
        "hosts": list(run.get("hosts") or []),
        "root_cause": v["class"], "confidence": v["confidence"], "rule": v.get("rule"), "title": v.get("title"),
        "culprit_ranks": list(v.get("culprit_ranks") or []), "culprit_hosts": list(v.get("culprit_hosts") or []),
        "culprit_gpus": _culprit_gpus(events, list(v.get("culprit_ranks") or []), rank_hosts),
        "pg": coll.get("pg"), "op": coll.get("op_type"), "seq": coll.get("seq"),
        "first_failure": utc_text(ff.get("ts"), SUMMARY), "first_failure_rank": ff.get("rank"),
        "last_event": utc_text(last, SUMMARY),
        "xids": sorted({f"{x['code']}@{x['host'] or '?'}" for x in xids}),
        "xid_codes": sorted({x["code"] for x in xids if x["code"] is not None}),
        "xid_hosts": sorted({x["host"] for x in xids if x["host"]}),
        "xid_gpus": sorted({f"{x['host']} {x['pci']}" for x in xids if x["host"] and x["pci"]}),
    }


ASSETS = "assets"  # OUTDIR/assets/: the plotly.js every per-run report of a scan loads


def shared_plotly_src() -> str:
    """The shared bundle's URL from OUTDIR/runs/<id>/report.html."""
    from ncclforensics.report.bundle import bundle

    return f"../../{ASSETS}/{bundle().asset_name}"


def write_shared_assets(out_dir: Path) -> None:
    """OUTDIR/assets/plotly-cartesian-<version>.min.js and its licence, written once, atomically."""
    from ncclforensics.report.bundle import ASSETS as VENDORED
    from ncclforensics.report.bundle import bundle, plain_js

    d = out_dir / ASSETS
    d.mkdir(parents=True, exist_ok=True)
    js = d / bundle().asset_name
    text = plain_js()
    if not js.exists() or js.stat().st_size != len(text.encode("utf-8")):
        atomic_write(js, text)
    lic = d / "plotly-LICENSE.txt"
    if not lic.exists():
        atomic_write(lic, (VENDORED / "plotly-LICENSE.txt").read_text(encoding="utf-8"))


def _report(analysis, repro, *, self_contained: bool = True) -> tuple[str | None, str | None]:
    """(html, None), or (None, why) when the report failed: the run's row still has its verdict."""
    from ncclforensics.outputs import Inputs, render

    try:
        inputs = Inputs(analysis, repro, None, plotly_src=None if self_contained else shared_plotly_src())
        return render(DocFormat.HTML, inputs), None
    except Exception as exc:
        return None, f"report failed ({type(exc).__name__}: {str(exc)[:300]})"


def analyze_run(spec: dict, out_dir: str | None) -> dict:
    """Analyze one run. With out_dir, write runs/<id>/{diagnosis.json,report.html,result.json} there
    (result.json last, each atomically) and return the result; without, return the result with the
    file texts under "_files" for the caller to write (Ray workers may not share OUTDIR)."""
    from ncclforensics.analysis import analyze_path
    from ncclforensics.errors import ForensicsError
    from ncclforensics.jsonout import diagnosis_dict
    from ncclforensics.outputs import Inputs, render, reproducer

    t0 = time.monotonic()
    files: dict[str, str] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            members = spec.get("members") or ()  # a run made of some entries of a folder
            analysis = analyze_path([str(Path(spec["path"]) / m) for m in members] if members else spec["path"],
                                    check_runs=bool(spec.get("check_runs")))
            repro, _problem = reproducer(analysis)  # none, or none for a renderer bug: the scan goes on
            row = diagnosis_row(diagnosis_dict(analysis.diagnosis, repro), analysis)
            files[DIAGNOSIS] = render(DocFormat.JSON, Inputs(analysis, repro, None))
            html, problem = (_report(analysis, repro, self_contained=bool(spec.get("self_contained", False)))
                             if spec.get("reports", True) else (None, None))
            if html is not None:
                files[REPORT] = html
            row["report"] = html is not None
            row["report_error"] = problem
            result = result_doc(spec, "ok", row, elapsed=time.monotonic() - t0)
        except ForensicsError as exc:
            result = error_result(spec, "error", exc.message, time.monotonic() - t0)
        except Exception as exc:
            tb = traceback.format_exc()[-_TRACEBACK_LIMIT:]
            result = error_result(spec, "error", f"internal error ({type(exc).__name__}: {str(exc)[:300]})",
                                  time.monotonic() - t0, traceback=tb)
    if caught:
        result["warnings"] = sorted({f"{w.category.__name__}: {w.message}"[:300] for w in caught})[:20]
    if out_dir is None:
        result["_files"] = files
        return result
    write_run(Path(out_dir), spec["id"], result, files)
    return result


def write_run(out_dir: Path, run_id: str, result: dict, files: dict[str, str]) -> None:
    """Write a run's files, then its result.json (the commit point), each by rename."""
    d = out_dir / "runs" / run_id
    d.mkdir(parents=True, exist_ok=True)
    for stale in d.glob(TMP_GLOB):
        stale.unlink(missing_ok=True)
    for name in (DIAGNOSIS, REPORT):
        if name in files:
            atomic_write(d / name, files[name])
        else:  # left from an earlier analysis of other content
            (d / name).unlink(missing_ok=True)
    result = {k: v for k, v in result.items() if k != "_files"}
    atomic_write(d / RESULT, json.dumps(result, ensure_ascii=False, default=str) + "\n")


def read_result(out_dir: Path, run_id: str) -> dict | None:
    try:
        doc = json.loads((out_dir / "runs" / run_id / RESULT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA or not isinstance(doc.get("row"), dict):
        return None
    return doc
