"""Reproducers: one per rule, rendered from validated fields only, and proven on their own logs.

The fast tests check every rule's `[reproducer]` section and render every template. The closed-loop
tests (marker `repro`) run each rule's cases under torchrun on CPU with gloo, analyze the run's own
logs and expect the rule, culprit ranks, stuck OpType and top fix the script's docstring promises;
then run it with --fixed and expect exit 0 and logs in which the analyzer finds no failure.
`pytest -m "not repro"` skips them; NCCLF_REPRO_TIMES=path writes each run's times there (JSON).
Each torchrun is forked from one process that imported torch once (tests/fixtures/torchrun_server.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import pytest

from ncclforensics.analysis import analyze_path
from ncclforensics.jsonout import diagnosis_dict
from ncclforensics.model import Evidence, Finding, Fix, RootCause, RunFacts
from ncclforensics.repro.catalog import plans
from ncclforensics.repro.render import NoReproducer, Reproducer, render_reproducer
from tests.fixtures.torchrun_server import TorchrunServer

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CANARY = "CANARY_7f3a"  # stands for any log text; it must never reach a script
PLANS = plans()
SCRIPTED = [p for p in PLANS if p.script]


def make_finding(rule: str, **params: object) -> Finding:
    culprits = params.get("culprit_ranks", [])
    plan = next(p for p in PLANS if p.rule.id == rule)
    return Finding(
        root_cause=plan.rule.root_cause, rule=rule, title="t", message="m", confidence=0.9,
        culprit_ranks=list(culprits) if isinstance(culprits, list) else [], params=dict(params),
    )


def make_facts(world_size: int | None = 4) -> RunFacts:
    return RunFacts(path="logs", files=3, lines=100, bytes=1000, world_size=world_size, ranks_seen=[],
                    hosts=["node-a"], versions={}, skipped=[])


def render_case(rule: str, case: dict, **kwargs: object) -> Reproducer:
    params = {k: v for k, v in case.items() if k != "extended"}  # `extended`: a closed-loop flag, not a param
    return render_reproducer(make_finding(rule, **params), make_facts(case.get("world_size")), **kwargs)


# --- every rule has a reproducer or says why not ------------------------------------------------


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.rule.id)
def test_every_rule_has_a_reproducer_or_says_why(plan):
    assert not plan.broken, f"{plan.rule.id}: {plan.none}"
    if plan.script is None:
        assert len(plan.none) > 30, f"{plan.rule.id}: `none` must say why there is no reproducer"
        with pytest.raises(NoReproducer, match=plan.rule.id):
            render_reproducer(make_finding(plan.rule.id), make_facts())
        return
    when_keys = {k for f in plan.rule.fixes for k in f.when}
    assert when_keys <= set(plan.variants), (
        f"{plan.rule.id}: the fixes depend on {sorted(when_keys)}; list them under variants so the script "
        "applies the fix the report shows first")
    assert plan.cases, f"{plan.rule.id}: no closed-loop case"
    assert any(not c.get("extended") for c in plan.cases), (
        f"{plan.rule.id}: every case is `extended`; the default closed loop (CI) must run one of them")


def variant_cases():
    """Every rule's cases, and every combination of its variant values on its first case."""
    for plan in SCRIPTED:
        for i, case in enumerate(plan.cases):
            yield pytest.param(plan.rule.id, case, id=f"{plan.rule.id}-case{i}")
        keys = list(plan.variants)
        for values in product(*(plan.variants[k] for k in keys)):
            case = {**plan.cases[0], **dict(zip(keys, values, strict=True))}
            yield pytest.param(plan.rule.id, case, id=f"{plan.rule.id}-" + "-".join(map(str, values)))


