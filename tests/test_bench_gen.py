"""bench/gen_run.py: a small generated run reads back into the event table with the right shape."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from ncclforensics.events import build_events

GEN = Path(__file__).resolve().parent.parent / "bench" / "gen_run.py"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("bench_gen_run", GEN)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _generate(gen, out: Path, *extra: str) -> dict:
    assert gen.main(["--ranks", "8", "--per-host", "4", "--size", "2M", "--seed", "5", "--out", str(out), *extra]) == 0
    return json.loads(out.with_name(out.name + ".truth.json").read_text())


@pytest.mark.parametrize("layout", ["logdir", "console"])
def test_lagging_rank_run_reads_back(gen, tmp_path, layout):
    out = tmp_path / f"run_{layout}"
    truth = _generate(gen, out, "--layout", layout)
    assert truth["world_size"] == 8 and truth["failure"] == "lagging_rank"
    assert 1.5e6 < truth["bytes"] < 2.5e6

    res = build_events(out)
    df = res.events
    ranks = {int(r) for r in df["rank"].drop_nulls().unique().to_list()}
    assert ranks == set(range(8))  # the whole world, nothing else

    culprit, seq = truth["culprit_rank"], truth["seq"]
    timeouts = df.filter(df["kind"].cast(str) == "watchdog_timeout")
    assert set(timeouts["rank"].drop_nulls().to_list()) == set(range(8)) - {culprit}
    assert set(timeouts["seq"].to_list()) == {seq}
    assert set(timeouts["op"].to_list()) == {"ALLREDUCE"}

    # the laggard only saw the dump signal, with a frontier below S
    dump = df.filter((df["kind"].cast(str) == "dump_signal") & (df["rank"] == culprit))
    assert dump.height == 1


def test_same_seed_same_bytes(gen, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _generate(gen, a, "--failure", "xid")
    _generate(gen, b, "--failure", "xid")
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files_a == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert any(p.name.startswith("dmesg-") for p in files_a)
    for rel in files_a:
        assert (a / rel).read_bytes() == (b / rel).read_bytes()


@pytest.mark.parametrize("failure", ["xid", "oom"])
def test_other_failures_read_back(gen, tmp_path, failure):
    out = tmp_path / failure
    truth = _generate(gen, out, "--failure", failure, "--tar-gz")
    df = build_events(out).events
    kinds = set(df["kind"].cast(str).to_list())
    assert "watchdog_timeout" in kinds
    assert ("xid" if failure == "xid" else "cuda_oom") in kinds
    # the archive holds the same run
    tgz = Path(truth["tar_gz"])
    assert tgz.exists()
    df2 = build_events(tgz).events
    assert df2.height == df.height
