"""Every signature file: its `match` samples match and yield their fields, `no_match` samples don't."""

from __future__ import annotations

import re
import time

import polars as pl
import pytest

from ncclforensics.ingest.envelope import ANSI, peel_all
from ncclforensics.model import EVENT_SCHEMA, INT_COLUMNS
from ncclforensics.parse.signatures import FIELD_TYPES, SIGNATURES_DIR, load_signatures

SIGS = load_signatures().signatures
IDS = [s.path for s in SIGS]


def bodies(line: str) -> list[str]:
    return [e.body for e in peel_all(ANSI.sub("", line))]


def first_match(sig, line):
    for body in bodies(line):
        if any(lit in body for lit in sig.prefilter):
            got = sig.match(body)
            if got is not None:
                return got
    return None


def test_signatures_exist():
    assert len(SIGS) >= 30
    assert {p.parent.name for p in SIGS_DIR_FILES()} >= {"nccl", "gloo", "torchrun", "kernel"}


def SIGS_DIR_FILES():
    return list(SIGNATURES_DIR.rglob("*.toml"))


@pytest.mark.parametrize("sig", SIGS, ids=IDS)
def test_file_layout(sig):
    source, name = sig.path.split("/")
    assert source == sig.source, "folder must be the source"
    assert name == f"{sig.event}.toml", "file name must be the event"
    assert sig.description, "describe the signature, with its FORMATS.md section"
    assert sig.samples, "at least one match sample"
    assert sig.no_match, "at least one no_match sample"


@pytest.mark.parametrize("sig", SIGS, ids=IDS)
def test_declared_fields_are_capture_groups(sig):
    groups = set()
    for rx in sig.variants:
        groups |= set(rx.groupindex)
    assert set(sig.fields) <= groups, f"declared but never captured: {set(sig.fields) - groups}"
    assert groups <= set(sig.fields), f"captured but not declared: {groups - set(sig.fields)}"
    assert set(sig.fields.values()) <= set(FIELD_TYPES)


@pytest.mark.parametrize("sig", SIGS, ids=IDS)
def test_match_samples(sig):
    for sample in sig.samples:
        got = first_match(sig, sample["line"])
        assert got is not None, f"no match: {sample['line'][:120]}"
        for key, want in sample.get("fields", {}).items():
            assert got.get(key) == want, f"{key}: got {got.get(key)!r}, want {want!r}"


@pytest.mark.parametrize("sig", SIGS, ids=IDS)
def test_no_match_samples(sig):
    for line in sig.no_match:
        assert first_match(sig, line) is None, f"should not match: {line[:120]}"


@pytest.mark.parametrize("sig", SIGS, ids=IDS)
def test_prefilter_literal_present_in_every_match_sample(sig):
    for sample in sig.samples:
        assert any(any(lit in b for lit in sig.prefilter) for b in bodies(sample["line"]))