@pytest.mark.parametrize(("rule", "case"), list(variant_cases()))
def test_every_variant_renders(rule, case):
    repro = render_case(rule, case, script_name="r011.py")
    assert repro.rule == rule
    assert repro.command == f"torchrun --nproc-per-node {repro.world_size} r011.py"
    assert repro.script.startswith(f'r"""Reproducer for {rule} (')
    for flag in ("--backend", "--timeout", "--fixed"):
        assert f'"{flag}"' in repro.script
    assert "repro.py" not in repro.script, "the docstring names the file the script was written to"
    doc = " ".join(repro.script.split('"""')[1].split())
    culprits = "no culprit rank" if not repro.culprit_ranks else "culprit rank"
    assert f"the analyzer reports {rule} ({repro.root_cause}) with {culprits}" in doc
    assert f'its top fix is "{repro.fix}"' in doc
    if repro.demonstrates != repro.fix:
        assert f'--fixed demonstrates "{repro.demonstrates}" instead' in doc
    if repro.op_type:
        assert f"waiting in {'an' if repro.op_type[0] in 'AEIOU' else 'a'} {repro.op_type}" in doc
    assert not re.search(r"\ba [AEIOU][A-Z_]+\b", repro.script), "an ALLREDUCE, not a ALLREDUCE"
    compile(repro.script, "r011.py", "exec")


