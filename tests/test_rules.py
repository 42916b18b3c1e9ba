"""Every rule file follows the conventions; every rule's cases (fires / quiet) hold."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path

import pytest

from ncclforensics.events import build_events
from ncclforensics.model import CAUSES, RootCause
from ncclforensics.repro import templates as _templates_pkg  # noqa: F401 - the folder must exist
from ncclforensics.rules import engine
from ncclforensics.rules.context import Context
from ncclforensics.rules.detectors import DETECTORS
from ncclforensics.rules.loader import DOC_SECTIONS, RULES_DIR, load_rules

RULES = load_rules()
RULE_FILES = sorted(p for p in RULES_DIR.rglob("*.toml") if not p.name.endswith(".cases.toml"))
CASE_FILES = sorted(RULES_DIR.rglob("*.cases.toml"))


def test_rules_cover_every_class():
    assert {r.root_cause for r in RULES} == set(RootCause) - {RootCause.UNKNOWN}


def test_one_row_per_root_cause():
    assert set(CAUSES) == set(RootCause)
    rows = [CAUSES[c] for c in RootCause if c is not RootCause.UNKNOWN]
    assert all(re.fullmatch(r"[A-Z]{2}", c.prefix) for c in rows)
    assert len({c.prefix for c in rows}) == len(rows), "prefixes are never shared"
    assert len({c.color for c in CAUSES.values()}) == len(CAUSES), "each class its own colour"
    assert all(c.plain and c.plain[0].isupper() and not c.plain.endswith(".") for c in CAUSES.values())


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.stem)
def test_rule_file_conventions(path: Path):
    d = tomllib.loads(path.read_text())
    assert path.stem == f"{d['id']}-{d['name']}", "file name must be {id}-{name}"
    assert path.parent.name == d["root_cause"], "folder must be the root cause"
    assert re.fullmatch(r"[A-Z]{2}\d{3}", d["id"])
    assert d["id"][:2] == CAUSES[RootCause(d["root_cause"])].prefix, "id prefix must match the root cause"
    assert re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", d["name"])
    for section in DOC_SECTIONS:
        assert len(d.get("doc", {}).get(section, "")) > 20, f"doc section {section} missing or empty"
    for m in d["match"]:
        assert m["detector"] in DETECTORS, f"unknown detector {m['detector']}"
    assert d.get("fixes"), "a rule ships at least one fix"
    for fx in d["fixes"]:
        assert fx["title"] and fx.get("why") and fx.get("code"), "fixes need title, why and code"
    for cls in d.get("yields_to", []):
        assert cls in {c.value for c in RootCause}
    tmpl = d.get("reproducer", {}).get("template")
    assert tmpl in {c.value for c in RootCause}
    assert (path.parent / f"{path.stem}.cases.toml").exists(), "a rule ships with its cases file"


@pytest.mark.parametrize("path", CASE_FILES, ids=lambda p: p.stem)
def test_every_rule_has_a_firing_and_a_quiet_case(path: Path):
    """STYLE.md habit 3: a rule ships with at least one case it fires on and one it stays quiet on."""
    cases = [c for c in tomllib.loads(path.read_text()).values() if isinstance(c, dict)]
    fires = [c["expect"]["fires"] for c in cases]
    assert True in fires, "no case where the rule fires"
    assert False in fires, "no case where the rule stays quiet"


CASE_KEYS = {"logs", "expect"}
EXPECT_KEYS = {"fires", "culprit_ranks", "op_type", "seq", "fix"}  # what test_rule_case checks


@pytest.mark.parametrize("path", CASE_FILES, ids=lambda p: p.stem)
def test_cases_files_have_no_unknown_keys(path: Path):
    """A typo in `expect` (`culprits = [1]`) would leave the case checking less than it says."""
    cases = {n: c for n, c in tomllib.loads(path.read_text()).items() if isinstance(c, dict)}
    for name, case in cases.items():
        assert set(case) <= CASE_KEYS, f"{name}: unknown key(s) {sorted(set(case) - CASE_KEYS)}"
        assert set(case["expect"]) <= EXPECT_KEYS, f"{name}: unknown expect key(s) {set(case['expect']) - EXPECT_KEYS}"


def test_every_rule_has_its_cases_file():
    assert {p.name.removesuffix(".cases.toml") for p in CASE_FILES} == {p.stem for p in RULE_FILES}


def test_rule_ids_unique():
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))


def _cases():
    for path in CASE_FILES:
        d = tomllib.loads(path.read_text())
        for name, case in d.items():
            if isinstance(case, dict):
                yield pytest.param(d["rule"], case, id=f"{d['rule']}-{name}")


def run_rule(rule_id: str, logs: dict[str, str], tmp_path: Path):
    for name, text in logs.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text if text.endswith("\n") else text + "\n")
    ctx = Context.build(build_events(tmp_path).events)
    rule = next(r for r in RULES if r.id == rule_id)
    rows = copy.deepcopy(ctx.all_rows)
    found = engine.run_rule(rule, ctx)[0]
    assert ctx.all_rows == rows, "detectors are pure: a detector changed a row of the Context"
    return found


@pytest.mark.parametrize(("rule_id", "case"), list(_cases()))
def test_rule_case(rule_id: str, case: dict, tmp_path: Path, monkeypatch):
    missing: list[str] = []  # message/title/fix placeholders the detector gave no value for (shown as "?")
    monkeypatch.setattr(engine._Blank, "__missing__", lambda self, key: missing.append(key) or "?")
    found = run_rule(rule_id, case["logs"], tmp_path)
    assert not missing, f"{rule_id}: no value for {sorted(set(missing))} in {[f.message for f in found]}"
    exp = case["expect"]
    if not exp["fires"]:
        assert not found, f"{rule_id} should stay quiet, fired: {[f.message for f in found]}"
        return
    assert found, f"{rule_id} should fire"
    f = found[0]
    if "culprit_ranks" in exp:
        assert sorted(f.culprit_ranks) == sorted(exp["culprit_ranks"])
    if "op_type" in exp:
        assert f.collective.op_type == exp["op_type"]
    if "seq" in exp:
        assert f.collective.seq == exp["seq"]
    if "fix" in exp:
        assert any(exp["fix"].lower() in fx.title.lower() for fx in f.fixes), [fx.title for fx in f.fixes]


def test_the_context_cannot_be_changed():
    """Detectors share one Context: it is frozen, and its notes field is gone (notes travel in the Hit)."""
    import dataclasses

    ctx = Context.build(build_events(Path(__file__).resolve().parent.parent / "sample_logs").events)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.stuck = None
    assert not hasattr(ctx, "notes")
    assert ctx.world_size == 4 and ctx.world_size_stated


def test_evidence_lists_a_line_once():
    """One line can hold two events (a CUDA error inside a watchdog exception): one evidence row."""
    import polars as pl

    from ncclforensics.model import EVENT_SCHEMA

    row = {k: None for k in EVENT_SCHEMA}
    rows = [dict(row, file="r2.out", line=4, kind="cuda_error", rank=2, text="x", detail="CUDA error: a"),
            dict(row, file="r2.out", line=4, kind="watchdog_exception", rank=2, text="x", detail="b"),
            dict(row, file="r2.out", line=6, kind="watchdog_exception", rank=2, text="y", detail="c")]
    ctx = Context.build(pl.DataFrame(rows, schema=EVENT_SCHEMA))
    assert [(r["file"], r["line"]) for r in ctx.evidence_rows(rows)] == [("r2.out", 4), ("r2.out", 6)]


def _finding(cls: str, conf: float, ts, yields: tuple[str, ...], rule: str):
    from ncclforensics.model import Finding, RootCause

    return Finding(root_cause=RootCause(cls), rule=rule, title=rule, message="", confidence=conf, ts=ts,
                   yields_to=yields)


@pytest.mark.parametrize("swap", [False, True])
def test_two_findings_that_explain_each_other_leave_one_root(swap):
    """A save that never ended and a rank that died each explain the other: at equal confidence the
    earlier stays the root (never both cascades, which would leave the run `unknown`)."""
    import datetime as dt

    from ncclforensics.model import Role
    from ncclforensics.rules.engine import order

    t = dt.datetime(2026, 3, 2, 4, 0)
    save = _finding("checkpoint_save", 0.9, t, ("rank_crash",), "CKx")
    crash = _finding("rank_crash", 0.9, t + dt.timedelta(seconds=30), ("checkpoint_save",), "RCx")
    findings = [crash, save] if swap else [save, crash]
    assert order(findings) is save
    assert (save.role, crash.role) == (Role.ROOT, Role.CASCADE)
    # without times, the rule order decides; a more credible finding always stays
    a = _finding("checkpoint_save", 0.9, None, ("rank_crash",), "CKy")
    b = _finding("rank_crash", 0.9, None, ("checkpoint_save",), "RCy")
    assert order([b, a]) is b and a.role is Role.CASCADE
    c = _finding("checkpoint_save", 0.8, t, ("rank_crash",), "CKz")
    d = _finding("rank_crash", 0.9, t, ("checkpoint_save",), "RCz")
    assert order([c, d]) is d and c.role is Role.CASCADE


def test_an_exit_code_explains_no_finding_of_substance():
    """A finding on weak evidence alone (an exit code: every rank of a failed run exits non-zero, the
    waiting ones too) neither makes a credible finding its cascade nor wins as the earlier one; where
    nothing else stands it is still the verdict, and it still yields to others."""
    import datetime as dt

    from ncclforensics.model import Role
    from ncclforensics.rules.engine import order

    t = dt.datetime(2024, 6, 11, 13, 33)
    exit_code = _finding("rank_crash", 0.45, t, (), "RC900")
    exit_code.params["strength"] = 1
    lagging = _finding("rank_divergence", 0.63, None, ("rank_crash",), "RD007")
    assert order([lagging, exit_code]) is lagging
    assert (lagging.role, exit_code.role) == (Role.ROOT, Role.CONTEXT)
    # the same finding on strong evidence (a traceback) does explain the lagging rank
    crash = _finding("rank_crash", 0.45, t, (), "RC900")
    crash.params["strength"] = 2
    lagging = _finding("rank_divergence", 0.63, None, ("rank_crash",), "RD007")
    assert order([lagging, crash]) is crash and lagging.role is Role.CASCADE
    # alone, an exit code is the verdict
    alone = _finding("rank_crash", 0.45, t, (), "RC900")
    alone.params["strength"] = 1
    assert order([alone]) is alone


def test_a_restarts_failure_explains_no_earlier_attempts():
    """torchrun --max-restarts: attempt 0 raised, attempts 1-2 then hit CUDA OOM (the crashed process still
    held the GPU) in lines without a time. The later attempt's finding cannot make the first one its
    cascade; the first attempt's failure is the root (FORMATS.md §2.2 attempt_<n> folders)."""
    import datetime as dt

    from ncclforensics.model import Role
    from ncclforensics.rules.engine import order

    crash = _finding("rank_crash", 0.9, dt.datetime(2024, 3, 12, 15, 31, 52), ("oom",), "RC001")
    crash.attempt = 0
    oom = _finding("oom", 0.9, None, ("gpu_hardware",), "OM001")
    oom.attempt = 1
    assert order([oom, crash]) is crash and crash.role is Role.ROOT
    # without attempts, the untimed OOM would explain the crash (it may have come first)
    crash = _finding("rank_crash", 0.9, dt.datetime(2024, 3, 12, 15, 31, 52), ("oom",), "RC001")
    oom = _finding("oom", 0.9, None, ("gpu_hardware",), "OM001")
    assert order([oom, crash]) is oom and crash.role is Role.CASCADE


