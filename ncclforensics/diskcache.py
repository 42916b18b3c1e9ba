"""The user's cache folder: what ncclforensics can compute again but would rather not at every start.

Everything kept here is checked against what it was made from (file sizes and times, hashes of the
inputs) or is Jinja's own template bytecode, keyed by template source: deleting the folder is always safe.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jinja2


def cache_dir() -> Path:
    """XDG_CACHE_HOME/ncclforensics, else ~/.cache/ncclforensics."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ncclforensics"


def template_cache() -> jinja2.BytecodeCache | None:
    """Compiled Jinja templates, kept between runs (compiling the reproducer's and the report's
    templates is a fifth of a small run's time: bench/README.md, "Start-up"); None where the folder
    cannot be made."""
    folder = cache_dir() / "jinja"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    import jinja2  # here: reading logs needs no templates

    return jinja2.FileSystemBytecodeCache(str(folder))
