"""Reproducer templates: they render from validated fields only, pass ruff, and really fail as diagnosed.

The closed-loop tests (marker `repro`) run each rendered script under torchrun on CPU with gloo, analyze
the run's own logs and expect the finding's class and culprit ranks back; then run it with --fixed and
expect exit 0. They need torch and take a few minutes; `pytest -m "not repro"` skips them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ncclforensics.model import Evidence, Finding, Fix, RootCause, RunFacts
from ncclforensics.repro.render import MODES, Reproducer, render_reproducer

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CANARY = "CANARY_7f3a"  # stands for any log text; it must never reach a script


def make_finding(cause: RootCause | str, **params: object) -> Finding:
    culprits = params.get("culprit_ranks", [])
    return Finding(
        root_cause=RootCause(cause), rule="XX000", title="t", message="m", confidence=0.9,
        culprit_ranks=list(culprits) if isinstance(culprits, list) else [], params=dict(params),
    )


def make_facts(world_size: int | None = 4) -> RunFacts:
    return RunFacts(path="logs", files=3, lines=100, bytes=1000, world_size=world_size, ranks_seen=[],
                    hosts=["node-a"], versions={}, skipped=[])


def template_cases() -> list[tuple[RootCause, str | None]]:
    cases: list[tuple[RootCause, str | None]] = []
    for cause in RootCause:
        cases += [(cause, mode) for mode in MODES.get(cause, (None,))]
    return cases


TEMPLATE_CASES = template_cases()
TEMPLATE_IDS = [f"{cause.value}-{mode}" if mode else cause.value for cause, mode in TEMPLATE_CASES]


def render_case(cause: RootCause, template_mode: str | None, **params: object) -> Reproducer:
    params.setdefault("culprit_ranks", [1])
    if template_mode:
        params["mode"] = template_mode
    return render_reproducer(make_finding(cause, **params), make_facts())


# --- fast unit tests ---------------------------------------------------------------------------


@pytest.mark.parametrize(("cause", "mode"), TEMPLATE_CASES, ids=TEMPLATE_IDS)
def test_every_template_renders(cause, mode):
    repro = render_case(cause, mode, step=3, op_type="ALLREDUCE", seq=812, timeout_s=600, signal=11)
    assert repro.template == cause.value
    assert repro.command == f"torchrun --nproc-per-node {repro.world_size} repro.py"
    assert repro.script.startswith('"""Reproducer: ')
    for flag in ("--backend", "--timeout", "--fixed"):
        assert f'"{flag}"' in repro.script
    compile(repro.script, "repro.py", "exec")


