"""Load the signature files (patterns/signatures/**.toml), compile them once, match candidate lines."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import regex

from ncclforensics.atomic import atomic_write
from ncclforensics.digits import BLIND, ShapeMemo, shape_of
from ncclforensics.diskcache import cache_dir
from ncclforensics.errors import CatalogueError, PatternError
from ncclforensics.model import SOURCES
from ncclforensics.parse.prefilter import LiteralSet
from ncclforensics.patternfile import read_table
from ncclforensics.signals import signal_number


def _patterns_dir() -> Path:
    """The pattern catalogue: ncclforensics/patterns in a wheel (setup.py maps it there), patterns/
    at the top of the repository in a source checkout or an editable install."""
    package = Path(__file__).resolve().parent.parent
    shipped = package / "patterns"
    if not shipped.is_dir() and (package.parent / "pyproject.toml").is_file():
        return package.parent / "patterns"
    return shipped


PATTERNS_DIR = _patterns_dir()
SIGNATURES_DIR = PATTERNS_DIR / "signatures"
NOISE_FILE = PATTERNS_DIR / "noise.txt"
ANCHOR_LENGTHS = (6, 8)
FIELD_TYPES = ("int", "str", "ms", "ranks", "float", "signal")
MATCH_TIMEOUT_S = 0.05  # per regex attempt: a pathological line is dropped, never hangs the run
MAX_MATCH_LEN = 16_384  # characters of a body given to the full regexes
MATCH_CACHE_CHARS = 1024  # bodies up to this long have their matches remembered (match_all)
MATCH_CACHE_ENTRIES = 8192  # then it starts again (a few MB at most)
# bodies' shapes whose answers are kept (match_all, candidates; digits.ShapeMemo: those met twice)
SHAPE_CACHE_ENTRIES = 2048


# keys a signature file may have; `parser` (a kind a block parser emits), `meaning`, `carrier`, `launcher`,
# `timeline`, `*_fields`, `duplicate_of` and `same_meaning_as` are read by ncclforensics.vocabulary
_KEYS = frozenset({"event", "source", "description", "prefilter", "no_match", "fields", "variants", "match",
                   "set", "weak", "meaning", "carrier", "launcher", "timeline",
                   "rank_fields", "culprit_fields", "duplicate_of",
                   "same_meaning_as", "parser"})
_VARIANT_KEYS = frozenset({"name", "regex"})
# a `match` sample: one line (`line`), or a block parser's input (`lines`, `json`); its typed `fields`
# (tests/test_signatures.py) and its row's `meaning` (tests/test_vocabulary.py)
_SAMPLE_KEYS = frozenset({"line", "lines", "json", "fields", "meaning"})


class SignatureError(PatternError):
    """A signature file is malformed (a bug in patterns/, caught by the tests)."""


@dataclass(frozen=True, eq=False)
class Signature:
    path: str
    event: str
    source: str
    prefilter: tuple[str, ...]
    patterns: tuple[str, ...]  # compiled on first use: most signatures never see a candidate line
    fields: dict[str, str]
    constants: dict[str, object]
    samples: tuple[dict, ...] = ()
    no_match: tuple[str, ...] = ()
    description: str = ""
    weak: bool = False  # common literals: not used to select blocks (see lines.LineScanner)

    @functools.cached_property
    def variants(self) -> tuple[regex.Pattern, ...]:
        return tuple(regex.compile(p, regex.VERSION0) for p in self.patterns)

    @functools.cached_property
    def blind_variants(self) -> tuple[bool, ...]:
        """Per variant, whether it treats every ASCII digit alike (digits.digit_blind): then two bodies
        that differ only in which digits they hold match it alike, with the same spans."""
        return tuple(BLIND.blind(p) for p in self.patterns)

    def match(self, body: str) -> dict[str, object] | None:
        """Typed fields of the first variant that matches `body`, or None."""
        text = body if len(body) <= MAX_MATCH_LEN else body[:MAX_MATCH_LEN]
        for rx in self.variants:
            try:
                m = rx.search(text, timeout=MATCH_TIMEOUT_S, concurrent=False)  # short: keep the GIL
            except TimeoutError:
                continue
            if m is not None:
                return self._typed(m)
        return None

    def match_shaped(self, body: str, seen: dict[int, tuple | None]) -> dict[str, object] | None:
        """match(body), where `seen` holds the blind variants' answers for bodies of body's shape (None,
        or where the typed fields are: (name, start, end) each) and gets those worked out here."""
        text = body if len(body) <= MAX_MATCH_LEN else body[:MAX_MATCH_LEN]
        blind = self.blind_variants
        for vi, rx in enumerate(self.variants):
            if blind[vi] and vi in seen:
                spans = seen[vi]
                if spans is not None:
                    return self.fields_at(body, spans)
                continue
            try:
                m = rx.search(text, timeout=MATCH_TIMEOUT_S, concurrent=False)
            except TimeoutError:
                continue
            if blind[vi]:
                seen[vi] = None if m is None else tuple((name, *m.span(name)) for name, raw in m.groupdict().items()
                                                        if raw is not None and name in self.fields)
            if m is not None:
                return self._typed(m)
        return None

    def fields_at(self, body: str, spans: tuple[tuple[str, int, int], ...]) -> dict[str, object]:
        """The typed fields of a match whose fields are at `spans` in `body` (match_shaped)."""
        out: dict[str, object] = dict(self.constants)
        for name, a, b in spans:
            val = convert(self.fields[name], body[a:b])
            if val is not None:
                out[name] = val
        return out

    def _typed(self, m: regex.Match) -> dict[str, object]:
        out: dict[str, object] = dict(self.constants)
        for name, raw in m.groupdict().items():
            if raw is None or name not in self.fields:
                continue
            val = convert(self.fields[name], raw)
            if val is not None:
                out[name] = val
        return out


_MS = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)?")
_MS_SCALE = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, None: 1}
_NUMBER = re.compile(r"\d+")
_DIGIT = re.compile("[0-9]")


def convert(kind: str, raw: str) -> object | None:
    raw = raw.strip()
    try:
        if kind == "int":
            v = int(raw)
            return v if -(2**63) <= v < 2**63 else None  # size_t -1 for COALESCED work: no value
        if kind == "float":
            return float(raw)
        if kind == "ms":
            num = _MS.match(raw)
            if not num:
                return None
            scale = _MS_SCALE[num.group(2)]
            value = float(num.group(1)) * scale
            return int(value) if value < 2**63 else None
        if kind == "ranks":
            return [int(x) for x in _NUMBER.findall(raw)]
        if kind == "signal":
            return signal_number(raw)
    except (ValueError, OverflowError):
        return None
    return raw


def _load_one(path: Path, root: Path = SIGNATURES_DIR) -> Signature | None:
    """The line signature a file declares, or None for a kind a block parser emits (`parser = …`)."""
    rel = path.relative_to(root).as_posix()
    where = path.relative_to(root.parent.parent).as_posix()  # patterns/signatures/<source>/<file>
    data = read_table(path, where, SignatureError, _KEYS, {"variants": _VARIANT_KEYS, "match": _SAMPLE_KEYS})
    if "parser" in data:
        return None
    for key in ("event", "source", "prefilter", "variants"):
        if key not in data:
            raise SignatureError(f"{where}: missing key {key!r}")
    if data["source"] not in SOURCES:
        raise SignatureError(f"{where}: unknown source {data['source']!r}")
    fields = dict(data.get("fields", {}))
    for name, kind in fields.items():
        if kind not in FIELD_TYPES:
            raise SignatureError(f"{where}: field {name!r} has unknown type {kind!r}")
    variants = []
    for v in data["variants"]:
        if not isinstance(v.get("regex"), str) or not v["regex"]:
            raise SignatureError(f"{where}: a variant needs a regex")
        variants.append(v["regex"])
    prefilter = tuple(data["prefilter"])
    if not prefilter or any(not p for p in prefilter):
        raise SignatureError(f"{where}: prefilter needs non-empty literals")
    return Signature(
        path=rel, event=data["event"], source=data["source"], prefilter=prefilter,
        patterns=tuple(variants), fields=fields, constants=dict(data.get("set", {})),
        samples=tuple(data.get("match", [])), no_match=tuple(data.get("no_match", [])),
        description=data.get("description", ""), weak=bool(data.get("weak", False)),
    )


@dataclass
class SignatureSet:
    signatures: list[Signature]
    by_literal: dict[str, list[Signature]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for sig in self.signatures:
            for lit in sig.prefilter:
                self.by_literal.setdefault(lit, []).append(sig)
        self.literals = sorted(self.by_literal, key=lambda lit: (-len(lit), lit))
        # Strong literals select 64 KiB blocks; weak ones (progress lines: `step`, `epoch`) are in
        # nearly every block of a real log and would select them all.
        self.strong_literals = sorted({lit for s in self.signatures if not s.weak for lit in s.prefilter},
                                      key=lambda lit: (-len(lit), lit))
        self.weak_signatures = [s for s in self.signatures if s.weak]
        self.anchors = _cached_anchors(self.strong_literals)
        # candidates(): every literal a body holds, found in one scan; then their signatures
        self._order = {lit: i for i, lit in enumerate(self.by_literal)}
        self._weak_sigs = {lit: [s for s in sigs if s.weak] for lit, sigs in self.by_literal.items()
                           if any(s.weak for s in sigs)}
        self._finder = LiteralSet({"prefilter": list(self.by_literal)})
        self._matches: dict[tuple[str, bool], tuple[tuple[Signature, dict[str, object]], ...]] = {}
        # the blind variants' answers by a body's shape (digits made 0): Signature.match_shaped's `seen`
        self._shapes: ShapeMemo = ShapeMemo(SHAPE_CACHE_ENTRIES)
        # candidates(): the literals without a digit a shape holds, and the literals with one
        self._free_by_shape: dict[str, frozenset[int]] = {}
        self._digit_literals = tuple((i, lit) for i, lit in enumerate(self._finder.texts) if _DIGIT.search(lit))
        self._digit_literal_ids = frozenset(i for i, _ in self._digit_literals)
        # candidates() by the literals found: few sets recur (one line's wording from every rank)
        self._by_found: dict[tuple[frozenset[int], bool], tuple[Signature, ...]] = {}

    def forget(self) -> None:
        """Drop what matching remembers (the run is read: the memory goes to its table)."""
        for memo in (self._matches, self._shapes, self._free_by_shape, self._by_found):
            memo.clear()

    def candidates(self, body: str, *, weak_only: bool = False, shape: str | None = None) -> Sequence[Signature]:
        """The signatures whose prefilter literals occur in `body`, in signature-file order. `shape`:
        shape_of(body) (digits.py), when known: the literals without a digit are found once a shape
        (such a literal occurs where the body holds no digit: the same places in every body of that
        shape), the few with a digit looked up in the body itself."""
        if shape is None:
            found = self._finder.literal_ids_in(body)
        else:
            free = self._free_by_shape.get(shape)
            if free is None:
                if len(self._free_by_shape) >= SHAPE_CACHE_ENTRIES:
                    self._free_by_shape.clear()
                free = self._free_by_shape[shape] = self._finder.literal_ids_in(body) - self._digit_literal_ids
            found = free | {i for i, lit in self._digit_literals if lit in body} if self._digit_literals else free
        if not found:
            return ()
        key = (found, weak_only)
        sigs = self._by_found.get(key)
        if sigs is None:
            if len(self._by_found) >= MATCH_CACHE_ENTRIES:
                self._by_found.clear()
            sigs = self._by_found[key] = self._candidates_of(found, weak_only)
        return sigs

    def _candidates_of(self, found: frozenset[int], weak_only: bool) -> tuple[Signature, ...]:
        texts = self._finder.texts
        lits = {texts[i] for i in found}
        if weak_only:
            lits = {lit for lit in lits if lit in self._weak_sigs}
        table = self._weak_sigs if weak_only else self.by_literal
        seen: list[Signature] = []
        for lit in sorted(lits, key=self._order.__getitem__):
            for sig in table[lit]:
                if sig not in seen:
                    seen.append(sig)
        return tuple(seen)

    def match_all(self, body: str, *, weak_only: bool = False) -> Sequence[tuple[Signature, dict[str, object]]]:
        """The signatures matching `body` with their typed fields, in signature-file order.

        Remembered by body (short ones, a bounded number): the same line comes from every rank of
        a run (NCCL's init, the watchdog's teardown), most of them word for word. The fields are
        shared between callers, which only read them."""
        cacheable = len(body) <= MATCH_CACHE_CHARS
        spans_of: dict[Signature, dict[int, tuple | None]] | None = None
        shape = None
        if cacheable:
            hit = self._matches.get((body, weak_only))
            if hit is not None:
                return hit
            # the same line from another rank (other numbers): digit-blind variants answer as for it
            shape = shape_of(body)
            spans_of = self._shapes.get(shape)
            if spans_of is None and shape != body and self._shapes.admit(shape):
                spans_of = self._shapes[shape] = {}
            if spans_of is None:
                shape = None  # no digit (the body is its own key), or a shape met once so far
        out = []
        for sig in self.candidates(body, weak_only=weak_only, shape=shape):
            if spans_of is not None:
                seen = spans_of.get(sig)
                if seen is None:
                    seen = spans_of[sig] = {}
                fields = sig.match_shaped(body, seen)
            else:
                fields = sig.match(body)
            if fields is not None:
                out.append((sig, fields))
        found = tuple(out)
        if cacheable:
            if len(self._matches) >= MATCH_CACHE_ENTRIES:
                self._matches.clear()
            self._matches[(body, weak_only)] = found
        return found


def _noise_lines() -> list[str]:
    try:
        text = NOISE_FILE.read_text(encoding="utf-8")
    except OSError:
        return []
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def _cached_anchors(literals: list[str]) -> list[str]:
    """choose_anchors, cached on disk by the hash of its inputs (it takes ~0.3 s; start-up matters)."""
    noise = _noise_lines()
    key = hashlib.sha256(json.dumps([literals, noise, ANCHOR_LENGTHS]).encode()).hexdigest()[:20]
    cache = cache_dir() / f"anchors-{key}.json"
    try:
        anchors = json.loads(cache.read_text())
        if isinstance(anchors, list) and all(any(a in lit for a in anchors) for lit in literals):
            return anchors
    except (OSError, ValueError):
        pass
    anchors = choose_anchors(literals, noise)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, json.dumps(anchors))
    except OSError:
        pass  # a read-only home: compute again next time
    return anchors


def choose_anchors(literals: list[str], noise: list[str]) -> list[str]:
    """Few short substrings such that every literal contains one and no noise line does.

    The block prefilter is Rust-regex alternations: fast with tens of alternatives, several times
    slower past ~48-64 (bench/README.md, "Figures the code's comments rest on"). Greedy set cover keeps
    the count small; a literal with no noise-free substring stands for itself.
    """
    noise_subs: set[str] = set()
    for line in noise:
        for n in ANCHOR_LENGTHS:
            noise_subs.update(line[i : i + n] for i in range(len(line) - n + 1))
    uncovered = set(literals)
    anchors: list[str] = []
    while uncovered:
        count: dict[str, int] = {}
        for lit in uncovered:
            subs = {lit[i : i + n] for n in ANCHOR_LENGTHS for i in range(len(lit) - n + 1)}
            for sub in subs - noise_subs:
                count[sub] = count.get(sub, 0) + 1
        if not count:
            anchors.extend(sorted(uncovered))
            break
        best = max(count, key=lambda sub: (count[sub], len(sub), sub))
        anchors.append(best)
        uncovered = {lit for lit in uncovered if best not in lit}
    return anchors


@functools.cache
def load_signatures(root: Path = SIGNATURES_DIR) -> SignatureSet:
    sigs = [s for p in sorted(root.rglob("*.toml")) if (s := _load_one(p, root)) is not None]
    if not sigs:  # a broken install would otherwise read every log as `unknown`
        raise CatalogueError(f"no signature files under {root}")
    return SignatureSet(sigs)
