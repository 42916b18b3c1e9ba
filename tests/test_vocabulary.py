"""The event vocabulary: every signature file says what its event means; the meanings reach the table."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import polars as pl
import pytest

import ncclforensics
from ncclforensics.events import build_events
from ncclforensics.ingest.envelope import ANSI, peel_all
from ncclforensics.model import EVENT_SCHEMA, RootCause
from ncclforensics.parse.lines import FileContext, emit_row
from ncclforensics.parse.signatures import SIGNATURES_DIR, load_signatures
from ncclforensics.report.timeline import BOOKKEEPING, CATEGORIES
from ncclforensics.vocabulary import EvidenceRole, Strength, VocabularyError, load_vocabulary, vocabulary

VOCAB = vocabulary()
FILES = sorted(SIGNATURES_DIR.rglob("*.toml"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(SIGNATURES_DIR).as_posix())
def test_every_signature_declares_a_meaning_and_samples(path: Path):
    d = tomllib.loads(path.read_text())
    assert d.get("meaning") or d.get("same_meaning_as"), "declare [[meaning]]: class, role, strength (DESIGN.md §3)"
    assert d.get("match"), "at least one sample"
    spec = VOCAB.spec(d["event"])
    assert spec.path == path.relative_to(SIGNATURES_DIR).as_posix()
    if spec.parser is None:
        assert d.get("no_match"), "line signatures carry no_match samples too"


WHEN_REGEXES = sorted({(s.path, key, want) for s in VOCAB.specs.values() for m in s.meanings
                       for key, want in m.when if isinstance(want, str)})


@pytest.mark.parametrize("path,key,want", WHEN_REGEXES, ids=[f"{p}:{k}" for p, k, _ in WHEN_REGEXES])
def test_every_when_regex_compiles_in_both_engines(path, key, want):
    """A `when` regex is evaluated by polars on the event table (vocabulary._condition) and by the
    regex module on one row (meaning_of); start-up does not compile them, so a bad one fails here."""
    import regex

    regex.compile(want)
    pl.Series([""], dtype=pl.Utf8).str.contains(want)


def test_causes_have_a_class_and_strength_and_symptoms_none():
    for spec in VOCAB.specs.values():
        for m in spec.meanings:
            if m.role is EvidenceRole.CAUSE:
                assert m.cls is not None and m.strength is not None, spec.path
            else:
                assert m.strength is None, spec.path


def test_every_class_has_a_cause():
    for cls in set(RootCause) - {RootCause.UNKNOWN}:
        assert VOCAB.kinds(role=EvidenceRole.CAUSE, cls=cls), cls


def _sample_rows():
    """(signature, sample, row) for each line sample that says what meaning it expects."""
    sigs = {s.event: s for s in load_signatures().signatures}
    for event, sig in sigs.items():
        for sample in sig.samples:
            if "meaning" not in sample:
                continue
            fields = None
            for env in peel_all(ANSI.sub("", sample["line"])):
                fields = sig.match(env.body)
                if fields is not None:
                    break
            assert fields is not None, (sig.path, sample["line"])
            # the row as the scanner makes it: typed fields, and what the envelope says, in `extra`
            ctx = FileContext(name="f")
            emit_row(ctx, sig.source, event, fields, env, 1, sample["line"])
            made = ctx.rows[0] if ctx.rows else next(iter(ctx.progress.values()))[0]
            row = {k: v for k, v in made.items() if k in EVENT_SCHEMA and k not in ("file", "line")}
            row.setdefault("extra", "{}")
            yield pytest.param(sig, sample, row, id=f"{event}:{sample['line'][:40]}")


@pytest.mark.parametrize(("sig", "sample", "row"), list(_sample_rows()))
def test_sample_meanings(sig, sample, row):
    want = sample["meaning"]
    got = VOCAB.meaning_of(row)
    assert got.role.value == want["role"]
    assert (got.cls.value if got.cls else None) == want.get("class")
    assert (got.strength.name.lower() if got.strength else None) == want.get("strength")
    # the vectorised annotation agrees with the row-wise one
    df = pl.DataFrame([{**{c: None for c in EVENT_SCHEMA}, **row, "file": "f", "line": 1}],
                      schema={**EVENT_SCHEMA, "kind": pl.Utf8, "source": pl.Utf8})
    out = VOCAB.annotate(df).row(0, named=True)
    assert out["role"] == want["role"] and out["class"] == want.get("class")
    assert out["strength"] == (Strength[want["strength"].upper()] if "strength" in want else None)


def test_meanings_reach_the_event_table(tmp_path: Path):
    (tmp_path / "dmesg.txt").write_text(
        "kernel: NVRM: Xid (PCI:...): 79, pid=<unknown>, name=<unknown>, GPU has fallen off the bus.\n"
        "kernel: NVRM: Xid (PCI:0000:5d:00): 45, pid=4021, name=python3, Ch 00000008\n")
    ev = build_events(tmp_path).events
    assert ev.select("code", "class", "role", "strength").rows() == [
        (79, "gpu_hardware", "cause", 3), (45, "gpu_hardware", "context", None)]


def test_a_lost_what_line_after_a_ranks_own_timeout_is_the_watchdogs_teardown(tmp_path: Path):
    """`terminate called after throwing …` without its `what():` line (cut from the paste) on a rank whose
    watchdog timed out is the watchdog taking it down (FORMATS.md §3.7): a symptom. On a rank without a
    timeout of its own it stays a (weak) crash."""
    (tmp_path / "console.log").write_text(
        " 1: [E ProcessGroupNCCL.cpp:587] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(OpType="
        "ALLREDUCE, TensorShape=[1], Timeout(ms)=1800000) ran for 1800419 milliseconds before timing out.\n"
        " 1: terminate called after throwing an instance of 'std::runtime_error'\n"
        " 2: terminate called after throwing an instance of 'std::runtime_error'\n")
    ev = build_events(tmp_path).events.filter(pl.col("kind") == "cpp_terminate").sort("rank")
    assert ev.select("rank", "role", "class").rows() == [(1, "symptom", None), (2, "cause", "rank_crash")]


def test_a_carrier_yields_to_the_specific_event_on_its_line(tmp_path: Path):
    """A traceback whose exception line is a CUDA OOM: the OOM row gives the meaning (FORMATS.md §14.2)."""
    (tmp_path / "r.log").write_text(
        "Traceback (most recent call last):\n"
        '  File "train.py", line 9, in <module>\n'
        "    loss.backward()\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.19 GiB of which 1.06 GiB is free.\n")
    ev = build_events(tmp_path).events
    got = {r["kind"]: (r["class"], r["role"]) for r in ev.iter_rows(named=True)}
    assert got["cuda_oom"] == ("oom", "cause")
    assert got["exception"][1] == "context"


def test_undeclared_kinds_are_refused():
    with pytest.raises(VocabularyError):
        VOCAB.check("no_such_kind")
    df = pl.DataFrame([{**{c: None for c in EVENT_SCHEMA}, "kind": "no_such_kind", "file": "f", "line": 1}],
                      schema={**EVENT_SCHEMA, "kind": pl.Utf8, "source": pl.Utf8})
    with pytest.raises(VocabularyError):
        VOCAB.annotate(df)


def test_a_file_without_meaning_is_refused(tmp_path: Path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "bare.toml").write_text('event = "bare"\nsource = "x"\n')
    with pytest.raises(VocabularyError, match="no \\[\\[meaning\\]\\]"):
        load_vocabulary(tmp_path)


# -- no module keeps its own kinds ---------------------------------------------------------
_KIND_CALLS = {"rows", "check"}  # ctx.rows("xid"), vocabulary().check("xid")
_KIND_HOLDER = re.compile(r"(?:^|_)KINDS?$")  # TIMEOUT_KINDS = ("watchdog_timeout",)


def _about_kind(node: ast.AST) -> bool:
    """An expression holding an event kind: r["kind"], pl.col("kind")…, a variable named kinds."""
    text = ast.unparse(node)
    return "['kind']" in text or "col('kind')" in text or (isinstance(node, ast.Name) and node.id == "kinds")


def _strings(node: ast.AST) -> list[str]:
    """String constants of a literal, a tuple/list/set of them, or frozenset({...})/tuple((...))."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set", "tuple"):
        return [s for a in node.args for s in _strings(a)]
    return []


