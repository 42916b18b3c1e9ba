"""A real run mixed with hostile files still gets its own verdict (nothing else may change it)."""

from __future__ import annotations

import json
import pickle
import shutil
import tarfile
from pathlib import Path

import pytest

from ncclforensics.analysis import analyze_path

from .builders import elf_like, gz, put, random_bytes

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus"
CASES = sorted(p.parent for p in CORPUS.glob("*/label.json"))


class _Boom:
    def __reduce__(self):
        return (open, ("/tmp/ncclforensics-mixed-pwned", "w"))


@pytest.mark.skipif(not CASES, reason="../shared/corpus not present")
@pytest.mark.parametrize("case_prefix", ["002", "013", "019"])
def test_verdict_survives_hostile_neighbours(tmp_path: Path, case_prefix: str):
    case = next(c for c in CASES if c.name.startswith(case_prefix))
    label = json.loads((case / "label.json").read_text())
    run = tmp_path / "run"
    shutil.copytree(case, run)
    (run / "label.json").unlink()
    put(run, "core.bin", elf_like())
    put(run, "noise.dat", random_bytes(50_000, seed=3))
    put(run, "latin1.log", "caf\xe9 r\xe9sum\xe9 step 3\n".encode("latin-1"))
    put(run, "<img src=x onerror=alert(1)>.log", "</script><script>alert(1)</script>\n")
    put(run, "huge_line.log", "x" * 10_000_000)
    put(run, "truncated.log.gz", gz(b"hello\n" * 5000)[:-40])
    put(run, "fr_trace_rank_99", pickle.dumps(_Boom(), protocol=2))
    with tarfile.open(run / "evil.tar.gz", "w:gz") as tf:
        info = tarfile.TarInfo("../../escape.log")
        data = b"[rank0]: RuntimeError: not from this run\n"
        info.size = len(data)
        import io

        tf.addfile(info, io.BytesIO(data))
    (run / "loop").symlink_to(run, target_is_directory=True)
    (run / "outside.log").symlink_to("/etc/hostname")

    diag = analyze_path(run).diagnosis
    assert diag.verdict.root_cause.value == label["class"]
    assert sorted(diag.verdict.culprit_ranks) == sorted(label["culprit_ranks"])
    skipped = {s.file: s.reason for s in diag.facts.skipped}
    assert "core.bin" in skipped and "noise.dat" in skipped
    assert any("refused" in r for f, r in skipped.items() if f.startswith("fr_trace_rank_99"))
    assert not Path("/tmp/ncclforensics-mixed-pwned").exists()
    assert not (tmp_path / "escape.log").exists()