def test_rules_make_dicts_of_the_rows_they_read_only():
    """Most rows of a large run are context (NCCL's init noise, environment lines) that no detector
    reads: the Context makes a row a dict only when a detector asks for its kind or role, and the verdict
    is the one with every row made a dict first."""
    import polars as pl

    sample = Path(__file__).resolve().parent.parent / "sample_logs"
    events = build_events(sample).events
    # NCCL's `NET/IB` lines (nccl_net: context, read by no detector), one per rank and NIC in a large run
    noise = events.filter(pl.col("role") == "context").head(1).with_columns(
        pl.lit("nccl_net").cast(events.schema["kind"]).alias("kind"), pl.lit("nccl").cast(events.schema["source"])
        .alias("source"), pl.lit("NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>").alias("text"))
    assert noise.height == 1
    many = 5000
    filler = pl.concat([noise] * many).with_columns(
        pl.Series("line", range(10**6, 10**6 + many), dtype=noise.schema["line"]), pl.lit("filler.log").alias("file"))
    big = pl.concat([events, filler])
    lazy = Context.build(big)
    found = engine.evaluate(lazy).findings
    assert len(lazy._dicts) < big.height - many // 2  # the filler rows stayed in the table
    eager = Context.build(big)
    assert len(eager.all_rows) == big.height  # every row a dict before any detector runs
    assert [(f.rule, f.root_cause, f.culprit_ranks, f.confidence) for f in engine.evaluate(eager).findings] == [
        (f.rule, f.root_cause, f.culprit_ranks, f.confidence) for f in found]


