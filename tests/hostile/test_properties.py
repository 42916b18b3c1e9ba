"""Properties over arbitrary input: ingest, envelope peeling and every signature never raise.

Runs are derandomized (the same examples on every run, no example database), so the suite is
deterministic; raise HYPOTHESIS_PROFILE=hostile-long for a longer local search.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ncclforensics.events import build_events
from ncclforensics.ingest.envelope import ANSI, Envelope, peel_all
from ncclforensics.parse.signatures import load_signatures

from .builders import watchdog

settings.register_profile("hostile", max_examples=120, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("hostile-long", max_examples=5_000, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "hostile")

SIGS = load_signatures().signatures
SAMPLES = [s["line"] for sig in SIGS for s in sig.samples]
ENVELOPES = [
    "[rank3]:", "[rank11]: ", "[default3]:", "[default3|1]:", "[E0914 02:11:53.518220741 ProcessGroupNCCL.cpp:665] ",
    "[E ProcessGroupNCCL.cpp:833] ", "W1122 07:44:17.428000 873 torch/distributed/run.py:874] ",
    "[2025-02-17 06:30:12,408] torch.distributed.run: [WARNING] ", "ERROR:torch.distributed.elastic:",
    "[1,7]<stderr>:", "(RayWorkerWrapper pid=61833, ip=10.42.7.19) ", "[ 912734.602118] ",
    "[Tue Jun 10 03:17:42 2025] ", "kern  :err   : ", "2025-06-10T03:17:42,604118+02:00 ", "11/22/2026 07:50:18 ",
    "Jun 10 03:17:42 gpu-q17 kernel: ", "4,88213,912734602118,-;", " 7: ", "P1 7: ", "INFO: ", "[Rank 0/4] ",
    "node-a:3: ", "[40218] ", "gpu-q17:58213:58391 [5] ", "gpu-q17:58213:58391 [5] misc/socket.cc:538 ",
    "\x1b[31m", "\x1b[0m", "[31m", "\r", "\t", "\ufeff",
]
SEPARATORS = [b"\n", b"\r\n", b"\r", b"\x00", b"", b" "]
MAGIC = [b"", b"\x1f\x8b\x08\x00", b"\x80\x04\x95", b"\x80\x02", b"\xff\xfe", b"\xfe\xff", b"{", b'{"entries": [',
         b"PK\x03\x04", b"\xef\xbb\xbf", b"\x28\xb5\x2f\xfd", b"BZh9", b"\xfd7zXZ\x00", b"\x7fELF"]
SUFFIXES = ["", ".log", ".txt", ".out", ".json", ".pkl", ".gz", ".bz2", ".xz", ".zst", ".tar", ".tar.gz", ".tgz",
            ".zip", "rank3.log", "dmesg-node1.log"]


def _mutated(draw, line: str) -> str:
    """A sample line cut, spliced or salted with arbitrary text."""
    i = draw(st.integers(0, len(line)))
    j = draw(st.integers(i, len(line)))
    return line[:i] + draw(st.text(max_size=20)) + line[j:]


@st.composite
def log_text(draw) -> str:
    parts = draw(st.lists(st.one_of(
        st.sampled_from(ENVELOPES), st.sampled_from(SAMPLES), st.text(max_size=40),
    ), max_size=8))
    out = "".join(parts)
    if out and draw(st.booleans()):
        out = _mutated(draw, out)
    return out


@st.composite
def log_bytes(draw) -> bytes:
    lines = draw(st.lists(st.one_of(log_text().map(lambda s: s.encode("utf-8", "surrogatepass")),
                                    st.binary(max_size=64)), max_size=12))
    sep = draw(st.sampled_from(SEPARATORS))
    return draw(st.sampled_from(MAGIC)) + sep.join(lines)


def _ingest_never_raises(data: bytes, name: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        run.mkdir()
        f = run / name
        f.write_bytes(data)
        for path in (run, f):
            res = build_events(path)
            assert all(s.reason for s in res.skipped)
            # every event comes from the one file written, and the file is either read or skipped
            assert set(res.events["file"].unique().to_list()) <= {name}
            assert res.files + len(res.skipped) >= 1


@settings.get_profile(PROFILE)
@given(data=st.binary(max_size=4096), magic=st.sampled_from(MAGIC), suffix=st.sampled_from(SUFFIXES))
def test_arbitrary_bytes_never_raise(data, magic, suffix):
    _ingest_never_raises(magic + data, "f" + suffix)


@settings.get_profile(PROFILE)
@given(data=log_bytes(), suffix=st.sampled_from(["x.log", "rank2.log", "fr_trace_3", "error.json"]))
def test_log_like_bytes_never_raise(data, suffix):
    _ingest_never_raises(data, suffix)


@settings.get_profile(PROFILE)
@given(line=st.one_of(st.text(), log_text()))
def test_peel_all_never_raises(line):
    envs = peel_all(line)
    assert envs and all(isinstance(e, Envelope) and isinstance(e.body, str) for e in envs)
    peel_all(ANSI.sub("", line))


@settings.get_profile(PROFILE)
@given(sig=st.sampled_from(SIGS), text=st.one_of(st.text(), log_text()), data=st.data())
def test_every_signature_match_never_raises(sig, text, data):
    if data.draw(st.booleans()) and sig.samples:
        text = _mutated(data.draw, data.draw(st.sampled_from(sig.samples))["line"]) + text
    fields = sig.match(text)
    if fields is not None:  # only declared fields and constants, each of its declared type
        assert set(fields) <= set(sig.fields) | set(sig.constants)
    for found, got in load_signatures().match_all(text):
        assert got == found.match(text)


# -- crashes found by these properties in modules this suite may not change (reported) ----------

def test_iso_stamp_at_the_edge_of_time():
    env = peel_all("0001-01-01T00:00:00+05:00 " + watchdog(1))[-1]
    assert env.rank == 1
    assert env.body.startswith("[Rank 1] Watchdog caught collective operation timeout")


def test_huge_number_in_a_ms_field():
    sig = next(s for s in SIGS if s.path == "c10d/store_timeout.toml")
    fields = sig.match(f"torch.distributed.DistStoreError: Timed out after {'9' * 400} seconds waiting for clients. "
                       "1/2 clients joined.")
    # the line is still recognised; the number past Int64 gives no timeout rather than a wrong one
    assert fields == {"detail": "Timed out after", "joined": 1, "expected": 2}
