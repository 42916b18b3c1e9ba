"""Fixtures of the hostile-input suite (the builders are in builders.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ncclforensics.events import build_events

from .builders import CORPUS, FALLBACK_GOOD, CliOutcome, check_cli, cpu_seconds, rows_of


@pytest.fixture(scope="session")
def good_bytes() -> bytes:
    """A real failure log (the shared corpus when present): its events must survive every case."""
    logs = sorted(CORPUS.glob("*/console.log"))
    return logs[0].read_bytes() if logs else FALLBACK_GOOD.encode()


@pytest.fixture(scope="session")
def good_expected(good_bytes, tmp_path_factory) -> set[tuple[int, str]]:
    """(line, kind) of every event of the good log read alone."""
    d = tmp_path_factory.mktemp("good_alone")
    (d / "good.log").write_bytes(good_bytes)
    res = build_events(d)
    found = rows_of(res, "good.log")
    assert found, "the good log must yield events on its own"
    return found


@pytest.fixture
def cli_inproc():
    """The same check, with the CLI run in this process (so monkeypatched constants apply)."""
    from typer.testing import CliRunner

    from ncclforensics.cli import app

    def run(path: Path, code: int) -> CliOutcome:
        t0 = cpu_seconds()
        res = CliRunner().invoke(app, ["events", os.fsdecode(path), "-f", "json"])
        assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
        return check_cli(CliOutcome(res.exit_code, res.stdout, res.stderr, cpu_seconds() - t0), code)

    return run