def _kind_literals() -> list[tuple[str, int, str]]:
    """String literals the package uses as event kinds: arguments of ctx.rows()/check(), comparisons
    with a row's or a column's kind (==, in, is_in, set operations) and constants named *_KINDS."""
    out = []
    root = Path(ncclforensics.__file__).parent
    for path in root.rglob("*.py"):
        where = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            found: list[str] = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in _KIND_CALLS:
                    found = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                elif node.func.attr == "is_in" and _about_kind(node.func.value):
                    found = [s for a in node.args for s in _strings(a)]
            elif isinstance(node, ast.Compare) and _about_kind(node.left):
                found = [s for c in node.comparators for s in _strings(c)]
            elif (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.Sub))
                  and (_about_kind(node.left) or _about_kind(node.right))):
                found = _strings(node.left) + _strings(node.right)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and _KIND_HOLDER.search(t.id) for t in targets) and node.value:
                    found = _strings(node.value)
            out += [(where, node.lineno, k) for k in found]
    return out


def test_timeline_categories_are_declared():
    """`timeline = "…"` names a category of the report's timeline, or bookkeeping (not drawn unless cited)."""
    named = {s.timeline for s in VOCAB.specs.values() if s.timeline}
    assert named <= set(CATEGORIES) | {BOOKKEEPING}, named - set(CATEGORIES)
    assert set(CATEGORIES) <= named, f"categories no kind belongs to: {set(CATEGORIES) - named}"


