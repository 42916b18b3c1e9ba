"""parse/prefilter.py: the literal search answers as a plain line-by-line search would, with
Hyperscan and with Python's re."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ncclforensics.parse.prefilter import HYPERSCAN, LiteralSet

LITS = {"strong": ["NCCL WARN", "Watchdog", "WARN"], "weak": ["step", "ep", "é"]}
ENGINES = [False] + ([True] if HYPERSCAN else [])

# lines made of pieces that hold, overlap and nearly hold the literals, bytes that are not UTF-8 too
PIECES = ["NCCL WARN", "NCCL WAR", "Watch", "dog", "step", "ste", "p", "é", "\xe9", "x", " ", "WARN"]
line = st.lists(st.sampled_from(PIECES), max_size=6).map("".join)
text = st.lists(line, max_size=40).map("\n".join).map(lambda s: s.encode("utf-8", "surrogateescape"))


def reference(data: bytes, a: int, b: int) -> list[tuple[int, str]]:
    lits = [x.encode() for group in LITS.values() for x in group]
    lines = data[a:b].split(b"\n")
    return [(i, ln.decode("utf-8", "replace")) for i, ln in enumerate(lines) if any(x in ln for x in lits)][::-1]


@pytest.mark.parametrize("use_hyperscan", ENGINES)
@settings(max_examples=150, deadline=None)
@given(data=text, cut=st.tuples(st.integers(0, 400), st.integers(0, 400)), window=st.sampled_from([1, 7, 64, 4096]),
       known=st.booleans())
def test_lines_backward_is_a_reversed_line_search(use_hyperscan: bool, data: bytes, cut: tuple[int, int],
                                                  window: int, known: bool) -> None:
    # a range starts at a line start and ends just after a newline or at the end of the data
    starts = [0] + [i + 1 for i, c in enumerate(data) if c == 10]
    a = starts[min(cut[0], len(starts) - 1)]
    ends = [i + 1 for i, c in enumerate(data) if c == 10 and i + 1 > a] + [len(data)]
    b = ends[min(cut[1], len(ends) - 1)]
    ls = LiteralSet(LITS, use_hyperscan=use_hyperscan)
    got = list(ls.lines_backward(data, a, b, newlines=data.count(b"\n", a, b) if known else None, window=window))
    assert got == (reference(data, a, b) if a < b else [])


@pytest.mark.parametrize("use_hyperscan", ENGINES)
@settings(max_examples=150, deadline=None)
@given(data=text)
def test_lines_with_is_a_line_search(use_hyperscan: bool, data: bytes) -> None:
    ls = LiteralSet(LITS, use_hyperscan=use_hyperscan)
    got = ls.lines_with(data, 0, len(data))
    lines = data.split(b"\n")
    for group, lits in LITS.items():
        want = [i for i, ln in enumerate(lines) if any(x.encode() in ln for x in lits)]
        assert got.get(group, []) == want


@pytest.mark.parametrize("use_hyperscan", ENGINES)
@settings(max_examples=200, deadline=None)
@given(body=st.lists(st.sampled_from(PIECES + ["\ud800", "WARNé"]), max_size=8).map("".join))
def test_literals_in_finds_what_in_finds(use_hyperscan: bool, body: str) -> None:
    """SignatureSet.candidates' literals: one scan of a body gives what `lit in body` gives, overlapping
    and non-ASCII literals and a lone surrogate included."""
    lits = [x for group in LITS.values() for x in group] + ["WARNé", "dog"]
    finder = LiteralSet({"all": lits}, use_hyperscan=use_hyperscan)
    assert finder.literals_in(body) == {lit for lit in lits if lit in body}


def test_candidates_are_the_signatures_of_the_literals_a_body_holds() -> None:
    from ncclforensics.parse.signatures import load_signatures

    sigset = load_signatures()
    for sig in sigset.signatures:
        for sample in sig.samples:
            body = sample.get("line")
            if not isinstance(body, str):
                continue
            want = [s for s in sigset.signatures if any(lit in body for lit in s.prefilter)]
            assert list(sigset.candidates(body)) == want
            assert list(sigset.candidates(body, weak_only=True)) == [s for s in want if s.weak]
            assert list(sigset.candidates(body)) == want  # again: remembered by the literals found


def test_match_all_remembers_bodies_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body seen before is answered as a fresh signature set answers it; the memory of bodies
    stays bounded, and long bodies are not remembered."""
    from ncclforensics.parse import signatures

    monkeypatch.setattr(signatures, "MATCH_CACHE_ENTRIES", 4)
    sigset = signatures.load_signatures()
    sigset._matches.clear()  # the set is shared by the process: start from no memory
    bodies = ["NCCL WARN Cuda failure 'out of memory'", "step 12 loss 2.5", "NCCL INFO Init COMPLETE",
              "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, "
              "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.",
              "nothing here", "x" * (signatures.MATCH_CACHE_CHARS + 1) + " step 3"]

    def fresh(body: str, weak_only: bool) -> list:
        return [(sig.path, f) for sig in sigset.candidates(body, weak_only=weak_only)
                if (f := sig.match(body)) is not None]

    for _ in range(3):
        for body in bodies:
            for weak_only in (False, True):
                assert [(sig.path, f) for sig, f in sigset.match_all(body, weak_only=weak_only)] == \
                    fresh(body, weak_only)
                assert len(sigset._matches) <= 4
    assert all(len(body) <= signatures.MATCH_CACHE_CHARS for body, _ in sigset._matches)
    assert any(sig.event == "watchdog_timeout" for sig, _ in sigset.match_all(bodies[3]))


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=3000).map(lambda b: b.replace(b"\x00", b"\n")),
       cut=st.tuples(st.integers(0, 3100), st.one_of(st.none(), st.integers(0, 3100))),
       sizes=st.sampled_from([(1, 1, 1), (16, 16, 7), (100, 1, 64), (1 << 30, 1 << 30, 1), (1 << 30, 50, 16)]))
def test_count_newlines_counts_as_bytes_count(data: bytes, cut: tuple[int, int | None],
                                              sizes: tuple[int, int, int]) -> None:
    """NumPy's count (ranges of NUMPY_MIN bytes and more, or NUMPY_SMALL once NumPy is imported,
    NUMPY_STEP at a time) and bytes.count agree whatever the range and the step; the thresholds are
    lowered here so that small inputs take both paths."""
    from ncclforensics.parse import prefilter

    assert prefilter.numpy_module() is not None  # imported: NUMPY_SMALL applies
    saved = prefilter.NUMPY_MIN, prefilter.NUMPY_SMALL, prefilter.NUMPY_STEP
    prefilter.NUMPY_MIN, prefilter.NUMPY_SMALL, prefilter.NUMPY_STEP = sizes
    try:
        a, b = cut
        assert prefilter.count_newlines(data, a, b) == data.count(b"\n", a, b)
    finally:
        prefilter.NUMPY_MIN, prefilter.NUMPY_SMALL, prefilter.NUMPY_STEP = saved


def test_count_newlines_leaves_numpy_unimported_on_small_ranges() -> None:
    """A small run (sample_logs) never pays NumPy's import: ranges under NUMPY_MIN use bytes.count."""
    import subprocess
    import sys

    code = ("import sys; from ncclforensics.parse.prefilter import count_newlines, NUMPY_MIN; "
            "n = count_newlines(b'a\\n' * (NUMPY_MIN // 2 - 1)); "
            "assert 'numpy' not in sys.modules, 'imported'; "
            "assert count_newlines(b'a\\n' * NUMPY_MIN) == NUMPY_MIN; assert 'numpy' in sys.modules; print(n)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) > 0
