"""The event vocabulary: what each event kind is evidence of, as declared in its signature file.

Every file under patterns/signatures declares its kind's meaning (DESIGN.md §3) in `[[meaning]]`
entries; the first entry whose `when` holds for a row gives that row's meaning:

    [[meaning]]
    when = { code = [48, 79] }   # optional: field -> allowed values, or field -> regex (search)
    class = "gpu_hardware"       # what it is evidence of (for symptoms: the class the shape suggests)
    role = "cause"               # cause | symptom | context | progress
    strength = "decisive"        # causes only: decisive | strong | weak
    phase = "init"               # optional: init | runtime (when the failure happened)

A file may also name its kind's category in the report's timeline (`timeline = "gpu"`; the
categories are report/timeline.CATEGORIES).

This module is the one place that answers "is this kind a cause of X?": no other module keeps its
own set of kinds. `annotate` writes each row's meaning into the event table (columns `class`,
`role`, `strength`, `phase`), so rules read meanings as data.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from pathlib import Path

import polars as pl
import regex

from ncclforensics.errors import PatternError
from ncclforensics.model import EVENT_SCHEMA, MEANING_COLUMNS, RootCause, extra_field, json_object
from ncclforensics.parse.signatures import SIGNATURES_DIR
from ncclforensics.patternfile import check_keys, load_toml

_MEANING_TYPES = {c: EVENT_SCHEMA[c] for c in MEANING_COLUMNS}
# columns a `when` may test directly; any other key is a typed field kept in the `extra` JSON
_COLUMN_KEYS = frozenset({"code", "detail", "text", "op", "seq", "source", "pg", "rank", "timeout_ms"})
_PHASES = ("init", "runtime")
_MEANING_KEYS = frozenset({"when", "class", "role", "strength", "phase"})


class VocabularyError(PatternError):
    """A signature file declares no meaning or a malformed one, or code names an undeclared kind."""


class EvidenceRole(StrEnum):
    CAUSE = "cause"
    SYMPTOM = "symptom"
    CONTEXT = "context"
    PROGRESS = "progress"


class Strength(IntEnum):
    WEAK = 1
    STRONG = 2
    DECISIVE = 3


@dataclass(frozen=True)
class Meaning:
    role: EvidenceRole
    cls: RootCause | None = None
    strength: Strength | None = None
    phase: str | None = None
    when: tuple[tuple[str, object], ...] = ()  # (field, list of values | regex string)

    @property
    def label(self) -> str:
        parts = [self.role.value]
        if self.cls:
            parts.append(self.cls.value)
        if self.strength:
            parts.append(self.strength.name.lower())
        return " ".join(parts)


@dataclass(frozen=True)
class KindSpec:
    kind: str
    source: str
    path: str
    meanings: tuple[Meaning, ...]
    description: str = ""
    parser: str | None = None  # the block parser that emits the kind, for kinds no line regex makes
    carrier: bool = False  # its text carries other events: a specific event on the same line gives the meaning
    launcher: bool = False  # a launcher's line about a worker (an exit report), not the worker's own
    rank_fields: tuple[str, ...] = ()  # fields holding ranks the text names (they count as seen)
    culprit_fields: tuple[str, ...] = ()  # fields holding ranks the text names as the culprits
    duplicate_of: tuple[str, ...] = ()  # dropped where one of these kinds is on the same line (it says the same)
    same_meaning_as: str | None = None  # another kind whose [[meaning]] list this one shares
    timeline: str | None = None  # its category in the report's timeline (report/timeline.CATEGORIES)

    def meaning_of(self, row: dict) -> Meaning:
        """The meaning of one row (a dict of event-table columns)."""
        extra = _extra(row)
        for m in self.meanings:
            if all(_holds(row, extra, key, want) for key, want in m.when):
                return m
        return self.meanings[-1]

    def can_be(self, *, role: EvidenceRole | None = None, cls: RootCause | None = None) -> bool:
        return any((role is None or m.role is role) and (cls is None or m.cls is cls) for m in self.meanings)


def _extra(row: dict) -> dict:
    return json_object(row.get("extra"))


def _holds(row: dict, extra: dict, key: str, want: object) -> bool:
    value = row.get(key) if key in _COLUMN_KEYS else extra.get(key)
    if isinstance(want, str):
        return value is not None and regex.search(want, str(value)) is not None
    if isinstance(value, list):
        return any(v in want for v in value)
    return value in want


def _parse_meaning(rel: str, entry: dict) -> Meaning:
    check_keys(entry, _MEANING_KEYS, rel, VocabularyError, "meaning")
    try:
        role = EvidenceRole(entry["role"])
    except (KeyError, ValueError):
        raise VocabularyError(f"{rel}: meaning needs a role ({', '.join(r.value for r in EvidenceRole)})") from None
    cls = None
    if "class" in entry:
        try:
            cls = RootCause(entry["class"])
        except ValueError:
            raise VocabularyError(f"{rel}: unknown class {entry['class']!r}") from None
    strength = None
    if "strength" in entry:
        try:
            strength = Strength[str(entry["strength"]).upper()]
        except KeyError:
            raise VocabularyError(f"{rel}: strength must be decisive, strong or weak") from None
    if role is EvidenceRole.CAUSE and (cls is None or strength is None):
        raise VocabularyError(f"{rel}: a cause needs a class and a strength")
    if role is not EvidenceRole.CAUSE and strength is not None:
        raise VocabularyError(f"{rel}: only causes have a strength")
    phase = entry.get("phase")
    if phase is not None and phase not in _PHASES:
        raise VocabularyError(f"{rel}: phase must be one of {_PHASES}")
    when = entry.get("when", {})
    if not isinstance(when, dict):
        raise VocabularyError(f"{rel}: `when` must be a table")
    conds = []
    for key, want in when.items():
        # a regex string is checked by the tests (test_vocabulary), not here: every start-up would
        # compile the same few dozen (about 10 ms), and the event table evaluates them in polars
        if not isinstance(want, (str, list)):
            raise VocabularyError(f"{rel}: when.{key} must be a list of values or a regex string")
        conds.append((key, want))
    return Meaning(role=role, cls=cls, strength=strength, phase=phase, when=tuple(conds))


def _load_spec(path: Path, root: Path) -> KindSpec:
    rel = path.relative_to(root).as_posix()
    try:
        data = load_toml(path)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise VocabularyError(f"{rel}: {exc}") from None
    entries = data.get("meaning")
    if not entries and data.get("same_meaning_as"):
        entries = [{"role": "context"}]  # replaced by the named kind's meanings once all are loaded
    if not entries:
        raise VocabularyError(f"{rel}: no [[meaning]]: say what the event is evidence of (DESIGN.md §3)")
    if isinstance(entries, dict):
        entries = [entries]
    meanings = tuple(_parse_meaning(rel, e) for e in entries)
    if meanings[-1].when:
        raise VocabularyError(f"{rel}: the last [[meaning]] must have no `when` (the default)")
    return KindSpec(kind=data.get("event", path.stem), source=data.get("source", path.parent.name), path=rel,
                    meanings=meanings, description=data.get("description", ""), parser=data.get("parser"),
                    carrier=bool(data.get("carrier", False)), launcher=bool(data.get("launcher", False)),
                    rank_fields=tuple(data.get("rank_fields", ())),
                    culprit_fields=tuple(data.get("culprit_fields", ())),
                    duplicate_of=tuple(data.get("duplicate_of", ())),
                    same_meaning_as=data.get("same_meaning_as"), timeline=data.get("timeline"))


@dataclass(frozen=True, eq=False)
class Vocabulary:
    specs: dict[str, KindSpec]

    def spec(self, kind: str) -> KindSpec:
        try:
            return self.specs[kind]
        except KeyError:
            raise VocabularyError(f"event kind {kind!r} is declared by no signature file") from None

    def check(self, *kinds: str) -> tuple[str, ...]:
        """`kinds`, after checking that each is declared (code that names a kind calls this)."""
        for k in kinds:
            self.spec(k)
        return kinds

    def kinds(self, *, role: EvidenceRole | None = None, cls: RootCause | None = None) -> frozenset[str]:
        """Kinds that can carry this meaning (under some `when`)."""
        return frozenset(k for k, s in self.specs.items() if s.can_be(role=role, cls=cls))

    def meaning_of(self, row: dict) -> Meaning:
        return self.spec(row["kind"]).meaning_of(row)

    def kinds_in_timeline(self, category: str) -> frozenset[str]:
        """Kinds whose signature files put them in this timeline category."""
        return frozenset(k for k, s in self.specs.items() if s.timeline == category)

    @functools.cached_property
    def _naming(self) -> frozenset[str]:
        return frozenset(k for k, s in self.specs.items() if s.rank_fields or s.culprit_fields)

    def kinds_naming_ranks(self) -> frozenset[str]:
        """Kinds whose text names ranks (fingerprints, duplicate GPUs, desync reports …)."""
        return self._naming

    @functools.cached_property
    def _launcher(self) -> frozenset[str]:
        return frozenset(k for k, s in self.specs.items() if s.launcher)

    def kinds_from_launcher(self) -> frozenset[str]:
        """Kinds a launcher writes about a worker (exit reports), not the worker itself."""
        return self._launcher

    def annotate(self, events: pl.DataFrame) -> pl.DataFrame:
        """The event table with each row's meaning in `class`, `role`, `strength`, `phase`."""
        events = events.drop([c for c in MEANING_COLUMNS if c in events.columns])
        kinds = events["kind"].cast(pl.Utf8).unique().drop_nulls().to_list() if events.height else []
        plain = [self.specs[k] for k in kinds if k in self.specs and len(self.specs[k].meanings) == 1]
        table = pl.DataFrame(
            {"_k": [s.kind for s in plain],
             "class": [s.meanings[0].cls.value if s.meanings[0].cls else None for s in plain],
             "role": [s.meanings[0].role.value for s in plain],
             "strength": [int(s.meanings[0].strength) if s.meanings[0].strength else None for s in plain],
             "phase": [s.meanings[0].phase for s in plain]},
            schema={"_k": pl.Utf8, **_MEANING_TYPES})
        out = (events.with_columns(pl.col("kind").cast(pl.Utf8).alias("_k"), pl.lit(True).alias("_default"))
               .join(table, on="_k", how="left", maintain_order="left"))
        cond_specs = [self.specs[k] for k in kinds if k in self.specs and len(self.specs[k].meanings) > 1]
        if cond_specs:
            out = self._conditional_meanings(out, cond_specs)
        undeclared = out.filter(pl.col("role").is_null())["_k"].unique().to_list()
        if undeclared:
            raise VocabularyError(f"event kind(s) {sorted(undeclared)} declared by no signature file")
        return self._teardown_yields(self._carriers_yield(out)).drop("_k", "_default")

    @staticmethod
    def _conditional_meanings(out: pl.DataFrame, specs: list[KindSpec]) -> pl.DataFrame:
        """The meanings of the rows whose kind has several (each under its `when`: the first that holds).
        Each kind's conditions are evaluated on its own rows only (they read `extra` as JSON, a parse a
        row), once: the number of the meaning that holds, then its values from a table of meanings."""
        out = out.with_row_index("_i")
        of_cond = pl.col("_k").is_in([s.kind for s in specs])
        rest, cond_rows = out.filter(~of_cond), out.filter(of_cond)
        by_kind = cond_rows.partition_by("_k", as_dict=True, maintain_order=True)
        values: list[Meaning] = []
        parts = []
        for s in specs:
            part = by_kind.get((s.kind,))
            if part is None:
                continue
            first = len(values)
            values += s.meanings
            expr: pl.Expr | None = None
            for n, m in enumerate(s.meanings[:-1]):  # the last has no `when`: the default
                cond = pl.all_horizontal(_condition(key, want) for key, want in m.when) if m.when else pl.lit(True)
                expr = (pl.when(cond) if expr is None else expr.when(cond)).then(pl.lit(first + n, dtype=pl.UInt32))
            last = pl.lit(first + len(s.meanings) - 1, dtype=pl.UInt32)
            parts.append(part.with_columns((last if expr is None else expr.otherwise(last)).alias("_m")))
        table = pl.DataFrame(
            {"_m": list(range(len(values))),
             "class": [m.cls.value if m.cls else None for m in values],
             "role": [m.role.value for m in values],
             "strength": [int(m.strength) if m.strength else None for m in values],
             "phase": [m.phase for m in values],
             "_default": [not m.when for m in values]},
            schema={"_m": pl.UInt32, **_MEANING_TYPES, "_default": pl.Boolean})
        meant = (pl.concat(parts).drop(*table.columns[1:])
                 .join(table, on="_m", how="left").drop("_m").select(out.columns))
        return pl.concat([rest, meant], how="vertical_relaxed").sort("_i").drop("_i")

    @staticmethod
    def _teardown_yields(out: pl.DataFrame) -> pl.DataFrame:
        """`terminate called after throwing …` whose `what():` line the paste lost, on a rank whose own
        watchdog timed out: the watchdog taking the process down (FORMATS.md §3.7, §19.4), a symptom like
        the `what():` it would have shown, not a crash of that rank's own."""
        timed_out = out.filter((pl.col("_k") == "watchdog_timeout") & pl.col("rank").is_not_null())["rank"].unique()
        if timed_out.is_empty():
            return out
        lost = ((pl.col("_k") == "cpp_terminate") & pl.col("rank").is_in(timed_out.implode())
                & pl.col("_default") & ~pl.col("extra").str.contains('"what"').fill_null(False))
        return out.with_columns(
            pl.when(lost).then(pl.lit("symptom")).otherwise(pl.col("role")).alias("role"),
            pl.when(lost).then(pl.lit(None, dtype=pl.Int8)).otherwise(pl.col("strength")).alias("strength"),
            pl.when(lost).then(pl.lit(None, dtype=out.schema["class"])).otherwise(pl.col("class")).alias("class"))

    def _carriers_yield(self, out: pl.DataFrame) -> pl.DataFrame:
        """A carrier row (a traceback's exception, an error.json message) whose line also yields a
        specific event (an NCCL error, a CUDA OOM, a DataLoader death …) takes no meaning of its own:
        the specific event has it."""
        carriers = [k for k, s in self.specs.items() if s.carrier]
        # a carrier whose own text gave a specific meaning (a `when` held: a save on its stack, …) keeps it
        is_carrier = pl.col("_k").is_in(carriers) & pl.col("_default")
        # any other event of that line but an application's loose wording (a step, a save) is specific
        specific = (out.filter(~pl.col("_k").is_in(carriers) & ((pl.col("source").cast(pl.Utf8) != "app")
                                              | pl.col("role").is_in(["cause", "symptom"])))
                    .select("file", "line").unique().with_columns(pl.lit(True).alias("_specific")))
        out = out.join(specific, on=["file", "line"], how="left", maintain_order="left")
        yielded = is_carrier & pl.col("_specific").fill_null(False)
        return out.with_columns(
            pl.when(yielded).then(pl.lit("context")).otherwise(pl.col("role")).alias("role"),
            pl.when(yielded).then(pl.lit(None, dtype=pl.Int8)).otherwise(pl.col("strength")).alias("strength"),
        ).drop("_specific")

    def drop_duplicates(self, events: pl.DataFrame) -> pl.DataFrame:
        """Rows of a kind declared `duplicate_of` another, where that other kind is on the same line."""
        for spec in self.specs.values():
            if not spec.duplicate_of:
                continue
            kind = pl.col("kind").cast(pl.Utf8)
            over = events.filter(kind.is_in(list(spec.duplicate_of))).select("file", "line").unique()
            if over.is_empty():
                continue
            dup = events.filter(kind == spec.kind).join(over, on=["file", "line"], how="semi")
            if dup.height:
                events = events.join(dup.select("file", "line", "kind").unique(), on=["file", "line", "kind"],
                                     how="anti", maintain_order="left")
        return events


