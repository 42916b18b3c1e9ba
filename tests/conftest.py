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
def pytest_xdist_auto_num_workers(config):
    """No workers when every argument names a test (`pytest FILE::TEST`): starting them would take
    longer than the tests. Otherwise xdist's count (pyproject: `-n logical`)."""
    if config.args and all("::" in arg for arg in config.args):
        return 0
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With `-n` (pyproject's addopts) and the default `--dist load`: each module is one work unit, so
    its module fixtures are made once and its tests run in file order (test_packaging's last test
    breaks the wheel its first one uses); the closed-loop reproducer tests are a unit of their own.

    That unit's module fixture runs all selected cases, a few torchruns at a time, for most of the
    suite's CPU time (on a second worker it would run them all again): sent first, it overlaps the
    rest instead of trailing it. The other units follow from the fewest tests to the most: here the
    modules of few tests are the slow ones (a wheel build, browsers, subprocesses, hypothesis) and
    the modules of hundreds are quick table checks, so the workers run out of work together.
    (xdist's `--dist loadgroup` with an xdist_group mark would group the closed loop, but with
    pytest 9.2 it no longer does: pytest-xdist issue 1386.)
    """
    if config.getvalue("dist") != "load":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    def rank(scope: str, work_unit: dict) -> tuple[bool, int]:
        return scope != "closed_loop", len(work_unit)

    class Ordered(OrderedDict):
        """The work queue, kept in `rank` order as the scheduler fills it (it pops from the front)."""

        def __setitem__(self, scope, work_unit):
            super().__setitem__(scope, work_unit)
            for later in [s for s, unit in self.items() if rank(s, unit) > rank(scope, work_unit)]:
                self.move_to_end(later)

    class ModulesClosedLoopFirst(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = Ordered()

        def _split_scope(self, nodeid: str) -> str:
            return "closed_loop" if nodeid.startswith(CLOSED_LOOP) else nodeid.split("::", 1)[0]

    return ModulesClosedLoopFirst(config, log)
