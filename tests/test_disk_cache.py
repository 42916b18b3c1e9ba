"""What ncclforensics keeps in the user's cache folder (ncclforensics.diskcache) is checked against what
it was made from: a changed pattern file is parsed again, a damaged cache is rebuilt, a cache that
cannot be written costs only time; the answers never change."""

from __future__ import annotations

import json
import os

import pytest

from ncclforensics import patternfile
from ncclforensics.parse import prefilter
from ncclforensics.parse.prefilter import HYPERSCAN, LiteralSet


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "ncclforensics"


def test_toml_tables_follow_their_files(tmp_path, cache_home, monkeypatch):
    cache = patternfile._TomlCache()
    assert cache.file.parent == cache_home
    monkeypatch.setattr(patternfile, "_CACHE", cache)
    path = tmp_path / "sig.toml"
    path.write_text('event = "a"\nvariants = [{ regex = "x" }]\n')
    first = patternfile.load_toml(path)
    first["event"] = "changed by a caller"
    assert patternfile.load_toml(path) == {"event": "a", "variants": [{"regex": "x"}]}  # a copy of its own
    cache.write()
    assert json.loads(cache.file.read_text())[os.path.abspath(path)][2] == json.dumps(
        {"event": "a", "variants": [{"regex": "x"}]})
    # a new process reads the cache; an edited file (other size or time) is parsed again
    fresh = patternfile._TomlCache()
    monkeypatch.setattr(patternfile, "_CACHE", fresh)
    assert patternfile.load_toml(path)["event"] == "a"
    path.write_text('event = "bb"\n')
    assert patternfile.load_toml(path) == {"event": "bb"}
    # a damaged cache file is ignored and replaced
    cache.file.write_text("{not json")
    damaged = patternfile._TomlCache()
    monkeypatch.setattr(patternfile, "_CACHE", damaged)
    assert patternfile.load_toml(path) == {"event": "bb"}
    damaged.write()
    assert os.path.abspath(path) in json.loads(cache.file.read_text())


def test_toml_errors_are_not_cached(tmp_path, cache_home, monkeypatch):
    monkeypatch.setattr(patternfile, "_CACHE", patternfile._TomlCache())
    path = tmp_path / "bad.toml"
    path.write_text("event = \n")
    with pytest.raises(patternfile.tomllib.TOMLDecodeError):
        patternfile.load_toml(path)
    path.write_text('event = "ok"\n')
    assert patternfile.load_toml(path) == {"event": "ok"}


def test_an_unwritable_cache_costs_only_time(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # a file where the folder would be
    cache = patternfile._TomlCache()
    monkeypatch.setattr(patternfile, "_CACHE", cache)
    path = tmp_path / "sig.toml"
    path.write_text('event = "a"\n')
    assert patternfile.load_toml(path) == {"event": "a"}
    cache.write()  # no error
    assert LiteralSet({"strong": ["WARN"]}).blocks_with_any(b"x\nWARN\n", [(0, 2), (2, 7)]) == [1]


@pytest.mark.skipif(not HYPERSCAN, reason="the hyperscan package is not installed")
def test_hyperscan_databases_are_kept_and_rebuilt(cache_home):
    lits = {"strong": ["NCCL WARN", "Watchdog"], "weak": ["step"]}
    data = b"step 1\nNCCL WARN x\nnothing\nWatchdog caught\n"
    spans = [(0, 7), (7, 19), (19, 27), (27, len(data))]
    want = LiteralSet(lits).lines_with(data, 0, len(data))
    kept = sorted((cache_home / "hyperscan").iterdir())
    assert len(kept) == 2  # the literals, with and without SINGLEMATCH
    assert LiteralSet(lits).lines_with(data, 0, len(data)) == want  # loaded from the cache
    for f in kept:
        f.write_bytes(b"damaged")
    again = LiteralSet(lits)
    assert again.lines_with(data, 0, len(data)) == want
    assert again.blocks_with_any(data, spans) == [0, 1, 3]
    assert all(f.read_bytes() != b"damaged" for f in kept)  # compiled again and kept
    assert prefilter._database([b"a"], 0, literal=True) is not None


def _console_script(args, cache_home, **kw):
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home.parent)}
    return subprocess.run([sys.executable, "-m", "ncclforensics", *args], capture_output=True, text=True, env=env,
                          timeout=120, **kw)


def test_the_console_scripts_quick_exit_still_runs_the_exit_handlers(cache_home):
    """The console script (cli.run) ends without tearing the modules down, after the exit handlers:
    the pattern tables are written at exit, the exit code and every byte of stdout are kept."""
    from pathlib import Path

    sample = Path(__file__).resolve().parent.parent / "sample_logs"
    proc = _console_script(["analyze", str(sample), "--json", "--fail-on", "any"], cache_home)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["verdict"]["class"] == "rank_divergence"
    assert "named by --fail-on" in proc.stderr
    assert list(cache_home.glob("toml-*.json")), "the exit handler wrote no pattern tables"
    assert _console_script(["analyze", str(sample / "no-such-folder")], cache_home).returncode == 3
    usage = _console_script(["analyze", "--no-such-flag"], cache_home)
    assert usage.returncode == 2 and "--no-such-flag" in usage.stderr