def test_rendered_scripts_pass_ruff(tmp_path):
    ruff = shutil.which("ruff", path=str(BIN)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    for (cause, mode), name in zip(TEMPLATE_CASES, TEMPLATE_IDS, strict=True):
        (tmp_path / f"{name}.py").write_text(render_case(cause, mode).script)
    result = subprocess.run([ruff, "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(tmp_path)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_reproducer_names_the_template_it_used():
    finding = make_finding(RootCause.RANK_CRASH, culprit_ranks=[1])
    finding.reproducer = "oom"
    assert render_reproducer(finding, make_facts()).template == "oom"
    finding.reproducer = "no such template"
    assert render_reproducer(finding, make_facts()).template == "rank_crash"


@pytest.mark.parametrize("bad", ["; rm -rf /", "ALLREDUCE\nimport os", "allreduce", 7, None])
def test_bad_op_type_falls_back(bad):
    script = render_case(RootCause.RANK_DIVERGENCE, "extra_collective", op_type=bad).script
    assert "rm -rf" not in script
    assert "import os\nimport os" not in script
    assert "dist.all_reduce(norm_sq)" in script


def test_op_type_picks_the_collective():
    script = render_case(RootCause.RANK_DIVERGENCE, "extra_collective", op_type="BROADCAST").script
    assert "dist.broadcast(norm_sq, src=0)" in script


@pytest.mark.parametrize("bad", [[10**12], [-1], ["1"], [True], "0,1", [1.5]])
def test_bad_culprit_ranks_are_dropped(bad):
    repro = render_case(RootCause.RANK_CRASH, "exception", culprit_ranks=bad)
    assert "CRASHING_RANKS = (3,)" in repro.script  # the template's default: the last rank


@pytest.mark.parametrize(("key", "bad"), [("world_size", 10**9), ("world_size", True), ("step", -5),
                                          ("step", "3"), ("signal", 99), ("mode", "rm -rf"), ("timeout_s", 10**12)])
def test_bad_scalars_fall_back(key, bad):
    repro = render_case(RootCause.RANK_CRASH, None, **{key: bad})
    assert repro.world_size == 4
    assert "CRASH_AT_STEP = 3" in repro.script
    assert "rm -rf" not in repro.script


def test_signal_and_mode_are_used():
    script = render_case(RootCause.RANK_CRASH, "signal", signal=7).script
    assert "FATAL_SIGNAL = signal.SIGBUS" in script


def test_no_log_text_reaches_the_script():
    finding = make_finding(
        RootCause.RANK_DIVERGENCE, culprit_ranks=[1], mode="early_exit", op_type=CANARY, note=CANARY,
    )
    finding.title = finding.message = f'"""{CANARY}'
    finding.evidence = [Evidence(file=f"{CANARY}.log", line=1, text=f"{CANARY}\n\"\"\"; import os")]
    finding.fixes = [Fix(title=CANARY, why=CANARY, code=CANARY)]
    finding.doc = {"what_it_detects": CANARY}
    facts = RunFacts(path=CANARY, files=1, lines=1, bytes=1, world_size=4, ranks_seen=[0, 1], hosts=[CANARY],
                     versions={"torch": CANARY}, skipped=[], env={"X": CANARY}, notes=[CANARY])
    for template in (*[c.value for c in RootCause], None):
        finding.reproducer = template
        assert CANARY not in render_reproducer(finding, facts).script


def test_large_world_is_capped_and_culprits_remapped():
    repro = render_reproducer(make_finding(RootCause.RANK_CRASH, culprit_ranks=[37]), make_facts(64))
    assert repro.world_size == 4
    assert "CRASHING_RANKS = (3,)" in repro.script
    assert "The diagnosed run had 64 ranks; this one has 4." in repro.script
    assert "Diagnosed rank 37 is played by rank 3." in repro.script


def test_rank_zero_stays_rank_zero_and_culprits_stay_a_minority():
    finding = make_finding(RootCause.RANK_DIVERGENCE, culprit_ranks=[0, 40, 41], mode="early_exit")
    repro = render_reproducer(finding, make_facts(64))
    assert "CULPRIT_RANKS = (0,)" in repro.script
    assert "diagnosed ranks 40, 41" in repro.script


def test_real_world_size_keeps_the_ranks():
    finding = make_finding(RootCause.RANK_CRASH, culprit_ranks=[37])
    repro = render_reproducer(finding, make_facts(64), real_world_size=True)
    assert repro.world_size == 64
    assert repro.command == "torchrun --nproc-per-node 64 repro.py"
    assert "CRASHING_RANKS = (37,)" in repro.script


def test_unknown_world_size_fits_the_culprits():
    repro = render_reproducer(make_finding(RootCause.OOM, culprit_ranks=[1]), make_facts(None))
    assert repro.world_size == 3


def test_launch_config_always_shares_a_gpu_between_two_ranks():
    repro = render_case(RootCause.LAUNCH_CONFIG, None, culprit_ranks=[2])
    assert "SHARED_GPU_RANKS = (0, 2)" in repro.script


def test_unreachable_store_without_culprits_misconfigures_every_rank():
    repro = render_case(RootCause.NETWORK_INIT, "unreachable_store", culprit_ranks=[], world_size=3)
    assert "MISCONFIGURED_RANKS = (0, 1, 2)" in repro.script
    assert "Every rank was launched with the wrong store port" in repro.script


# --- closed loop: run the reproducer, analyze its logs ------------------------------------------

TORCH = importlib.util.find_spec("torch") is not None
PG_TIMEOUT_S = 12  # long enough for every rank to import torch on a loaded 2-core machine
RUN_LIMIT_S = 150
PARALLEL_RUNS = 4


@dataclass(frozen=True)
class LoopCase:
    name: str
    cause: RootCause
    world_size: int
    culprits: tuple[int, ...]
    params: dict[str, object] = field(default_factory=dict)

    @property
    def expected_culprits(self) -> list[int]:
        return list(self.culprits)  # what the finding said, also when it named no rank


# One case per template runs by default; NCCLF_REPRO_ALL_MODES=1 adds every other mode (about twice as long).
LOOP_CASES = [
    LoopCase("rank_divergence-extra", RootCause.RANK_DIVERGENCE, 3, (0,), {"mode": "extra_collective", "step": 3}),
    LoopCase("checkpoint_save-barrier", RootCause.CHECKPOINT_SAVE, 3, (0,), {"mode": "barrier"}),
    LoopCase("network_init-unreachable", RootCause.NETWORK_INIT, 2, (1,), {"mode": "unreachable_store"}),
    LoopCase("dataloader_abort-sigkill", RootCause.DATALOADER_ABORT, 2, (1,), {"mode": "sigkill"}),
    LoopCase("oom-host", RootCause.OOM, 2, (1,), {"mode": "host"}),
    LoopCase("rank_crash-exception", RootCause.RANK_CRASH, 3, (1,), {"mode": "exception"}),
    LoopCase("gpu_hardware", RootCause.GPU_HARDWARE, 2, (1,)),
    # NR001 blames a host, not ranks (culprit policy "none"): the finding names no rank.
    LoopCase("network_runtime", RootCause.NETWORK_RUNTIME, 2, ()),
    LoopCase("launch_config-duplicate_gpu", RootCause.LAUNCH_CONFIG, 3, (0, 1), {"mode": "duplicate_gpu"}),
    LoopCase("unknown", RootCause.UNKNOWN, 2, ()),
]
OTHER_MODE_CASES = [
    LoopCase("rank_divergence-missing", RootCause.RANK_DIVERGENCE, 3, (1,), {"mode": "missing_collective"}),
    LoopCase("rank_divergence-early_exit", RootCause.RANK_DIVERGENCE, 3, (2,), {"mode": "early_exit"}),
    LoopCase("checkpoint_save-collective", RootCause.CHECKPOINT_SAVE, 2, (0,), {"mode": "collective"}),
    LoopCase("network_init-missing_rank", RootCause.NETWORK_INIT, 3, (1,), {"mode": "missing_rank"}),
    LoopCase("dataloader_abort-bus_error", RootCause.DATALOADER_ABORT, 2, (1,), {"mode": "bus_error"}),
    LoopCase("dataloader_abort-exit", RootCause.DATALOADER_ABORT, 2, (0,), {"mode": "exit"}),
    LoopCase("rank_crash-signal", RootCause.RANK_CRASH, 2, (1,), {"mode": "signal", "signal": 9}),
    LoopCase("launch_config-device", RootCause.LAUNCH_CONFIG, 2, (1,), {"mode": "device"}),
    LoopCase("launch_config-shm", RootCause.LAUNCH_CONFIG, 2, (1,), {"mode": "shm"}),
]


if os.environ.get("NCCLF_REPRO_ALL_MODES") == "1":
    LOOP_CASES += OTHER_MODE_CASES


@dataclass(frozen=True)
class LoopResult:
    exit_code: int
    fixed_exit_code: int
    verdict: dict
    seconds: float
    log_dir: Path


_PORTS_GIVEN: set[int] = set()
_PORTS_LOCK = threading.Lock()


def free_port_pair() -> int:
    """A port P with P and P + 1 free: network_init points its misconfigured ranks at P + 1.

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


def run_torchrun(case: LoopCase, script: Path, workdir: Path, *, fixed: bool) -> tuple[int, Path]:
    """torchrun the script with a --log-dir tree; the console goes to LOGDIR/console.log."""
    log_dir = workdir / "logs"
    log_dir.mkdir(parents=True)
    command = [str(BIN / "torchrun"), "--nproc-per-node", str(case.world_size), "--master-port",
               str(free_port_pair()), "--log-dir", str(log_dir / "torchrun_logs"), "--redirects", "3", "--tee", "3",
               str(script), "--timeout", str(PG_TIMEOUT_S)]
    if "--fr-dir" in script.read_text():
        command += ["--fr-dir", str(log_dir / "fr_trace")]
    if fixed:
        command.append("--fixed")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with (log_dir / "console.log").open("wb") as console:
        proc = subprocess.run(command, cwd=workdir, stdout=console, stderr=subprocess.STDOUT, env=env,
                              timeout=RUN_LIMIT_S, check=False)
    return proc.returncode, log_dir


PORT_ATTEMPTS = 3


def run_until_port_held(case: LoopCase, script: Path, workdir: Path, *, fixed: bool) -> tuple[int, Path]:
    """run_torchrun, again on a new port when another process took the master port first.

    A port found free can still be taken before torchrun binds it; that run then fails at start-up
    (the analyzer rightly says launch_config) and says nothing about the case under test.
    """
    for attempt in range(PORT_ATTEMPTS):
        target = workdir if attempt == 0 else workdir.with_name(f"{workdir.name}-retry{attempt}")
        exit_code, log_dir = run_torchrun(case, script, target, fixed=fixed)
        console = (log_dir / "console.log").read_text(errors="replace")
        if "failed to bind" not in console and "Address already in use" not in console:
            break
    return exit_code, log_dir


def analyze(log_dir: Path) -> dict:
    proc = subprocess.run([str(BIN / "ncclforensics"), "analyze", str(log_dir), "--json", "-q"],
                          capture_output=True, text=True, timeout=RUN_LIMIT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["verdict"]


def run_loop(case: LoopCase, root: Path) -> LoopResult:
    started = time.monotonic()
    finding = make_finding(case.cause, world_size=case.world_size, culprit_ranks=list(case.culprits), **case.params)
    repro = render_reproducer(finding, make_facts(case.world_size))
    assert repro.world_size == case.world_size
    (root / case.name).mkdir()
    script = root / case.name / "repro.py"  # outside the log dir, so the analyzer never reads it
    script.write_text(repro.script)
    exit_code, log_dir = run_until_port_held(case, script, root / case.name / "failing", fixed=False)
    verdict = analyze(log_dir)
    fixed_exit_code = exit_code  # the healthy "unknown" job has no fix to apply
    if case.cause is not RootCause.UNKNOWN:
        fixed_exit_code, _ = run_until_port_held(case, script, root / case.name / "fixed", fixed=True)
    return LoopResult(exit_code, fixed_exit_code, verdict, time.monotonic() - started, log_dir)


@pytest.fixture(scope="module")
def loop_results(request, tmp_path_factory) -> dict[str, LoopResult]:
    """Run every selected closed-loop case once, a few at a time (most of the time is spent waiting)."""
    selected = {item.callspec.params["case"].name for item in request.session.items
                if item.originalname == "test_closed_loop" and hasattr(item, "callspec")}
    cases = [c for c in LOOP_CASES if c.name in selected]
    root = tmp_path_factory.mktemp("repro")
    with ThreadPoolExecutor(PARALLEL_RUNS) as pool:
        futures = {c.name: pool.submit(run_loop, c, root) for c in cases}
    return {name: future.result() for name, future in futures.items()}


@pytest.mark.repro
@pytest.mark.skipif(not TORCH, reason="torch is not installed")
@pytest.mark.parametrize("case", LOOP_CASES, ids=[c.name for c in LOOP_CASES])
def test_closed_loop(case, loop_results):
    result = loop_results[case.name]
    got = (result.verdict["class"], result.verdict["culprit_ranks"])
    want = (case.cause.value, case.expected_culprits)
    if case.cause is RootCause.UNKNOWN:
        assert result.exit_code == 0, f"the healthy job failed; logs in {result.log_dir}"
    else:
        assert result.exit_code != 0, f"the reproducer did not fail; logs in {result.log_dir}"
    assert got == want, f"analyzer said {got}, expected {want}; logs in {result.log_dir} ({result.seconds:.0f} s)"
    assert result.fixed_exit_code == 0, f"--fixed did not finish cleanly; logs in {result.log_dir.parents[1] / 'fixed'}"
