"""A UTC time as text, in each style an output writes it (one formatter, the styles as data)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class TimeStyle:
    sep: str = "T"  # between the date and the time of day
    unit: Literal["minute", "second", "milli", "micro"] = "micro"
    trim: bool = False  # no fraction at all when the microseconds are 0
    zone: str = "Z"  # written after the time
    date: bool = True  # False: the time of day alone


# the --json evidence and first failure: whole seconds
JSON_SECONDS = TimeStyle(unit="second")
# the event table as JSON (`events -f json`): microseconds where the line had them
JSON_EVENT = TimeStyle(trim=True)
# a scan's result.json and summary: always microseconds (the one format the summary parses)
SUMMARY = TimeStyle()
# plotly's date strings: no zone (the axis is labelled UTC)
PLOTLY = TimeStyle(sep=" ", zone="")
# people: the report's evidence and first failure
READABLE = TimeStyle(sep=" ", unit="milli", trim=True, zone=" UTC")
# when a report or an index page was made
GENERATED_MINUTE = TimeStyle(sep=" ", unit="minute", zone=" UTC")
GENERATED_SECOND = TimeStyle(sep=" ", unit="second", zone=" UTC")
# a row of the scan index (its column header says UTC)
TABLE = TimeStyle(sep=" ", unit="second", zone="")
# a line of the merged last-lines view: the time of day to the millisecond
CLOCK = TimeStyle(unit="milli", zone="", date=False)

_TIME_OF_DAY = {"minute": "%H:%M", "second": "%H:%M:%S", "milli": "%H:%M:%S", "micro": "%H:%M:%S"}


def as_utc(ts: dt.datetime | str | None) -> dt.datetime | None:
    """A datetime in UTC (naive ones are UTC already), from a datetime or an ISO 8601 string; None
    for None or a string that is no ISO time."""
    if ts is None:
        return None
    if not isinstance(ts, dt.datetime):
        try:
            ts = dt.datetime.fromisoformat(str(ts).strip().replace("Z", "+00:00"))
        except ValueError:
            return None
    return ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts.astimezone(dt.UTC)


def utc_text(ts: dt.datetime | str | None, style: TimeStyle) -> str | None:
    """`ts` written in `style`; None when there is no time (or a string that is no ISO time)."""
    t = as_utc(ts)
    if t is None:
        return None
    text = t.strftime(("%Y-%m-%d" + style.sep if style.date else "") + _TIME_OF_DAY[style.unit])
    if style.unit == "milli" and not (style.trim and not t.microsecond):
        text += f".{t.microsecond // 1000:03d}"
    elif style.unit == "micro" and not (style.trim and not t.microsecond):
        text += f".{t.microsecond:06d}"
    return text + style.zone


def now_text(style: TimeStyle) -> str:
    """The time now, in `style`."""
    return utc_text(dt.datetime.now(dt.UTC), style) or ""