def test_the_kind_finder_finds_what_it_should():
    """The finder below sees each way the package names kinds (else the test after it checks nothing)."""
    found = {(f, k) for f, _n, k in _kind_literals()}
    for where, kind in (("analysis.py", "env_setting"), ("align.py", "fr_entry"), ("align.py", "dump_signal"),
                        ("report/timeline.py", "gloo_timeout"), ("report/timeline.py", "fr_entry"),
                        ("rules/detectors/common.py", "agent_signal"), ("scan/worker.py", "xid")):
        assert (where, kind) in found, (where, kind)


def test_every_kind_the_code_names_is_declared():
    undeclared = [f"{f}:{n} {k!r}" for f, n, k in _kind_literals() if k not in VOCAB.specs]
    assert not undeclared, undeclared


PARSER_FILES = {"traceback": "console.log", "fault_stack": "console.log", "child_failed": "console.log",
                "error_json": "0/error.json", "flight_recorder": "fr_trace_rank_1.json"}


def _parser_samples():
    for spec in VOCAB.specs.values():
        if spec.parser is None:
            continue
        d = tomllib.loads((SIGNATURES_DIR / spec.path).read_text())
        for i, sample in enumerate(d["match"]):
            yield pytest.param(spec, sample, id=f"{spec.kind}-{i}")


@pytest.mark.parametrize(("spec", "sample"), list(_parser_samples()))
def test_parser_kind_samples(spec, sample, tmp_path: Path):
    """A block parser's sample (lines, error.json or a Flight Recorder dump) yields an event of its kind."""
    assert spec.parser in PARSER_FILES, spec.parser
    p = tmp_path / "run" / PARSER_FILES[spec.parser]
    p.parent.mkdir(parents=True)
    p.write_text(sample.get("lines") or sample.get("json"))
    ev = build_events(tmp_path / "run").events.filter(pl.col("kind") == spec.kind)
    assert ev.height, f"no {spec.kind} event from its sample"
    row = ev.row(0, named=True)
    for key, want in sample.get("fields", {}).items():
        assert row[key] == want, (key, row[key])
    if "meaning" in sample:
        want = sample["meaning"]
        assert (row["role"], row["class"]) == (want["role"], want.get("class"))
