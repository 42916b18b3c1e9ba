"""Whether a folder holds several runs: the check `analyze` does beside the reading (build_events'
`aside`, in a reading process). Imports nothing heavy: the command asks for it before the reading
starts, and scan.discover (which reads every file's identity) is imported by the check itself."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path


def several_runs_check(path: str | Path | list[str | Path]) -> Callable[[], str | None] | None:
    """Whether the folder `path` holds several runs, as work for build_events' `aside` (done beside
    the reading); None where there is nothing to check: several paths, standard input."""
    if isinstance(path, list) or str(path) == "-":
        return None
    return functools.partial(several_runs_warning, Path(path))


def several_runs_warning(path: Path) -> str | None:
    """"this folder looks like N runs (…)" when the logs under a folder tell several runs apart."""
    if not path.is_dir():
        return None
    from ncclforensics.scan.discover import several_runs

    runs = several_runs(path)
    if len(runs) < 2:
        return None
    shown = ", ".join(runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
    return (f"this folder looks like {len(runs)} runs ({shown}); analyzing them as one — "
            "use `ncclforensics scan` to get one verdict per run")