@pytest.mark.parametrize("sig", SIGS, ids=IDS)
def test_near_miss_line_is_bounded(sig):
    # 1 MB of near-matches (prefilter literal + the sample's start, repeated) must not hang.
    sample = sig.samples[0]["line"]
    body = bodies(sample)[-1]
    near = (body[: max(1, len(body) - 3)] + " ") * (1_000_000 // (len(body) + 1) + 1)
    t0 = time.perf_counter()
    sig.match(near)
    assert time.perf_counter() - t0 < 2.0


def test_regexes_have_no_nested_unbounded_quantifiers():
    nested = re.compile(r"\((?:[^()]*[*+])[^()]*\)[*+]")
    for sig in SIGS:
        for rx in sig.variants:
            assert not nested.search(rx.pattern), f"{sig.path}: nested quantifier in {rx.pattern[:80]}"


# Event names other stages rely on (rules, align): renaming one breaks them silently.
REQUIRED_EVENTS = {
    "nccl_init", "nccl_version", "heartbeat_hang", "teardown", "comm_aborted", "desync_report", "nccl_error_trace",
    "pg_init", "remote_error", "gloo_connect_failed", "running_collective", "ddp_error", "worker_group_restart",
    "rendezvous_ranks", "error_file_copy", "srun_task_exit", "step_cancelled", "slurm_oom",
    "watchdog_timeout", "watchdog_status", "dump_signal", "nccl_warn", "nccl_error", "fingerprint_mismatch",
}


def test_required_events_exist():
    missing = REQUIRED_EVENTS - {s.event for s in SIGS}
    assert not missing


@pytest.mark.parametrize("sig", SIGS, ids=IDS)
def test_description_names_its_section(sig):
    assert re.search(r"(?:FORMATS|DESIGN)\.md §\d", sig.description), "name the FORMATS.md section"


@pytest.mark.parametrize("sig", SIGS, ids=IDS)
def test_fields_named_like_a_column_have_its_type(sig):
    # a field whose name is a column lands in that column (parse/lines.py): the types must agree
    for name, kind in sig.fields.items():
        if name not in EVENT_SCHEMA or name in ("extra", "text"):
            continue
        if name in INT_COLUMNS:
            assert kind in ("int", "ms", "signal"), f"{name} is an integer column, not {kind}"
        elif EVENT_SCHEMA[name] == pl.Utf8:
            assert kind == "str", f"{name} is a text column, not {kind}"
        else:
            pytest.fail(f"{name} is a {EVENT_SCHEMA[name]} column: no signature field may fill it")


# -- lines from other ranks: digit-blind signatures answer by a body's shape ---------------------------

@pytest.mark.parametrize(("pattern", "blind"), [
    (r"exitcode\s*:\s*(?P<code>-?\d+)", True),
    (r"WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)", True),
    (r"sendbuff 0x[0-9a-fA-F]+ count (?P<n>\d{1,12})", False),  # a digit of its own: `0x`
    (r"Signal 6 \(SIGABRT\)", False),
    (r"device (?P<d>[0-7])", False),  # a class holding some digits
    (r"[^5]+", False),
    (r"(?P<a>\d)(?P=a)", False),  # a back-reference
    (r"[\w.\-]+:\d+ [^\s:\]]+", True),
    (r"\D+\W\S", True),
    (r"(?:(?P<pg>\w+)|x(?P<pg>\d+))", True),  # names shared by alternatives (the regex module's)
    (r"\p{Nd}+", False),  # the regex module's own syntax: not provably blind
])
def test_digit_blind_patterns(pattern: str, blind: bool) -> None:
    from ncclforensics.digits import digit_blind

    assert digit_blind(pattern) is blind


def _other_ranks(body: str, n: int, seed: int) -> list[str]:
    """`body` with its digits changed (other ranks, stamps, counts), digits kept where they are."""
    import random

    rnd = random.Random(seed)
    return [re.sub(r"[0-9]", lambda _: rnd.choice("0123456789"), body) for _ in range(n)]


def _sample_bodies(sig) -> list[str]:
    lines = [s["line"] for s in sig.samples if "line" in s] + list(sig.no_match)
    return [b for line in lines for b in bodies(line) if any(c.isdigit() for c in b)]


@pytest.mark.parametrize("sig", [s for s in SIGS if any(s.blind_variants)],
                         ids=[s.path for s in SIGS if any(s.blind_variants)])
def test_a_digit_blind_variant_matches_other_digits_alike(sig):
    """The property the shape cache rests on, on the signature's own samples: changing which digits a
    body holds changes neither whether a blind variant matches nor where its groups are."""
    for body in _sample_bodies(sig):
        for rx, blind in zip(sig.variants, sig.blind_variants, strict=True):
            if not blind:
                continue
            want = rx.search(body)
            for other in _other_ranks(body, 8, seed=len(body)):
                got = rx.search(other)
                assert (got is None) == (want is None), other
                if got is not None:
                    assert got.regs == want.regs, other


def test_most_signatures_are_blind_and_some_are_not():
    """Digits of their own (`0x`, `[c10d]`, `[01]`, `[0-7]`) make a variant see digits: such variants
    are matched on every line."""
    blind = [b for s in SIGS for b in s.blind_variants]
    assert sum(blind) > len(blind) // 2
    assert not all(blind)


def test_lines_from_other_ranks_match_as_matched_afresh():
    """match_all, having seen one rank's line, answers another rank's (other digits) as matching every
    candidate afresh would: the same signatures, in order, with that line's own fields; the candidates
    found by shape (literals with a digit looked up in the line) are the line's own."""
    from ncclforensics.digits import ZERO_DIGITS
    from ncclforensics.parse.signatures import SignatureSet

    sset = SignatureSet(list(SIGS))
    checked = 0
    for sig in SIGS:
        for body in _sample_bodies(sig):
            sset.match_all(body)
            for other in _other_ranks(body, 4, seed=7 + len(body)):
                afresh = [(s, f) for s in sset.candidates(other) for f in [s.match(other)] if f is not None]
                assert sset.candidates(other, shape=other.translate(ZERO_DIGITS)) == sset.candidates(other)
                assert list(sset.match_all(other)) == afresh, other
                checked += 1
    assert checked > 500


def test_digit_blind_verdicts_are_kept_in_the_cache_folder(tmp_path):
    """A verdict worked out once is read back by the next process; a damaged file is worked out again."""
    from ncclforensics import digits

    first = digits.BlindCache()
    first.file = tmp_path / "digit-guards.json"
    assert first.blind(r"SeqNum=(?P<seq>\d+)") is True
    assert first.blind(r"Signal 6") is False
    assert first.get(r"[01]") is None
    first.write()
    again = digits.BlindCache()
    again.file = first.file
    assert again._read() == {r"SeqNum=(?P<seq>\d+)": [], "Signal 6": ["Signal 0"], "[01]": None}
    assert again.blind("Signal 6") is False and again.get("[01]") is None and not again.dirty
    first.file.write_text("{not json")
    damaged = digits.BlindCache()
    damaged.file = first.file
    assert damaged.blind(r"SeqNum=(?P<seq>\d+)") is True and damaged.dirty


@pytest.mark.parametrize(("pattern", "guards"), [
    (r"(?:\[c10d\] )?x", ("[c00d] ",)),  # c10's tag: lines whose shape holds `[c00d] ` are matched afresh
    (r"got 0 bytes", ("got 0 bytes",)),
    (r"(?i)got 0 bytes", None),  # under IGNORECASE a text's letters may differ: no guard
    (r"[01]", None),
    (r"\d+ ms", ()),
])
def test_texts_with_digits_a_pattern_reads_are_its_guards(pattern, guards):
    """A line whose shape holds none of a pattern's guards meets it as a blind pattern."""
    from ncclforensics.digits import digit_guards

    assert digit_guards(pattern) == guards


@pytest.mark.parametrize("body", ["[Rank 1499] SeqNum=2547 ran for 600020 ms", "é 12 ✓ 90 ﹙٣﹚ x", "", "no digits",
                                  "\udc80 3"])
def test_a_bodys_shape_is_its_digits_made_0(body: str) -> None:
    from ncclforensics.digits import ZERO_DIGITS, shape_of

    assert shape_of(body) == body.translate(ZERO_DIGITS)
