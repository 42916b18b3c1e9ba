"""What every detector reads: the event table, the frontier, and facts derived from them once."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

import polars as pl

from ncclforensics import align
from ncclforensics.model import json_object

# Rows that are reactions to someone else's failure, never a root by themselves.
SYMPTOM_KINDS = frozenset({
    "watchdog_timeout", "watchdog_status", "dump_signal", "gloo_timeout", "peer_closed", "teardown",
    "comm_aborted", "closing_signal", "heartbeat_hang", "monitored_barrier", "desync_report",
})
# Exception texts that are symptoms of a peer's failure (FORMATS.md §5, §6, §9.2).
_SYMPTOM_TEXT = re.compile(
    r"Timed out waiting \d+ms|Connection closed by (?:remote )?peer|Read error \[|Connection reset by peer|"
    r"Watchdog caught collective operation timeout|remote process exited|failed to pass monitoredBarrier|"
    r"successfully reached monitoredBarrier|NCCL communicator was aborted|Failed to recv, got 0 bytes|"
    r"Broken pipe|ChildFailedError|Detected mismatch between collectives|Socket Timeout|"
    r"timed out in blocking wait|SIGTERM|Signal 15|Terminated|"
    # waiting for peers at start-up: the store never saw them (FORMATS.md §6.2, §9)
    r"DistStoreError|wait timeout after|waiting for (?:clients|workers)|client socket has timed out|"
    r"client socket has failed to connect|TCP client failed to connect|RendezvousTimeoutError|"
    r"store based barrier|connectFullMesh failed")
CAUSE_KINDS = frozenset({
    "worker_killed", "worker_fault", "loader_error", "cuda_oom", "cpu_oom", "cuda_error", "xid",
    "gpu_lost", "oom_killer", "segfault", "fatal_signal", "cpp_terminate", "gloo_enforce",
})
SIGNAL_NAMES = {6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM", 2: "SIGINT", 8: "SIGFPE",
                4: "SIGILL"}


def extra(row: dict) -> dict:
    return json_object(row.get("extra"))


def is_symptom_row(row: dict) -> bool:
    kind = row["kind"]
    if kind in SYMPTOM_KINDS:
        return True
    if kind in ("exception", "error_file", "child_failed", "nccl_error", "store_conn_lost", "watchdog_exception"):
        text = f"{row.get('detail') or ''} {row.get('text') or ''}"
        if _SYMPTOM_TEXT.search(text):
            return True
        if kind == "child_failed" and row.get("code") in (-15, 15, -2):
            return True
    if kind == "cpp_terminate" and "DistBackendError" in (row.get("text") or ""):
        return True
    return False


@dataclass
class Context:
    events: pl.DataFrame
    frontier: pl.DataFrame
    stuck: align.Stuck
    notes: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, events: pl.DataFrame) -> Context:
        events = events.with_columns(pl.col("kind").cast(pl.Utf8), pl.col("source").cast(pl.Utf8))
        fr = align.frontier(events)
        return cls(events=events, frontier=fr, stuck=align.stuck_collective(fr))

    # -- selections --------------------------------------------------------------------
    def rows(self, *kinds: str) -> list[dict]:
        return self.events.filter(pl.col("kind").is_in(list(kinds))).to_dicts()

    def kind_count(self, kind: str) -> int:
        return self.events.filter(pl.col("kind") == kind).height

    @cached_property
    def all_rows(self) -> list[dict]:
        """Every row as a dict, built once (detectors read it; none may change a row)."""
        return self.events.to_dicts()

    @cached_property
    def search_texts(self) -> list[str]:
        """Per row of all_rows: detail, text and the NCCL `Last error:` text, for regex searches."""
        return [f"{r.get('detail') or ''} {r.get('text') or ''} {extra(r).get('last_error') or ''}"
                if r["source"] != "flight_recorder" else "" for r in self.all_rows]

    def search_hits(self, rx: re.Pattern) -> list[bool]:
        """Per row of all_rows: whether `rx` finds something in its search text. Runs in polars
        (Rust regex: ~20x Python's re on case-insensitive alternations); Python's re where the
        pattern is beyond Rust's syntax."""
        flags = "(?i)" if rx.flags & re.IGNORECASE else ""
        try:
            return self._search_series.str.contains(flags + rx.pattern).fill_null(False).to_list()
        except pl.exceptions.PolarsError:
            return [bool(rx.search(t)) for t in self.search_texts]

    @cached_property
    def _search_series(self) -> pl.Series:
        return pl.Series("t", self.search_texts, dtype=pl.Utf8)

    # -- facts -------------------------------------------------------------------------
    @cached_property
    def ranks_seen(self) -> list[int]:
        ev = self.events.filter(pl.col("rank").is_not_null() & (pl.col("source") != "flight_recorder"))
        ranks = set(ev["rank"].to_list())
        ranks |= set(self.events.filter(pl.col("kind") == "fr_entry")["rank"].drop_nulls().to_list())
        return sorted(r for r in ranks if r >= 0)

    @cached_property
    def world_size(self) -> int | None:
        cands: list[int] = []
        for r in self.rows("pg_init", "nccl_init", "fr_pg"):
            x = extra(r)
            for key in ("world_size", "nranks"):
                if isinstance(x.get(key), int):
                    cands.append(x[key])
            if r["kind"] == "fr_pg" and x.get("members"):
                cands.append(len(x["members"]))
        ws = self.events.filter(pl.col("extra").str.contains('"world_size"'))
        for r in ws.to_dicts():
            v = extra(r).get("world_size")
            if isinstance(v, int):
                cands.append(v)
        for r in self.rows("rendezvous_ranks"):
            g = extra(r).get("global_ranks") or []
            if g:
                cands.append(max(g) + 1)
        stated = [c for c in cands if 0 < c <= 1_000_000]
        self.world_size_stated = bool(stated)  # else only a lower bound: the highest rank seen + 1
        if self.ranks_seen:
            cands.append(max(self.ranks_seen) + 1)
        cands = [c for c in cands if 0 < c <= 1_000_000]
        return max(cands) if cands else None

    @cached_property
    def hosts(self) -> list[str]:
        return sorted(h for h in self.events["host"].drop_nulls().unique().to_list() if h)

    @cached_property
    def rank_hosts(self) -> dict[int, str]:
        ev = self.events.filter(pl.col("rank").is_not_null() & pl.col("host").is_not_null())
        out: dict[int, str] = {}
        for r, h in zip(ev["rank"].to_list(), ev["host"].to_list(), strict=False):
            out.setdefault(r, h)
        return out

    @cached_property
    def training_started(self) -> bool:
        """Any sign a collective or a step ran (a failure after this is not an init failure)."""
        kinds = set(self.events["kind"].unique().to_list())
        if kinds & {"step_progress", "fr_entry", "fingerprint_mismatch", "ckpt_save"}:
            return True
        seqs = self.events.filter(pl.col("kind").is_in(["watchdog_timeout", "watchdog_status"]))["seq"]
        return bool(seqs.drop_nulls().len() and seqs.max() > 2)

    @cached_property
    def first_symptom_ts(self):
        ts = [r["ts"] for r in self.all_rows if r["ts"] is not None and is_symptom_row(r)]
        return min(ts) if ts else None

    @cached_property
    def symptom_ranks(self) -> set[int]:
        """Ranks with a row showing they reacted to a peer (timeouts, closed connections)."""
        return {r["rank"] for r in self.all_rows
                if r["rank"] is not None and r["kind"] not in ("child_failed", "worker_failed")
                and is_symptom_row(r)}

    @cached_property
    def self_failures(self) -> dict[int, dict]:
        """rank -> the earliest row saying that rank failed on its own (not as a symptom).

        An exit code alone (torchrun's summary) counts only for a rank with no symptom of its own:
        a rank whose watchdog fired dies of SIGABRT in the watchdog's teardown (FORMATS.md §3.7).
        """
        out: dict[int, dict] = {}
        symptomatic = self.symptom_ranks
        for r in self.all_rows:
            rank = r["rank"]
            if rank is None or r["source"] == "flight_recorder" or is_symptom_row(r):
                continue
            kind = r["kind"]
            if kind in ("child_failed", "worker_failed"):
                own = r.get("code") not in (None, 0) and rank not in symptomatic
            else:
                own = kind in CAUSE_KINDS or kind in ("exception", "error_file")
            if not own:
                continue
            prev = out.get(rank)
            if prev is None or _earlier(r, prev):
                out[rank] = r
        return out

    @cached_property
    def exit_codes(self) -> dict[int, int]:
        """rank -> exit code torchrun reported (negative = signal), for ranks that showed no
        symptom of their own (a timed-out rank's SIGABRT is the watchdog's teardown)."""
        out: dict[int, int] = {}
        for r in self.rows("child_failed", "worker_failed"):
            if r["rank"] is not None and r["code"] is not None and r["rank"] not in self.symptom_ranks:
                out.setdefault(r["rank"], r["code"])
        return out

    def evidence_rows(self, rows: list[dict], limit: int = 8) -> list[dict]:
        seen = set()
        out = []
        for r in rows:
            # the same line reaches us twice with torchrun --tee (console and per-rank file), and one
            # line can hold two events (a CUDA error inside a watchdog exception): show it once
            key = (r["rank"], r["kind"], r["detail"] or (r["text"] or "")[-100:])
            at = (r["file"], r["line"])
            if key in seen or at in seen:
                continue
            seen.update((key, at))
            out.append(r)
            if len(out) >= limit:
                break
        return out


def _earlier(a: dict, b: dict) -> bool:
    if a["ts"] is not None and b["ts"] is not None and a["ts"] != b["ts"]:
        return a["ts"] < b["ts"]
    return _cause_rank(a) > _cause_rank(b)


def _cause_rank(r: dict) -> int:
    """Prefer the most specific row when times tie: a named cause over a generic exit."""
    kind = r["kind"]
    if kind in CAUSE_KINDS:
        return 3
    if kind in ("exception", "error_file"):
        return 2
    return 1
