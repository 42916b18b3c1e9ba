"""The `[reproducer]` section of each rule file, read and checked: which script recreates the rule's mechanism.

A rule's section names one template (`script`, under `templates/<class>/`) or says why it has none
(`none`). `variants` lists the finding params the script branches on, with their allowed values
(the first is the default): the same params that pick the rule's fixes, so the script always
applies the fix the report shows first. `instead` names what `--fixed` demonstrates when that fix
cannot run on a laptop, and `cases` are the diagnoses the closed-loop test renders and runs.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ncclforensics.patternfile import load_toml
from ncclforensics.rules.loader import RULES_DIR, FixSpec, Rule, load_rules, rule_by_id

TEMPLATE_DIR = Path(__file__).parent / "templates"
EXPECT_CULPRITS = ("same", "none")  # the analyzer names the script's culprits / names none (policy "none")
DEFAULT_CULPRITS = ("first", "last", "all", "none")  # who plays the culprit when the finding names none


class CatalogError(Exception):
    """A `[reproducer]` section is malformed (the tests over patterns/rules catch it)."""


@dataclass(frozen=True)
class Instead:
    """What --fixed demonstrates when the report's top fix cannot run on a laptop."""
    fix: str    # the top fix's title
    demo: str   # a title of another fix of the rule, or the name of a mitigation
    why: str    # why the top fix cannot run here


@dataclass(frozen=True)
class Plan:
    """One rule's reproducer: its template, or why it has none."""
    rule: Rule
    script: str | None                  # template path under TEMPLATE_DIR, e.g. "rank_divergence/rank_only_work.py.j2"
    none: str | None                    # why there is no reproducer (or what is wrong with the section)
    variants: dict[str, tuple]          # finding param -> allowed values, the first is the default
    options: dict[str, object]          # fixed template switches for this rule (e.g. flight_recorder = false)
    instead: tuple[Instead, ...]
    expect_culprits: str
    cases: tuple[dict, ...]             # diagnoses (finding params) the closed-loop test runs
    broken: bool = False                # the section is malformed (`none` says how)

    def variant_values(self, params: dict) -> dict[str, object]:
        """The finding's value of each variant param, or its default when absent or not allowed."""
        out = {}
        for key, allowed in self.variants.items():
            value = params.get(key)
            out[key] = value if _allowed(value, allowed) else allowed[0]
        return out

    def top_fix(self, variant: dict[str, object]) -> FixSpec:
        """The fix the report shows first for a finding with these variant values (engine._fixes' order)."""
        for fix in self.rule.fixes:
            if all(variant.get(k) in (v if isinstance(v, list) else [v]) for k, v in fix.when.items()):
                return fix
        raise CatalogError(f"{self.rule.id}: no fix applies to {variant}")

    def instead_for(self, fix: FixSpec) -> Instead | None:
        return next((i for i in self.instead if i.fix == fix.title), None)


def _allowed(value: object, allowed: tuple) -> bool:
    return any(type(value) is type(a) and value == a for a in allowed)


def _plan(rule: Rule) -> Plan:
    path = RULES_DIR / rule.path
    section = load_toml(path).get("reproducer", {})
    where = f"{rule.path} [reproducer]"
    script, none = section.get("script"), section.get("none")
    if bool(script) == bool(none):
        raise CatalogError(f"{where}: give either `script` (a template) or `none` (why there is no reproducer)")
    if script is not None:
        script = f"{rule.root_cause.value}/{script}.py.j2"
        if not (TEMPLATE_DIR / script).is_file():
            raise CatalogError(f"{where}: no template {script}")
    variants = {}
    for key, values in section.get("variants", {}).items():
        if not isinstance(values, list) or not values:
            raise CatalogError(f"{where}: variants.{key} must list its allowed values")
        variants[key] = tuple(values)
    instead = tuple(Instead(fix=i["fix"], demo=i["demo"], why=i["why"]) for i in section.get("instead", []))
    titles = {f.title for f in rule.fixes}
    for i in instead:
        if i.fix not in titles:
            raise CatalogError(f"{where}: instead names {i.fix!r}, which is not a fix of {rule.id}")
    expect = section.get("expect_culprits", "same")
    if expect not in EXPECT_CULPRITS:
        raise CatalogError(f"{where}: expect_culprits must be one of {EXPECT_CULPRITS}")
    options = dict(section.get("options", {}))
    if options.get("default_culprits", "last") not in DEFAULT_CULPRITS:
        raise CatalogError(f"{where}: options.default_culprits must be one of {DEFAULT_CULPRITS}")
    cases = tuple(dict(c) for c in section.get("cases", []))
    if script is not None and not cases:
        raise CatalogError(f"{where}: a reproducer ships at least one closed-loop case")
    return Plan(rule=rule, script=script, none=none, variants=variants, options=options,
                instead=instead, expect_culprits=expect, cases=cases)


@functools.cache
def plans() -> tuple[Plan, ...]:
    """Every rule's plan, in rule order. A malformed section costs its own rule the reproducer, no other."""
    out = []
    for rule in load_rules():
        try:
            out.append(_plan(rule))
        except (CatalogError, KeyError, TypeError, ValueError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            out.append(Plan(rule=rule, script=None, none=f"its [reproducer] section is malformed ({exc})",
                            variants={}, options={}, instead=(), expect_culprits="same", cases=(), broken=True))
    return tuple(out)


def plan_for(rule_id: str) -> Plan | None:
    rule = rule_by_id(rule_id) if rule_id else None
    if rule is None:
        return None
    return next((p for p in plans() if p.rule.id == rule.id), None)