def _condition(key: str, want: object) -> pl.Expr:
    if key in _COLUMN_KEYS:
        col = pl.col(key)
    else:
        col = extra_field(key)
    if isinstance(want, str):
        return col.cast(pl.Utf8).str.contains(want).fill_null(False)
    if key in _COLUMN_KEYS and key not in ("detail", "text", "op", "source", "pg"):
        return col.is_in([v for v in want if isinstance(v, int)]).fill_null(False)
    # extra values come out of JSON as text: compare as text (lists match if any element does)
    texts = [str(v).lower() if isinstance(v, bool) else str(v) for v in want]
    scalar = col.cast(pl.Utf8)
    listed = col.str.json_decode(pl.List(pl.Utf8)) if key not in _COLUMN_KEYS else None
    expr = scalar.is_in(texts).fill_null(False)
    if listed is not None:
        expr = expr | (scalar.str.starts_with("[") & scalar.str.contains(
            "|".join(rf"(?:\[|, ?){_re_escape(t)}(?:\]|,)" for t in texts) or "$^").fill_null(False))
    return expr


def _re_escape(text: str) -> str:
    return re.escape(text)


@functools.cache
def load_vocabulary(root: Path = SIGNATURES_DIR) -> Vocabulary:
    specs: dict[str, KindSpec] = {}
    for path in sorted(root.rglob("*.toml")):
        spec = _load_spec(path, root)
        if spec.kind in specs:
            raise VocabularyError(f"{spec.path}: event {spec.kind!r} is declared twice (also {specs[spec.kind].path})")
        specs[spec.kind] = spec
    for kind, spec in list(specs.items()):
        if spec.same_meaning_as:
            other = specs.get(spec.same_meaning_as)
            if other is None or other.same_meaning_as:
                raise VocabularyError(f"{spec.path}: same_meaning_as names {spec.same_meaning_as!r}, "
                                      "which declares no meanings of its own")
            specs[kind] = dataclasses.replace(spec, meanings=other.meanings)
    return Vocabulary(specs)


def vocabulary() -> Vocabulary:
    return load_vocabulary()