def _inputs_with_facts() -> list[Path]:
    """Real incidents (../shared/corpus-real, read in place, where it is there), the sample run and the
    fixture pastes (which have runs that trained and one that did not)."""
    here = Path(__file__).resolve().parent
    real = here.parent.parent / "shared" / "corpus-real"
    cases = sorted(p.parent for p in real.glob("*/label.json"))
    return [*cases, here.parent / "sample_logs", *sorted((here / "fixtures" / "pastes").glob("*"))]


def test_facts_read_from_columns_equal_their_row_definitions():
    """Context facts that large runs read from the columns (a timeout row a rank) equal the same facts
    read from the rows as dicts: whether the run trained, the first symptoms, what the other ranks did."""
    inputs = _inputs_with_facts()
    assert len(inputs) >= 3
    trained = 0
    for path in inputs:
        ctx = Context.build(build_events(path).events)
        assert ctx.training_started == bool(ctx._training_signs), path
        trained += ctx.training_started
        rows = ctx.symptoms()
        assert ctx.first_symptoms(3) == rows[:3], path
        ranks = sorted({r["rank"] for r in rows if r["rank"] is not None})
        for culprits in ([], ranks[:1], ranks[1:], ranks):
            others = [r for r in rows if r["rank"] not in culprits]
            want = ({r["kind"] for r in others}, sorted({r["rank"] for r in others if r["rank"] is not None}))
            assert ctx.symptoms_apart_from(culprits) == want, (path, culprits)
    assert 0 < trained < len(inputs)  # both answers occur
