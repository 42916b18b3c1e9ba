"""Fixtures every test module may use, and how pytest-xdist spreads the tests over its workers."""

from __future__ import annotations

import pytest

from tests.fixtures.cli_run import runner


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run `ncclforensics ARGS` in-process: cli("analyze", path, "--json") -> Ran(code, out, err)."""
    return runner(capsys, monkeypatch)


CLOSED_LOOP = "tests/test_repro.py::test_closed_loop["


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With `-n` (pyproject's addopts) and the default `--dist load`: each module is one work unit, so
    its module fixtures are made once and its tests run in file order (test_packaging's last test
    breaks the wheel its first one uses); the closed-loop reproducer tests are a unit of their own,
    sent first.

    That unit's module fixture runs all selected cases, a few torchruns at a time, for most of the
    suite's CPU time (on a second worker it would run them all again): started first, it overlaps
    the rest instead of trailing it. (xdist's `--dist loadgroup` with an xdist_group mark no longer
    groups with pytest 9.2: pytest-xdist issue 1386.)
    """
    if config.getvalue("dist") != "load":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    class ClosedLoopAhead(OrderedDict):
        def __setitem__(self, scope, work_unit):
            super().__setitem__(scope, work_unit)
            if scope == "closed_loop":
                self.move_to_end(scope, last=False)

    class ModulesClosedLoopFirst(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = ClosedLoopAhead()

        def _split_scope(self, nodeid: str) -> str:
            return "closed_loop" if nodeid.startswith(CLOSED_LOOP) else nodeid.split("::", 1)[0]

    return ModulesClosedLoopFirst(config, log)
