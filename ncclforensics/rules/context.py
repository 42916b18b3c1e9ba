"""What every detector reads: the event table with its meanings, the frontier, facts derived once."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import polars as pl

from ncclforensics import align
from ncclforensics.model import MEANING_COLUMNS, RootCause, json_object
from ncclforensics.vocabulary import EvidenceRole, Strength, vocabulary

CAUSE, SYMPTOM = EvidenceRole.CAUSE.value, EvidenceRole.SYMPTOM.value
# rows that show the run trained, whatever their role (Context._training_signs)
_TRAINING_KINDS = ["fingerprint_mismatch", "ckpt_save", "ckpt_saved", "desync_report"]


def extra(row: dict) -> dict:
    return json_object(row.get("extra"))


# torchrun's restart attempts: a --log-dir's attempt_<n> folders (FORMATS.md §2.2)
_ATTEMPT_DIR = re.compile(r"(?:^|/)attempt_(\d+)/")


def attempt_of(r: dict) -> int | None:
    """The torchrun restart attempt a row comes from: its `attempt` (the reader's), else its file's
    attempt_<n> folder; None where neither says."""
    a = extra(r).get("attempt")
    if isinstance(a, int):
        return a
    m = _ATTEMPT_DIR.search(r.get("file") or "")
    return int(m.group(1)) if m else None


def is_symptom_row(row: dict) -> bool:
    return row.get("role") == SYMPTOM


def is_cause_row(row: dict) -> bool:
    return row.get("role") == CAUSE


def named_ranks(row: dict) -> list[int]:
    """Ranks a row's text names (a fingerprint's two sides, the two ranks on one GPU, a desync
    report's lists), as its signature declares them (`rank_fields`)."""
    spec = vocabulary().specs.get(row["kind"])
    if spec is None or not spec.rank_fields:
        return []
    x = extra(row)
    out: list[int] = []
    for key in spec.rank_fields:
        v = row.get(key) if key in row else x.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            out.append(v)
        elif isinstance(v, list):
            out.extend(i for i in v if isinstance(i, int) and not isinstance(i, bool))
    return [r for r in out if r >= 0]


def culprits_named(row: dict) -> list[int]:
    """Ranks a cause row's text names as its culprits (`culprit_fields`): e.g. both ranks that NCCL
    found on one GPU (FORMATS.md §20.2)."""
    spec = vocabulary().specs.get(row["kind"])
    if spec is None or not spec.culprit_fields:
        return []
    x = extra(row)
    out: list[int] = []
    for key in spec.culprit_fields:
        v = row.get(key) if key in row else x.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            out.append(v)
        elif isinstance(v, list):
            out.extend(i for i in v if isinstance(i, int) and not isinstance(i, bool))
    return sorted({r for r in out if r >= 0})


@dataclass(frozen=True)
class Context:
    """What detectors read: the annotated event table and facts derived from it, each computed once.
    Frozen: a detector returns what it found (rules.detectors.Hit, its notes included) and changes nothing."""

    events: pl.DataFrame
    frontier: pl.DataFrame
    stuck: align.Stuck

    @classmethod
    def build(cls, events: pl.DataFrame) -> Context:
        if any(c not in events.columns for c in MEANING_COLUMNS) or (
                events.height and events["role"].null_count() == events.height):
            events = vocabulary().annotate(events)
        events = events.with_columns(pl.col("kind").cast(pl.Utf8), pl.col("source").cast(pl.Utf8))
        fr = align.frontier(events)
        return cls(events=events, frontier=fr, stuck=align.stuck_collective(fr))

    # -- selections --------------------------------------------------------------------
    def rows(self, *kinds: str) -> list[dict]:
        """Rows of these (declared) kinds, in table order."""
        vocabulary().check(*kinds)
        by_kind = self._by_kind
        if len(kinds) == 1:
            return self._rows_at(by_kind.get(kinds[0], ()))
        return self._rows_at(sorted(i for k in dict.fromkeys(kinds) for i in by_kind.get(k, ())))

    @cached_property
    def all_rows(self) -> list[dict]:
        """Every row as a dict (detectors read them; none may change a row). Detectors ask for kinds,
        roles or columns instead where they can: a row becomes a dict only when one is asked for
        (_rows_at), and most rows of a large run are context no detector reads."""
        return self._rows_at(range(self.events.height))

    @cached_property
    def _dicts(self) -> dict[int, dict]:
        """Table position -> its row as a dict, for the rows asked for so far (each built once)."""
        return {}

    def _rows_at(self, at) -> list[dict]:
        """The rows at these table positions, as dicts (the same dict each time a row is asked for)."""
        made = self._dicts
        missing = [i for i in at if i not in made]
        if missing:
            made.update(zip(missing, self.events[missing].to_dicts(), strict=True))
        return [made[i] for i in at]

    def _positions(self, mask: pl.Expr) -> list[int]:
        """The table positions of the rows where `mask` holds."""
        return self.events.select(pl.arg_where(mask.fill_null(False))).to_series().to_list()

    @cached_property
    def _by_kind(self) -> dict[str, list[int]]:
        """kind -> the table positions of its rows: detectors ask for a few kinds of a table that may
        hold tens of thousands of rows (one per rank and line), many times."""
        out: dict[str, list[int]] = {}
        for i, k in enumerate(self.events["kind"].to_list()):
            out.setdefault(k, []).append(i)
        return out

    @cached_property
    def file_ranks(self) -> dict[str, frozenset[int]]:
        """file -> the ranks its rows carry (a rank's own file, a node's console, a launcher's output)."""
        per = (self.events.lazy().filter(pl.col("rank").is_not_null()).group_by("file")
               .agg(pl.col("rank").unique()).collect())
        return {f: frozenset(rs) for f, rs in per.iter_rows()}

    @cached_property
    def _by_role(self) -> _RoleRows:
        """role -> its rows, in table order (each role's made into dicts when first asked for)."""
        at: dict[str | None, list[int]] = {}
        for i, role in enumerate(self.events["role"].to_list()):
            at.setdefault(role, []).append(i)
        return _RoleRows(self, at)

    @cached_property
    def _cause_rows(self) -> list[dict]:
        """What causes() chooses from: cause rows but a Flight Recorder's, the exit reports that follow
        from a rank's own lines, and a start-up reading of a line that another row of it (a traceback's
        stack: the launcher's run loop) places while the run went on."""
        explained = self._ranks_with_own_lines
        rows = self._by_role.get(CAUSE, ())
        in_run = {(r["file"], r["line"]) for r in rows
                  if r["phase"] == "runtime" and r["class"] == RootCause.NETWORK_RUNTIME.value}
        return [r for r in rows if r["source"] != "flight_recorder"
                and not (r["rank"] in explained and _is_agent_row(r))
                and not (r["class"] == RootCause.NETWORK_INIT.value and (r["file"], r["line"]) in in_run)]

    def causes(self, cls: RootCause | None = None, *, min_strength: Strength = Strength.WEAK) -> list[dict]:
        """Cause rows (their signature says they can be a root), of one class if given. A launcher's
        exit report of a rank whose own lines show a cause or a symptom follows from it (a rank that
        raised or timed out exits too), so it is no cause of its own."""
        return [r for r in self._cause_rows if (cls is None or r["class"] == cls.value)
                and (r["strength"] or 0) >= min_strength]

    @cached_property
    def _ranks_with_own_lines(self) -> set[int]:
        """Ranks whose own lines show a cause or a symptom: their exit report follows from it."""
        return self._own_ranks(CAUSE, SYMPTOM)

    def _own_ranks(self, *roles: str) -> set[int]:
        """Ranks of the rows of these roles that are the ranks' own lines (no launcher's report)."""
        own = (pl.col("role").is_in(list(roles)) & pl.col("rank").is_not_null()
               & ~pl.col("kind").is_in(list(vocabulary().kinds_from_launcher())))
        return set(self.events.filter(own)["rank"].unique().to_list())

    def symptoms(self, cls: RootCause | None = None) -> list[dict]:
        return [r for r in self._by_role.get(SYMPTOM, ()) if cls is None or r["class"] == cls.value]

    def first_symptoms(self, n: int) -> list[dict]:
        """symptoms()[:n], making no other row a dict (a large run has a timeout row a rank and more)."""
        return self._rows_at(self._by_role.positions(SYMPTOM)[:n])

    def symptoms_apart_from(self, ranks: list[int]) -> tuple[set[str], list[int]]:
        """The kinds of the symptom rows whose rank is not one of `ranks` (rows without a rank count), and
        the ranks they carry: what the other ranks did, read from the columns."""
        other = (pl.col("role") == SYMPTOM) & (pl.col("rank").is_null() | ~pl.col("rank").is_in(list(ranks)))
        rows = self.events.filter(other.fill_null(False)).select("kind", "rank")
        return set(rows["kind"].to_list()), sorted(rows["rank"].drop_nulls().unique().to_list())

    # -- facts -------------------------------------------------------------------------
    @cached_property
    def ranks_seen(self) -> list[int]:
        """Ranks with a line of their own, a Flight Recorder dump, or named in a line's text."""
        ev = self.events.filter(pl.col("rank").is_not_null() & (pl.col("source") != "flight_recorder"))
        ranks = set(ev["rank"].to_list())
        ranks |= set(self.events.filter(pl.col("kind") == "fr_entry")["rank"].drop_nulls().to_list())
        ranks |= set(self.text_ranks)
        return sorted(r for r in ranks if r >= 0)

    @cached_property
    def text_ranks(self) -> list[int]:
        """Ranks named only inside message texts (fingerprints, duplicate GPUs, desync reports)."""
        named = vocabulary().kinds_naming_ranks()
        out: set[int] = set()
        for r in self.rows(*(k for k in named if k in self._by_kind)):
            out.update(named_ranks(r))
        return sorted(out)

    @property
    def world_size(self) -> int | None:
        return self._world_size[0]

    @property
    def world_size_stated(self) -> bool:
        """Whether a line states the world size; else it is only a lower bound: the highest rank seen + 1."""
        return self._world_size[1]

    @cached_property
    def _world_size(self) -> tuple[int | None, bool]:
        cands: list[int] = []
        for r in self.rows("pg_init", "nccl_init", "fr_pg"):
            x = extra(r)
            for key in ("world_size", "nranks"):
                if isinstance(x.get(key), int):
                    cands.append(x[key])
            if r["kind"] == "fr_pg" and x.get("members"):
                cands.append(len(x["members"]))
        for r in self._rows_at(self._positions(pl.col("extra").str.contains('"world_size"', literal=True))):
            v = extra(r).get("world_size")
            if isinstance(v, int):
                cands.append(v)
        for r in self.rows("rendezvous_ranks"):
            g = extra(r).get("global_ranks") or []
            if g:
                cands.append(max(g) + 1)
        # an all-gather's output holds every rank's input: NumelOut / NumelIn is the group size (§3.2)
        for r in self.rows("watchdog_timeout"):
            if r["op"] in ("ALLGATHER", "_ALLGATHER_BASE") and r["pg"] in (None, "0", "default_pg") \
                    and r["numel_in"] and r["numel_out"] and r["numel_out"] % r["numel_in"] == 0:
                cands.append(r["numel_out"] // r["numel_in"])
        stated = any(0 < c <= 1_000_000 for c in cands)
        if self.ranks_seen:
            cands.append(max(self.ranks_seen) + 1)
        cands = [c for c in cands if 0 < c <= 1_000_000]
        return (max(cands) if cands else None), stated

    @cached_property
    def hosts(self) -> list[str]:
        return sorted(h for h in self.events["host"].drop_nulls().unique().to_list() if h)

    @cached_property
    def rank_hosts(self) -> dict[int, str]:
        ev = self.events.filter(pl.col("rank").is_not_null() & pl.col("host").is_not_null())
        out: dict[int, str] = {}
        for r, h in zip(ev["rank"].to_list(), ev["host"].to_list(), strict=False):
            if h:
                out.setdefault(r, h)
        return out

    @cached_property
    def training_started(self) -> bool:
        """Any sign that a collective completed or a step ran: a failure after this is no init failure.
        Whether _training_signs has a row, read from the columns (a large run has a progress row a rank)."""
        kind = pl.col("kind")
        sign = (((pl.col("role") == EvidenceRole.PROGRESS.value) & (kind != "fr_pg"))
                | kind.is_in(_TRAINING_KINDS)
                | (kind.is_in(["watchdog_timeout", "watchdog_status"]) & (pl.col("seq") > 2)))
        return bool(self.events.select(sign.fill_null(False).any()).item())

    @cached_property
    def _training_signs(self) -> list[dict]:
        """The signs of training: progress, a fingerprint or a save, a timeout past SeqNum 2."""
        signs = [r for r in self._by_role.get(EvidenceRole.PROGRESS.value, ()) if r["kind"] != "fr_pg"]
        signs += self.rows(*_TRAINING_KINDS)
        return signs + [r for r in self.rows("watchdog_timeout", "watchdog_status")
                        if r["seq"] is not None and r["seq"] > 2]

    def trained_after(self, row: dict) -> bool:
        """Whether a sign of training follows `row`: later in its own file, or in another file unless both
        are stamped and the sign is not later (a paste of a run that trained, then of a relaunch that could
        not start, has its start-up failure after every step line)."""
        for s in self._training_signs:
            if s["file"] == row["file"]:
                if s["line"] > row["line"]:
                    return True
            elif s["ts"] is None or row["ts"] is None or s["ts"] > row["ts"]:
                return True
        return False

    @cached_property
    def first_symptom_ts(self):
        return self.events.filter(pl.col("role") == SYMPTOM)["ts"].min()

    @cached_property
    def symptom_ranks(self) -> set[int]:
        """Ranks with a row showing they reacted to a peer (timeouts, closed connections)."""
        return self._own_ranks(SYMPTOM)

    @cached_property
    def self_failures(self) -> dict[int, dict]:
        """rank -> the earliest row saying that rank failed on its own (a cause of its own).

        An exit code alone (a launcher's report) counts only for a rank with no symptom of its own:
        a rank whose watchdog fired dies of SIGABRT in the watchdog's teardown (FORMATS.md §3.7).
        """
        out: dict[int, dict] = {}
        symptomatic = self.symptom_ranks
        for r in self._by_role.get(CAUSE, ()):
            rank = r["rank"]
            if rank is None or r["source"] == "flight_recorder":
                continue
            if _is_agent_row(r) and (r.get("code") == 0 or rank in symptomatic):
                continue
            prev = out.get(rank)
            if prev is None or _earlier(r, prev):
                out[rank] = r
        return out

    @cached_property
    def exit_codes(self) -> dict[int, int]:
        """rank -> exit code a launcher reported (negative = signal), for ranks that showed no
        symptom of their own (a timed-out rank's SIGABRT is the watchdog's teardown)."""
        out: dict[int, int] = {}
        # the signals the launcher itself sent, by pid (closing_signal: its teardown, its SIGKILL of a worker
        # that outlived the SIGTERM): an exit by one of them is the launcher's doing, not the worker's
        sent = {(r["pid"], r["code"]) for r in self.rows("closing_signal") if r["pid"] is not None}
        for r in self.rows("child_failed", "worker_failed", "srun_task_exit", "launcher_exit"):
            # srun and mpirun name a signal in words (`task 9: Segmentation fault`): as Python reports it
            code = r["code"] if r["code"] is not None else (-extra(r)["signo"] if isinstance(
                extra(r).get("signo"), int) else None)
            if code is not None and code < 0 and (r["pid"], -code) in sent:
                continue
            if r["rank"] is not None and code is not None and r["rank"] not in self.symptom_ranks:
                out.setdefault(r["rank"], code)
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


class _RoleRows:
    """role -> its rows (Context._by_role): a role's rows become dicts when that role is first asked for."""

    def __init__(self, ctx: Context, at: dict[str | None, list[int]]) -> None:
        self._ctx = ctx
        self._at = at
        self._rows: dict[str | None, list[dict]] = {}

    def positions(self, role: str | None) -> list[int]:
        """The table positions of the role's rows (no row made a dict)."""
        return self._at.get(role, [])

    def get(self, role: str | None, default=()) -> list[dict]:
        rows = self._rows.get(role)
        if rows is None:
            if role not in self._at:
                return default
            rows = self._rows[role] = self._ctx._rows_at(self._at[role])
        return rows


def _is_agent_row(row: dict) -> bool:
    """A launcher's line about a worker (exit reports), not the worker's own."""
    return row["kind"] in vocabulary().kinds_from_launcher()


def _earlier(a: dict, b: dict) -> bool:
    if a["ts"] is not None and b["ts"] is not None and a["ts"] != b["ts"]:
        return a["ts"] < b["ts"]
    return _specificity(a) > _specificity(b)


def _specificity(r: dict) -> int:
    """Prefer the most specific row when times tie: a stronger cause, then a worker's own line."""
    return 2 * (r["strength"] or 0) + (0 if _is_agent_row(r) else 1)
