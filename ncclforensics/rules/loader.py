"""Load the rule files (patterns/rules/<root_cause>/<ID>-<name>.toml) into Rule objects."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path

from ncclforensics.errors import CatalogueError, PatternError
from ncclforensics.model import RootCause
from ncclforensics.parse.signatures import PATTERNS_DIR
from ncclforensics.patternfile import check_keys, read_table

RULES_DIR = PATTERNS_DIR / "rules"
CONFIDENCE = {"high": 0.9, "medium": 0.75, "low": 0.55}
DOC_SECTIONS = ("what_it_detects", "why_it_happens", "known_false_positives")


class RuleError(PatternError):
    """A rule file is malformed (caught by the tests over patterns/rules)."""


@dataclass(frozen=True)
class FixSpec:
    title: str
    why: str
    code: str
    when: dict  # hit params that must match for this fix to apply, e.g. {mode = ["bus_error"]}


@dataclass(frozen=True)
class Match:
    detector: str
    params: dict


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    root_cause: RootCause
    confidence: float
    yields_to: tuple[str, ...]
    title: str
    message: str
    matches: tuple[Match, ...]
    doc: dict
    fixes: tuple[FixSpec, ...]
    reproducer: str | None
    reproducer_mode: str | None
    path: str
    priority: int
    fallback: bool = False  # a class-level rule: it stands only when no mechanism rule of its class fires


_KEYS = frozenset({"id", "name", "root_cause", "confidence", "priority", "yields_to", "title", "message", "match",
                   "doc", "fixes", "reproducer", "fallback"})
_FIX_KEYS = frozenset({"title", "why", "code", "when"})
_MATCH_KEYS = frozenset({"detector", "params"})
# the section is read and checked in full by ncclforensics.repro.catalog
_REPRODUCER_KEYS = frozenset({"template", "mode", "script", "none", "variants", "instead", "expect_culprits",
                              "options", "cases"})


def _load(path: Path, root: Path = RULES_DIR) -> Rule:
    rel = path.relative_to(root).as_posix()
    where = path.relative_to(root.parent.parent).as_posix()  # patterns/rules/<class>/<file>: the error's words
    d = read_table(path, where, RuleError, _KEYS, {"match": _MATCH_KEYS, "fixes": _FIX_KEYS,
                                                   "doc": frozenset(DOC_SECTIONS), "reproducer": _REPRODUCER_KEYS})
    for m in d.get("match", []):
        _check_detector(m, where)
    try:
        rc = RootCause(d["root_cause"])
        conf = d["confidence"]
        conf = CONFIDENCE[conf] if isinstance(conf, str) else float(conf)
        matches = tuple(Match(m["detector"], dict(m.get("params", {}))) for m in d["match"])
        fixes = tuple(FixSpec(f["title"], f.get("why", ""), f.get("code", "").strip("\n"), dict(f.get("when", {})))
                      for f in d.get("fixes", []))
        rep = d.get("reproducer", {})
        return Rule(
            id=d["id"], name=d["name"], root_cause=rc, confidence=conf, yields_to=tuple(d.get("yields_to", [])),
            title=d["title"], message=d["message"], matches=matches, doc=dict(d.get("doc", {})),
            fixes=fixes, reproducer=rep.get("template"), reproducer_mode=rep.get("mode"), path=rel,
            priority=int(d.get("priority", 50)), fallback=bool(d.get("fallback", False)),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise RuleError(f"{where}: {type(exc).__name__}: {exc}") from None


def _check_detector(match: dict, where: str) -> None:
    """The detector a `[[match]]` names exists and takes its params (a typo would fail mid-run)."""
    from ncclforensics.rules.detectors import DETECTORS  # imported on use: `rules list` needs no polars

    name = match.get("detector")
    if name not in DETECTORS:
        raise RuleError(f"{where}: unknown detector {name!r}")
    params = inspect.signature(DETECTORS[name]).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        check_keys(match.get("params", {}), frozenset(list(params)[1:]), where, RuleError, "match.params")


@functools.cache
def load_rules(root: Path = RULES_DIR) -> tuple[Rule, ...]:
    rules = [_load(p, root) for p in sorted(root.rglob("*.toml")) if not p.name.endswith(".cases.toml")]
    if not rules:
        raise CatalogueError(f"no rule files under {root}")
    return tuple(sorted(rules, key=lambda r: (r.priority, r.id)))


def rule_by_id(rule_id: str) -> Rule | None:
    return next((r for r in load_rules() if r.id.upper() == rule_id.upper()), None)