def test_rendered_scripts_pass_ruff(tmp_path):
    ruff = shutil.which("ruff", path=str(BIN)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    for param in variant_cases():
        rule, case = param.values
        (tmp_path / f"{param.id.replace('-', '_')}.py").write_text(render_case(rule, case).script)
    result = subprocess.run([ruff, "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(tmp_path)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_the_samples_reproducer_is_rd007s_first_case():
    """The bundled sample's reproducer recreates RD007, and the closed loop runs exactly that script."""
    diag = analyze_path(ROOT / "sample_logs").diagnosis
    repro = render_reproducer(diag.verdict, diag.facts)
    assert (repro.rule, repro.culprit_ranks, repro.op_type) == ("RD007", (0,), "ALLREDUCE")
    assert repro.fix == diag.verdict.fixes[0].title == repro.demonstrates
    # the top fix brackets the rank-only work with barriers on every rank, on a group with a generous timeout
    assert repro.script.count("dist.barrier(group=barrier_group)") == 2
    assert repro.script == render_case("RD007", next(p for p in PLANS if p.rule.id == "RD007").cases[0]).script


def test_a_verdict_without_a_rule_has_no_reproducer():
    finding = Finding(root_cause=RootCause.UNKNOWN, rule="", title="t", message="m", confidence=0.0)
    with pytest.raises(NoReproducer, match="no rule"):
        render_reproducer(finding, make_facts())


# --- validated fields only ----------------------------------------------------------------------


def first_scripted(rule_prefix: str):
    return next(p for p in SCRIPTED if p.rule.id.startswith(rule_prefix))


@pytest.mark.parametrize("bad", ["; rm -rf /", "ALLREDUCE\nimport os", "allreduce", 7, None])
def test_bad_op_type_falls_back(bad):
    repro = render_case("RD007", {"world_size": 2, "culprit_ranks": [0], "op_type": bad})
    assert "rm -rf" not in repro.script
    assert "import os\nimport os" not in repro.script
    assert repro.op_type == "ALLREDUCE"


def test_op_type_picks_the_collective():
    repro = render_case("RD007", {"world_size": 2, "culprit_ranks": [0], "op_type": "BROADCAST"})
    assert "dist.broadcast(result, src=VALIDATING_RANKS[0])" in repro.script
    assert repro.op_type == "BROADCAST"
    assert "waiting in a BROADCAST" in " ".join(repro.script.split())


@pytest.mark.parametrize("bad", [[10**12], [-1], ["1"], [True], "0,1", [1.5]])
def test_bad_culprit_ranks_are_dropped(bad):
    repro = render_case("RC001", {"world_size": 4, "culprit_ranks": bad})
    assert repro.culprit_ranks == (3,)  # the rule's default: the last rank plays the culprit
    assert "The report named no culprit rank; rank 3 plays the part." in repro.script


@pytest.mark.parametrize(("key", "bad"), [("world_size", 10**9), ("world_size", True), ("step", -5),
                                          ("step", "3"), ("signal", 99), ("lagging", "rm -rf")])
def test_bad_scalars_fall_back(key, bad):
    rule = "RC002" if key == "signal" else "RD007"
    repro = render_reproducer(make_finding(rule, culprit_ranks=[1], **{key: bad}), make_facts(4))
    assert repro.world_size == 4
    assert "rm -rf" not in repro.script
    assert "STEP = 3" in repro.script


def test_no_log_text_reaches_the_script():
    facts = RunFacts(path=CANARY, files=1, lines=1, bytes=1, world_size=4, ranks_seen=[0, 1], hosts=[CANARY],
                     versions={"torch": CANARY}, skipped=[], env={"X": CANARY}, notes=[CANARY])
    for plan in SCRIPTED:
        params = {key: CANARY for key in plan.variants} | {"op_type": CANARY, "note": CANARY, "culprit_ranks": [1]}
        finding = make_finding(plan.rule.id, **params)
        finding.title = finding.message = f'"""{CANARY}'
        finding.evidence = [Evidence(file=f"{CANARY}.log", line=1, text=f"{CANARY}\n\"\"\"; import os")]
        finding.fixes = [Fix(title=CANARY, why=CANARY, code=CANARY)]
        finding.doc = {"what_it_detects": CANARY}
        finding.reproducer = CANARY
        assert CANARY not in render_reproducer(finding, facts).script


def test_large_world_is_capped_and_culprits_remapped():
    repro = render_reproducer(make_finding("RC001", culprit_ranks=[37]), make_facts(64))
    assert repro.world_size == 4
    assert repro.culprit_ranks == (3,)
    assert "The diagnosed run had 64 ranks; this one has 4." in repro.script
    assert "Diagnosed rank 37 is played by rank 3." in repro.script


def test_rank_zero_stays_rank_zero_and_culprits_stay_a_minority():
    repro = render_reproducer(make_finding("RD007", culprit_ranks=[0, 40, 41]), make_facts(64))
    assert repro.culprit_ranks == (0,)
    assert "diagnosed ranks 40, 41" in repro.script


def test_real_world_size_keeps_the_ranks():
    repro = render_reproducer(make_finding("RC001", culprit_ranks=[37]), make_facts(64), real_world_size=True)
    assert repro.world_size == 64
    assert repro.command == "torchrun --nproc-per-node 64 repro.py"
    assert repro.culprit_ranks == (37,)


def test_unknown_world_size_fits_the_culprits():
    repro = render_reproducer(make_finding("RC001", culprit_ranks=[1]), make_facts(None))
    assert repro.world_size == 3


def test_bad_script_name_falls_back():
    repro = render_case("RD007", {"world_size": 2}, script_name='x"; import os; ".py')
    assert repro.command.endswith(" repro.py")


# --- closed loop: run the reproducer, analyze its logs ------------------------------------------

TORCH = importlib.util.find_spec("torch") is not None
RUN_LIMIT_S = 120
PARALLEL_RUNS = int(os.environ.get("NCCLF_REPRO_PARALLEL", "4"))


@dataclass(frozen=True)
class LoopCase:
    rule: str
    index: int
    params: dict

    @property
    def name(self) -> str:
        return f"{self.rule}-case{self.index}"


def loop_cases(all_modes: bool) -> list[LoopCase]:
    """Each rule's cases; with all_modes, also its `extended` ones and one run of each variant
    combination no case covers."""
    cases = []
    for plan in SCRIPTED:
        cases += [LoopCase(plan.rule.id, i, dict(c)) for i, c in enumerate(plan.cases)
                  if all_modes or not c.get("extended")]
        if not all_modes:
            continue
        keys = list(plan.variants)
        covered = {tuple(plan.variant_values(c)[k] for k in keys) for c in plan.cases}
        extra = [v for v in product(*(plan.variants[k] for k in keys)) if v not in covered]
        for i, values in enumerate(extra, start=len(plan.cases)):
            cases.append(LoopCase(plan.rule.id, i, {**plan.cases[0], **dict(zip(keys, values, strict=True))}))
    return cases


# NCCLF_REPRO_ALL_MODES=1 adds the `extended` cases and a run of every variant (signal, mode, ...) that
# no listed case covers.
LOOP_CASES = loop_cases(os.environ.get("NCCLF_REPRO_ALL_MODES") == "1")


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    seconds: float
    log_dir: Path
    verdict: dict
    findings: list
    top_fix: str | None


@dataclass(frozen=True)
class LoopResult:
    repro: Reproducer
    failing: RunResult
    fixed: RunResult


_PORTS_GIVEN: set[int] = set()
_PORTS_LOCK = threading.Lock()


def free_port_pair() -> int:
    """A port P with P and P + 1 free (a script may point ranks at P + 1, where nothing listens).

    Drawn from below the kernel's ephemeral range, which the parallel runs' own outgoing gloo
    and store connections use, and never handed out twice in this process.
    """
    with _PORTS_LOCK:
        while True:
            port = random.randrange(20000, 32000, 2)
            if port in _PORTS_GIVEN or not (_port_free(port) and _port_free(port + 1)):
                continue
            _PORTS_GIVEN.add(port)
            return port


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_torchrun(server: TorchrunServer, repro: Reproducer, script: Path, workdir: Path, *,
                 fixed: bool) -> tuple[int, float, Path]:
    """torchrun the script as its docstring says; the console goes to LOGDIR/console.log.

    torchrun is forked from `server`, which imported torch once for all runs (tests/fixtures/torchrun_server.py).
    """
    log_dir = workdir / "logs"
    log_dir.mkdir(parents=True)
    argv = ["--nproc-per-node", str(repro.world_size), "--master-port", str(free_port_pair()), "--log-dir",
            str(log_dir), "--redirects", "3", "--tee", "3",
            str(script)]  # the script's own --timeout default, as its docstring runs it
    if "--fr-dir" in script.read_text():
        argv += ["--fr-dir", str(log_dir / "fr_trace")]
    if fixed:
        argv.append("--fixed")
    started = time.monotonic()
    code = server.run(argv, cwd=workdir, out=log_dir / "console.log", timeout=RUN_LIMIT_S)
    return code, time.monotonic() - started, log_dir


PORT_ATTEMPTS = 3


def run_and_analyze(server: TorchrunServer, repro: Reproducer, script: Path, workdir: Path, *,
                    fixed: bool) -> RunResult:
    """Run, then analyze; again on a new port when another process took the master port first.

    A port found free can still be taken before torchrun binds it; that run then fails at start-up,
    before any worker wrote a line, and says nothing about the case under test.
    """
    for attempt in range(PORT_ATTEMPTS):
        target = workdir if attempt == 0 else workdir.with_name(f"{workdir.name}-retry{attempt}")
        exit_code, seconds, log_dir = run_torchrun(server, repro, script, target, fixed=fixed)
        console = (log_dir / "console.log").read_text(errors="replace")
        agent_could_not_bind = "EADDRINUSE" in console and "[default" not in console
        if not agent_could_not_bind:
            break
    doc = analyze(log_dir)
    fixes = doc.get("fixes") or []
    return RunResult(exit_code, seconds, log_dir, doc["verdict"], doc.get("findings") or [],
                     fixes[0]["title"] if fixes else None)


_ANALYZE_LOCK = threading.Lock()


def analyze(log_dir: Path) -> dict:
    """What `ncclforensics analyze LOGDIR --json` prints, computed in this process (one import of the
    analyzer instead of one per run: the closed loop's time is mostly process start-up)."""
    with _ANALYZE_LOCK:
        return json.loads(json.dumps(diagnosis_dict(analyze_path(log_dir).diagnosis), default=str))


def run_loop(server: TorchrunServer, case: LoopCase, repro: Reproducer, root: Path) -> LoopResult:
    (root / case.name).mkdir()
    script = root / case.name / f"{case.name}.py"  # outside the log dir, so the analyzer never reads it
    script.write_text(repro.script)
    failing = run_and_analyze(server, repro, script, root / case.name / "failing", fixed=False)
    fixed = run_and_analyze(server, repro, script, root / case.name / "fixed", fixed=True)
    return LoopResult(repro, failing, fixed)


@pytest.fixture(scope="module")
def loop_results(request, tmp_path_factory) -> dict[str, LoopResult]:
    """Run every selected closed-loop case once, a few at a time (most of the time is spent waiting)."""
    selected = {item.callspec.params["case"].name for item in request.session.items
                if item.originalname == "test_closed_loop" and hasattr(item, "callspec")}
    cases = [c for c in LOOP_CASES if c.name in selected]
    root = tmp_path_factory.mktemp("repro")
    # rendered here, one at a time: Python 3.11's ast.parse (render_reproducer's check) is not
    # thread-safe ("AST constructor recursion depth mismatch")
    repros = {c.name: render_case(c.rule, c.params, script_name=f"{c.name}.py") for c in cases}
    # the longest runs (hangs: they wait out a timeout) first, so the pool drains evenly
    cases.sort(key=lambda c: repros[c.name].op_type is None)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # every torchrun's (the server's, which they inherit)
    with TorchrunServer(env, root / "torchrun_server.err") as server, ThreadPoolExecutor(PARALLEL_RUNS) as pool:
        futures = {c.name: pool.submit(run_loop, server, c, repros[c.name], root) for c in cases}
    results = {name: future.result() for name, future in futures.items()}
    if os.environ.get("NCCLF_REPRO_TIMES"):
        Path(os.environ["NCCLF_REPRO_TIMES"]).write_text(json.dumps({
            name: {"rule": r.repro.rule, "world_size": r.repro.world_size, "culprits": list(r.repro.culprit_ranks),
                   "failing_s": round(r.failing.seconds, 1), "fixed_s": round(r.fixed.seconds, 1),
                   "got": [r.failing.verdict.get("rule"), r.failing.verdict.get("culprit_ranks")],
                   "fixed_verdict": r.fixed.verdict.get("class"), "demonstrates": r.repro.demonstrates}
            for name, r in results.items()}, indent=1))
    return results


@pytest.mark.repro
@pytest.mark.skipif(not TORCH, reason="torch is not installed")
@pytest.mark.parametrize("case", LOOP_CASES, ids=[c.name for c in LOOP_CASES])
def test_closed_loop(case, loop_results):
    result = loop_results[case.name]
    repro, failing, fixed = result.repro, result.failing, result.fixed
    where = f"logs in {failing.log_dir} ({failing.seconds:.0f} s)"
    assert failing.exit_code != 0, f"the reproducer did not fail; {where}"
    got = (failing.verdict["rule"], failing.verdict["culprit_ranks"])
    assert got == (repro.rule, list(repro.culprit_ranks)), f"analyzer said {got}; {where}"
    if repro.op_type:
        assert failing.verdict["collective"]["op_type"] == repro.op_type, where
    assert failing.top_fix == repro.fix, f"the report's top fix is {failing.top_fix!r}; {where}"
    where = f"logs in {fixed.log_dir} ({fixed.seconds:.0f} s)"
    assert fixed.exit_code == 0, f"--fixed did not finish cleanly; {where}"
    failures = [f for f in fixed.findings if f["class"] != "unknown"]
    assert fixed.verdict["class"] == "unknown" and not failures, f"--fixed logs show a failure; {where}"
    console = (fixed.log_dir / "console.log").read_text(errors="replace")
    assert "Traceback (most recent call last)" not in console, f"--fixed logs hold a traceback; {where}"
