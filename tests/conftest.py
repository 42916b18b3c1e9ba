"""Fixtures every test module may use."""

from __future__ import annotations

import pytest

from tests.fixtures.cli_run import runner


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run `ncclforensics ARGS` in-process: cli("analyze", path, "--json") -> Ran(code, out, err)."""
    return runner(capsys, monkeypatch)
