"""The terminal side of the CLI: width, colour, plurals, the progress line on stderr."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console

MIN_WIDTH = 40  # narrower than this, lines wrap so often that the terminal does better alone


class ColorMode(StrEnum):
    auto = "auto"  # on a terminal, unless NO_COLOR is set (https://no-color.org) or TERM=dumb
    always = "always"
    never = "never"


def plural(n: int, word: str, many: str | None = None) -> str:
    """plural(1, "file") -> '1 file'; plural(1200, "file") -> '1,200 files'."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def terminal_width() -> int:
    """Columns of the terminal on stdout; COLUMNS wins (shutil); 80 in a pipe."""
    return max(MIN_WIDTH, shutil.get_terminal_size((80, 24)).columns)


def stdout_console(color: ColorMode, width: int | None = None) -> Console:
    """A rich Console on stdout that never re-wraps or crops what it is given (soft_wrap): the
    callers lay out lines for `width` themselves and choose what may be cut, and how it is marked."""
    from rich.console import Console

    kwargs: dict = {}
    if color is ColorMode.always:
        kwargs.update(force_terminal=True, no_color=False)
    elif color is ColorMode.never or os.environ.get("NO_COLOR"):  # rich alone would keep bold
        kwargs.update(color_system=None, no_color=True)
    return Console(file=sys.stdout, width=width or terminal_width(), soft_wrap=True, highlight=False,
                   markup=False, emoji=False, **kwargs)


def err(msg: str) -> None:
    """One message for a person, on stderr."""
    from rich.console import Console

    Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False).print(msg)


class Progress:
    """One status line on stderr while a long analysis runs (on a terminal only; -q turns it off).

    Nothing shows before DELAY_S, so quick runs print nothing; the line is redrawn at most every
    EVERY_S and erased by close(), before the results reach stdout.
    """

    DELAY_S = 0.5
    EVERY_S = 0.1

    def __init__(self, *, enabled: bool, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.clock = clock
        self.start = clock()
        self.last = float("-inf")
        self.shown = False
        self.files = 0
        self.bytes = 0
        self.name: str | None = None

    @classmethod
    def for_terminal(cls, *, quiet: bool) -> Progress:
        on = not quiet and sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
        return cls(enabled=on)

    def read(self, name: str, nbytes: int) -> None:
        """build_events' progress callback: `nbytes` more of file `name` reached the scanner."""
        from ncclforensics.words import human_bytes

        if name != self.name:
            self.files += 1
            self.name = name
        self.bytes += nbytes
        self._show(f"reading {plural(self.files, 'file')}, {human_bytes(self.bytes)} so far: {name}")

    def phase(self, text: str) -> None:
        self._show(text, now=True)

    def _show(self, text: str, *, now: bool = False) -> None:
        if not self.enabled:
            return
        t = self.clock()
        if t - self.start < self.DELAY_S or (not now and t - self.last < self.EVERY_S):
            return
        self.last = t
        try:
            width = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            width = 80
        line = f"ncclforensics: {text}"
        if len(line) > width - 1:
            line = line[: width - 2] + "…"
        self.stream.write("\r\x1b[K" + line)
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False
